"""`glassllm features`: sparse dictionaries of a model's named values.

    glassllm features train --model M --data D --name blocks.2.residual_out --kind topk \
        --d-sae 2048 --k 32 --steps N --out DIR

`train` streams the model's values over the corpus into `glassllm.lens.features.train_dictionary`
(a tqdm bar of its events), evaluates the result (`evaluate_dictionary`, printed and stored as
DIR/evaluation.json) and leaves DIR in SAELens' format. Ctrl-C keeps a checkpoint in DIR; the
same command resumes from it. Subcommands are listed in FEATURE_COMMANDS (`show` joins them).
"""
from __future__ import annotations

import argparse
import os

from .common import (UsageError, load_model_and_tokenizer, non_negative_int, one_line,
                     path_arg)
from .features_show import add_show


def positive_int(text: str) -> int:
    try:  # not through non_negative_int, whose message would say ">= 0" of a negative number
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def add_features_train(sub) -> None:
    p = sub.add_parser("train", help="train a sparse dictionary (SAE or transcoder) on a "
                                     "named value")
    p.add_argument("--model", required=True, type=path_arg,
                   help="model file, HF directory or llama2.c .bin")
    p.add_argument("--data", required=True, type=path_arg,
                   help="token file or directory of `glassllm prepare` (trained on train.bin, "
                        "evaluated on val.bin), or a text file (encoded with the model's "
                        "tokenizer); of one file, the last 10%% is held out for the evaluation")
    p.add_argument("--eval-data", default=None, type=path_arg,
                   help="evaluate on this corpus instead (a directory: its val.bin); --data "
                        "is then trained on whole")
    p.add_argument("--tokenizer", default=None, type=path_arg,
                   help="tokenizer for a text --data, if the model has none (e.g. llama2.c's "
                        ".bin)")
    p.add_argument("--name", required=True, help="the value read, e.g. blocks.2.residual_out")
    p.add_argument("--out-name", default=None, help="a transcoder's target value, e.g. "
                                                    "blocks.2.mlp.output")
    p.add_argument("--kind", choices=("topk", "relu", "jumprelu"), default="topk")
    p.add_argument("--d-sae", type=positive_int, required=True, help="number of features")
    p.add_argument("--k", type=positive_int, default=None, help="features per token (topk)")
    p.add_argument("--steps", type=positive_int, required=True)
    p.add_argument("--batch-size", type=positive_int, default=4096, help="tokens per step")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--out", required=True, type=path_arg,
                   help="output directory (SAELens' format); resumed when it holds a "
                        "checkpoint")
    p.set_defaults(func=run_features_train)


FEATURE_COMMANDS = [add_features_train, add_show]


def add_features(sub) -> None:
    p = sub.add_parser("features", help="sparse dictionaries (SAEs, transcoders) of a model's "
                                        "named values")
    inner = p.add_subparsers(dest="features_command", required=True)
    for add in FEATURE_COMMANDS:
        add(inner)


def run_features_train(args) -> int:
    from .common import tokenizer_option
    if args.kind == "topk" and args.k is None:
        raise UsageError("--kind topk needs --k (features kept per token)")
    if args.kind != "topk" and args.k is not None:
        raise UsageError(f"--k is for --kind topk only (--kind is {args.kind})")
    model, tokenizer = load_model_and_tokenizer(args.model)
    if args.tokenizer is not None:
        tokenizer = tokenizer_option(args.tokenizer, model.cfg.vocab_size)
    with _locked(args.out):  # a second run on the same --out would mix the two's files
        return _train_and_evaluate(args, model, tokenizer)


def _locked(out: str):
    """The lock of a dictionary directory, `<out>.lock` beside it (`training.lock`): a
    second `features train` on it is refused, naming the run that holds it."""
    from ..lens.features.train import check_out_directory
    from ..training.lock import lock_outputs
    try:
        check_out_directory(out)  # before a lock file is made beside it
    except ValueError as e:
        raise UsageError(one_line(e)) from None
    out = os.path.normpath(out)  # "d/x/" locks d/x.lock, beside the directory
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # as train_dictionary
    return lock_outputs([out])


def _train_and_evaluate(args, model, tokenizer) -> int:
    from ..lens.features import evaluate_dictionary, train_dictionary
    from ..lens.features.train import train_and_evaluation_corpora
    bar = _ProgressBar(args.steps)
    try:
        train_ids, eval_ids, evaluated_on = train_and_evaluation_corpora(
            model, args.data, tokenizer, args.eval_data)
        sae = train_dictionary(model, train_ids, args.name, kind=args.kind, d_sae=args.d_sae,
                               k=args.k, steps=args.steps, out=args.out, out_name=args.out_name,
                               batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                               on_event=bar)
    except KeyboardInterrupt:
        bar.close()
        if bar.checkpoint:  # none yet when stopped while the first activations were read
            print(f"checkpoint kept in {args.out}; the same command resumes from it",
                  flush=True)
        raise
    except ValueError as e:
        bar.close()
        raise UsageError(one_line(e)) from None
    bar.close()
    report = evaluate_dictionary(model, sae, eval_ids, out=args.out)
    print(f"evaluated on {evaluated_on}")
    print(report)
    print(f"saved {args.out} (SAELens format; evaluation.json beside it)")
    return 0


class _ProgressBar:
    """The tqdm bar of a dictionary's training events."""

    def __init__(self, steps: int):
        self.steps, self.bar = steps, None  # drawn at the first event: an error before it
        self.checkpoint = False  # whether `out` holds a checkpoint (written or resumed from)

    def __call__(self, event) -> None:
        if self.bar is None:  # (a bad name, a corpus too small) stays the only line
            from tqdm import tqdm
            self.bar = tqdm(total=self.steps, unit="step", dynamic_ncols=True)
        name = type(event).__name__
        self.checkpoint |= name in ("DictionaryCheckpointed", "DictionaryResumed")
        if name == "DictionaryResumed":
            self.bar.update(event.step - self.bar.n)
        elif name == "DictionaryStep":
            self.bar.update(1)
            self.bar.set_postfix(fvu=f"{event.fvu:.3f}", l0=f"{event.l0:.1f}",
                                 dead=f"{event.dead_fraction:.0%}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
