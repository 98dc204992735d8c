"""Regressions found by trying every Hugging Face class with unusual but valid (and damaged)
checkpoints: each test pins one input that once loaded wrongly or failed with a traceback."""
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
