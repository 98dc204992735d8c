"""`glassllm.load` and `LM.generate` / `LM.stream`: the text `glassllm generate --seed` prints,
for a glassllm model file, a Hugging Face directory and a llama2.c checkpoint; hub-style names
answered with how to download them."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import glassllm
from glassllm import Config, GlassLM
from glassllm.cli import SAMPLE_SEPARATOR, main
from glassllm.formats import files, hf
from glassllm.formats.lm import LM, hub_name_error, looks_like_hub_name
from glassllm.tokenizers import BPETokenizer, ByteTokenizer

from conftest import REPO, shared_data_path

WORDS = "the cat sat on a mat while a dog ran far away from home today".split()
TEXT = " ".join(np.random.default_rng(0).choice(WORDS, 2000)) + "\n"


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def decided(model: GlassLM) -> GlassLM:
    model.token_embedding.weight.data *= 6  # logits of a few nats: varied, decided text
    return model


@pytest.fixture(scope="module")
def glassllm_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm") / "byte.safetensors"
    model = decided(GlassLM(Config(d_model=32, n_layers=2, n_heads=4, max_len=64), seed=4))
    files.save(model, path, tokenizer=ByteTokenizer())
    return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A gpt2-family model with a trained 300-id BPE, written by `to_hf` (tokenizer.json)."""
    tokenizer = BPETokenizer.train([TEXT], 300)
    model = decided(GlassLM(Config(vocab_size=300, d_model=32, n_layers=2, n_heads=4,
                                   max_len=64, family="gpt2"), seed=5))
    directory = tmp_path_factory.mktemp("lm") / "gpt2-tiny"
    hf.to_hf(model, directory, tokenizer)
    return directory


@pytest.fixture(scope="module")
def llama2c():
    return shared_data_path("llama2c", "stories260K.bin"), shared_data_path("llama2c",
                                                                            "tok512.bin")


@pytest.fixture(scope="module", params=["glassllm", "hf", "llama2c"])
def source(request):
    """(load arguments, generate flags) of each source."""
    if request.param == "glassllm":
        path = request.getfixturevalue("glassllm_file")
        return (path,), ["--model", path]
    if request.param == "hf":
        path = request.getfixturevalue("hf_dir")
        return (path,), ["--model", path]
    model, tokenizer = request.getfixturevalue("llama2c")
    return (model, str(tokenizer)), ["--model", model, "--tokenizer", tokenizer]


def test_load_gives_the_model_and_its_tokenizer(glassllm_file, hf_dir, llama2c):
    lm = glassllm.load(glassllm_file)
    assert isinstance(lm, glassllm.LM) and isinstance(lm.tokenizer, ByteTokenizer)
    assert lm.model.cfg.d_model == 32
    assert isinstance(glassllm.load(hf_dir).tokenizer, BPETokenizer)
    lm = glassllm.load(*llama2c)
    assert lm.model.cfg.vocab_size == lm.tokenizer.vocab_size == 512
    assert lm.encode("Once")[0] == 1  # BOS first, as run.c


@pytest.mark.parametrize("prompt,flags,kwargs", [
    ("the cat", ["--seed", 3], dict(seed=3)),
    ("Once upon", ["--seed", 7, "--temperature", "1.1", "--top-k", 20, "--top-p", "0.9"],
     dict(seed=7, temperature=1.1, top_k=20, top_p=0.9)),
    ("the", ["--temperature", 0], dict(temperature=0)),
])
def test_generate_is_the_text_of_the_command(capsys, source, prompt, flags, kwargs):
    args, model_flags = source
    lm = glassllm.load(*args)
    text = lm.generate(prompt, max_new_tokens=30, **kwargs)
    code, out, err = cli(capsys, "generate", *model_flags, "--prompt", prompt,
                         "--max-new-tokens", 30, *flags)
    assert (code, err) == (0, "")
    assert out == prompt + text + "\n"
    assert len(text) >= 10  # a real continuation, not an early end-of-text
    assert "".join(lm.stream(prompt, max_new_tokens=30, **kwargs)) == text


def test_stream_yields_as_tokens_are_drawn(glassllm_file):
    lm = glassllm.load(glassllm_file)
    pieces = list(lm.stream("é", max_new_tokens=25, seed=1))
    assert len(pieces) >= 20  # one piece per token (bytes of a character held back: "")
    assert "".join(pieces) == lm.generate("é", max_new_tokens=25, seed=1)


def test_a_list_of_prompts_is_num_samples(capsys, hf_dir):
    lm = glassllm.load(hf_dir)
    texts = lm.generate(["the dog"] * 3, max_new_tokens=20, seed=11)
    assert isinstance(texts, list) and len(set(texts)) == 3  # one stream: three samples
    code, out, err = cli(capsys, "generate", "--model", hf_dir, "--prompt", "the dog",
                         "--max-new-tokens", 20, "--seed", 11, "--num-samples", 3)
    assert code == 0
    assert out == f"\n{SAMPLE_SEPARATOR}\n".join("the dog" + t for t in texts) + "\n"
    assert lm.generate(["the dog", "a cat"], max_new_tokens=5, seed=2)[0] == \
        lm.generate("the dog", max_new_tokens=5, seed=2)


def test_no_prompt_starts_from_the_start_token(capsys, glassllm_file, llama2c):
    lm = glassllm.load(glassllm_file)
    assert lm.encode("") == [256]  # end-of-text: the byte tokenizer's start token
    assert glassllm.load(*llama2c).encode("") == [1]  # BOS
    code, out, _ = cli(capsys, "generate", "--model", glassllm_file, "--max-new-tokens", 20,
                       "--seed", 5)
    assert code == 0 and out == lm.generate(max_new_tokens=20, seed=5) + "\n"


def test_prompt_file(capsys, tmp_path, glassllm_file):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Ünïcode\nprompt\n", encoding="utf-8")
    code, out, _ = cli(capsys, "generate", "--model", glassllm_file, "--prompt-file", prompt,
                       "--max-new-tokens", 15, "--seed", 0)
    text = glassllm.load(glassllm_file).generate("Ünïcode\nprompt\n", max_new_tokens=15, seed=0)
    assert code == 0 and out == "Ünïcode\nprompt\n" + text + "\n"
    prompt.write_bytes(b"ok \xff")
    code, _, err = cli(capsys, "generate", "--model", glassllm_file, "--prompt-file", prompt)
    assert code == 2 and err.count("\n") == 1
    assert f"--prompt-file {prompt}: not UTF-8 text (byte 3)" in err
    code, _, err = cli(capsys, "generate", "--model", glassllm_file, "--prompt-file", prompt,
                       "--prompt", "x")
    assert code == 2 and "give --prompt or --prompt-file, not both" in err
    code, _, err = cli(capsys, "generate", "--model", glassllm_file, "--num-samples", 0)
    assert code == 2 and "--num-samples must be >= 1, got 0" in err


@pytest.mark.parametrize("name", ["gpt2", "openai-community/gpt2", "roneneldan/TinyStories-1M"])
def test_a_hub_name_says_glassllm_reads_local_files(capsys, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    local = name.rsplit("/", 1)[-1]
    with pytest.raises(FileNotFoundError) as e:
        glassllm.load(name)
    assert str(e.value) == (
        f"{name}: no such local file or directory; glassllm reads local files only (it never "
        f"downloads). Get it with `huggingface-cli download {name} --local-dir {local}` (or "
        f"from https://huggingface.co/{name}), then give the directory {local}")
    code, out, err = cli(capsys, "generate", "--model", name, "--prompt", "hi")
    assert (code, out) == (2, "") and err == f"glassllm generate: error: {e.value}\n"


def test_paths_are_not_hub_names(tmp_path):
    for path in ["model.safetensors", "./gpt2", "/abs/gpt2", "runs/a/b", "stories260K.bin",
                 "../x"]:
        assert not looks_like_hub_name(path), path
    with pytest.raises(FileNotFoundError, match="no such model file: .*missing.safetensors"):
        glassllm.load(tmp_path / "missing.safetensors")
    assert "huggingface-cli download a/b --local-dir b" in str(hub_name_error("a/b"))


def test_errors(glassllm_file, llama2c, tmp_path):
    with pytest.raises(ValueError, match="has no tokenizer .* tokenizer=PATH"):
        glassllm.load(llama2c[0])
    lm = glassllm.load(glassllm_file)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0, got -1"):
        lm.stream("a", max_new_tokens=-1)
    with pytest.raises(ValueError, match="top_p"):
        lm.generate("a", top_p=2.0)
    weights_only = tmp_path / "w.safetensors"
    files.save(GlassLM(Config(vocab_size=300, d_model=16, n_layers=1, n_heads=2,
                              max_len=8)), weights_only)
    with pytest.raises(ValueError, match="the tokenizer has 512 ids but the model's "
                                         "vocab_size is 300"):
        glassllm.load(weights_only, tokenizer=llama2c[1])
    assert glassllm.load(weights_only, tokenizer="byte").generate("a", max_new_tokens=3,
                                                                  seed=0) is not None
    assert isinstance(LM(lm.model, ByteTokenizer()), LM)


def test_import_glassllm_stays_cheap_and_version():
    code = ("import sys, glassllm; heavy = {'safetensors', 'tokenizers', 'glassllm.formats.lm'}"
            "; print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO / "src")}, check=True).stdout
    assert out == "[]\n"
    version = subprocess.run([sys.executable, "-m", "glassllm.cli", "--version"],
                             capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": str(REPO / "src")}).stdout
    assert version == f"glassllm {glassllm.__version__}\n"
