"""`glassllm features`: sparse dictionaries (SAEs, transcoders) of a model's named values
(docs/features.md). Each subcommand is a pair `add_<name>(subparsers)` / `run_<name>(args)`
in its own module: `show` (`features_show`)."""
from __future__ import annotations

from .features_show import add_show


def add_features(sub) -> None:
    p = sub.add_parser(
        "features", help="sparse dictionaries of a model's values: look at their features",
        description="Sparse autoencoders and transcoders of a model's named values, in "
                    "SAELens' format (docs/features.md).")
    commands = p.add_subparsers(dest="features_command", required=True, metavar="COMMAND")
    add_show(commands)
