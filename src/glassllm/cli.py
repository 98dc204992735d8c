"""The `glassllm` command line: train, generate, prepare, convert, plot.

Each subcommand is a pair of functions: `add_<name>(subparsers)` declares its options and
`run_<name>(args)` does the work. This is the only module that prints (through tqdm and
`print`); the library reports through return values and events.

Errors a user can cause (bad paths, bad options, corrupt files) end with one line on stderr
and exit code 2, never a traceback; Ctrl-C ends with exit code 130.
"""
from __future__ import annotations

import argparse
import sys


class UsageError(Exception):
    """A mistake in the command line or its inputs: printed as one line, exit code 2."""


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model on text files")
    p.set_defaults(func=run_train)


def run_train(args) -> int:
    raise UsageError("train: not implemented yet")


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a saved model")
    p.set_defaults(func=run_generate)


def run_generate(args) -> int:
    raise UsageError("generate: not implemented yet")


SUBCOMMANDS = [add_train, add_generate]


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
