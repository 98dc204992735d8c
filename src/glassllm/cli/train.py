"""`glassllm train`: parse, build the `RunPlan`, `execute` it, print its events.

The run itself (locks, temporaries, history, plot, the exit reason) is the library's:
`glassllm.training.plan` and `glassllm.training.run`. This module declares the flags, reads a
--config file, checks the flags' bounds, and prints through `TrainPrinter`.
"""
from __future__ import annotations

from .common import FAMILIES, UsageError, add_device_option, non_negative_int


def add_train(sub) -> None:
    from ..training.corpus import STDLIB_CORPUS_BYTES
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
                        "run's; when runs/ holds an earlier run, runs/2/model.safetensors, "
                        "runs/3/..., printed); its directory also gets history.csv, loss.png, "
                        "checkpoint.safetensors and val.csv (a row per evaluation, as it "
                        "happens). A folder holding another run's files "
                        "(an interrupted one's too) is refused: give a new --out, "
                        "--overwrite, or --resume its checkpoint. Locked while the run lasts: "
                        "a second run on the same paths is refused")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run at --out (default runs/model.safetensors): all of "
                        "its files (model, history.csv, loss.png, checkpoint, step log, "
                        "health.jsonl, val.csv) are removed when this run starts, so the folder never "
                        "mixes two runs; not with --resume")
    _add_model_flags(p)
    _add_training_flags(p)
    _add_output_flags(p)
    _add_parallel_flags(p)
    _add_train_serve(p)
    p.add_argument("--config", metavar="FILE.toml",
                   help="read options from a TOML file, one key per flag (d_model = 128, "
                        "steps = 2000, data = [\"input.txt\"], precision = \"bf16\"; dashes "
                        "or underscores; paths from the current directory); a flag given on the "
                        "command line overrides the file")
    p.set_defaults(func=run_train, config_options=_config_options(p))


def _add_model_flags(p) -> None:
    from ..training.plan import TRAIN_MODEL_DEFAULTS as m
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


def _add_training_flags(p) -> None:
    from ..training import TrainSettings
    d = TrainSettings()
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


def _add_output_flags(p) -> None:
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
    add_device_option(p)  # not a setting: a checkpoint resumes on any device


def _add_parallel_flags(p) -> None:
    from ..training.distributed import DEFAULT_TIMEOUT_S
    g = p.add_argument_group(
        "data parallelism (`mpiexec -n N glassllm train ...` runs N ranks; needs the extra "
        "glassllm[mpi])")
    g.add_argument("--mpi-timeout", type=float, metavar="SECONDS",
                   help=f"end the job when a collective waits this long for the other ranks "
                        f"(a hung or lost rank; default {DEFAULT_TIMEOUT_S:g})")


def _add_train_serve(p) -> None:
    """train's --serve: the training page of `glassllm serve` on this run, while it runs."""
    g = p.add_argument_group("watching the run in the browser (needs glassllm[serve])")
    g.add_argument("--serve", action="store_true",
                   help="start `glassllm serve --run` on this run's directory in a separate "
                        "process (it only reads the run's files) and print its URL; it stops "
                        "when training ends. Writes steps.csv (per-step loss and lr) beside "
                        "--out unless --log-csv is given")
    g.add_argument("--serve-port", type=non_negative_int, default=0, metavar="N",
                   help="its port (default 0: a free one, printed)")


def run_train(args) -> int:
    """`glassllm train`, on one process or as one rank of `mpiexec -n N` (every rank runs
    this; rank 0 alone checks and locks the outputs, prints and writes files)."""
    from ..training import distributed, stopping
    from ..training import run as training_run
    from .printer import TrainPrinter
    from .serve import training_server
    try:
        comm = distributed.from_environment()
    except RuntimeError as e:
        raise UsageError(str(e)) from None
    args.comm = comm  # main() prints errors on rank 0 only
    printer = TrainPrinter(None)
    try:
        # SIGTERM and SIGHUP (kill, timeout, Slurm, a closed terminal) stop the run as Ctrl-C
        # does: held at a step boundary inside the loop, raised as an interrupt outside it.
        with stopping.signals_raise():
            printer.plan = _plan(args, comm, printer.show)
            around = training_server(args.serve_port) if args.serve else None
            result = training_run.execute(printer.plan, printer.show, around=around)
            # the other ranks train in silence: rank 0 says how the run ended
            return printer.result(result) if comm.rank == 0 else result.exit_code
    finally:
        printer.close()  # any other error: main() prints it, on a line of its own
        comm.close()


def _plan(args, comm, on_event):
    """The RunPlan of the command line: --config applied, bounds checked, on every rank.

    A mistake found on some ranks only (a data file missing on one node) stops every rank
    here, before the first collective of the training loop; one that every rank finds (a flag
    out of range) is printed once, by rank 0."""
    from ..training import distributed
    from ..training.plan import RunPlan, check_bounds
    with distributed.agreement(comm, errors=(UsageError, OSError, ValueError, MemoryError)):
        _apply_config_file(args)
        check_bounds(args)
        if args.mpi_timeout is not None:
            comm.timeout_s = args.mpi_timeout  # the watchdog reads it at each check
        _train_serve_defaults(args)
        return RunPlan.from_options(args, comm, on_event=on_event)


def _config_options(parser) -> dict:
    """{key: argparse action} of the options a --config file may set: every option of
    `parser` but --help and --config."""
    return {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}


def _apply_config_file(args) -> None:
    """Options from `--config FILE.toml` (`glassllm.training.plan.read_options_file`) for every
    flag not given on the command line (still its default object). Paths in the file are
    read as on the command line, from the current directory.

    Raises:
        UsageError: the file cannot be read or is not TOML; a key that is no option of
            `glassllm train`, or a value of the wrong type (the file and the key named).
    """
    from ..training.plan import read_options_file
    if args.config is None:
        return
    try:
        found = read_options_file(args.config)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for dest, value in found.items():
        if getattr(args, dest) is args.config_options[dest].default:  # the command line wins
            setattr(args, dest, value)


def _train_serve_defaults(args) -> None:
    """With --serve: aiohttp must be there (before any work). A new run then logs every step
    to steps.csv beside --out (a resumed run keeps its own --log-csv): the plan's default."""
    if not getattr(args, "serve", False):
        return
    import importlib.util
    if importlib.util.find_spec("aiohttp") is None:
        raise UsageError("--serve needs aiohttp: pip install 'glassllm[serve]'")
    # steps.csv beside --out is the plan's default with serve (RunPlan.from_options)


def _choose_threads(comm, requested):
    """`glassllm.training.run.choose_threads` (its old name here)."""
    from ..training.run import choose_threads
    return choose_threads(comm, requested)
