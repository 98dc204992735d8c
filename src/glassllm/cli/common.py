"""What the commands share: the usage error, reading the files options name, loading a model
with its tokenizer, and argparse types."""
from __future__ import annotations

import argparse

from ..config import FAMILIES  # noqa: F401 (the --family choices: the presets)

# The library beyond what `import glassllm` loads (the training package, the formats, tqdm) is
# imported inside the functions that use it: `glassllm --version` stays quick, and a Ctrl-C
# while the parser is built is caught by `main`.

# glassllm.training.plan's limit (a prompt or a --config file), spelled here so that the
# package imports no training module; tests/test_run_plan.py checks they are equal
SMALL_FILE_BYTES = 16 << 20


class UsageError(Exception):
    """A mistake in the command line or its inputs: printed as one line, exit code 2."""


TOKENIZER_HELP = ("tokenizer instead of the model's (as generate: a tokenizer JSON, a GPT-2 "
                  "vocab.json + merges.txt directory, llama2.c's tokenizer.bin, or `byte`)")


def load_model_and_tokenizer(path):
    """(GlassLM, tokenizer) from a glassllm model file, a Hugging Face checkpoint directory (one
    holding config.json) or a llama2.c checkpoint (.bin): `glassllm.formats.lm`. The tokenizer
    is None for a weights-only file, a llama2.c checkpoint or a directory without tokenizer
    files.

    Raises FileNotFoundError (with how to download, for a hub name such as "gpt2") /
    IsADirectoryError / ValueError as `files.load`, `hf.from_hf` and `hf.tokenizer_from_hf` do.
    """
    from ..formats import lm
    return lm.load_model_and_tokenizer(path)


DEVICE_HELP = ("where the model computes: cpu (NumPy and the compiled engine, the default), "
               "cuda or cuda:N (CuPy on an NVIDIA GPU: pip install 'glassllm[cuda]'), or "
               "strict (the array API standard alone, for tests)")


def add_device_option(p) -> None:
    """--device D of train, generate, inspect and serve (`glassllm.devices`)."""
    p.add_argument("--device", default=None, metavar="D", help=DEVICE_HELP)


def model_with_tokenizer(args):
    """(model, tokenizer) of a command's --model and --tokenizer (generate, inspect, serve):
    `load_model_and_tokenizer`, the tokenizer given replacing the model's.

    Raises:
        UsageError: a model left without a tokenizer (weights-only, a llama2.c checkpoint).
    """
    model, tokenizer = load_model_and_tokenizer(args.model)
    if getattr(args, "device", None) is not None:  # read on the host, then moved
        model.to(args.device)
    if args.tokenizer is not None:
        tokenizer = tokenizer_option(args.tokenizer, model.cfg.vocab_size)
    elif tokenizer is None:
        raise UsageError(f"{args.model} has no tokenizer (a weights-only model or a llama2.c "
                         f"checkpoint); give one with --tokenizer PATH (a tokenizer JSON, a "
                         f"directory with GPT-2's vocab.json + merges.txt, a llama2.c "
                         f"tokenizer.bin, or `byte`)")
    return model, tokenizer


def tokenizer_option(path: str, vocab_size: int):
    """--tokenizer PATH (or `byte`) of generate: the tokenizer, which must fit the model. A
    `.bin` file is read as llama2.c's tokenizer.bin, anything else as `load_tokenizer` does."""
    from ..formats.lm import read_tokenizer
    try:
        tokenizer = read_tokenizer(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"--tokenizer {path}: {one_line(e)}") from None
    if tokenizer.vocab_size > vocab_size:
        raise UsageError(f"--tokenizer {path}: it has {tokenizer.vocab_size} ids but the "
                         f"model's vocab_size is {vocab_size}")
    return tokenizer


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0 (argparse names the flag in its one-line error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def path_arg(text: str) -> str:
    """argparse type: a non-empty path. "" would be read as the current directory by some
    calls and as no file by others, each with its own confusing message."""
    if not text:
        raise argparse.ArgumentTypeError("must be a path, got an empty string")
    return text


def read_option_file(path: str, option: str) -> bytes:
    """`glassllm.training.plan.read_small_file` (at most SMALL_FILE_BYTES of a file an option
    names), its one-line ValueError as a UsageError."""
    from ..training.plan import read_small_file
    try:
        return read_small_file(path, option)
    except ValueError as e:
        raise UsageError(str(e)) from None


def one_line(e: Exception) -> str:
    """An error as one line: OSErrors as "PATH: reason" (the path the user gave, without
    Python's "[Errno N]"), others as their message."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        text = f"{e.filename}: {e.strerror}"
    else:
        text = str(e)
    return " ".join(text.split("\n"))


__all__ = ["UsageError", "FAMILIES", "TOKENIZER_HELP", "SMALL_FILE_BYTES",
           "load_model_and_tokenizer", "model_with_tokenizer", "tokenizer_option",
           "DEVICE_HELP", "add_device_option",
           "non_negative_int", "read_option_file", "one_line"]
