"""The benchmark's PyTorch side: the same architecture as glassllm.GlassLM, written the way a
PyTorch user would (nn.Linear, F.scaled_dot_product_attention, nn.functional norms), plus a
simple preallocated KV cache for generation.

It is independent of glassllm's code: only the weights are copied over, by name
(`load_glassllm_state`). glassllm stores Linear weights [in, out]; nn.Linear wants [out, in].
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class TorchKVCache:
    """Preallocated keys/values (n_layers, B, Hkv, max_len, D) and the filled length."""

    def __init__(self, cfg: dict, batch_size: int = 1):
        shape = (cfg["n_layers"], batch_size, cfg["n_kv_heads"], cfg["max_len"],
                 cfg["d_model"] // cfg["n_heads"])
        self.k = torch.zeros(shape)
        self.v = torch.zeros(shape)
        self.length = 0


def _rope_tables(max_len, head_dim, theta):
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _apply_rope(x, cos, sin):  # x (B, H, T, D); cos, sin (T, D); rotate-half convention
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class _Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, H, Hkv = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
        bias = cfg["family"] == "gpt2"
        self.H, self.Hkv, self.D = H, Hkv, C // H
        self.query = nn.Linear(C, C, bias=bias)
        self.key = nn.Linear(C, Hkv * self.D, bias=bias)
        self.value = nn.Linear(C, Hkv * self.D, bias=bias)
        self.output = nn.Linear(C, C, bias=bias)

    def forward(self, x, cos, sin, cache, layer):
        B, T, C = x.shape
        q = self.query(x).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.key(x).view(B, T, self.Hkv, self.D).transpose(1, 2)
        v = self.value(x).view(B, T, self.Hkv, self.D).transpose(1, 2)
        if cos is not None:
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        causal = True
        if cache is not None:
            start = cache.length
            cache.k[layer, :, :, start:start + T] = k
            cache.v[layer, :, :, start:start + T] = v
            k, v = cache.k[layer, :, :, :start + T], cache.v[layer, :, :, :start + T]
            if start > 0:
                if T != 1:
                    raise ValueError("the bench's torch cache decodes one token at a time")
                causal = False  # a single new query sees every cached key
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                           enable_gqa=self.H != self.Hkv)
        return self.output(y.transpose(1, 2).reshape(B, T, C))


class _MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, d_ff = cfg["d_model"], cfg["d_ff"]
        self.swiglu = cfg["family"] == "llama"
        if self.swiglu:
            self.gate = nn.Linear(C, d_ff, bias=False)
        self.up = nn.Linear(C, d_ff, bias=not self.swiglu)
        self.down = nn.Linear(d_ff, C, bias=not self.swiglu)

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class _Norm(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["d_model"]
        self.rms = cfg["family"] == "llama"
        self.eps = cfg["norm_eps"]
        self.weight = nn.Parameter(torch.ones(C))
        self.bias = None if self.rms else nn.Parameter(torch.zeros(C))

    def forward(self, x):
        if self.rms:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class _Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention_norm = _Norm(cfg)
        self.attention = _Attention(cfg)
        self.mlp_norm = _Norm(cfg)
        self.mlp = _MLP(cfg)

    def forward(self, x, cos, sin, cache, layer):
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, layer)
        return x + self.mlp(self.mlp_norm(x))


class BenchTorchLM(nn.Module):
    """Decoder-only LM of either family; `cfg` is glassllm's `Config.to_dict()`."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        self.position_embedding = None
        if cfg["family"] == "gpt2":
            self.position_embedding = nn.Embedding(cfg["max_len"], cfg["d_model"])
        else:
            cos, sin = _rope_tables(cfg["max_len"], cfg["d_model"] // cfg["n_heads"],
                                    cfg["rope_theta"])
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg["n_layers"]))
        self.final_norm = _Norm(cfg)
        self.lm_head = None
        if not cfg["tie_embeddings"]:
            self.lm_head = nn.Linear(cfg["d_model"], cfg["vocab_size"], bias=False)

    def forward(self, idx: torch.Tensor, cache: TorchKVCache | None = None):
        """idx (B, T) int64 -> logits (B, T, V)."""
        T = idx.shape[1]
        start = cache.length if cache is not None else 0
        x = self.token_embedding(idx)
        cos = sin = None
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(start, start + T))
        else:
            cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        for layer, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache, layer)
        if cache is not None:
            cache.length = start + T
        x = self.final_norm(x)
        if self.lm_head is None:
            return x @ self.token_embedding.weight.T
        return self.lm_head(x)


def load_glassllm_state(model: BenchTorchLM, state: dict) -> None:
    """Copy a glassllm `state_dict()` into `model` (Linear weights transposed)."""
    own = dict(model.named_parameters())
    missing = set(own) ^ set(state)
    if missing:
        raise KeyError(f"parameter names differ: {sorted(missing)}")
    with torch.no_grad():
        for name, p in own.items():
            value = torch.from_numpy(np.ascontiguousarray(state[name], dtype=np.float32))
            is_linear_weight = name.endswith(".weight") and p.ndim == 2 \
                and "embedding" not in name
            if is_linear_weight:
                value = value.T
            if value.shape != p.shape:
                raise ValueError(f"{name}: {tuple(value.shape)} vs {tuple(p.shape)}")
            p.copy_(value)


def torch_adamw(model: nn.Module, lr: float):
    """torch.optim.AdamW with glassllm's choices: decay only on ndim >= 2 parameters."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)

