"""`glassllm generate`: streamed output equal to the library's generation, early stop at
end-of-text, and one-line errors with exit code 2 for bad paths and options."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from glassllm import Config, GlassLM
from glassllm.formats import files
from glassllm.cli import load_model_and_tokenizer, main
from glassllm.generate import Sampling, generate
from glassllm.tokenizers import ByteTokenizer

CFG = Config(d_model=32, n_layers=2, n_heads=4, max_len=24)


@pytest.fixture
def model_path(tmp_path):
    model = GlassLM(CFG, seed=4)
    model.token_embedding.weight.data *= 6  # logits of a few nats: varied, decided text
    path = tmp_path / "tiny.safetensors"
    files.save(model, path, tokenizer=ByteTokenizer())
    return path


@pytest.fixture
def eot_model_path(tmp_path):
    """A gpt2-family model whose every prediction is end-of-text: the final LayerNorm's output
    is pinned to a multiple of the eot embedding row, which has the largest norm."""
    model = GlassLM(Config(d_model=16, n_layers=1, n_heads=2, max_len=16, family="gpt2"))
    emb = model.token_embedding.weight.data
    emb[256] = 1.0
    model.final_norm.weight.data[:] = 0.0
    model.final_norm.bias.data[:] = 10 * emb[256]
    path = tmp_path / "eot.safetensors"
    files.save(model, path, tokenizer=ByteTokenizer())
    return path


def expected_text(path, prompt, n, sampling, seed):
    """What the CLI must print: the prompt, then the decoded new tokens up to end-of-text."""
    model, tok = files.load(path), files.load_tokenizer(path)
    new = generate(model, tok.encode(prompt), n, sampling, np.random.default_rng(seed),
                   stop_id=tok.eot_id)
    if new and new[-1] == tok.eot_id:
        new = new[:-1]
    return prompt + tok.decode(new) + "\n"


def run(capsys, *argv):
    code = main(["generate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_load_model_and_tokenizer(model_path):
    model, tok = load_model_and_tokenizer(model_path)
    assert model.cfg == CFG and isinstance(tok, ByteTokenizer)


@pytest.mark.parametrize("flags,sampling", [
    ([], Sampling(temperature=0.8)),
    (["--temperature", "0"], Sampling(temperature=0)),
    (["--temperature", "1.2", "--top-k", "40", "--top-p", "0.9"], Sampling(1.2, 40, 0.9)),
])
def test_output_is_the_prompt_plus_the_generated_text(capsys, model_path, flags, sampling):
    code, out, err = run(capsys, "--model", model_path, "--prompt", "Héllo, ",
                         "--max-new-tokens", 40, "--seed", 3, *flags)
    assert code == 0 and err == ""
    assert out == expected_text(model_path, "Héllo, ", 40, sampling, seed=3)
    assert len(out) > len("Héllo, \n")


def test_same_seed_same_text_other_seed_other_text(capsys, model_path):
    args = ("--model", model_path, "--prompt", "ab", "--max-new-tokens", 30)
    first, second = run(capsys, *args, "--seed", 1)[1], run(capsys, *args, "--seed", 1)[1]
    other = run(capsys, *args, "--seed", 2)[1]
    assert first == second and first != other


def test_text_is_streamed_piece_by_piece(monkeypatch, model_path):
    """Each produced piece is written and flushed at once, not gathered for the end."""
    events = []

    class Recorder:
        def write(self, text):
            events.append(("write", text))
            return len(text)

        def flush(self):
            events.append(("flush", None))

    monkeypatch.setattr(sys, "stdout", Recorder())
    assert main(["generate", "--model", str(model_path), "--prompt", "x",
                 "--max-new-tokens", "25", "--seed", "0", "--temperature", "0"]) == 0
    pieces = [text for kind, text in events if kind == "write" and text]
    assert len(pieces) >= 10
    # every non-empty write is followed by a flush before the next write
    for i, (kind, text) in enumerate(events):
        if kind == "write" and text:
            assert ("flush", None) in events[i + 1:i + 3]


def test_stops_early_at_end_of_text(capsys, eot_model_path):
    code, out, err = run(capsys, "--model", eot_model_path, "--prompt", "Hi",
                         "--max-new-tokens", 50, "--seed", 0, "--temperature", 1.0)
    assert (code, out, err) == (0, "Hi\n", "")


def test_zero_new_tokens_prints_the_prompt(capsys, model_path):
    assert run(capsys, "--model", model_path, "--prompt", "abc", "--max-new-tokens", 0)[1] \
        == "abc\n"


def test_long_prompt_beyond_max_len_is_cropped_not_refused(capsys, model_path):
    prompt = "the quick brown fox jumps over the lazy dog"  # 43 bytes > max_len 24
    code, out, _ = run(capsys, "--model", model_path, "--prompt", prompt,
                       "--max-new-tokens", 10, "--seed", 0)
    assert code == 0
    assert out == expected_text(model_path, prompt, 10, Sampling(0.8), seed=0)


@pytest.mark.parametrize("flags,message", [
    (["--temperature", "-1"], "temperature"),
    (["--top-k", "0"], "top_k"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
    (["--max-new-tokens", "-5"], "--max-new-tokens"),
])
def test_bad_options_one_line_exit_2(capsys, model_path, flags, message):
    code, out, err = run(capsys, "--model", model_path, "--prompt", "x", *flags)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and err.startswith("glassllm generate: error")


def test_empty_prompt_samples_unconditionally_from_end_of_text(capsys, model_path):
    """The byte tokenizer has no BOS: an empty prompt starts from eot_id (256), as nanoGPT
    and transformers start GPT-2; the start token itself is not printed."""
    code, out, err = run(capsys, "--model", model_path, "--prompt", "", "--max-new-tokens", 20,
                         "--seed", 5)
    assert code == 0 and err == ""
    model = files.load(model_path)
    tok = ByteTokenizer()
    new = generate(model, [tok.eot_id], 20, Sampling(0.8), np.random.default_rng(5),
                   stop_id=tok.eot_id)
    assert new and new[0] != tok.eot_id
    new = new[:-1] if new[-1] == tok.eot_id else new
    assert out == tok.decode(new) + "\n" and len(out) > 1


class BosByteTokenizer(ByteTokenizer):
    """The byte tokenizer with a begin-of-sequence id, as a SentencePiece tokenizer has
    (llama2.c's: bos 1, eot 2); here BOS is the byte 'A', so printing it would show."""
    bos_id = 65


def test_empty_prompt_starts_from_bos_when_the_tokenizer_has_one(capsys, monkeypatch,
                                                                  model_path):
    import glassllm.cli.common as cli  # where generate's model_with_tokenizer finds it
    model = files.load(model_path)
    monkeypatch.setattr(cli, "load_model_and_tokenizer",
                        lambda path: (model, BosByteTokenizer()))
    code, out, err = run(capsys, "--model", model_path, "--prompt", "", "--max-new-tokens", 12,
                         "--temperature", 0)
    assert code == 0 and err == ""
    from_bos = generate(model, [65], 12, Sampling(0), stop_id=256)
    from_eot = generate(model, [256], 12, Sampling(0), stop_id=256)
    assert from_bos != from_eot  # so the output tells which start was used
    from_bos = from_bos[:-1] if from_bos[-1] == 256 else from_bos
    assert out == ByteTokenizer().decode(from_bos) + "\n"  # no leading "A": BOS unprinted


def test_weights_only_model_needs_tokenizer_option(capsys, tmp_path):
    """A weights-only file (vocab 8, the README's smallest example model) exits 2 with one line saying
    how to give a tokenizer; --tokenizer then makes it generate."""
    small = tmp_path / "v8.safetensors"
    model = GlassLM(Config(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1,
                           max_len=4), seed=0)
    files.save(model, small)
    code, out, err = run(capsys, "--model", small, "--prompt", "x")
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "has no tokenizer" in err and "--tokenizer PATH" in err
    # a tokenizer bigger than the model is refused, naming both sizes
    code, out, err = run(capsys, "--model", small, "--prompt", "x", "--tokenizer", "byte")
    assert code == 2 and "257 ids" in err and "vocab_size is 8" in err and out == ""

    byte_model = GlassLM(CFG, seed=4)
    weights = tmp_path / "weights.safetensors"
    files.save(byte_model, weights)
    tok_file = tmp_path / "byte.json"
    tok_file.write_text(ByteTokenizer().to_json())
    args = ("--prompt", "ab", "--max-new-tokens", 8, "--temperature", 0)
    code, out, err = run(capsys, "--model", weights, *args)
    assert code == 2 and "--tokenizer" in err
    new = generate(byte_model, ByteTokenizer().encode("ab"), 8, Sampling(0), stop_id=256)
    new = new[:-1] if new[-1] == 256 else new
    for given in (tok_file, "byte"):
        code, out, err = run(capsys, "--model", weights, "--tokenizer", given, *args)
        assert (code, err) == (0, "") and out == "ab" + ByteTokenizer().decode(new) + "\n"
    code, out, err = run(capsys, "--model", weights, "--tokenizer", tmp_path / "no.json", *args)
    assert code == 2 and "no.json" in err and err.count("\n") == 1


def test_missing_corrupt_and_directory_paths(capsys, tmp_path):
    missing = tmp_path / "absent.safetensors"
    code, _, err = run(capsys, "--model", missing, "--prompt", "x")
    assert code == 2 and "no such model file" in err and str(missing) in err

    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x00" * 3 + b"garbage" * 10)
    code, _, err = run(capsys, "--model", corrupt, "--prompt", "x")
    assert code == 2 and "not a readable safetensors file" in err and err.count("\n") == 1

    code, _, err = run(capsys, "--model", tmp_path, "--prompt", "x")
    assert code == 2 and "directory" in err


def test_non_numeric_option_is_argparse_usage_error(capsys, model_path):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", str(model_path), "--prompt", "x", "--temperature", "hot"])
    assert e.value.code == 2
    assert "invalid float value" in capsys.readouterr().err


def test_subprocess_end_to_end(model_path, tmp_path):
    """The real console entry point, in a fresh interpreter: output and exit codes."""
    cmd = [sys.executable, "-m", "glassllm.cli", "generate", "--model", str(model_path),
           "--prompt", "Once", "--max-new-tokens", "30", "--seed", "11", "--top-k", "50"]
    done = subprocess.run(cmd, capture_output=True, timeout=120,
                          env=dict(os.environ, PYTHONIOENCODING="utf-8"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode("utf-8") == expected_text(model_path, "Once", 30,
                                                        Sampling(0.8, 50), seed=11)
    bad = subprocess.run(cmd[:5] + [str(tmp_path / "nope.safetensors"), "--prompt", "x"],
                         capture_output=True, timeout=120)
    assert bad.returncode == 2
    assert b"Traceback" not in bad.stderr and bad.stderr.count(b"\n") == 1
    assert b"no such model file" in bad.stderr


def test_prompt_that_is_not_utf8_is_refused_before_loading(capsys, model_path):
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # as Python passes such argv bytes
    code, out, err = run(capsys, "--model", model_path, "--prompt", bad)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--prompt is not valid UTF-8" in err and "character 3" in err


def test_prompt_that_is_not_utf8_bpe_model(capsys, tmp_path):
    from glassllm.tokenizers import BPETokenizer
    tok = BPETokenizer.train(["a cafe sells coffee and tea " * 40], 300)
    path = tmp_path / "bpe.safetensors"
    files.save(GlassLM(Config(vocab_size=300, d_model=16, n_layers=1, n_heads=2,
                              max_len=16)), path, tok)
    code, out, err = run(capsys, "--model", path, "--prompt", "caf\udce9")
    assert code == 2 and out == "" and "--prompt" in err and "Traceback" not in err


def test_sampling_error_comes_before_any_output(capsys, monkeypatch, model_path):
    import glassllm.cli.common as cli  # where generate's model_with_tokenizer finds it
    model, tok = load_model_and_tokenizer(model_path)
    model.final_norm.weight.data[:] = np.nan  # a diverged model: logits all NaN
    monkeypatch.setattr(cli, "load_model_and_tokenizer", lambda path: (model, tok))
    code, out, err = run(capsys, "--model", model_path, "--prompt", "abc", "--seed", 0)
    assert code == 2 and out == "" and "NaN" in err and err.count("\n") == 1


def test_a_tokenizer_smaller_than_the_model_gets_only_ids_it_can_decode(capsys, tmp_path):
    """A vocab-300 model with the 257-id byte tokenizer (in the file or from --tokenizer):
    generation never draws an id the tokenizer lacks (it stopped with "ids must be in
    [0, 257)" after printing part of the text)."""
    model = GlassLM(Config(vocab_size=300, d_model=16, n_layers=1, n_heads=2, max_len=8),
                    seed=0)
    model.token_embedding.weight.data[257:] *= 50  # the padded ids have the top logits
    path = tmp_path / "padded.safetensors"
    files.save(model, path, tokenizer=ByteTokenizer())
    for extra in ((), ("--tokenizer", "byte")):
        for sampling in (("--temperature", 0), ("--temperature", 2, "--seed", 0)):
            code, out, err = run(capsys, "--model", path, "--prompt", "ab",
                                 "--max-new-tokens", 30, *sampling, *extra)
            assert (code, err) == (0, ""), err
            assert out.startswith("ab")
    new = generate(model, [97, 98], 30, Sampling(0.0), vocab_limit=257, stop_id=256)
    code, out, _ = run(capsys, "--model", path, "--prompt", "ab", "--max-new-tokens", 30,
                       "--temperature", 0)
    new = new[:-1] if new and new[-1] == 256 else new
    assert out == "ab" + ByteTokenizer().decode(new) + "\n"
