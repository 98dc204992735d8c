"""The `glassllm` command line: train, generate, prepare, convert, plot, inspect, serve, features.

One module per command, each a pair of functions: `add_<name>(subparsers)` declares its options
and `run_<name>(args)` parses them into a call of the library and prints the result
(`train`, `generate`, `prepare`, `plot`, `convert`, `inspect`, `serve`); `common` holds what
they share, `entry` the parser and `main`, `printer` the one printer of a training run's
events. This package is the only one that prints (through tqdm and `print`); the library
reports through return values and events.

Errors a user can cause (bad paths, bad options, corrupt files) end with one line on stderr
and exit code 2, never a traceback; Ctrl-C ends with exit code 130, SIGTERM 143, SIGHUP 129
(`glassllm train` handles all three alike: `glassllm.training.stopping`).
"""
from __future__ import annotations

from .common import (FAMILIES, SMALL_FILE_BYTES, TOKENIZER_HELP, UsageError,
                     load_model_and_tokenizer, model_with_tokenizer)
from .common import one_line as _one_line  # noqa: F401 (the old private names)
from .common import read_option_file as _read_small_file  # noqa: F401
from .convert import CONVERT_USAGE, add_convert, run_convert
from .entry import _error_report, _print_paths_as_given, build_parser, main, version
from .features import add_features, run_features_train
from .generate import SAMPLE_SEPARATOR, add_generate, run_generate
from .inspect import add_inspect, run_inspect
from .plot import add_plot, run_plot
from .prepare import add_prepare, run_prepare
from .serve import SERVE_PORT, _serve_model, add_serve, run_serve
from .train import _choose_threads, add_train, run_train

SUBCOMMANDS = [add_train, add_generate, add_prepare, add_plot, add_convert, add_inspect,
               add_serve, add_features]

__all__ = ["main", "build_parser", "version", "UsageError", "SUBCOMMANDS", "FAMILIES",
           "SAMPLE_SEPARATOR", "SMALL_FILE_BYTES", "SERVE_PORT",
           "CONVERT_USAGE", "TOKENIZER_HELP", "load_model_and_tokenizer",
           "model_with_tokenizer", "add_train", "run_train", "add_generate", "run_generate",
           "add_prepare", "run_prepare", "add_plot", "run_plot", "add_convert", "run_convert",
           "add_inspect", "run_inspect", "add_serve", "run_serve", "_error_report",
           "_print_paths_as_given", "_choose_threads", "_serve_model"]


def __getattr__(name: str):
    """The old `glassllm.cli.TRAIN_MODEL_DEFAULTS`, now `glassllm.training.plan`'s (read on
    first use: importing the training package at start would slow every command's start)."""
    if name == "TRAIN_MODEL_DEFAULTS":
        from ..training.plan import TRAIN_MODEL_DEFAULTS
        return TRAIN_MODEL_DEFAULTS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
