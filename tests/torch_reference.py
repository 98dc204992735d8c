"""An independent PyTorch implementation of glassllm's two model families, for parity tests.

Written from the papers and Hugging Face's conventions, not from glassllm's code:
- llama (Touvron et al. 2023; HF `modeling_llama.py`): RMSNorm (Zhang & Sennrich 2019),
  rotary embedding in the rotate-half layout (Su et al. 2021; HF `rotate_half`), grouped-query
  attention by repeating each KV head for its group (Ainslie et al. 2023; HF `repeat_kv`, here
  `repeat_interleave`), SwiGLU MLP (Shazeer 2020), no biases, tied or untied output head.
- gpt2 (Radford et al. 2019; HF `modeling_gpt2.py`, nanoGPT): LayerNorm, learned positions,
  GELU tanh MLP, biases, output head tied to the token embedding.

Usage (also from bench/):
    model = TorchLM(cfg.to_dict())                 # plain dict of Config fields
    load_glassllm_state(model, glass.state_dict()) # glassllm names, Linear weights [in, out]
    logits = model(idx)                            # (B, T) ids -> (B, T, V)
    loss = model.loss(idx, targets)                # mean nats
    grads = glassllm_gradients(model)              # .grad arrays under glassllm's names

Attention uses an explicit masked softmax (not a fused kernel) so float64 works everywhere.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _d_ff(cfg: dict) -> int:
    if cfg.get("d_ff"):
        return int(cfg["d_ff"])
    d = cfg["d_model"]
    if cfg.get("family", "llama") == "gpt2":
        return 4 * d
    return 32 * math.ceil(8 * d / 3 / 32)  # Llama's multiple_of rounding of 8/3 * d


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_cos_sin(max_len: int, head_dim: int, theta: float, dtype):
    """HF Llama's cos/sin: inv_freq = 1/theta^(2i/D), each frequency used by both halves."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([-x2, x1], dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, cfg: dict, bias: bool):
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg["n_heads"], cfg["n_kv_heads"] or cfg["n_heads"]
        self.head_dim = cfg["d_model"] // self.n_heads
        d = cfg["d_model"]
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=bias)

    def forward(self, x, cos=None, sin=None):
        B, T, _ = x.shape
        # HF layout: (B, heads, T, head_dim)
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if cos is not None:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        n_rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(n_rep, dim=1)  # query head h reads KV head h // n_rep
        v = v.repeat_interleave(n_rep, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, d_ff, bias=False)
        self.up_proj = nn.Linear(d, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GeluMLP(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.c_fc = nn.Linear(d, d_ff)
        self.c_proj = nn.Linear(d_ff, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        llama = cfg.get("family", "llama") == "llama"
        d, eps = cfg["d_model"], cfg.get("norm_eps", 1e-5)
        norm = (lambda: RMSNorm(d, eps)) if llama else (lambda: nn.LayerNorm(d, eps=eps))
        self.input_norm = norm()
        self.attn = SelfAttention(cfg, bias=not llama)
        self.post_attention_norm = norm()
        self.mlp = SwiGLU(d, _d_ff(cfg)) if llama else GeluMLP(d, _d_ff(cfg))

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attention_norm(x))


class TorchLM(nn.Module):
    """Decoder-only LM from a dict of glassllm Config fields (`Config.to_dict()`)."""

    def __init__(self, cfg: dict, dtype=torch.float32):
        super().__init__()
        self.cfg = dict(cfg)
        self.llama = cfg.get("family", "llama") == "llama"
        self.tied = cfg.get("tie_embeddings", True) or not self.llama
        d, V = cfg["d_model"], cfg["vocab_size"]
        self.embed_tokens = nn.Embedding(V, d)
        if not self.llama:
            self.wpe = nn.Embedding(cfg["max_len"], d)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["n_layers"]))
        eps = cfg.get("norm_eps", 1e-5)
        self.norm = RMSNorm(d, eps) if self.llama else nn.LayerNorm(d, eps=eps)
        if not self.tied:
            self.lm_head = nn.Linear(d, V, bias=False)
        self.to(dtype)

    def forward(self, idx):
        idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        if idx.ndim == 1:
            idx = idx[None]
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos = sin = None
        if self.llama:
            head_dim = self.cfg["d_model"] // self.cfg["n_heads"]
            cos, sin = rotary_cos_sin(T, head_dim, self.cfg.get("rope_theta", 10000.0), x.dtype)
        else:
            x = x + self.wpe(torch.arange(T))
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        if self.tied:
            return x @ self.embed_tokens.weight.T
        return self.lm_head(x)

    def loss(self, idx, targets):
        logits = self(idx)
        targets = torch.as_tensor(np.asarray(targets), dtype=torch.long).reshape(-1)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)


def name_map(model: TorchLM) -> dict[str, tuple[str, bool]]:
    """glassllm parameter name -> (torch parameter name, whether the weight is transposed).

    glassllm's Linear weights are [in, out]; torch's nn.Linear stores [out, in].
    """
    names = {"token_embedding.weight": ("embed_tokens.weight", False)}
    if not model.llama:
        names["position_embedding.weight"] = ("wpe.weight", False)
    norm_parts = ("weight",) if model.llama else ("weight", "bias")
    linear_parts = ("weight",) if model.llama else ("weight", "bias")
    mlp = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"} if model.llama \
        else {"up": "c_fc", "down": "c_proj"}
    for i in range(len(model.layers)):
        g, t = f"blocks.{i}.", f"layers.{i}."
        for part in norm_parts:
            names[f"{g}attention_norm.{part}"] = (f"{t}input_norm.{part}", False)
            names[f"{g}mlp_norm.{part}"] = (f"{t}post_attention_norm.{part}", False)
        for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"),
                             ("output", "o_proj")):
            for part in linear_parts:
                names[f"{g}attention.{ours}.{part}"] = (f"{t}attn.{theirs}.{part}",
                                                       part == "weight")
        for ours, theirs in mlp.items():
            for part in linear_parts:
                names[f"{g}mlp.{ours}.{part}"] = (f"{t}mlp.{theirs}.{part}", part == "weight")
    for part in norm_parts:
        names[f"final_norm.{part}"] = (f"norm.{part}", False)
    if not model.tied:
        names["lm_head.weight"] = ("lm_head.weight", True)
    return names


def load_glassllm_state(model: TorchLM, state_dict: dict) -> None:
    """Copy a glassllm state_dict (name -> ndarray) into `model`, strictly, in model's dtype."""
    names = name_map(model)
    missing, unexpected = set(names) - set(state_dict), set(state_dict) - set(names)
    if missing or unexpected:
        raise KeyError(f"missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    params = dict(model.named_parameters())
    assert set(params) == {t for t, _ in names.values()}, "name map does not cover the model"
    with torch.no_grad():
        for ours, (theirs, transposed) in names.items():
            value = torch.from_numpy(np.array(state_dict[ours]))
            value = value.T if transposed else value
            target = params[theirs]
            if value.shape != target.shape:
                raise ValueError(f"{ours}: shape {tuple(value.shape)} vs {tuple(target.shape)}")
            target.copy_(value.to(target.dtype))


def glassllm_gradients(model: TorchLM) -> dict[str, np.ndarray]:
    """The .grad of every parameter, under glassllm's names and in glassllm's layout."""
    params = dict(model.named_parameters())
    grads = {}
    for ours, (theirs, transposed) in name_map(model).items():
        g = params[theirs].grad
        grads[ours] = None if g is None else (g.T if transposed else g).detach().numpy()
    return grads
