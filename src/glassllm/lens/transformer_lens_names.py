"""glassllm's names (`glassllm.lens.trace.NAMES`) and TransformerLens' hook names, both ways.

TransformerLens (Nanda & Bloom, github.com/TransformerLensOrg/TransformerLens) names each
HookPoint by its module path: `blocks.{layer}.hook_resid_pre`, `blocks.{layer}.attn.hook_z`,
`ln_final.hook_normalized` (components/transformer_block.py, abstract_attention.py, mlp.py,
layer_norm.py). The table maps each glassllm name to the TransformerLens hook that carries the
same value, for a model loaded into TransformerLens WITHOUT weight processing
(`from_pretrained_no_processing`): `from_pretrained`'s defaults fold the norms' weights into
the next layer and centre the weights writing to the residual stream, which changes the values
of `hook_normalized` and `hook_resid_*` (not the logits). Where the two differ even so (llama's
`hook_normalized` is before the RMSNorm weight in TransformerLens, after it in glassllm), the
table's page, docs/names-transformerlens.md, says how.

`to_glassllm(name, family)` turns a TransformerLens name (a layer number or "*" in the layer
slot) into the glassllm name or pattern a trace accepts; a hook glassllm has no value for, or
whose value differs in a way no mapping hides, is refused with the reason.
"""
from __future__ import annotations

import re

# glassllm name template -> TransformerLens hook name template ("{layer}" in both)
TRANSFORMER_LENS_NAMES: dict[str, str] = {
    "token_embedding": "hook_embed",
    "position_embedding": "hook_pos_embed",
    "blocks.{layer}.residual_in": "blocks.{layer}.hook_resid_pre",
    "blocks.{layer}.attention.input": "blocks.{layer}.ln1.hook_normalized",
    "blocks.{layer}.attention.q_normed": "",  # q/k norm (Qwen3, Gemma 3, OLMo-2): no hook named
    "blocks.{layer}.attention.k_normed": "",
    "blocks.{layer}.attention.q": "blocks.{layer}.attn.hook_q",
    "blocks.{layer}.attention.k": "blocks.{layer}.attn.hook_k",
    "blocks.{layer}.attention.v": "blocks.{layer}.attn.hook_v",
    "blocks.{layer}.attention.scores": "blocks.{layer}.attn.hook_attn_scores",
    "blocks.{layer}.attention.pattern": "blocks.{layer}.attn.hook_pattern",
    "blocks.{layer}.attention.head_output": "blocks.{layer}.attn.hook_z",
    "blocks.{layer}.attention.output": "blocks.{layer}.hook_attn_out",
    "blocks.{layer}.attention.output_normed": "",  # Gemma 2/3, OLMo-2 post-norms: no hook named
    "blocks.{layer}.residual_mid": "blocks.{layer}.hook_resid_mid",
    "blocks.{layer}.mlp.input": "blocks.{layer}.ln2.hook_normalized",
    "blocks.{layer}.mlp.hidden_pre": "blocks.{layer}.mlp.hook_pre",
    "blocks.{layer}.mlp.up": "blocks.{layer}.mlp.hook_pre_linear",
    "blocks.{layer}.mlp.hidden_post": "blocks.{layer}.mlp.hook_post",
    "blocks.{layer}.mlp.output": "blocks.{layer}.hook_mlp_out",
    "blocks.{layer}.mlp.output_normed": "",
    "blocks.{layer}.residual_out": "blocks.{layer}.hook_resid_post",
    "final_norm": "ln_final.hook_normalized",
    "logits_pre_softcap": "",  # Gemma 2's final soft-cap: TransformerLens hooks neither side
    "logits": "",  # TransformerLens has no hook on the logits: they are run_with_hooks' return
}

# llama (rotary) models: glassllm's q and k are after RoPE, TransformerLens' hook_q/hook_k
# before it; its hook_rot_q/hook_rot_k carry glassllm's values
ROTARY_NAMES: dict[str, str] = {
    "blocks.{layer}.attention.q": "blocks.{layer}.attn.hook_rot_q",
    "blocks.{layer}.attention.k": "blocks.{layer}.attn.hook_rot_k",
}

_LAYER = re.compile(r"^blocks\.(\d+|\*)\.(.+)$")
_BY_TL = {tl: ours for ours, tl in TRANSFORMER_LENS_NAMES.items() if tl}
_ROTARY_BY_TL = {tl: ours for ours, tl in ROTARY_NAMES.items()}


def is_transformer_lens_name(name: str) -> bool:
    """True for a TransformerLens hook name ("hook_..." as its last dotted part)."""
    return isinstance(name, str) and name.rsplit(".", 1)[-1].startswith("hook_")


def to_glassllm(name: str, family: str, rotary: bool | None = None) -> str:
    """The glassllm name (or pattern, for "*" as the layer) of a TransformerLens hook name.

    family: the model's family, named in messages; rotary: whether its positions are rotary
    (then hook_rot_q/hook_rot_k are glassllm's q/k); None -> family == "llama".

    Raises:
        ValueError: a hook name glassllm has no value for (naming the table), or, for a
            rotary model, hook_q/hook_k (before RoPE; glassllm has only after).
    """
    match = _LAYER.match(name)
    layer, template = (match.group(1), f"blocks.{{layer}}.{match.group(2)}") if match else \
        (None, name)
    rotary = family == "llama" if rotary is None else rotary
    ours = (_ROTARY_BY_TL.get(template) if rotary else None) or _BY_TL.get(template)
    if rotary and template in ("blocks.{layer}.attn.hook_q", "blocks.{layer}.attn.hook_k"):
        ours = None
        why = (f"; a {family} model's q and k are traced after RoPE: TransformerLens' "
               f"{template.replace('{layer}', layer or '0').replace('hook_', 'hook_rot_')}")
    elif not rotary and template in _ROTARY_BY_TL:
        ours, why = None, f"; a {family} model has no rotary embedding: use hook_q / hook_k"
    else:
        why = "; see glassllm.lens.trace.TRANSFORMER_LENS_NAMES"
    if ours is None:
        raise ValueError(f"trace: TransformerLens hook {name!r} has no glassllm value{why}")
    return ours.replace("{layer}", layer) if layer is not None else ours
