"""The `glassllm` command line: train, generate, prepare, convert, plot, inspect.

Each subcommand is a pair of functions: `add_<name>(subparsers)` declares its options and
`run_<name>(args)` does the work. This is the only module that prints (through tqdm and
`print`); the library reports through return values and events.

Errors a user can cause (bad paths, bad options, corrupt files) end with one line on stderr
and exit code 2, never a traceback; Ctrl-C ends with exit code 130, SIGTERM 143, SIGHUP 129
(`glassllm train` handles all three alike: `glassllm.training.stopping`).
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys


class UsageError(Exception):
    """A mistake in the command line or its inputs: printed as one line, exit code 2."""


# the architecture presets (glassllm.config.PRESETS), for --family; the config module imports
# NumPy only, which the parser needs anyway for nothing else, so the names are spelled here
# and tests/test_cli_train.py checks them against the presets
FAMILIES = ("llama", "gpt2", "neox", "gptneo", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
            "gemma3", "phi", "olmo2")
# families without grouped-query attention in their Hugging Face class
_NO_GQA_FAMILIES = ("gpt2", "neox", "gptneo")


# ----------------------------------------------------------------------------------- train
# The default model of `glassllm train`, chosen with TrainSettings' defaults so that the README's
# run on tinyshakespeare ends below 2.0 nats per byte (1.75) in minutes on two CPU cores.
# n_kv_heads is not here: its default depends on the family and n_heads (_default_kv_heads).
TRAIN_MODEL_DEFAULTS = {"family": "llama", "d_model": 128, "n_layers": 4, "n_heads": 4}
_MODEL_FLAGS = ("family", "d_model", "n_layers", "n_heads", "n_kv_heads")
_SETTING_FLAGS = ("steps", "batch_size", "seq_len", "lr", "warmup", "eval_every", "eval_batches",
                  "seed", "precision", "max_skip_rate", "max_consecutive_skips", "grad_accum")
# Every numeric flag is checked against these bounds before it is used, so a huge value is a
# one-line error naming the flag (not an OverflowError deep in NumPy or BLAS). Wide enough for
# any model this library can train; TrainSettings and Config check the finer rules.
_TRAIN_INT_BOUNDS = {
    "d_model": (1, 1 << 16), "n_layers": (1, 1 << 10), "n_heads": (1, 1 << 12),
    "n_kv_heads": (1, 1 << 12), "seq_len": (1, 1 << 20), "batch_size": (1, 1 << 20),
    # --steps 0 would train nothing yet replace the run's history (and leave its model and
    # plot): refused, as `glassllm train` is for training
    "steps": (1, 10**9), "warmup": (0, 10**9), "eval_every": (1, 10**9),
    "eval_batches": (1, 10**6), "seed": (0, 2**63 - 1), "checkpoint_every": (1, 10**9),
    "max_consecutive_skips": (1, 10**9), "threads": (1, 1024), "health_every": (1, 10**9),
    "grad_accum": (1, 1 << 20),
}
# lr > 0 (hi None: a lower bound only); rate in [0, 1)
_TRAIN_FLOAT_BOUNDS = {"lr": (0.0, None), "max_skip_rate": (0.0, 1.0),
                       "mpi_timeout": (0.0, None)}


def add_train(sub) -> None:
    from .training.data import STDLIB_CORPUS_BYTES
    from .training.distributed import DEFAULT_TIMEOUT_S
    from .training import TrainSettings
    d = TrainSettings()
    m = TRAIN_MODEL_DEFAULTS
    p = sub.add_parser(
        "train", help="train a model on text files",
        description="Train a GlassLM on text, evaluating on the last 10% of it, and save the "
                    "best model. Without --data it trains on the Python standard library's own "
                    "source code. Ctrl-C, SIGTERM or SIGHUP (kill, timeout, Slurm) stops "
                    "at the end of the update in progress and writes a checkpoint that --resume "
                    "continues exactly (exit 130, 143, 129; docs/faults.md).")
    p.add_argument("--data", nargs="+", metavar="FILE_OR_DIR",
                   help="UTF-8 text files or directories (read as bytes, byte tokenizer; a "
                        "directory gives its files that are UTF-8 text without NUL bytes, "
                        "others are skipped with a note), or one directory written by "
                        "`glassllm prepare` (train.bin/val.bin), alone. Default: the stdlib's "
                        f".py files, first {STDLIB_CORPUS_BYTES >> 20} MiB")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="best model file (default runs/model.safetensors, or the resumed "
                        "run's); its directory also gets history.csv, loss.png and "
                        "checkpoint.safetensors. Locked while the run lasts: a second run on "
                        "the same paths is refused")
    g = p.add_argument_group("model (with --resume the checkpoint's; other values are refused)")
    g.add_argument("--family", choices=list(FAMILIES),
                   help=f"architecture preset (default {m['family']}; see "
                        f"glassllm.config.PRESETS)")
    g.add_argument("--init-from", metavar="MODEL",
                   help="fine-tune: start from this model's weights, config and tokenizer (a "
                        "glassllm model file or a Hugging Face directory; nanoGPT's "
                        "init_from); the model flags above are then the model's own; text "
                        "data is encoded with its tokenizer")
    for flag in ("d_model", "n_layers", "n_heads"):
        g.add_argument("--" + flag.replace("_", "-"), type=int, metavar="N",
                       help=f"default {m[flag]}")
    g.add_argument("--n-kv-heads", type=int, metavar="N",
                   help="key/value heads; default: 2 (grouped-query attention) when "
                        "--n-heads is even, else --n-heads; gpt2, neox, gptneo: --n-heads "
                        "(they have no grouped-query attention)")
    g = p.add_argument_group("training")
    g.add_argument("--seq-len", type=int, metavar="T",
                   help=f"tokens per window, also the model's max_len (default {d.seq_len})")
    g.add_argument("--batch-size", type=int, metavar="B",
                   help=f"windows per micro-batch, on each MPI rank (default {d.batch_size})")
    g.add_argument("--grad-accum", type=int, metavar="K",
                   help="micro-batches per update, gradients averaged (nanoGPT's "
                        "gradient_accumulation_steps): an update sees N x K x B windows, N "
                        f"the MPI ranks (default {d.grad_accum})")
    g.add_argument("--steps", type=int, metavar="N", help=f"updates (default {d.steps})")
    g.add_argument("--lr", type=float, help=f"peak learning rate (default {d.lr:g})")
    g.add_argument("--warmup", type=int, metavar="N", help=f"warmup steps (default {d.warmup})")
    g.add_argument("--eval-every", type=int, metavar="N",
                   help=f"evaluate every N updates and at the last (default {d.eval_every})")
    g.add_argument("--eval-batches", type=int, metavar="N",
                   help=f"batches per evaluation (default {d.eval_batches})")
    g.add_argument("--seed", type=int, help=f"sampler and init seed (default {d.seed})")
    g.add_argument("--precision", choices=["fp32", "fp16", "bf16"],
                   help="matmul precision; fp16 adds dynamic loss scaling (default fp32)")
    g.add_argument("--max-skip-rate", type=float, metavar="R",
                   help="stop when more than this fraction of the last 100 steps were skipped "
                        "for inf/NaN, 100 steps in a row, or of the whole run when it is "
                        "shorter (default: no alert)")
    g.add_argument("--max-consecutive-skips", type=int, metavar="N",
                   help=f"stop (exit 1) after N skipped steps in a row, or when every step of "
                        f"the run was skipped and one for a non-finite loss: no real update "
                        f"is being made "
                        f"(default {d.max_consecutive_skips})")
    g = p.add_argument_group("output and resume")
    g.add_argument("--log-csv", metavar="PATH",
                   help="per-step CSV: step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,"
                        "skipped,skip_reason,scaler_scale (flushed every row, the failing "
                        "step's included)")
    g.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="write a checkpoint every N updates (always on Ctrl-C)")
    g.add_argument("--health-every", type=int, metavar="N",
                   help="every N updates, measure training health (update:data ratio, "
                        "gradient and weight norms per tensor, activation statistics, "
                        "attention entropy, clip events) into health.jsonl next to --out; a "
                        "one-line warning when a ratio stays out of its band")
    g.add_argument("--checkpoint", metavar="PATH",
                   help="checkpoint file (default: checkpoint.safetensors next to --out; "
                        "with --resume, the resumed file)")
    g.add_argument("--resume", metavar="CKPT",
                   help="continue the run saved in CKPT with the same data (checked by its "
                        "SHA-256) and settings; the result equals an uninterrupted run. "
                        "--steps cannot grow: the learning-rate schedule depends on it")
    p.add_argument("--threads", type=int, metavar="N",
                   help="threads for matrix products and elementwise passes (default: the "
                        "resumed run's thread count, so that it continues bit for bit, else "
                        "one per core unless other processes "
                        "are measured busy at start, then the cores they leave free; the "
                        "header says which; under mpiexec, the host's cores shared by its "
                        "ranks)")
    g = p.add_argument_group(
        "data parallelism (`mpiexec -n N glassllm train ...` runs N ranks; needs the extra "
        "glassllm[mpi])")
    g.add_argument("--mpi-timeout", type=float, metavar="SECONDS",
                   help=f"end the job when a collective waits this long for the other ranks "
                        f"(a hung or lost rank; default {DEFAULT_TIMEOUT_S:g})")
    _add_train_serve(p)
    p.add_argument("--config", metavar="FILE.toml",
                   help="read options from a TOML file, one key per flag (d_model = 128, "
                        "steps = 2000, data = [\"input.txt\"], precision = \"bf16\"; dashes "
                        "or underscores; paths from the current directory); a flag given on the "
                        "command line overrides the file")
    p.set_defaults(func=run_train, config_options=_config_options(p))


def run_train(args) -> int:
    """`glassllm train`, on one process or as one rank of `mpiexec -n N` (every rank runs
    this; rank 0 alone checks and locks the outputs, prints and writes files)."""
    import contextlib

    from .training import distributed, stopping

    try:
        comm = distributed.from_environment()
    except RuntimeError as e:
        raise UsageError(str(e)) from None
    args.comm = comm  # main() prints errors on rank 0 only
    try:
        # SIGTERM and SIGHUP (kill, timeout, Slurm, a closed terminal) stop the run as Ctrl-C
        # does: held at a step boundary inside the loop, raised as an interrupt outside it.
        with stopping.signals_raise(), contextlib.ExitStack() as held:
            # A mistake found on some ranks only (a data file missing on one node) stops
            # every rank here, before the first collective of the training loop; one that
            # every rank finds (a flag out of range) is printed once, by rank 0.
            with distributed.agreement(comm, errors=(UsageError, OSError, ValueError,
                                                     MemoryError)):
                _apply_config_file(args)
                _check_bounds(args, _TRAIN_INT_BOUNDS, _TRAIN_FLOAT_BOUNDS)
                if args.mpi_timeout is not None:
                    comm.timeout_s = args.mpi_timeout  # the watchdog reads it at each check
                _train_serve_defaults(args)
                prepared = _prepare_train(args, comm, held)
            with _train_server(args, comm, prepared[4]["model"]):
                return _train(args, comm, *prepared)
    finally:
        comm.close()


def _prepare_train(args, comm, held):
    """Settings, model config, corpus, checkpoint and output paths of a run; on rank 0 the
    outputs checked, their directories made and locked (until `held` closes)."""
    import dataclasses

    from .formats import checkpoint
    from .training import runfiles
    from .formats.atomic import remove_leftover_temporaries
    from .training.data import check_same_data, load_corpus
    from .training.lock import lock_outputs
    from .model import Config
    from .training import TrainSettings

    if args.resume == "" or any(not source for source in args.data or ()):
        raise UsageError(f"{'--resume' if args.resume == '' else '--data'} is an empty path")
    given = {k: getattr(args, k) for k in _MODEL_FLAGS + _SETTING_FLAGS
             if getattr(args, k) is not None}
    initial, init_tokenizer = _init_from(args, given)
    resume = checkpoint.load_checkpoint(args.resume) if args.resume is not None else None
    saved = runfiles.resolve_saved_paths(_resumed_extra(resume, args.resume), args.resume) \
        if resume is not None else {}
    if resume is not None and "init_from" in resume.extra:  # its data, in its tokenizer
        init_tokenizer = _resumed_tokenizer(resume, args.resume)
    # A resumed run keeps writing where the interrupted one did, unless told otherwise.
    out = _first_given(args.out, saved.get("out"), os.path.join("runs", "model.safetensors"))
    threads = _first_given(args.threads, saved.get("threads"))  # None: measure at start

    if resume is not None and resume.world_size != comm.size:
        how = _train_command(resume.world_size) + (" (one process, no mpiexec)"
                                                   if resume.world_size == 1 else "")
        raise UsageError(f"--resume {args.resume} was written by a run of {resume.world_size} "
                         f"rank(s) and this run has {comm.size}: continue it with `{how} "
                         f"--resume ...` (the global batch and the order of the gradient sums "
                         f"depend on the number of ranks)")
    if resume is not None:
        settings = _resumed_settings(resume, given, args, saved.get("log_csv"))
        cfg = Config.from_dict(resume.config)
        sources = args.data or saved.get("sources")
    else:
        try:
            settings = TrainSettings(
                **{k: v for k, v in given.items() if k in _SETTING_FLAGS},
                log_csv=_absolute(args.log_csv),
                checkpoint_every=args.checkpoint_every)
        except (TypeError, ValueError) as e:
            raise UsageError(_flag_spelling(str(e))) from None
        cfg = None
        sources = args.data
    paths = runfiles.run_paths(out, _first_given(args.checkpoint, args.resume),
                               settings.log_csv)
    if resume is not None and comm.rank == 0:  # never into another run's folder
        runfiles.check_resume_outputs(paths, args.resume)
    health_every = _first_given(args.health_every, settings.health_every)
    settings = dataclasses.replace(  # health.jsonl lives beside history.csv
        settings, health_every=health_every,
        health_log=paths["health_jsonl"] if health_every is not None else None)
    outputs = {"--out": paths["model"], "--checkpoint": paths["checkpoint"],
               "--log-csv": paths["log_csv"],
               "history.csv (next to --out)": paths["history_csv"],
               "health.jsonl (next to --out)": settings.health_log,
               "loss.png (next to --out)": paths["plot"]}
    writer = comm.rank == 0  # the one rank that writes
    data_dirs = [s for s in sources or () if os.path.isdir(s)]
    if writer:  # before reading any data: a bad path fails now
        runfiles.check_output_paths(outputs, data_dirs=data_dirs)
        if args.init_from is not None:  # a fine-tune never replaces what it starts from
            runfiles.check_init_from_kept(outputs, args.init_from)
    corpus = load_corpus(sources, settings.seq_len, tokenizer=init_tokenizer)
    for name, note in corpus.notes if writer else ():
        print(f"note: {name}: {note}", file=sys.stderr, flush=True)
    if writer:  # an output that is a data file by another name (a link) too
        runfiles.check_output_paths(outputs, inputs=corpus.input_files(), data_dirs=data_dirs)
    if resume is not None:
        check_same_data(resume.data, corpus.train, corpus.val, where=f"--resume {args.resume}")
    elif initial is not None:
        cfg = initial.cfg
        if settings.seq_len > cfg.max_len:
            raise UsageError(f"--seq-len {settings.seq_len} exceeds the max_len {cfg.max_len} "
                             f"of --init-from {args.init_from}")
    else:
        cfg = _new_model_config(given, corpus.tokenizer.vocab_size, settings.seq_len)
    if writer:
        runfiles.make_parent_dirs(outputs.values())
        lock = held.enter_context(lock_outputs(outputs.values()))
        for holder in lock.stale:
            print(f"note: took over a lock left by pid {holder.get('pid')} (no longer "
                  f"running)", file=sys.stderr, flush=True)
        for path in lock.stale_paths:
            for tmp in remove_leftover_temporaries(path):
                print(f"note: removed {tmp}, a temporary file left by that run",
                      file=sys.stderr, flush=True)
    return cfg, settings, corpus, resume, paths, threads


def _train(args, comm, cfg, settings, corpus, resume, paths, threads) -> int:
    """The run itself, output paths checked and locked: build, train, report, write files.
    Every rank trains; rank 0 alone prints and writes.

    A stop signal from here on is held (`glassllm.training.stopping.DeferredStop`): inside the
    loop until a step boundary, where the run stops with a checkpoint; after the last step
    until the run's files are written, and the run, complete, ends as one (exit 0)."""
    from .training import stopping
    with stopping.DeferredStop() as late:
        try:
            return _train_held(args, comm, cfg, settings, corpus, resume, paths, threads, late)
        finally:
            # ended or stopped, files written: a signal from here on is a repeat (under MPI
            # a rank stopped by the others' agreement may get its own SIGTERM only now)
            stopping.stop_begun()


def _train_held(args, comm, cfg, settings, corpus, resume, paths, threads, late) -> int:
    import signal
    import time

    import numpy as np

    from .engine import blas, cpu
    from .training import runfiles
    from .training.distributed import RanksDisagree
    from .model import GlassLM
    from .training.safety import SkipRateExceeded
    from .training import stopping
    from .training import (Checkpointed, Evaluated, HealthWarning, NonFiniteLossError,
                           Resumed, RunWriteError, Saved, Started, Stepped, Trainer,
                           TrainingInterrupted)

    out = paths["model"]
    initial = getattr(args, "initial_model", None)  # --init-from's model (_init_from)
    model = GlassLM(cfg, seed=settings.seed) if initial is None else initial
    # Output paths relative to the checkpoint's folder: a run moved as a whole (`mv runs
    # archive`) resumes where it now is, never into the folder it came from.
    extra = {"data": corpus.describe(),
             **runfiles.relative_paths({"out": out, "log_csv": settings.log_csv},
                                       paths["checkpoint"])}
    if initial is not None:
        extra["init_from"] = os.path.abspath(args.init_from)
    kept = args.threads is None and threads is not None  # the resumed run's count
    threads, why = _choose_threads(comm, threads)  # measures the load when not given
    if kept:
        why = "the resumed run's, for the same bits"
    # The count in effect is kept for --resume, measured or given: on NumPy's BLAS the last
    # bits of a product depend on where its rows are cut (docs/performance.md), so a resume
    # on another count (the load measured anew) would not continue bit for bit.
    extra["threads"] = threads
    trainer = Trainer(settings, corpus.train, corpus.val, model_path=out,
                      checkpoint_path=paths["checkpoint"], tokenizer=corpus.tokenizer,
                      extra=extra, comm=comm)
    blas.backend()  # GLASSLLM_BLAS=mkl without a usable MKL: a clear error before any work
    if comm.rank != 0:  # the other ranks train in silence and write nothing
        try:
            with cpu.use_threads(threads), np.errstate(over="ignore", invalid="ignore",
                                                       divide="ignore"):
                trainer.run(model, resume=resume)
        except TrainingInterrupted as e:
            return stopping.exit_code(e)
        except (NonFiniteLossError, SkipRateExceeded, RanksDisagree, RunWriteError):
            return 1
        return 0

    print(f"glassllm train: {cfg.family} model, d_model {cfg.d_model}, {cfg.n_layers} layers, "
          f"{cfg.n_heads} heads ({cfg.n_kv_heads} kv), {sum(p.size for p in model.parameters()):,} "
          f"parameters", flush=True)
    print(f"data: {corpus.name}: {corpus.train.token_count():,} training and "
          f"{corpus.val.token_count():,} validation tokens", flush=True)
    print(f"{settings.steps} steps of {_batch_words(comm.size, settings)} tokens, lr "
          f"{settings.lr:g}, warmup {settings.warmup}, {settings.precision}; best model -> {out}",
          flush=True)
    print(f"threads: {threads} ({why})", flush=True)
    print(blas.describe(), flush=True)  # which BLAS computes the matrix products
    _warn_if_warmup_outlasts_the_run(settings)

    bpb = corpus.bits_per_byte
    started = time.monotonic()
    bar = _progress_bar(settings.steps)
    last_checkpoint = []  # the Checkpointed event of --checkpoint-every, if one came

    def on_event(event) -> None:
        if isinstance(event, Checkpointed):
            last_checkpoint[:] = [event]
        if isinstance(event, Stepped):
            bar.update(1)
            bar.set_postfix(loss=f"{event.loss:.3f}", lr=f"{event.lr:.2e}",
                            tok_s=f"{event.tokens_per_s:,.0f}", refresh=False)
        elif isinstance(event, Started):
            bar.write(f"initial val loss {event.val_loss:.4f} nats/token "
                      f"({bpb(event.val_loss):.3f} bits/byte)")
        elif isinstance(event, Resumed):
            bar.update(event.step)
            bar.write(f"resumed after step {event.step} from {args.resume}")
        elif isinstance(event, Evaluated):
            bar.write(f"step {event.step:>6}: train {event.train_loss:.4f}, val "
                      f"{event.val_loss:.4f} nats/token ({bpb(event.val_loss):.3f} bits/byte), "
                      f"{event.tokens_per_s:,.0f} tokens/s")
        elif isinstance(event, Saved):
            bar.write(f"{'':14}saved (best so far) -> {event.path}")
        elif isinstance(event, Checkpointed):
            bar.write(f"{'':14}checkpoint after {event.step} steps -> {event.path}")
        elif isinstance(event, HealthWarning):
            bar.write(f"warning: {event.message}")

    try:
        # A diverging run overflows inside NumPy; the loop itself detects and reports
        # non-finite losses, so NumPy's RuntimeWarnings would only garble the bar.
        with cpu.use_threads(threads), np.errstate(over="ignore", invalid="ignore",
                                                 divide="ignore"):
            summary = trainer.run(model, resume=resume, on_event=on_event)
    except TrainingInterrupted as e:
        bar.close()  # ends the bar's line: the message starts on a fresh one
        if e.history:
            history_csv = runfiles.write_history_csv(paths["history_csv"], e.history)
            runfiles.write_plot(history_csv, paths["plot"], on_failure=lambda message: print(
                f"glassllm train: warning: {message}", file=sys.stderr, flush=True))
        # No checkpoint for this moment (Ctrl-C inside an update): the last periodic one.
        step, path = (e.step, e.checkpoint_path) if e.checkpoint_path else \
            (last_checkpoint[0].step, last_checkpoint[0].path) if last_checkpoint else (0, None)
        # A checkpoint resumes under its own number of ranks only: say the whole command.
        where = (f"checkpoint after {step} steps: {path}; continue with "
                 f"`{_train_command(comm.size)} --resume {path}`" if path
                 else "no checkpoint written")
        by = "" if e.signum == signal.SIGINT else f" by {stopping.signal_name(e.signum)}"
        print(f"glassllm train: interrupted{by}; {where}", file=sys.stderr, flush=True)
        return stopping.exit_code(e)
    except (NonFiniteLossError, SkipRateExceeded, RanksDisagree) as e:
        bar.close()
        if getattr(e, "history", None):
            runfiles.write_history_csv(paths["history_csv"], e.history)
        print(f"glassllm train: error: {e}", file=sys.stderr, flush=True)
        return 1
    except RunWriteError as e:  # a full disk mid-run: not a usage error (exit 1)
        bar.close()
        print(f"glassllm train: error: {e}", file=sys.stderr, flush=True)
        if e.history:  # the history of the updates done, if there is room for it
            try:
                runfiles.write_history_csv(paths["history_csv"], e.history)
            except OSError as again:
                print(f"glassllm train: {paths['history_csv']} not written either: "
                      f"{_one_line(again)}", file=sys.stderr, flush=True)
        return 1
    finally:
        bar.close()  # any other error: main() prints it, on a line of its own
    history_csv = runfiles.write_history_csv(paths["history_csv"], summary.history)
    plot = runfiles.write_plot(history_csv, paths["plot"], on_failure=lambda message: print(
        f"glassllm train: warning: {message}", file=sys.stderr, flush=True))
    elapsed = time.monotonic() - started
    if summary.best_val_loss is not None:
        print(f"best val loss {summary.best_val_loss:.4f} nats/token = "
              f"{bpb(summary.best_val_loss):.4f} bits/byte (step {summary.best_step}); "
              f"final {summary.final_val_loss:.4f} nats/token")
        if summary.model_path is not None:
            print(f"model: {summary.model_path}")
        else:  # resumed with a new --out, and no evaluation since beat the checkpoint's best
            before = runfiles.saved_path(resume.extra.get("out"), args.resume) \
                if resume is not None else None
            print(f"model: none written to {out}: no evaluation after the resume improved on "
                  f"step {summary.best_step}'s" + (f", whose model is in {before}" if before
                                                   else ""))
    print(f"history: {history_csv}" + (f", plot: {plot}" if plot else ""))
    print(f"{summary.steps - (resume.step if resume else 0)} steps in {elapsed:.1f} s "
          f"({summary.tokens / max(elapsed, 1e-9):,.0f} tokens/s overall)"
          + (f", {summary.skipped_steps} skipped" if summary.skipped_steps else ""), flush=True)
    if late.pending:
        print(f"glassllm train: {stopping.signal_name(late.pending)} arrived after the last "
              f"step; the run is complete", file=sys.stderr, flush=True)
    return 0


def _config_options(parser) -> dict:
    """{key: argparse action} of the options a --config file may set: every option of
    `parser` but --help and --config."""
    return {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}


def _apply_config_file(args) -> None:
    """Options from `--config FILE.toml` (read by the standard library's tomllib) for every
    flag not given on the command line (still its default object). Paths in the file are
    read as on the command line, from the current directory.

    Raises:
        UsageError: the file cannot be read or is not TOML; a key that is no option of
            `glassllm train`, or a value of the wrong type (the file and the key named).
    """
    import tomllib
    if args.config is None:
        return
    data = _read_small_file(args.config, "--config")
    try:
        table = tomllib.loads(data.decode("utf-8-sig"))  # a BOM (Windows editors) skipped
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"--config {args.config}: not valid TOML: {e}") from None
    seen = {}
    for key, value in table.items():
        dest = key.replace("-", "_")
        action = args.config_options.get(dest)
        if action is None:
            raise UsageError(f"{args.config}: unknown key {key!r}: not an option of glassllm "
                             f"train (see glassllm train --help)")
        if dest in seen:  # "d-model" and "d_model": one option set twice
            raise UsageError(f"{args.config}: keys {seen[dest]!r} and {key!r} are the same "
                             f"option; give one")
        seen[dest] = key
        if getattr(args, dest) is action.default:  # a flag on the command line wins
            setattr(args, dest, _config_value(args.config, key, value, action))


def _config_value(path: str, key: str, value, action):
    """`value` of `key` in a --config file, checked as the option `action` would parse it."""
    def wrong(kind: str) -> UsageError:
        return UsageError(f"{path}: key {key!r} must be {kind}, got {value!r}")
    if action.nargs == 0:  # a switch (store_true)
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if action.nargs == "+":
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not values or \
                not all(isinstance(v, str) for v in values):
            raise wrong("a string or a list of strings")
        return values
    if action.type is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise wrong("an integer")
    if action.type is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
        value = float(value)
    if action.type is None and not isinstance(value, str):
        raise wrong("a string")
    if action.choices is not None and value not in action.choices:
        raise wrong(f"one of {', '.join(map(str, action.choices))}")
    return value


def _warn_if_warmup_outlasts_the_run(settings) -> None:
    """A run whose last step comes before the warmup ends never reaches its learning rate:
    `optim.lr_schedule` climbs base_lr * (step + 1) / warmup and stops at steps / warmup."""
    if 0 < settings.steps < settings.warmup:
        peak = settings.lr * settings.steps / settings.warmup
        print(f"warning: --steps {settings.steps} ends before the warmup does (--warmup "
              f"{settings.warmup}): the learning rate climbs to {peak:.3g}, "
              f"{settings.steps / settings.warmup:.0%} of --lr {settings.lr:g}, and never "
              f"decays; give --warmup below --steps", file=sys.stderr, flush=True)


def _train_command(ranks: int) -> str:
    """The command that runs `glassllm train` on `ranks` ranks (a checkpoint resumes only
    under the number of ranks that wrote it)."""
    return f"mpiexec -n {ranks} glassllm train" if ranks > 1 else "glassllm train"


def _choose_threads(comm, requested: int | None) -> tuple[int, str]:
    """`cpu.choose_threads`, except that GLASSLLM_THREADS (under --threads) pins the count,
    and ranks of an MPI job on one host share its cores (each measuring the others as load
    would be a race): cores // ranks on the host."""
    from .engine import cpu
    if requested is None:  # GLASSLLM_THREADS pins the count for the CLI as for the library
        requested, source = cpu.default_threads_from_environment()
        if requested is not None:
            return requested, f"{source}={requested}"
    local = comm.local_size() if comm.size > 1 else 1
    if requested is not None or local == 1:
        return cpu.choose_threads(requested)
    cores = len(cpu.available_cpus())
    return max(1, cores // local), f"{local} MPI ranks share this host's {cores} cores"


def _batch_words(ranks: int, settings) -> str:
    """'16 x 64' or, with ranks and micro-batches, '2 ranks x 2 micro-batches x 8 x 64'."""
    parts = ([f"{ranks} ranks"] if ranks > 1 else []) + \
        ([f"{settings.grad_accum} micro-batches"] if settings.grad_accum > 1 else [])
    return " x ".join(parts + [str(settings.batch_size), str(settings.seq_len)])


def _non_negative_int(text: str) -> int:
    """argparse type: an int >= 0 (argparse names the flag in its one-line error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def _flag_spelling(message: str) -> str:
    """"TrainSettings.batch_size must ..." -> "--batch-size must ...": the user typed flags."""
    import re
    return re.sub(r"TrainSettings\.(\w+)", lambda m: "--" + m.group(1).replace("_", "-"),
                  message)


def _check_bounds(args, int_bounds: dict, float_bounds: dict) -> None:
    """Every numeric flag given, against its bounds: UsageError "--flag must be ..." else.
    Integers in [lo, hi]; floats finite, > lo when hi is None (e.g. --lr), else in [lo, hi)."""
    import math
    for name, (lo, hi) in int_bounds.items():
        value = getattr(args, name, None)
        if value is not None and not lo <= value <= hi:
            shown = str(value) if abs(value) < 10**30 else f"{str(value)[:12]}... " \
                                                          f"({len(str(value))} digits)"
            raise UsageError(f"--{name.replace('_', '-')} must be an integer in [{lo}, {hi}], "
                             f"got {shown}")
    for name, (lo, hi) in float_bounds.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        ok = math.isfinite(value) and (value > lo if hi is None else lo <= value < hi)
        if not ok:
            want = f"a finite number > {lo:g}" if hi is None else f"a number in [{lo:g}, {hi:g})"
            raise UsageError(f"--{name.replace('_', '-')} must be {want}, got {value!r}")


def _absolute(path: str | None) -> str | None:
    """An absolute path (a resumed run may start elsewhere); None and "" stay as they are, so
    that an empty path is refused rather than turned into the current directory."""
    return os.path.abspath(path) if path else path


def _first_given(*values):
    """The first value that is not None (an empty string counts as given: it is then refused
    as a path, not silently replaced by a default)."""
    return next((v for v in values if v is not None), None)


def _resumed_extra(resume, path: str) -> dict:
    """What `glassllm train` stored in a checkpoint's extra (out, threads, data sources),
    type-checked: ValueError naming the checkpoint for a field of the wrong type."""
    from .checks import check_int

    extra, found = resume.extra, {}
    where = f"checkpoint {path!r}"
    for key in ("out", "log_csv"):
        if key in extra:
            if not isinstance(extra[key], str) or not extra[key]:
                raise ValueError(f"{where}: extra.{key} must be a file path, got "
                                 f"{extra[key]!r}")
            found[key] = extra[key]
    if "threads" in extra:
        lo, hi = _TRAIN_INT_BOUNDS["threads"]
        found["threads"] = check_int(extra["threads"], f"{where}: extra.threads", lo, hi)
    data = extra.get("data", {})
    sources = data.get("sources") if isinstance(data, dict) else []
    if not isinstance(data, dict) or not (sources is None or isinstance(sources, list) and all(
            isinstance(s, str) for s in sources)):
        raise ValueError(f"{where}: extra.data.sources must be null or a list of paths, got "
                         f"{sources!r}")
    found["sources"] = sources
    return found


def _new_model_config(given: dict, vocab_size: int, seq_len: int):
    """The Config of a new run: the defaults, the model flags given, the data's vocabulary."""
    from .model import Config
    model_args = {**TRAIN_MODEL_DEFAULTS, **{k: v for k, v in given.items()
                                             if k in _MODEL_FLAGS}}
    model_args.setdefault("n_kv_heads", _default_kv_heads(model_args))
    if model_args["family"] == "gpt2" and model_args["n_kv_heads"] != model_args["n_heads"]:
        raise UsageError(f"--family gpt2 has no grouped-query attention: --n-kv-heads "
                         f"{model_args['n_kv_heads']} must equal --n-heads "
                         f"{model_args['n_heads']} (or be left out)")
    try:
        return Config(vocab_size=vocab_size, max_len=seq_len, **model_args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _default_kv_heads(model_args: dict) -> int:
    """Grouped-query attention with 2 KV heads when n_heads is even (the default 4 heads ->
    2), else plain multi-head attention; GPT-2, GPT-NeoX and GPT-Neo never group their heads."""
    n_heads = model_args["n_heads"]
    if model_args["family"] not in _NO_GQA_FAMILIES and isinstance(n_heads, int) and \
            n_heads % 2 == 0:
        return 2
    return n_heads


def _init_from(args, given: dict):
    """(model, tokenizer) of --init-from, or (None, None) without it; the model is kept on
    `args.initial_model` for `_train`. A weights-only file of 257 ids gets the byte
    tokenizer.

    Raises:
        UsageError: with --resume, with model flags, a model without a tokenizer, or a file
            that does not load (the loader's one-line reason).
    """
    args.initial_model = None
    if args.init_from is None:
        return None, None
    from .formats.tokenizer import ByteTokenizer
    if args.resume is not None:
        raise UsageError("--init-from starts a new run; --resume continues one: give one")
    flags = [f"--{k.replace('_', '-')}" for k in _MODEL_FLAGS if k in given]
    if flags:
        raise UsageError(f"--init-from {args.init_from} brings its own architecture; drop "
                         f"{', '.join(flags)}")
    try:
        model, tokenizer = load_model_and_tokenizer(args.init_from)
    except (OSError, ValueError) as e:
        raise UsageError(f"--init-from: {e}") from None
    if tokenizer is None:
        if model.cfg.vocab_size != ByteTokenizer.vocab_size:
            raise UsageError(f"--init-from {args.init_from} has no tokenizer, and its "
                             f"{model.cfg.vocab_size} ids are not bytes")
        tokenizer = ByteTokenizer()
    args.initial_model = model
    return model, tokenizer


def _resumed_tokenizer(resume, path: str):
    """The tokenizer a --init-from run stored in its checkpoint (its data is encoded with it)."""
    from .formats.tokenizer import tokenizer_from_json
    text = resume.extra.get("tokenizer")
    if not isinstance(text, str):
        raise ValueError(f"checkpoint {path!r}: a --init-from run without extra.tokenizer")
    return tokenizer_from_json(text)


def _resumed_settings(resume, given: dict, args, saved_log_csv: str | None = None):
    """The checkpoint's settings; flags that would change them are refused (the result would
    no longer equal an uninterrupted run), output flags may change.

    --steps cannot grow either: lr_schedule(step, steps, ...) decays over the whole run, so
    the updates already done used a schedule that a longer run would not have used; a
    "continued" run would equal no uninterrupted run."""
    from .training import TrainSettings
    # a checkpoint older than a setting holds that setting's default (grad_accum: 1)
    saved = {**TrainSettings().to_dict(), **resume.settings}
    conflicts = [f"--{k.replace('_', '-')} {v} (checkpoint: {saved.get(k)})"
                 for k, v in given.items() if k in _SETTING_FLAGS and saved.get(k) != v]
    conflicts += [f"--{k.replace('_', '-')} {v} (checkpoint: {resume.config.get(k)})"
                  for k, v in given.items() if k in _MODEL_FLAGS and resume.config.get(k) != v]
    if conflicts:
        why = ("; the learning-rate schedule spans --steps, so a longer run is a new run"
               if "steps" in given and saved.get("steps") != given["steps"] else "")
        raise UsageError("--resume continues the saved run unchanged; drop "
                         + ", ".join(conflicts) + why)
    try:
        TrainSettings.from_dict(saved)
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {args.resume!r}: invalid settings: {e}") from None
    if args.log_csv is not None:
        saved["log_csv"] = _absolute(args.log_csv)
    elif saved_log_csv is not None:  # where it is now, beside the (maybe moved) checkpoint
        saved["log_csv"] = saved_log_csv
    if args.checkpoint_every is not None:
        saved["checkpoint_every"] = args.checkpoint_every
    try:
        return TrainSettings.from_dict(saved)
    except (TypeError, ValueError) as e:
        raise UsageError(_flag_spelling(str(e))) from None


def _progress_bar(total: int):
    from tqdm import tqdm
    return tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr,
                mininterval=0.5)


def load_model_and_tokenizer(path):
    """(GlassLM, tokenizer) from a glassllm model file, a Hugging Face checkpoint directory (one
    holding config.json) or a llama2.c checkpoint (.bin): `glassllm.formats.lm`. The tokenizer
    is None for a weights-only file, a llama2.c checkpoint or a directory without tokenizer
    files.

    Raises FileNotFoundError (with how to download, for a hub name such as "gpt2") /
    IsADirectoryError / ValueError as `files.load`, `hf.from_hf` and `hf.tokenizer_from_hf` do.
    """
    from .formats import lm
    return lm.load_model_and_tokenizer(path)


TOKENIZER_HELP = ("tokenizer instead of the model's (as generate: a tokenizer JSON, a GPT-2 "
                  "vocab.json + merges.txt directory, llama2.c's tokenizer.bin, or `byte`)")


def model_with_tokenizer(args):
    """(model, tokenizer) of a command's --model and --tokenizer (generate, inspect, serve):
    `load_model_and_tokenizer`, the tokenizer given replacing the model's.

    Raises:
        UsageError: a model left without a tokenizer (weights-only, a llama2.c checkpoint).
    """
    model, tokenizer = load_model_and_tokenizer(args.model)
    if args.tokenizer is not None:
        tokenizer = _tokenizer_option(args.tokenizer, model.cfg.vocab_size)
    elif tokenizer is None:
        raise UsageError(f"{args.model} has no tokenizer (a weights-only model or a llama2.c "
                         f"checkpoint); give one with --tokenizer PATH (a tokenizer JSON, a "
                         f"directory with GPT-2's vocab.json + merges.txt, a llama2.c "
                         f"tokenizer.bin, or `byte`)")
    return model, tokenizer


def add_generate(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate text from a saved model",
        description="Continue a prompt with a saved model, printing text as it is produced. "
                    "Stops after --max-new-tokens tokens or at the end-of-text token.")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="model file written by `glassllm train` (glassllm safetensors), a "
                        "Hugging Face GPT-2/Llama directory (config.json + model.safetensors, "
                        "tokenizer from vocab.json + merges.txt or tokenizer.json), or a "
                        "llama2.c checkpoint (.bin, with --tokenizer); local files only")
    p.add_argument("--prompt", metavar="TEXT",
                   help="text to continue; none (or \"\") samples unconditionally, from the "
                        "tokenizer's start token: its begin-of-sequence token (SentencePiece/"
                        "Llama), else end-of-text (GPT-2 and byte tokenizers), never printed")
    p.add_argument("--prompt-file", metavar="PATH",
                   help="read the prompt from this UTF-8 text file (as it is, final newline "
                        "included), instead of --prompt")
    p.add_argument("--num-samples", type=int, default=1, metavar="N",
                   help="generate N samples of the prompt, one after the other from one "
                        "random stream, separated by a line of dashes (default 1)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer to use instead of the model's (needed for a weights-only "
                        "model or a llama2.c checkpoint): a tokenizer JSON (BPETokenizer.save, "
                        "a Hugging Face tokenizer.json), a directory with GPT-2's vocab.json + "
                        "merges.txt, a llama2.c tokenizer.bin, or `byte`")
    p.add_argument("--max-new-tokens", type=int, default=200, metavar="N",
                   help="most tokens to generate (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="softmax temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample only among the K most probable tokens (default: all)")
    p.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="sample only among the most probable tokens whose probabilities "
                        "add up to P, 0 < P <= 1 (default: all)")
    p.add_argument("--seed", type=_non_negative_int, default=None, metavar="S",
                   help="random seed >= 0, for a reproducible text (default: a fresh one)")
    p.set_defaults(func=run_generate)


def run_generate(args) -> int:
    import numpy as np

    from .formats.lm import LM
    from .generate import Sampling

    prompt = _generate_prompt(args)
    if args.max_new_tokens < 0:
        raise UsageError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.num_samples < 1:
        raise UsageError(f"--num-samples must be >= 1, got {args.num_samples}")
    try:
        Sampling(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise UsageError(f"bad --temperature/--top-k/--top-p: {e}") from None
    model, tokenizer = model_with_tokenizer(args)
    # The prompt is encoded as `LM.encode` does: BOS first where the tokenizer has one
    # (SentencePiece/Llama, as llama2.c's run.c), an empty prompt is the start token alone (an
    # unconditional sample; GPT-2 and byte: end-of-text, as nanoGPT and transformers). The
    # start token is never printed; generation stops at the tokenizer's stop ids.
    lm = LM(model, tokenizer)
    rng = np.random.default_rng(args.seed)  # one stream for all samples, as nanoGPT's sample.py
    try:
        for n in range(args.num_samples):
            # the first draw comes before any output, so an error (a model whose logits are
            # NaN) is a clean one-line error rather than a prompt followed by a message
            pieces = lm.stream(prompt, args.max_new_tokens, args.temperature, args.top_k,
                               args.top_p, seed=rng)
            if n:
                print(SAMPLE_SEPARATOR, flush=True)
            print(prompt, end="", flush=True)
            for piece in pieces:
                print(piece, end="", flush=True)
            print(flush=True)
    except BrokenPipeError:
        # The reader left (`glassllm generate ... | head`): stop quietly, as Unix tools do;
        # point stdout at devnull so the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


SAMPLE_SEPARATOR = "---------------"  # between --num-samples samples, as nanoGPT's sample.py


def _generate_prompt(args) -> str:
    """The prompt of generate: --prompt, the text of --prompt-file, or "" (the start token)."""
    if args.prompt is not None and args.prompt_file is not None:
        raise UsageError("give --prompt or --prompt-file, not both")
    if args.prompt_file is not None:
        data = _read_small_file(args.prompt_file, "--prompt-file")
        try:
            # universal newlines, as open(..., encoding="utf-8") reads a text file
            return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError as e:
            raise UsageError(f"--prompt-file {args.prompt_file}: not UTF-8 text (byte "
                             f"{e.start})") from None
    prompt = "" if args.prompt is None else args.prompt
    try:  # argv bytes that are not UTF-8 arrive as lone surrogates (surrogateescape)
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(f"--prompt is not valid UTF-8 text (undecodable byte(s) at character "
                         f"{e.start}); give the prompt in UTF-8") from None
    return prompt


def _tokenizer_option(path: str, vocab_size: int):
    """--tokenizer PATH (or `byte`) of generate: the tokenizer, which must fit the model. A
    `.bin` file is read as llama2.c's tokenizer.bin, anything else as `load_tokenizer` does."""
    from .formats.lm import read_tokenizer
    try:
        tokenizer = read_tokenizer(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"--tokenizer {path}: {_one_line(e)}") from None
    if tokenizer.vocab_size > vocab_size:
        raise UsageError(f"--tokenizer {path}: it has {tokenizer.vocab_size} ids but the "
                         f"model's vocab_size is {vocab_size}")
    return tokenizer


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
    import math

    from tqdm import tqdm

    from .training.data import bpe_vocab_size, prepare
    from .formats.tokenizer import load_tokenizer

    if not (math.isfinite(args.val_fraction) and 0.0 <= args.val_fraction < 1.0):
        raise UsageError(f"--val-fraction must be a number in [0, 1), got {args.val_fraction!r}")
    tokenizer = args.tokenizer
    if tokenizer.startswith("bpe:"):
        try:
            bpe_vocab_size(tokenizer)
        except ValueError as e:
            raise UsageError(f"--tokenizer: {e}") from None
    elif tokenizer != "byte":
        try:
            tokenizer = load_tokenizer(tokenizer)
        except FileNotFoundError as e:
            raise UsageError(f"--tokenizer {args.tokenizer}: {e} (expected byte, bpe:N or "
                             f"the path of a tokenizer)") from None
        except (OSError, ValueError) as e:
            raise UsageError(f"--tokenizer {args.tokenizer}: {e}") from None
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
    p = sub.add_parser("plot", help="draw a run's loss and learning-rate curves (and its "
                                    "health.jsonl panels, when present) to images")
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="directory holding history.csv (or history.jsonl)")
    p.add_argument("--out", default=None,
                   help="image path; its suffix picks the format (.png, .svg, .pdf, ...; "
                        "default RUN_DIR/loss.png)")
    p.set_defaults(func=run_plot)


def run_plot(args) -> int:
    from .lens.plots import find_history, plot_health, plot_history

    if not os.path.isdir(args.run_dir):
        raise FileNotFoundError(f"run directory not found: {args.run_dir}")
    out = os.path.join(args.run_dir, "loss.png") if args.out is None else args.out
    plot_history(find_history(args.run_dir), out)
    print(out, flush=True)
    health = os.path.join(args.run_dir, "health.jsonl")
    if os.path.isfile(health):  # health.png (or OUT-health.SUFFIX) beside the loss plot
        stem, suffix = os.path.splitext(out)
        image = os.path.join(args.run_dir, "health.png") if args.out is None else \
            f"{stem}-health{suffix}"
        print(plot_health(health, image), flush=True)
    return 0


# --------------------------------------------------------------------------------- convert
CONVERT_USAGE = ("give either --from-hf DIR --out FILE [--tokenizer PATH] [--max-len T], "
                 "--from-llama2c CKPT.bin [--tokenizer TOK.bin] --out FILE [--max-len T], "
                 "--model FILE --to-hf DIR [--force] [--max-shard-size SIZE] or --model FILE "
                 "--to-llama2c OUT.bin")


def add_convert(sub) -> None:
    p = sub.add_parser(
        "convert", help="import/export Hugging Face and llama2.c checkpoints",
        description="--from-hf DIR --out FILE: a transformers checkpoint directory (config.json "
                    "+ model.safetensors or shards, any class docs/architectures.md lists: "
                    "GPT-2, Llama, Mistral, Qwen2/3, GPT-NeoX, GPT-Neo, Phi, Gemma 1/2/3, "
                    "OLMo-2) to a glassllm "
                    "model file, with the directory's tokenizer. --model FILE --to-hf DIR: the "
                    "reverse; transformers' from_pretrained(DIR) then gives the same logits. "
                    "--from-llama2c CKPT.bin --out FILE: a llama2.c checkpoint (legacy "
                    "version 0, float32) to a glassllm model file, with llama2.c's "
                    "tokenizer.bin given by --tokenizer. --model FILE --to-llama2c OUT.bin: "
                    "the reverse, a file llama2.c's run.c runs.")
    p.add_argument("--from-hf", metavar="DIR", help="Hugging Face checkpoint directory to read")
    p.add_argument("--from-llama2c", metavar="CKPT.bin",
                   help="llama2.c checkpoint to read (legacy version 0, e.g. stories260K.bin)")
    p.add_argument("--out", metavar="FILE",
                   help="glassllm model file to write (with --from-hf / --from-llama2c)")
    p.add_argument("--model", metavar="FILE",
                   help="glassllm model file to read (with --to-hf / --to-llama2c)")
    p.add_argument("--to-hf", metavar="DIR", help="Hugging Face directory to write (with --model)")
    p.add_argument("--to-llama2c", metavar="OUT.bin",
                   help="llama2.c checkpoint (version 0) to write (with --model)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="with --from-hf: tokenizer to store when DIR has none (tokenizer JSON, "
                        "or a directory with vocab.json + merges.txt); with --from-llama2c: "
                        "llama2.c's tokenizer.bin (e.g. tok512.bin); without it the file "
                        "holds the weights only")
    p.add_argument("--max-len", type=int, metavar="T",
                   help="with --from-hf / --from-llama2c: a shorter context than the "
                        "checkpoint's")
    p.add_argument("--max-shard-size", metavar="SIZE",
                   help="with --to-hf: the largest weights file, e.g. 5GB, 100MB, 500KB "
                        "(decimal units, as transformers' save_pretrained) or bytes; larger "
                        "models are written as model-0000i-of-0000n.safetensors shards with "
                        "model.safetensors.index.json (default 50GB)")
    p.add_argument("--force", action="store_true",
                   help="with --to-hf: replace a checkpoint already in DIR (never the source "
                        "model file itself)")
    p.set_defaults(func=run_convert)


def run_convert(args) -> int:
    sources = [flag for flag in ("from_hf", "from_llama2c", "model")
               if getattr(args, flag) is not None]
    targets = [flag for flag in ("out", "to_hf", "to_llama2c") if getattr(args, flag) is not None]
    extras = {flag for flag in ("tokenizer", "max_len", "max_shard_size")
              if getattr(args, flag) is not None}
    if args.force:
        extras.add("force")
    allowed = {("from_hf", "out"): {"tokenizer", "max_len"},
               ("from_llama2c", "out"): {"tokenizer", "max_len"},
               ("model", "to_hf"): {"force", "max_shard_size"}, ("model", "to_llama2c"): set()}
    mode = (sources[0], targets[0]) if len(sources) == len(targets) == 1 else None
    if mode not in allowed or not extras <= allowed[mode]:
        raise UsageError(CONVERT_USAGE)
    if mode == ("from_hf", "out"):
        model, tokenizer = _convert_from_hf(args)
    elif mode == ("from_llama2c", "out"):
        model, tokenizer = _convert_from_llama2c(args)
    elif mode == ("model", "to_hf"):
        model, tokenizer = _convert_to_hf(args)
    else:
        model, tokenizer = _convert_to_llama2c(args)
    src, dst = getattr(args, mode[0]), getattr(args, mode[1])
    cfg = model.cfg
    kind = json.loads(tokenizer.to_json())["type"] if tokenizer is not None else "none"
    print(f"{src} -> {dst}: {cfg.family} model, d_model {cfg.d_model}, {cfg.n_layers} layers, "
          f"{cfg.n_heads} heads ({cfg.n_kv_heads} kv), vocab {cfg.vocab_size}, "
          f"{sum(p.size for p in model.parameters()):,} parameters; tokenizer {kind}",
          flush=True)
    return 0


def _check_out_file(out: str, source: str, what: str) -> None:
    """--out must be a file path other than the input (which it would replace)."""
    if os.path.isdir(out):
        raise UsageError(f"--out {out} is a directory; give a file path")
    if os.path.exists(out) and os.path.exists(source) and os.path.samefile(out, source):
        raise UsageError(f"--out {out} is the {what} being converted; write the result "
                         f"elsewhere")


def _convert_from_hf(args):
    from .formats import hf
    from .formats.tokenizer import load_tokenizer

    _check_out_file(args.out, args.from_hf, "--from-hf checkpoint")
    # Writing into the checkpoint's own directory could replace its model.safetensors
    # (or a shard) with a glassllm file: refuse any output that is one of its files.
    if os.path.isdir(args.from_hf) and os.path.exists(args.out) and any(
            os.path.samefile(args.out, os.path.join(args.from_hf, name))
            for name in os.listdir(args.from_hf)):
        raise UsageError(f"--out {args.out} is a file of the --from-hf checkpoint "
                         f"{args.from_hf}; write the glassllm model elsewhere")
    model = hf.from_hf(args.from_hf, max_len=args.max_len)
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
    else:
        tokenizer = hf.tokenizer_from_hf(args.from_hf, model.cfg.vocab_size)
    return _save_converted(model, tokenizer, args.out, (
        f"{args.from_hf} has no tokenizer files (vocab.json + merges.txt or tokenizer.json)",
        "give --tokenizer PATH here or to `glassllm generate`"))


def _convert_from_llama2c(args):
    from .formats import llama2c

    _check_out_file(args.out, args.from_llama2c, "--from-llama2c checkpoint")
    if args.tokenizer is not None:
        _check_out_file(args.out, args.tokenizer, "--tokenizer")
    model = llama2c.from_llama2c(args.from_llama2c, max_len=args.max_len)
    tokenizer = None  # a llama2.c checkpoint holds no tokenizer: weights-only unless given
    if args.tokenizer is not None:
        tokenizer = llama2c.tokenizer_from_llama2c(args.tokenizer)
        if tokenizer.vocab_size != model.cfg.vocab_size:
            raise UsageError(f"--tokenizer {args.tokenizer} has {tokenizer.vocab_size} pieces "
                             f"but {args.from_llama2c} has vocab_size {model.cfg.vocab_size}; "
                             f"give the checkpoint's own tokenizer.bin")
    return _save_converted(model, tokenizer, args.out, (
        "no --tokenizer", "give llama2.c's tokenizer.bin (e.g. tok512.bin for stories260K.bin) "
        "here, or a tokenizer to `glassllm generate --tokenizer`"))


def _save_converted(model, tokenizer, out: str, without: tuple[str, str]):
    """Save a converted model; without a tokenizer, say why (without[0]) and what to give
    (without[1]) on stderr: the file then holds the weights only."""
    from .formats import files
    files.save(model, out, tokenizer)
    if tokenizer is None:
        why, what = without
        print(f"note: {why}: {out} holds the weights only; {what}", file=sys.stderr,
              flush=True)
    return model, tokenizer


def _convert_to_hf(args):
    from .formats import hf

    size = hf.DEFAULT_MAX_SHARD_SIZE if args.max_shard_size is None else (
        int(args.max_shard_size) if args.max_shard_size.strip().isdigit() else args.max_shard_size)
    try:
        hf.shard_size_bytes(size)
    except ValueError as e:
        raise UsageError(f"--max-shard-size: {e}") from None
    model, tokenizer = _convert_source(args.model)
    try:
        hf.to_hf(model, args.to_hf, tokenizer, overwrite=args.force, source=args.model,
                 max_shard_size=size)
    except FileExistsError as e:
        raise UsageError(f"--to-hf: {e}") from None
    if tokenizer is not None and not hf.stores_tokenizer(tokenizer, model.cfg.vocab_size):
        kind = json.loads(tokenizer.to_json())["type"]
        print(f"note: {args.to_hf} holds no tokenizer: glassllm writes its byte, BPE and "
              f"SentencePiece tokenizers (tokenizer.json), not this {kind} tokenizer (it "
              f"stays in {args.model}); give its file to `glassllm generate --tokenizer`",
              file=sys.stderr, flush=True)
        tokenizer = None
    return model, tokenizer


def _convert_source(path: str):
    """(model, tokenizer or None) of `convert --model`: a glassllm model file. A llama2.c
    checkpoint given there (glassllm.load and generate take one) is told how to convert it.

    Raises:
        ValueError: as `files.load`, with the way from a llama2.c `.bin` added.
    """
    from .formats import files
    try:
        return files.load(path), files.load_tokenizer(path)
    except ValueError as e:
        if not path.endswith(".bin"):
            raise
        raise ValueError(f"{_one_line(e)}; --model takes a glassllm model file: for a "
                         f"llama2.c checkpoint, first `glassllm convert --from-llama2c {path} "
                         f"--tokenizer TOKENIZER.bin --out MODEL.safetensors`") from None


def _convert_to_llama2c(args):
    from .formats import llama2c

    if os.path.isdir(args.to_llama2c):
        raise UsageError(f"--to-llama2c {args.to_llama2c} is a directory; give a file path")
    if os.path.exists(args.to_llama2c) and os.path.exists(args.model) and \
            os.path.samefile(args.to_llama2c, args.model):
        raise UsageError(f"--to-llama2c {args.to_llama2c} is the model being converted; "
                         f"write the llama2.c file elsewhere")
    model, tokenizer = _convert_source(args.model)
    llama2c.to_llama2c(model, args.to_llama2c)
    if tokenizer is not None:  # the format has no place for one: run.c takes it with -z
        kind = json.loads(tokenizer.to_json())["type"]
        print(f"note: {args.to_llama2c} holds the weights only (a llama2.c checkpoint has no "
              f"tokenizer; run.c reads a tokenizer.bin given with -z); the {kind} tokenizer "
              f"stays in {args.model}", file=sys.stderr, flush=True)
    return model, None


# --------------------------------------------------------------------------------- inspect
def add_inspect(sub) -> None:
    p = sub.add_parser(
        "inspect", help="look inside a model on one prompt: terminal summary + HTML report",
        description="Run a model on a prompt and show what it computes: tokens coloured by "
                    "surprise, the logit lens per layer, the largest direct logit attributions "
                    "and head types in the terminal, and one self-contained HTML page "
                    "(attention per layer and head, logit lens grid, surprise, attribution "
                    "bars; training curves and health panels with --run).")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="glassllm model file or Hugging Face directory (as generate)")
    p.add_argument("--prompt", required=True, metavar="TEXT", help="text to inspect")
    p.add_argument("--tokenizer", metavar="PATH", help=TOKENIZER_HELP)
    p.add_argument("--out", default="report.html", metavar="FILE",
                   help="HTML report to write (default report.html)")
    p.add_argument("--run", default=None, metavar="DIR",
                   help="training run directory (history.csv, health.jsonl) to add its curves")
    p.add_argument("--top-k", type=int, default=5, metavar="K",
                   help="alternatives shown per position (default 5)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the terminal summary (default: when stdout is a terminal)")
    p.set_defaults(func=run_inspect)


def run_inspect(args) -> int:
    from .lens.report import check_report_path, inspect_model, summary, write_html

    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(f"--prompt is not valid UTF-8 text (undecodable byte(s) at character "
                         f"{e.start})") from None
    if args.top_k < 1:
        raise UsageError(f"--top-k must be >= 1, got {args.top_k}")
    if not args.out.lower().endswith((".html", ".htm")):
        raise UsageError(f"--out {args.out}: the report is HTML; give a .html path")
    check_report_path(args.out)  # before the model runs, not after
    model, tokenizer = model_with_tokenizer(args)
    ids = [int(i) for i in tokenizer.encode(args.prompt)]
    if getattr(tokenizer, "bos_id", None) is not None:  # as generate: BOS starts a context
        ids = [int(tokenizer.bos_id)] + ids
    if len(ids) < 2:
        raise UsageError(f"--prompt is {len(ids)} token(s); inspect needs at least 2 (one to "
                         f"predict)")
    if len(ids) > model.cfg.max_len:
        raise UsageError(f"--prompt is {len(ids)} tokens, over this model's max_len "
                         f"{model.cfg.max_len}")
    ins = inspect_model(model, ids, tokenizer, run_dir=args.run, k=args.top_k,
                        title=f"glassllm inspect: {os.path.basename(args.model.rstrip(os.sep))}")
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    report = write_html(ins, args.out)  # first: a reader that leaves early loses nothing
    try:
        print(summary(ins, color=color), flush=True)
        print(f"report: {report}", flush=True)
    except BrokenPipeError:
        # `glassllm inspect ... | head`: the report is written; stop quietly with success,
        # as Unix tools do (stdout -> devnull: the interpreter's final flush stays quiet)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# ----------------------------------------------------------------------------------- serve
SERVE_PORT = 8765


def add_serve(sub) -> None:
    p = sub.add_parser(
        "serve", help="look inside a model, and a running training, in the browser",
        description="Start a local web app on a model (--model) and/or a training run (--run) "
                    "and print its URL, with a session token. The model views: tokens and "
                    "surprise, attention, logit lens, direct logit attribution, ablation, "
                    "activation patching, generation step by step; the training view: curves, "
                    "health panels and warnings updating live, samples from the best model. "
                    "Needs the extra glassllm[serve] (aiohttp). Ctrl-C stops it.")
    p.add_argument("--model", metavar="PATH",
                   help="glassllm model file, Hugging Face directory, or llama2.c checkpoint "
                        "(.bin, with --tokenizer tokenizer.bin)")
    p.add_argument("--tokenizer", metavar="PATH", help=TOKENIZER_HELP)
    p.add_argument("--run", metavar="DIR",
                   help="training run directory to watch (history.csv, per-step CSV, "
                        "health.jsonl, saved models); it may not exist yet")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; "
                        "0.0.0.0 opens it to the network, with a warning)")
    p.add_argument("--port", type=_non_negative_int, default=SERVE_PORT,
                   help=f"port (default {SERVE_PORT}; 0 takes a free one, the URL says which)")
    p.add_argument("--open", action="store_true", help="open the page in the web browser")
    p.add_argument("--threads", type=int, metavar="N",
                   help="threads the analyses compute on (default: one per core, or the cores "
                        "other processes leave free when the machine is busy)")
    p.set_defaults(func=run_serve)


def run_serve(args) -> int:
    """`glassllm serve`: load the model, start the server, print its URL, serve until Ctrl-C."""
    try:
        from .serve.app import Server, run
    except ImportError as e:
        if getattr(e, "name", None) in ("aiohttp", "multidict", "yarl"):
            raise UsageError("glassllm serve needs aiohttp: pip install 'glassllm[serve]'") \
                from None
        raise
    from .serve.models import Loaded, ModelStore

    if args.model is None and args.run is None:
        raise UsageError("give --model PATH, --run DIR, or both")
    if args.port > 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    if args.threads is not None and not 1 <= args.threads <= 1024:
        raise UsageError(f"--threads must be an integer in [1, 1024], got {args.threads}")
    main_model = None
    if args.model is not None:
        model, tokenizer = _serve_model(args)
        main_model = Loaded("", os.path.basename(args.model.rstrip(os.sep)) or args.model,
                            model, tokenizer)
    if args.run is not None and os.path.exists(args.run) and not os.path.isdir(args.run):
        raise UsageError(f"--run {args.run} is not a directory")
    from .serve.security import is_loopback
    if not is_loopback(args.host):
        print(f"glassllm serve: warning: --host {args.host} lets other machines reach this "
              f"server (plain HTTP, no TLS); anyone with its URL and token can use it",
              file=sys.stderr, flush=True)
    server = Server(ModelStore(main_model, args.run), run_dir=args.run, bind=args.host)

    def announce(url: str) -> None:
        print(f"glassllm serve: {url}", flush=True)
        print("(Ctrl-C stops it)", file=sys.stderr, flush=True)
        if args.open:
            import webbrowser
            webbrowser.open(url)
    run(server, args.host, args.port, announce, threads=args.threads)
    return 0


def _serve_model(args):
    """(model, tokenizer) of serve's --model and --tokenizer: a glassllm file or Hugging Face
    directory (as generate), or a llama2.c checkpoint (.bin), whose tokenizer must be given."""
    return model_with_tokenizer(args)


def _add_train_serve(p) -> None:
    """train's --serve: the training page of `glassllm serve` on this run, while it runs."""
    g = p.add_argument_group("watching the run in the browser (needs glassllm[serve])")
    g.add_argument("--serve", action="store_true",
                   help="start `glassllm serve --run` on this run's directory in a separate "
                        "process (it only reads the run's files) and print its URL; it stops "
                        "when training ends. Writes steps.csv (per-step loss and lr) beside "
                        "--out unless --log-csv is given")
    g.add_argument("--serve-port", type=_non_negative_int, default=0, metavar="N",
                   help="its port (default 0: a free one, printed)")


def _train_serve_defaults(args) -> None:
    """With --serve: aiohttp must be there (before any work), and a new run logs every step
    to steps.csv beside --out (a resumed run keeps its own --log-csv)."""
    if not getattr(args, "serve", False):
        return
    import importlib.util
    if importlib.util.find_spec("aiohttp") is None:
        raise UsageError("--serve needs aiohttp: pip install 'glassllm[serve]'")
    if args.log_csv is None and args.resume is None:
        out = args.out or os.path.join("runs", "model.safetensors")
        args.log_csv = os.path.join(os.path.dirname(out), "steps.csv")


def _train_server(args, comm, model_path: str):
    """Context: with --serve (rank 0), `glassllm serve --run DIR` as a child process for the
    duration of the training; its URL printed. Stopped (SIGINT, then killed after 5 s) at
    the end. Ctrl-C in the terminal reaches both."""
    import contextlib
    import select
    import signal
    import subprocess

    if not getattr(args, "serve", False) or comm.rank != 0:
        return contextlib.nullcontext()
    run_dir = os.path.dirname(os.path.abspath(model_path))
    command = [sys.executable, "-m", "glassllm.cli", "serve", "--run", run_dir,
               "--port", str(args.serve_port), "--threads", "1"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([child.stdout], [], [], 60)
    line = child.stdout.readline().strip() if ready else ""
    if not line.startswith("glassllm serve: http"):
        child.kill()
        child.wait()
        raise UsageError(f"--serve: the server did not start ({line or 'no URL in 60 s'})")
    print(f"serve: {line.split(': ', 1)[1]}", flush=True)

    @contextlib.contextmanager
    def held():
        try:
            yield
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
                try:
                    child.wait(5)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    return held()


SUBCOMMANDS = [add_train, add_generate, add_prepare, add_plot, add_convert, add_inspect,
               add_serve]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glassllm", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"glassllm {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def version() -> str:
    """The installed distribution's version (importlib.metadata), else the package's
    `__version__` (a source tree on PYTHONPATH, never installed)."""
    from importlib import metadata
    try:
        return metadata.version("glassllm")
    except metadata.PackageNotFoundError:
        from . import __version__
        return __version__


def main(argv: list[str] | None = None) -> int:
    from .training import launch
    _print_paths_as_given()
    if argv is None and sys.argv[1:2] == ["train"] and launch.needs_supervisor():
        # One rank of `mpiexec -n N glassllm train`: this process watches the real one, so a
        # rank killed without a word is still named (glassllm.training.launch).
        return launch.supervise([sys.executable, "-m", "glassllm.cli", *sys.argv[1:]])
    try:  # building the parser imports numpy and the library: Ctrl-C often lands here
        parser = build_parser()
    except KeyboardInterrupt:
        print("\nglassllm: interrupted", file=sys.stderr, flush=True)
        return launch.interrupted_exit(130)  # under mpiexec: never leave the others waiting
    args = parser.parse_args(argv)  # argparse itself exits 2 with a usage line
    from .engine.blas import BlasError
    from .lens.interpret import AttributionError
    from . import kernels
    from .training import stopping
    try:
        # SIGTERM and SIGHUP unwind every command as Ctrl-C does (its temporary files
        # removed, one line, exit 128 + N) instead of ending it where it stands
        with stopping.signals_raise():
            kernels.mode()  # a mistyped GLASSLLM_KERNELS is this command's one error line
            return int(args.func(args) or 0)
    except (KeyboardInterrupt, BrokenPipeError, MemoryError, UsageError, OSError,
            ValueError, BlasError, AttributionError) as e:
        code, line = _error_report(args.command, e)
        # Under mpiexec every rank meets the same errors (glassllm.training.distributed.agreement):
        # rank 0 alone says so.
        if line is not None and getattr(getattr(args, "comm", None), "rank", 0) == 0:
            print(line, file=sys.stderr, flush=True)
        if isinstance(e, KeyboardInterrupt):  # e.g. before MPI_Init: see interrupted_exit
            return launch.interrupted_exit(code, getattr(e, "signum", None))
        return code
    finally:
        if argv is None:  # the process's own command: it exits now, a late stop changes nothing
            stopping.ignore_further_stops()


def _print_paths_as_given() -> None:
    """Let stdout print any path the user gave. A file name that is not UTF-8 reaches Python
    as lone surrogates (PEP 383); a stdout with errors="strict" (a UTF-8 locale other than C,
    PYTHONIOENCODING=utf-8) fails on the first line naming it, before or after a whole run.
    "surrogateescape" writes its bytes back as they were, as Python itself does in the C
    locale (stderr already uses "backslashreplace")."""
    stream = sys.stdout
    if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        stream.reconfigure(errors="surrogateescape")


def _error_report(command: str, e: BaseException) -> tuple[int, str | None]:
    """(exit code, the one line for stderr or None) of an error that reached main()."""
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C, or SIGTERM / SIGHUP (StopSignal)
        from .training import stopping
        signum = getattr(e, "signum", None)
        if signum is None or signum == 2:  # "\n": the terminal echoed ^C on the current line
            return 130, f"\nglassllm {command}: interrupted"
        return stopping.exit_code(e), \
            f"glassllm {command}: interrupted by {stopping.signal_name(signum)}"
    if isinstance(e, BrokenPipeError):
        # The reader of stdout left (`glassllm train ... | head -1`): stop quietly, as Unix
        # tools do; stdout -> devnull so the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1, None
    if isinstance(e, MemoryError):  # NumPy's _ArrayMemoryError says which array did not fit
        detail = f" ({e})" if str(e) else ""
        return 2, (f"glassllm {command}: error: not enough memory for this {command} "
                   f"run{detail}; use smaller sizes")
    from .lens.interpret import AttributionError
    if isinstance(e, AttributionError):  # not the user's input: the numbers disagree
        hint = "" if "not finite" in str(e) else " (float32 overflow in this model's forward?)"
        return 1, f"glassllm {command}: error: self-check failed: {_one_line(e)}{hint}"
    if isinstance(e, OSError) and e.errno in _WRITE_FAILURES:  # not the user's input: exit 1
        where = f" {e.filename}" if e.filename is not None else ""
        return 1, f"glassllm {command}: error: cannot write{where}: {e.strerror}"
    return 2, f"glassllm {command}: error: {_one_line(e)}"


# disk full, quota exceeded, an I/O error: a failure of the machine, not of the command line
_WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EIO)


SMALL_FILE_BYTES = 16 << 20  # a prompt or a --config file; /dev/zero must not fill memory


def _read_small_file(path: str, option: str) -> bytes:
    """The bytes of a file an option names (a regular file, a pipe such as /dev/stdin or a
    shell's <(...)), read up to SMALL_FILE_BYTES: a longer file, or an endless device such as
    /dev/zero, is refused instead of read until memory runs out.

    Raises:
        UsageError: cannot be read, or longer than SMALL_FILE_BYTES (option and path named).
    """
    try:
        with open(path, "rb") as f:
            data = f.read(SMALL_FILE_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{option} {_one_line(e)}") from None
    if len(data) > SMALL_FILE_BYTES:
        raise UsageError(f"{option} {path}: longer than {SMALL_FILE_BYTES >> 20} MiB; not "
                         f"read (is it the file you meant?)")
    return data


def _one_line(e: Exception) -> str:
    """An error as one line: OSErrors as "PATH: reason" (the path the user gave, without
    Python's "[Errno N]"), others as their message."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        text = f"{e.filename}: {e.strerror}"
    else:
        text = str(e)
    return " ".join(text.split("\n"))


if __name__ == "__main__":
    sys.exit(main())
