"""Hugging Face checkpoints that are unusual but valid (and damaged ones), for every class:
each test pins one input that once loaded wrongly or failed with a traceback."""
from __future__ import annotations

import json

import numpy as np
import pytest

from glassllm.formats import hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from test_hf_archs import batch, hf_logits, make_hf, tolerance  # noqa: E402


def test_a_model_type_that_is_not_a_string_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^x/config.json: model_type \['llama'\] is not "
                                         r"supported by glassllm"):
        hf.config_from_hf({"model_type": ["llama"]}, where="x/config.json")


def test_a_tied_config_with_a_different_stored_head_loads_as_transformers_does(tmp_path):
    """transformers 5 does not tie a head stored with other values than the embedding: it
    keeps the stored head. glassllm once dropped it and used the embedding (logits off by
    ~100)."""
    model = make_hf("smollm2", vocab_size=40)
    model.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors_numpy.load_file(path)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1.0
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager").eval()
    glass = hf.from_hf(tmp_path)
    idx = batch(3, shape=(2, 8)) % 40
    want = hf_logits(theirs, idx)
    assert not glass.cfg.tie_embeddings
    assert np.abs(glass(idx).data - want).max() <= tolerance(want)
    # an identical stored copy keeps the model tied
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})
    assert hf.from_hf(tmp_path).cfg.tie_embeddings


def test_a_gpt2_with_a_different_stored_head_is_refused_naming_the_tensor(tmp_path):
    """glassllm's GPT-2 is always tied: a GPT-2 directory whose stored lm_head differs (which
    transformers 5 would keep) is refused in one line naming the directory and the tensor."""
    config = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2,
                                     n_positions=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors_numpy.load_file(path)
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1.0
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"^{tmp_path}: tensor 'lm_head.weight' differs"):
        hf.from_hf(tmp_path)


# config.json of google/gemma-2-2b and google/gemma-3-1b-pt as transformers 4.x saved them: both
# store cache_implementation "hybrid" (generate's cache, not the arithmetic), and gemma-2-2b a
# hidden_act beside the hidden_activation its MLP reads. Both were once refused.
_GEMMA_HUB = {
    "architectures": ["X"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "initializer_range": 0.02,
    "max_position_embeddings": 8192, "num_attention_heads": 8, "num_key_value_heads": 4,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "torch_dtype": "bfloat16", "transformers_version": "4.42.4", "use_cache": True,
    "vocab_size": 256000}
GEMMA_2_2B = {**_GEMMA_HUB, "model_type": "gemma2", "hidden_act": "gelu_pytorch_tanh",
              "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
              "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
              "rope_theta": 10000.0, "sliding_window": 4096}
GEMMA_3_1B = {**_GEMMA_HUB, "model_type": "gemma3_text", "hidden_size": 1152,
              "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4,
              "num_key_value_heads": 1, "attn_logit_softcapping": None,
              "final_logit_softcapping": None, "rope_local_base_freq": 10000,
              "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512,
              "sliding_window_pattern": 6, "max_position_embeddings": 32768,
              "vocab_size": 262144}


def test_gemma_2_2b_and_gemma_3_1b_configs_read():
    g2 = hf.config_from_hf(GEMMA_2_2B, where="gemma-2-2b/config.json")
    assert (g2.family, g2.sliding_window, g2.attn_softcap, g2.final_softcap) == \
        ("gemma2", 4096, 50.0, 30.0)
    assert g2.layer_types[:2] == ("sliding_attention", "full_attention")
    g3 = hf.config_from_hf(GEMMA_3_1B, where="gemma-3-1b/config.json")
    assert (g3.family, g3.sliding_window, g3.rope_local_theta, g3.rope_theta) == \
        ("gemma3", 512, 10000.0, 1e6)
    assert g3.layer_types[4:7] == ("sliding_attention", "full_attention", "sliding_attention")


def test_gemma2s_stored_hidden_act_is_ignored_as_transformers_ignores_it(tmp_path):
    model = make_hf("gemma2", vocab_size=40, hidden_act="silu")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["hidden_act"] == "silu"
    idx = batch(4, shape=(2, 12)) % 40
    want = hf_logits(model, idx)
    assert np.abs(hf.from_hf(tmp_path)(idx).data - want).max() <= tolerance(want)


@pytest.mark.parametrize("fields,named", [
    ({"attention_types": [[["global", "sparse"], 1]]}, "attention_types"),
    ({"attention_types": None, "attention_layers": ["global", "sparse"]}, "attention_layers"),
    ({}, "attention_types"),  # GPTNeoConfig's default: 24 layers, not 2
])
def test_gpt_neo_layer_kinds_errors_name_the_field_given(fields, named):
    config = {"model_type": "gpt_neo", "hidden_size": 16, "num_layers": 2, "num_heads": 2,
              "max_position_embeddings": 8, "vocab_size": 10, **fields}
    with pytest.raises(ValueError, match=f"^c.json: field '{named}' must name"):
        hf.config_from_hf(config, where="c.json")


def test_a_tied_gpt_neox_with_a_stored_copy_of_its_head_loads(tmp_path):
    """Pythia names its head embed_out; a tied checkpoint that stores it equal to the
    embedding was once refused as an unexpected tensor."""
    model = make_hf("neox", vocab_size=40, tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors_numpy.load_file(path)
    tensors["embed_out.weight"] = tensors["gpt_neox.embed_in.weight"]
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})
    idx = batch(5, shape=(2, 12)) % 40
    want = hf_logits(model, idx)
    glass = hf.from_hf(tmp_path)
    assert glass.cfg.tie_embeddings
    assert np.abs(glass(idx).data - want).max() <= tolerance(want)


@pytest.mark.parametrize("change,said", [
    ("drop", "tensor 'transformer.h.0.attn.attention.k_proj.weight' is missing"),
    ("grow", "tensor 'transformer.h.0.attn.attention.k_proj.weight' has shape \\(17, 16\\)"),
    ("add", r"unexpected tensor\(s\) \['transformer.h.0.extra'\]"),
])
def test_tensor_errors_quote_the_name_in_the_file(change, said, tmp_path):
    """GPT-2 and GPT-Neo files prefix their tensors with `transformer.`; errors once quoted
    the names without it, which a reader does not find in the file."""
    config = transformers.GPTNeoConfig(vocab_size=20, hidden_size=16, num_layers=1,
                                       num_heads=2, max_position_embeddings=8,
                                       attention_types=[[["global"], 1]])
    transformers.GPTNeoForCausalLM(config).save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors_numpy.load_file(path)
    name = "transformer.h.0.attn.attention.k_proj.weight"
    if change == "drop":
        del tensors[name]
    elif change == "grow":
        tensors[name] = np.concatenate([tensors[name], tensors[name][:1]])
    else:
        tensors["transformer.h.0.extra"] = np.zeros(2, np.float32)
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"^{tmp_path}: {said}"):
        hf.from_hf(tmp_path)
