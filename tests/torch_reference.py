"""The PyTorch twin of glassllm's model: the same architectures, written the way a PyTorch
user writes them (nn.Linear, nn.Embedding, F.rms_norm / F.layer_norm, F.gelu, explicit
attention scores or F.scaled_dot_product_attention with enable_gqa, torch.optim.AdamW). One
twin serves the parity tests (`tests/test_model.py`, `tests/test_architectures.py`, float32
and float64) and the benchmarks (`bench/`).

It is written from the papers and Hugging Face's modeling files, not from glassllm's code; only
the parameter names and the config keys are glassllm's, so weights copy over by name:
- llama (Touvron et al. 2023; HF `modeling_llama.py`): RMSNorm (Zhang & Sennrich 2019),
  rotary embedding in the rotate-half layout (Su et al. 2021; HF `rotate_half`), grouped-query
  attention (Ainslie et al. 2023; SDPA's `enable_gqa`, HF's `repeat_kv`), SwiGLU MLP
  (Shazeer 2020), no biases, tied or untied output head.
- gpt2 (Radford et al. 2019; HF `modeling_gpt2.py`, nanoGPT): LayerNorm, learned positions,
  GELU tanh MLP, biases, output head tied to the token embedding.
- the switches of the other families, each as the HF file named: partial rotary and the
  parallel residual (`modeling_gpt_neox.py`, `modeling_phi.py`), GPT-Neo's unscaled scores and
  local layers (`modeling_gpt_neo.py`), sliding windows (`modeling_mistral.py`), q/k/v biases
  (`modeling_qwen2.py`), per-head q/k RMSNorm (`modeling_qwen3.py`), (1 + w) RMSNorm, GeGLU,
  sqrt(d) embeddings (`modeling_gemma.py`), sandwich norms and soft-caps
  (`modeling_gemma2.py`), local RoPE base (`modeling_gemma3.py`), post-norms and
  whole-projection q/k norms (`modeling_olmo2.py`).

A config dict without the switch keys (an older `to_dict()`) is read as its family, llama or
gpt2.

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

_OLD_FAMILIES = {  # what a config without the switch keys means
    "llama": dict(norm="rms", norm_bias=False, positions="rope", attn_bias="none",
                  mlp_bias=False, mlp="swiglu"),
    "gpt2": dict(norm="layer", norm_bias=True, positions="learned", attn_bias="all",
                 mlp_bias=True, mlp="gelu_tanh", tie_embeddings=True),
}
_DEFAULTS = dict(norm_offset=False, norm_position="pre", qk_norm=None, rotary_pct=1.0,
                 rope_theta=10000.0, rope_local_theta=None, lm_head_bias=False,
                 attn_scale=None, attn_softcap=None, sliding_window=None, layer_types=None,
                 parallel_block=False, shared_norm=False, embed_scale=False,
                 final_softcap=None, tie_embeddings=True, norm_eps=1e-5, head_dim=None,
                 n_kv_heads=None, d_ff=None)


def full_config(cfg: dict) -> dict:
    """cfg with every switch present (missing ones from its family, llama or gpt2), head_dim
    and n_kv_heads and d_ff filled in."""
    out = {**_DEFAULTS, **_OLD_FAMILIES.get(cfg["family"], {})}
    out.update({k: v for k, v in cfg.items() if v is not None or k in _DEFAULTS})
    out["n_kv_heads"] = out["n_kv_heads"] or out["n_heads"]
    out["head_dim"] = out["head_dim"] or out["d_model"] // out["n_heads"]
    if not out["d_ff"]:
        gated = out["mlp"] in ("swiglu", "geglu")
        d = out["d_model"]
        # Llama's multiple_of rounding of 8/3 * d for a gated MLP
        out["d_ff"] = 32 * math.ceil(8 * d / 3 / 32) if gated else 4 * d
    return out


class TorchKVCache:
    """Preallocated keys/values (n_layers, B, Hkv, max_len, D) and the filled length."""

    def __init__(self, cfg: dict, batch_size: int = 1, dtype=torch.float32):
        cfg = full_config(cfg)
        shape = (cfg["n_layers"], batch_size, cfg["n_kv_heads"], cfg["max_len"],
                 cfg["head_dim"])
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.length = 0


def rope_tables(max_len: int, head_dim: int, theta: float):
    """HF Llama's cos/sin in float64: inv_freq = 1/theta^(2i/D), each frequency used by both
    halves of the head (rotate-half layout). head_dim here is the rotated width (GPT-NeoX's
    rotary_ndims)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x (B, H, T, D); cos, sin (T, R): the first R channels turned, x * cos + rotate_half(x)
    * sin, the rest passed through (GPT-NeoX / Phi partial rotary)."""
    R = cos.shape[-1]
    x_rot, x_pass = x[..., :R], x[..., R:]
    half = R // 2
    rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    return torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1)


class Norm(nn.Module):
    """RMSNorm (gain w, or 1 + w: Gemma) or LayerNorm (with or without bias), last axis."""

    def __init__(self, cfg: dict, width: int | None = None, rms: bool | None = None):
        super().__init__()
        C = width or cfg["d_model"]
        self.rms = cfg["norm"] == "rms" if rms is None else rms
        self.offset = cfg["norm_offset"] and self.rms
        self.eps = cfg["norm_eps"]
        self.weight = nn.Parameter(torch.zeros(C) if self.offset else torch.ones(C))
        self.bias = nn.Parameter(torch.zeros(C)) if not self.rms and cfg["norm_bias"] else None

    def forward(self, x):
        if self.rms:
            gain = 1.0 + self.weight if self.offset else self.weight
            return F.rms_norm(x, (x.shape[-1],), gain, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: dict, layer: int):
        super().__init__()
        C, H, Hkv, D = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
        qkv_bias = cfg["attn_bias"] in ("qkv", "all")
        self.H, self.Hkv, self.D = H, Hkv, D
        self.query = nn.Linear(C, H * D, bias=qkv_bias)
        self.key = nn.Linear(C, Hkv * D, bias=qkv_bias)
        self.value = nn.Linear(C, Hkv * D, bias=qkv_bias)
        self.output = nn.Linear(H * D, C, bias=cfg["attn_bias"] in ("out", "all"))
        self.qk_norm = cfg["qk_norm"]
        if self.qk_norm is not None:  # always RMSNorm (Qwen3, Gemma 3, OLMo 2)
            per_head = self.qk_norm == "head"
            self.q_norm = Norm(cfg, D if per_head else H * D, rms=True)
            self.k_norm = Norm(cfg, D if per_head else Hkv * D, rms=True)
        types = cfg["layer_types"]
        self.window = cfg["sliding_window"] if types and types[layer] == "sliding_attention" \
            else None
        self.scale = cfg["attn_scale"] if cfg["attn_scale"] is not None else D ** -0.5
        self.softcap = cfg["attn_softcap"]
        self.plain = self.window is None and self.softcap is None and cfg["attn_scale"] is None

    def _heads(self, x, proj, norm, heads, B, T):
        y = proj(x)
        if self.qk_norm == "proj":
            y = norm(y)
        y = y.view(B, T, heads, self.D)
        if self.qk_norm == "head":
            y = norm(y)
        return y.transpose(1, 2)

    def forward(self, x, cos, sin, cache, layer):
        B, T, C = x.shape
        q = self._heads(x, self.query, getattr(self, "q_norm", None), self.H, B, T)
        k = self._heads(x, self.key, getattr(self, "k_norm", None), self.Hkv, B, T)
        v = self.value(x).view(B, T, self.Hkv, self.D).transpose(1, 2)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        start = 0
        if cache is not None:  # append this step's keys/values, attend to everything so far
            start = cache.length
            cache.k[layer, :, :, start:start + T] = k
            cache.v[layer, :, :, start:start + T] = v
            k, v = cache.k[layer, :, :, :start + T], cache.v[layer, :, :, :start + T]
        query_pos = torch.arange(start, start + T)[:, None]
        key_pos = torch.arange(start + T)[None, :]
        allowed = key_pos <= query_pos
        if self.window is not None:
            allowed &= key_pos > query_pos - self.window
        if self.plain:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                               enable_gqa=self.H != self.Hkv)
        else:  # explicit scores: scale, soft-cap (before the mask), window
            rep = self.H // self.Hkv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            scores = q @ k.transpose(-1, -2) * self.scale
            if self.softcap is not None:
                scores = torch.tanh(scores / self.softcap) * self.softcap
            scores = scores.masked_fill(~allowed, float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
        return self.output(y.transpose(1, 2).reshape(B, T, self.H * self.D))


class MLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        C, d_ff, bias = cfg["d_model"], cfg["d_ff"], cfg["mlp_bias"]
        self.kind = cfg["mlp"]
        if self.kind in ("swiglu", "geglu"):
            self.gate = nn.Linear(C, d_ff, bias=bias)
        self.up = nn.Linear(C, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, C, bias=bias)

    def forward(self, x):
        if self.kind == "swiglu":
            return self.down(F.silu(self.gate(x)) * self.up(x))
        if self.kind == "geglu":
            return self.down(F.gelu(self.gate(x), approximate="tanh") * self.up(x))
        if self.kind == "gelu":
            return self.down(F.gelu(self.up(x)))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: dict, layer: int):
        super().__init__()
        self.position, self.parallel = cfg["norm_position"], cfg["parallel_block"]
        self.shared = cfg["shared_norm"]
        if self.position != "post":
            self.attention_norm = Norm(cfg)
            if not self.shared:
                self.mlp_norm = Norm(cfg)
        if self.position != "pre":
            self.attention_post_norm = Norm(cfg)
            self.mlp_post_norm = Norm(cfg)
        self.attention = Attention(cfg, layer)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache, layer):
        if self.parallel:  # GPT-NeoX use_parallel_residual, Phi's one shared norm
            h = self.attention_norm(x)
            mlp_in = h if self.shared else self.mlp_norm(x)
            return x + self.attention(h, cos, sin, cache, layer) + self.mlp(mlp_in)
        a = self.attention(x if self.position == "post" else self.attention_norm(x),
                           cos, sin, cache, layer)
        if self.position != "pre":
            a = self.attention_post_norm(a)
        x = x + a
        m = self.mlp(x if self.position == "post" else self.mlp_norm(x))
        if self.position != "pre":
            m = self.mlp_post_norm(m)
        return x + m


class TorchLM(nn.Module):
    """Decoder-only LM of any preset; `cfg` is glassllm's `Config.to_dict()`."""

    def __init__(self, cfg: dict, dtype=torch.float32):
        super().__init__()
        self.cfg = cfg = full_config(cfg)
        C, V = cfg["d_model"], cfg["vocab_size"]
        self.token_embedding = nn.Embedding(V, C)
        self.position_embedding = None
        self.local = None
        if cfg["positions"] == "learned":
            self.position_embedding = nn.Embedding(cfg["max_len"], C)
        else:  # float64 tables, rounded once by .to(dtype) below
            rotary = int(cfg["head_dim"] * cfg["rotary_pct"])
            cos, sin = rope_tables(cfg["max_len"], rotary, cfg["rope_theta"])
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
            if cfg["rope_local_theta"] is not None:  # Gemma 3's sliding layers
                cos, sin = rope_tables(cfg["max_len"], rotary, cfg["rope_local_theta"])
                self.register_buffer("rope_local_cos", cos, persistent=False)
                self.register_buffer("rope_local_sin", sin, persistent=False)
                self.local = [t == "sliding_attention" for t in cfg["layer_types"] or
                              ["full_attention"] * cfg["n_layers"]]
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg["n_layers"]))
        self.final_norm = Norm(cfg)
        self.lm_head = None
        if not cfg["tie_embeddings"]:
            self.lm_head = nn.Linear(C, V, bias=cfg["lm_head_bias"])
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
        if self.cfg["embed_scale"]:  # Gemma: the factor in the activations' dtype
            x = x * torch.tensor(self.cfg["d_model"] ** 0.5, dtype=x.dtype)
        cos = sin = None
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(start, start + T))
        else:
            cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        for layer, block in enumerate(self.blocks):
            if self.local is not None and self.local[layer]:
                rows = slice(start, start + T)
                x = block(x, self.rope_local_cos[rows], self.rope_local_sin[rows], cache, layer)
            else:
                x = block(x, cos, sin, cache, layer)
        if cache is not None:
            cache.length = start + T
        x = self.final_norm(x)
        logits = F.linear(x, self.token_embedding.weight) if self.lm_head is None \
            else self.lm_head(x)
        if self.cfg["final_softcap"] is not None:
            cap = self.cfg["final_softcap"]
            logits = torch.tanh(logits / cap) * cap
        return logits

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
