"""The `glassllm` command line: train, generate, prepare, convert, plot.

Each subcommand is a pair of functions: `add_<name>(subparsers)` declares its options and
`run_<name>(args)` does the work. This is the only module that prints (through tqdm and
`print`); the library reports through return values and events.

Errors a user can cause (bad paths, bad options, corrupt files) end with one line on stderr
and exit code 2, never a traceback; Ctrl-C ends with exit code 130.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


class UsageError(Exception):
    """A mistake in the command line or its inputs: printed as one line, exit code 2."""


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model on text files")
    p.set_defaults(func=run_train)


def run_train(args) -> int:
    raise UsageError("train: not implemented yet")


def load_model_and_tokenizer(path):
    """(GlassLM, tokenizer) from a glassllm model file (see `glassllm.files`).

    Raises FileNotFoundError / IsADirectoryError / ValueError as `files.load` does.
    """
    from . import files
    return files.load(path), files.load_tokenizer(path)


def add_generate(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate text from a saved model",
        description="Continue a prompt with a saved model, printing text as it is produced. "
                    "Stops after --max-new-tokens tokens or at the end-of-text token.")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="model file written by `glassllm train` (glassllm safetensors)")
    p.add_argument("--prompt", required=True, metavar="TEXT", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200, metavar="N",
                   help="most tokens to generate (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="softmax temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample only among the K most probable tokens (default: all)")
    p.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="sample only among the most probable tokens whose probabilities "
                        "add up to P, 0 < P <= 1 (default: all)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="random seed, for a reproducible text (default: a fresh one)")
    p.set_defaults(func=run_generate)


def run_generate(args) -> int:
    import os

    import numpy as np

    from .generate import Generator, Sampling
    from .tokenizer import StreamDecoder

    if args.max_new_tokens < 0:
        raise UsageError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    try:
        sampling = Sampling(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise UsageError(f"bad --temperature/--top-k/--top-p: {e}") from None
    model, tokenizer = load_model_and_tokenizer(args.model)
    prompt_ids = tokenizer.encode(args.prompt)
    if len(prompt_ids) == 0:
        raise UsageError("--prompt is empty; give at least one character to continue")
    generator = Generator(model, prompt_ids)
    rng = np.random.default_rng(args.seed)
    decoder = StreamDecoder(tokenizer)  # holds back bytes of a character not yet complete
    try:
        print(args.prompt, end="", flush=True)
        for _ in range(args.max_new_tokens):
            token = generator.next_token(sampling, rng)
            if token == tokenizer.eot_id:
                break
            print(decoder.push(token), end="", flush=True)
        print(decoder.flush(), flush=True)
    except BrokenPipeError:
        # The reader left (`glassllm generate ... | head`): stop quietly, as Unix tools do;
        # point stdout at devnull so the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def add_prepare(sub) -> None:
    p = sub.add_parser("prepare", help="tokenize text files into train.bin / val.bin",
                       description="Tokenize text files (or directories, read in sorted order) "
                       "into OUT/train.bin and OUT/val.bin with JSON sidecars. Each file's last "
                       "VAL_FRACTION of bytes, from a line start, goes to val.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text file or directory")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tokenizer", default="byte",
                   help="byte, bpe:N (learn a byte-level BPE of N ids from the train part), or "
                        "PATH (a tokenizer JSON, or a directory with GPT-2 vocab.json + "
                        "merges.txt); default byte")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="fraction of each file's bytes for validation (default 0.1)")
    p.set_defaults(func=run_prepare)


def run_prepare(args) -> int:
    from tqdm import tqdm

    from .data import prepare
    from .tokenizer import load_tokenizer

    tokenizer = args.tokenizer
    if tokenizer != "byte" and not tokenizer.startswith("bpe:"):
        tokenizer = load_tokenizer(tokenizer)
    bars = {}

    def on_progress(p):
        bar = bars.get(p.stage)
        if bar is None:
            desc = "learning BPE" if p.stage == "tokenizer" else "tokenizing"
            bar = bars[p.stage] = tqdm(total=p.total, desc=desc, unit="B", unit_scale=True,
                                       file=sys.stderr)
        bar.update(p.done - bar.n)

    try:
        result = prepare(args.inputs, args.out, tokenizer, val_fraction=args.val_fraction,
                         on_progress=on_progress)
    finally:
        for bar in bars.values():
            bar.close()
    tok = result["tokenizer"]
    for name in ("train", "val"):
        meta = result[name]
        print(f"{name}: {meta['token_count']:,} tokens from {meta['text_bytes']:,} bytes "
              f"({meta['dtype']}) -> {os.path.join(args.out, name + '.bin')}", flush=True)
    print(f"tokenizer: {json.loads(tok.to_json())['type']}, vocab_size {tok.vocab_size}, "
          f"{len(result['files'])} file(s)", flush=True)
    return 0


def add_plot(sub) -> None:
    p = sub.add_parser("plot", help="draw a run's loss and learning-rate curves to a PNG")
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="directory holding history.csv (or history.jsonl)")
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/loss.png)")
    p.set_defaults(func=run_plot)


def run_plot(args) -> int:
    from .plots import find_history, plot_history

    if not os.path.isdir(args.run_dir):
        raise FileNotFoundError(f"run directory not found: {args.run_dir}")
    out = args.out or os.path.join(args.run_dir, "loss.png")
    plot_history(find_history(args.run_dir), out)
    print(out, flush=True)
    return 0


SUBCOMMANDS = [add_train, add_generate, add_prepare, add_plot]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glassllm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse itself exits 2 with a usage line
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\nglassllm: interrupted", file=sys.stderr, flush=True)
        return 130
    except (UsageError, FileNotFoundError, IsADirectoryError, PermissionError, ValueError) as e:
        print(f"glassllm {args.command}: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
