"""The PyTorch twin of glassllm's model: the same two architectures, written the way a PyTorch
user writes them (nn.Linear, nn.Embedding, F.rms_norm / F.layer_norm,
F.scaled_dot_product_attention with enable_gqa, torch.optim.AdamW). One twin serves both
the parity tests (`tests/test_model.py`, float32 and float64) and the benchmarks (`bench/`).

It is written from the papers and Hugging Face's conventions, not from glassllm's code; only
the parameter names are glassllm's, so weights copy over by name:
- llama (Touvron et al. 2023; HF `modeling_llama.py`): RMSNorm (Zhang & Sennrich 2019),
  rotary embedding in the rotate-half layout (Su et al. 2021; HF `rotate_half`), grouped-query
  attention (Ainslie et al. 2023; SDPA's `enable_gqa`, HF's `repeat_kv`), SwiGLU MLP
  (Shazeer 2020), no biases, tied or untied output head.
- gpt2 (Radford et al. 2019; HF `modeling_gpt2.py`, nanoGPT): LayerNorm, learned positions,
  GELU tanh MLP, biases, output head tied to the token embedding.

Usage:
    twin = TorchLM(cfg.to_dict())                   # float32; dtype=torch.float64 for checks
    load_glassllm_state(twin, glass.state_dict())   # Linear weights [in, out] -> [out, in]
    logits = twin(idx)                              # (B, T) ids (NumPy or torch) -> (B, T, V)
    loss = twin.loss(idx, targets)                  # mean nats
    grads = glassllm_gradients(twin)                # .grad arrays under glassllm's names
    cache = TorchKVCache(twin.cfg); twin(prompt, cache); twin(next_id, cache)  # decoding
    opt = torch_adamw(twin, lr)                     # AdamW with glassllm's decay groups
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def _d_ff(cfg: dict) -> int:
    if cfg.get("d_ff"):
        return int(cfg["d_ff"])
    d = cfg["d_model"]
    if cfg["family"] == "gpt2":
        return 4 * d
    return 32 * math.ceil(8 * d / 3 / 32)  # Llama's multiple_of rounding of 8/3 * d


class TorchKVCache:
    """Preallocated keys/values (n_layers, B, Hkv, max_len, D) and the filled length."""

    def __init__(self, cfg: dict, batch_size: int = 1, dtype=torch.float32):
        shape = (cfg["n_layers"], batch_size, cfg["n_kv_heads"] or cfg["n_heads"],
                 cfg["max_len"], cfg["d_model"] // cfg["n_heads"])
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.length = 0


def rope_tables(max_len: int, head_dim: int, theta: float):
    """HF Llama's cos/sin in float64: inv_freq = 1/theta^(2i/D), each frequency used by both
    halves of the head (rotate-half layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x (B, H, T, D); cos, sin (T, D): x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        C, H = cfg["d_model"], cfg["n_heads"]
        Hkv = cfg["n_kv_heads"] or H
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
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        start, mask = 0, None
        if cache is not None:  # append this step's keys/values, attend to everything so far
            start = cache.length
            cache.k[layer, :, :, start:start + T] = k
            cache.v[layer, :, :, start:start + T] = v
            k, v = cache.k[layer, :, :, :start + T], cache.v[layer, :, :, :start + T]
        if start > 0 and T > 1:  # queries at start..start+T-1 see keys up to their position
            mask = torch.arange(start + T)[None, :] <= torch.arange(start, start + T)[:, None]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           is_causal=mask is None and start == 0,
                                           enable_gqa=self.H != self.Hkv)
        return self.output(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        C, d_ff = cfg["d_model"], _d_ff(cfg)
        self.swiglu = cfg["family"] == "llama"
        if self.swiglu:
            self.gate = nn.Linear(C, d_ff, bias=False)
        self.up = nn.Linear(C, d_ff, bias=not self.swiglu)
        self.down = nn.Linear(d_ff, C, bias=not self.swiglu)

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Norm(nn.Module):
    """RMSNorm (llama) or LayerNorm (gpt2) over the last axis, with a learned gain."""

    def __init__(self, cfg: dict):
        super().__init__()
        C = cfg["d_model"]
        self.rms = cfg["family"] == "llama"
        self.eps = cfg.get("norm_eps", 1e-5)
        self.weight = nn.Parameter(torch.ones(C))
        self.bias = None if self.rms else nn.Parameter(torch.zeros(C))

    def forward(self, x):
        if self.rms:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class Block(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.attention_norm = Norm(cfg)
        self.attention = Attention(cfg)
        self.mlp_norm = Norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache, layer):
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, layer)
        return x + self.mlp(self.mlp_norm(x))


class TorchLM(nn.Module):
    """Decoder-only LM of either family; `cfg` is glassllm's `Config.to_dict()`."""

    def __init__(self, cfg: dict, dtype=torch.float32):
        super().__init__()
        self.cfg = dict(cfg)
        self.cfg["n_kv_heads"] = cfg.get("n_kv_heads") or cfg["n_heads"]
        C, V = cfg["d_model"], cfg["vocab_size"]
        self.token_embedding = nn.Embedding(V, C)
        self.position_embedding = None
        if cfg["family"] == "gpt2":
            self.position_embedding = nn.Embedding(cfg["max_len"], C)
        else:  # float64 tables, rounded once by .to(dtype) below
            cos, sin = rope_tables(cfg["max_len"], C // cfg["n_heads"],
                                   cfg.get("rope_theta", 10000.0))
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.blocks = nn.ModuleList(Block(self.cfg) for _ in range(cfg["n_layers"]))
        self.final_norm = Norm(cfg)
        self.lm_head = None
        if not cfg.get("tie_embeddings", True) and cfg["family"] == "llama":
            self.lm_head = nn.Linear(C, V, bias=False)
        self.to(dtype)

    def forward(self, idx, cache: TorchKVCache | None = None):
        """idx (B, T) or (T,) int ids, NumPy or torch -> logits (B, T, V)."""
        idx = torch.as_tensor(np.asarray(idx) if not torch.is_tensor(idx) else idx,
                              dtype=torch.long)
        if idx.ndim == 1:
            idx = idx[None]
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
            return F.linear(x, self.token_embedding.weight)  # tied head
        return self.lm_head(x)

    def loss(self, idx, targets):
        """Mean next-token cross-entropy in nats."""
        logits = self(idx)
        targets = torch.as_tensor(np.asarray(targets), dtype=torch.long).reshape(-1)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)


def _transposed(name: str, p: torch.Tensor) -> bool:
    """glassllm's Linear weights are [in, out]; nn.Linear stores [out, in]."""
    return name.endswith(".weight") and p.ndim == 2 and "embedding" not in name


def load_glassllm_state(model: TorchLM, state: dict) -> None:
    """Copy a glassllm `state_dict()` (name -> ndarray) into `model`, strictly, in the model's
    dtype.

    Raises:
        KeyError: the names differ. ValueError: a shape differs.
    """
    own = dict(model.named_parameters())
    missing, unexpected = set(own) - set(state), set(state) - set(own)
    if missing or unexpected:
        raise KeyError(f"missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    with torch.no_grad():
        for name, p in own.items():
            value = torch.from_numpy(np.array(state[name]))
            if _transposed(name, p):
                value = value.T
            if value.shape != p.shape:
                raise ValueError(f"{name}: shape {tuple(value.shape)} vs {tuple(p.shape)}")
            p.copy_(value.to(p.dtype))


def glassllm_gradients(model: TorchLM) -> dict[str, np.ndarray | None]:
    """The .grad of every parameter, under glassllm's names and in glassllm's layout."""
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad
        grads[name] = None if g is None else (g.T if _transposed(name, p) else g).numpy()
    return grads


def torch_adamw(model: nn.Module, lr: float):
    """torch.optim.AdamW with glassllm's choices: weight decay 0.1 on matrices (ndim >= 2)
    only, betas (0.9, 0.95), eps 1e-8."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)
