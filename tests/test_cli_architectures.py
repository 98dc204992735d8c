"""`glassllm train --family NAME` for every preset, and `glassllm train --init-from MODEL`
(fine-tuning a saved model with its config and tokenizer). Tiny models, few steps."""
from __future__ import annotations

import numpy as np
import pytest

from glassllm import GlassLM, cli, config
from glassllm.cli import main
from glassllm.formats import files
from glassllm.tokenizers import BPETokenizer, ByteTokenizer
from glassllm.training.data import load_corpus

TINY = ["--d-model", "16", "--n-layers", "2", "--n-heads", "2", "--seq-len", "16",
        "--batch-size", "4", "--eval-batches", "1", "--warmup", "2"]
TEXT = "The quick brown fox jumps over the lazy dog. Ünïcödé too.\n" * 60


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_cli_family_choices_are_the_presets():
    assert cli.FAMILIES == config.FAMILIES


@pytest.mark.parametrize("family", config.FAMILIES)
def test_train_family_runs_20_steps_and_saves_that_architecture(family, tmp_path, text_file,
                                                                 capsys):
    out = tmp_path / "model.safetensors"
    rc = main(["train", "--family", family, "--data", str(text_file), "--out", str(out),
               "--steps", "20", "--eval-every", "20", "--lr", "1e-2", *TINY])
    assert rc == 0, capsys.readouterr().err
    model = files.load(out)
    preset = config.PRESETS[family]
    assert model.cfg.family == family
    assert all(getattr(model.cfg, k) == v for k, v in preset.items() if k != "layer_types")
    assert f"glassllm train: {family} model" in capsys.readouterr().out


def _saved_model(tmp_path, family="gemma2", tokenizer=None, vocab_size=257):
    model = GlassLM(config.Config.preset(family, vocab_size=vocab_size, d_model=16,
                                         n_layers=2, n_heads=2, max_len=32), seed=3)
    rng = np.random.default_rng(0)
    for p in model.parameters():  # not the init a fresh run would draw
        p.data = (p.data + rng.normal(0, 0.1, p.shape)).astype(np.float32)
    path = tmp_path / "start.safetensors"
    files.save(model, path, tokenizer=tokenizer or ByteTokenizer())
    return model, path


def test_init_from_fine_tunes_the_saved_model(tmp_path, text_file, capsys):
    start, path = _saved_model(tmp_path)
    out = tmp_path / "tuned.safetensors"
    rc = main(["train", "--init-from", str(path), "--data", str(text_file), "--out", str(out),
               "--steps", "3", "--eval-every", "3", "--lr", "1e-6", "--seq-len", "16",
               "--batch-size", "4", "--eval-batches", "1", "--warmup", "1"])
    assert rc == 0, capsys.readouterr().err
    tuned = files.load(out)
    assert tuned.cfg == start.cfg  # its architecture and max_len, not the flags' defaults
    for (name, a), (_, b) in zip(start.named_parameters(), tuned.named_parameters()):
        # a learning rate of 1e-6 moves each weight by at most ~3e-6: the start is the file
        assert np.abs(a.data - b.data).max() < 1e-4, name
    assert any(np.abs(a.data - b.data).max() > 0
               for (_, a), (_, b) in zip(start.named_parameters(), tuned.named_parameters()))


def test_init_from_encodes_text_with_the_models_tokenizer(tmp_path, text_file, capsys):
    bpe = BPETokenizer.train([TEXT], vocab_size=300)
    _, path = _saved_model(tmp_path, "qwen3", tokenizer=bpe, vocab_size=bpe.vocab_size)
    out = tmp_path / "tuned.safetensors"
    rc = main(["train", "--init-from", str(path), "--data", str(text_file), "--out", str(out),
               "--steps", "2", "--eval-every", "2", "--seq-len", "8", "--batch-size", "2",
               "--eval-batches", "1", "--warmup", "1"])
    assert rc == 0, capsys.readouterr().err
    assert files.load_tokenizer(out).to_json() == bpe.to_json()


def test_load_corpus_with_a_tokenizer_splits_the_text_at_a_character(text_file):
    bpe = BPETokenizer.train([TEXT], vocab_size=300)
    corpus = load_corpus([str(text_file)], seq_len=8, tokenizer=bpe)
    raw = text_file.read_bytes()
    assert corpus.tokenizer is bpe
    assert bpe.decode_bytes(corpus.train.ids) + bpe.decode_bytes(corpus.val.ids) == raw
    assert corpus.val_text_bytes == len(bpe.decode_bytes(corpus.val.ids))
    assert abs(corpus.val_text_bytes - len(raw) // 10) <= 3


@pytest.mark.parametrize("extra, message", [
    (["--family", "gpt2"], "brings its own architecture; drop --family"),
    (["--resume", "x.safetensors"], "--resume continues one"),
])
def test_init_from_refuses_conflicting_flags(tmp_path, text_file, capsys, extra, message):
    _, path = _saved_model(tmp_path)
    rc = main(["train", "--init-from", str(path), "--data", str(text_file), "--out",
               str(tmp_path / "o.safetensors"), *extra])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.safetensors").exists()


def test_init_from_a_missing_model_is_exit_2(tmp_path, text_file, capsys):
    rc = main(["train", "--init-from", str(tmp_path / "none.safetensors"), "--data",
               str(text_file), "--out", str(tmp_path / "o.safetensors")])
    assert rc == 2
    assert "--init-from" in capsys.readouterr().err


def test_init_from_refuses_a_longer_seq_len_than_the_model(tmp_path, text_file, capsys):
    _, path = _saved_model(tmp_path)
    rc = main(["train", "--init-from", str(path), "--data", str(text_file), "--out",
               str(tmp_path / "o.safetensors"), "--seq-len", "64"])
    assert rc == 2
    assert "exceeds the max_len 32" in capsys.readouterr().err


def test_a_fine_tuning_run_resumes_on_its_tokenizers_data(tmp_path, text_file, capsys):
    bpe = BPETokenizer.train([TEXT], vocab_size=300)
    _, path = _saved_model(tmp_path, "olmo2", tokenizer=bpe, vocab_size=bpe.vocab_size)
    run = ["--steps", "2", "--seq-len", "8", "--batch-size", "2", "--eval-batches", "1",
           "--warmup", "1", "--eval-every", "2", "--checkpoint-every", "2"]
    out = tmp_path / "run" / "m.safetensors"
    assert main(["train", "--init-from", str(path), "--data", str(text_file), "--out",
                 str(out), *run]) == 0
    # the checkpoint's data fingerprint is of the BPE ids: a resume must encode alike
    assert main(["train", "--resume", str(tmp_path / "run" / "checkpoint.safetensors")]) == 0
    assert "resumed after step 2" in capsys.readouterr().out
