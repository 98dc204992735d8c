"""A training run's plan: everything `glassllm train` decides before the first update.

`RunPlan` holds the model config, the `TrainSettings`, the corpus, the output paths, the
thread count, the checkpoint a resume continues and the model a fine-tune starts from. It is
built from options named as `glassllm train`'s flags (`RunPlan.from_options`), from a TOML
file of those options (`RunPlan.from_toml`, the CLI's `--config`) or from a checkpoint
(`RunPlan.from_checkpoint`, the CLI's `--resume`); `glassllm.training.run.execute` runs it.

Building a plan checks the options, reads the data and, on the writing rank (rank 0), refuses
every output path that would fail or do harm (`glassllm.training.runfiles`) before any work;
it locks nothing and writes nothing (locks and files are `execute`'s). Errors a user can
cause are one-line ValueErrors naming the option as the command line spells it (`--seq-len`),
so the CLI prints them as they are.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from collections.abc import Mapping

from ..config import FAMILIES
from . import runfiles
from .events import CorpusNote
from .settings import TrainSettings

# The default model of `glassllm train`, chosen with TrainSettings' defaults so that the README's
# run on tinyshakespeare ends below 2.0 nats per byte (1.75) in minutes on two CPU cores.
# n_kv_heads is not here: its default depends on the family and n_heads (default_kv_heads).
TRAIN_MODEL_DEFAULTS = {"family": "llama", "d_model": 128, "n_layers": 4, "n_heads": 4}
MODEL_OPTIONS = ("family", "d_model", "n_layers", "n_heads", "n_kv_heads")
SETTING_OPTIONS = ("steps", "batch_size", "seq_len", "lr", "warmup", "eval_every",
                   "eval_batches", "seed", "precision", "max_skip_rate", "max_consecutive_skips",
                   "grad_accum")
# families without grouped-query attention in their Hugging Face class
NO_GQA_FAMILIES = ("gpt2", "neox", "gptneo")
# Every numeric option is checked against these bounds before it is used, so a huge value is a
# one-line error naming the option (not an OverflowError deep in NumPy or BLAS). Wide enough for
# any model this library can train; TrainSettings and Config check the finer rules.
INT_BOUNDS = {
    "d_model": (1, 1 << 16), "n_layers": (1, 1 << 10), "n_heads": (1, 1 << 12),
    "n_kv_heads": (1, 1 << 12), "seq_len": (1, 1 << 20), "batch_size": (1, 1 << 20),
    # steps 0 would train nothing yet replace the run's history (and leave its model and
    # plot): refused, as a run is for training
    "steps": (1, 10**9), "warmup": (0, 10**9), "eval_every": (1, 10**9),
    "eval_batches": (1, 10**6), "seed": (0, 2**63 - 1), "checkpoint_every": (1, 10**9),
    "max_consecutive_skips": (1, 10**9), "threads": (1, 1024), "health_every": (1, 10**9),
    "grad_accum": (1, 1 << 20),
}
# lr > 0 (hi None: a lower bound only); rate in [0, 1)
FLOAT_BOUNDS = {"lr": (0.0, None), "max_skip_rate": (0.0, 1.0), "mpi_timeout": (0.0, None)}

# Every option of a run and its kind, as a TOML file gives it: "paths" (a string or a list of
# strings), str, int, float, bool, or a tuple of the allowed strings. The CLI's parser declares
# the same names (tests/test_run_plan.py checks them against each other).
OPTIONS = {
    "data": "paths", "out": str, "family": FAMILIES, "init_from": str,
    "d_model": int, "n_layers": int, "n_heads": int, "n_kv_heads": int,
    "seq_len": int, "batch_size": int, "grad_accum": int, "steps": int, "lr": float,
    "warmup": int, "eval_every": int, "eval_batches": int, "seed": int,
    "precision": ("fp32", "fp16", "bf16"), "max_skip_rate": float,
    "max_consecutive_skips": int, "log_csv": str, "checkpoint_every": int,
    "health_every": int, "checkpoint": str, "resume": str, "threads": int,
    "mpi_timeout": float, "serve": bool, "serve_port": int, "overwrite": bool,
    "device": str,
}
SMALL_FILE_BYTES = 16 << 20  # a prompt or a config file; /dev/zero must not fill memory


@dataclasses.dataclass
class RunPlan:
    """One training run, decided: what `execute` trains and where it writes.

    Attributes:
        config: the model's `Config` (the checkpoint's on a resume, the model's own with
            init_from). settings: `TrainSettings` (log_csv absolute, health_log set when
            health_every is, val_log always: val.csv beside the model). corpus: `glassllm.training.corpus.Corpus`, train and val batches
            of token ids and their tokenizer. paths: `runfiles.run_paths` ({"model",
            "checkpoint", "log_csv", "history_csv", "health_jsonl", "val_csv", "plot"}, str or
            None).
        threads: the thread count asked for (None: measured at the start); threads_kept: it is
            the resumed run's (recorded for a bit-exact continuation), not given.
        resume: the `Checkpoint` continued (None for a new run); resume_path: its file.
        initial_model: the `GlassLM` a fine-tune starts from (None: fresh weights from
            settings.seed); `execute` trains a copy, so the plan runs again from the same
            weights (the copy doubles the weights' memory while the run lasts); init_from:
            its path. comm: the communicator (one process:
            `SerialCommunicator`); rank 0 alone writes. data_dirs: the data directories given
            (an output inside one is refused).
        device: where the model trains ("cpu", "cuda", "cuda:N", "strict"; None: the
            default, `glassllm.devices`); not a setting: a checkpoint resumes on any device.
        overwrite: a new run replaces the run whose files are at its paths (all of them
            removed once the outputs are locked); False: such a run is refused, and without
            --out the run goes to a new numbered folder (`runfiles.free_default_out`).
    """
    config: object
    settings: TrainSettings
    corpus: object
    paths: dict
    threads: int | None = None
    threads_kept: bool = False
    resume: object = None
    resume_path: str | None = None
    initial_model: object = None
    init_from: str | None = None
    comm: object = None
    data_dirs: list = dataclasses.field(default_factory=list)
    overwrite: bool = False
    device: str | None = None

    def __post_init__(self):
        if self.comm is None:
            from .distributed import SerialCommunicator
            self.comm = SerialCommunicator()

    @property
    def run_dir(self) -> str:
        """The folder of the run's files (the model file's), absolute: what `glassllm serve
        --run` watches."""
        return os.path.dirname(os.path.abspath(self.paths["model"]))

    @property
    def outputs(self) -> dict:
        """{label: path or None} of every file the run writes, labelled as the CLI's flags."""
        p = self.paths
        return {"--out": p["model"], "--checkpoint": p["checkpoint"], "--log-csv": p["log_csv"],
                "history.csv (next to --out)": p["history_csv"],
                "health.jsonl (next to --out)": self.settings.health_log,
                "val.csv (next to --out)": self.settings.val_log,
                "loss.png (next to --out)": p["plot"]}

    def inputs(self) -> list[str]:
        """The files the run reads (its data, --init-from): never removed or counted as
        another run's files, whatever their names."""
        found = self.corpus.input_files() if self.corpus is not None else []
        return found + ([self.init_from] if self.init_from is not None else [])

    @classmethod
    def from_options(cls, options, comm=None, on_event=None) -> "RunPlan":
        """The plan of `glassllm train` with these options (a mapping or an object with
        attributes, named as the flags: data, out, steps, resume, ...; missing ones are
        unset). `on_event` receives `CorpusNote`s (files of a data folder skipped). See
        `build_plan` for the errors."""
        return build_plan(options, comm, on_event)

    @classmethod
    def from_toml(cls, path, comm=None, on_event=None, **options) -> "RunPlan":
        """The plan of a TOML file of options (`read_options_file`); keyword options win
        over the file's."""
        return build_plan({**read_options_file(path), **options}, comm, on_event)

    @classmethod
    def from_checkpoint(cls, path, comm=None, on_event=None, **options) -> "RunPlan":
        """The plan that continues the run saved in checkpoint `path` (its data, settings and
        paths; output options may change)."""
        return build_plan({**options, "resume": os.fspath(path)}, comm, on_event)


def build_plan(options, comm=None, on_event=None) -> RunPlan:
    """A `RunPlan` from options named as `glassllm train`'s flags (`OPTIONS`).

    Raises:
        ValueError: one line naming the option: out of bounds, conflicting with --resume or
            --init-from, an empty path, a checkpoint of another number of ranks, an output
            path that would fail or do harm (rank 0), data that is not the checkpoint's.
        OSError: data or a checkpoint that cannot be read, naming it.
    """
    from .distributed import SerialCommunicator
    comm = SerialCommunicator() if comm is None else comm
    opts = _option_dict(options)
    check_kinds(opts)
    check_bounds(opts)
    if opts["mpi_timeout"] is not None:  # the watchdog reads it at each check
        comm.timeout_s = opts["mpi_timeout"]
    if opts["resume"] == "" or any(not source for source in opts["data"] or ()):
        raise ValueError(f"{'--resume' if opts['resume'] == '' else '--data'} is an empty path")
    given = {k: opts[k] for k in MODEL_OPTIONS + SETTING_OPTIONS if opts[k] is not None}
    initial, tokenizer = _init_from(opts, given)
    plan, sources = _plan_without_data(opts, given, comm, initial)
    if plan.resume is not None and "init_from" in plan.resume.extra:  # its data, in its tokenizer
        tokenizer = _resumed_tokenizer(plan.resume, opts["resume"])
    _load_data(plan, sources, opts, tokenizer, on_event)
    plan.config = _model_config(plan, opts, given)
    if opts["device"] is not None:
        from .. import devices
        plan.device = devices.parse(opts["device"])  # one line naming the valid ones
    return plan


def _plan_without_data(opts: dict, given: dict, comm, initial) -> tuple[RunPlan, list | None]:
    """(plan, data sources): the plan's settings, paths, threads and resume, outputs checked
    (rank 0); no corpus or config yet (they need the data)."""
    from ..formats import checkpoint
    if opts["resume"] is not None and opts["overwrite"]:
        raise ValueError("--overwrite starts a new run over an old one; --resume continues "
                         "one: give one")
    resume = checkpoint.load_checkpoint(opts["resume"]) if opts["resume"] is not None else None
    saved = runfiles.resolve_saved_paths(_resumed_extra(resume, opts["resume"]), opts["resume"]) \
        if resume is not None else {}
    # A resumed run keeps writing where the interrupted one did, unless told otherwise; a new
    # run without --out never lands on an earlier run's files (runs/2/, runs/3/...).
    out = first_given(opts["out"], saved.get("out"),
                      runfiles.DEFAULT_OUT if opts["overwrite"] else None)
    out = out if out is not None else runfiles.free_default_out()
    if opts["serve"] and opts["log_csv"] is None and resume is None:
        # --serve's live page reads per-step rows: steps.csv beside the model
        opts = {**opts, "log_csv": os.path.join(os.path.dirname(out), runfiles.STEP_LOG_NAME)}
    threads = first_given(opts["threads"], saved.get("threads"))  # None: measure at start
    if resume is not None and resume.world_size != comm.size:
        how = train_command(resume.world_size) + (" (one process, no mpiexec)"
                                                  if resume.world_size == 1 else "")
        raise ValueError(f"--resume {opts['resume']} was written by a run of "
                         f"{resume.world_size} rank(s) and this run has {comm.size}: continue "
                         f"it with `{how} --resume ...` (the global batch and the order of the "
                         f"gradient sums depend on the number of ranks)")
    if resume is not None:
        settings = _resumed_settings(resume, given, opts, saved.get("log_csv"))
    else:
        settings = _new_settings(given, opts)
    paths = runfiles.run_paths(out, first_given(opts["checkpoint"], opts["resume"]),
                               settings.log_csv)
    if resume is not None and comm.rank == 0:  # never into another run's folder
        runfiles.check_resume_outputs(paths, opts["resume"])
    health_every = first_given(opts["health_every"], settings.health_every)
    settings = dataclasses.replace(  # health.jsonl and val.csv live beside history.csv
        settings, health_every=health_every,
        health_log=paths["health_jsonl"] if health_every is not None else None,
        val_log=paths["val_csv"])
    sources = opts["data"] if resume is None else opts["data"] or saved.get("sources")
    return RunPlan(config=None, settings=settings, corpus=None, paths=paths,
                   threads=threads, threads_kept=opts["threads"] is None and threads is not None,
                   resume=resume, resume_path=opts["resume"], initial_model=initial,
                   init_from=opts["init_from"], comm=comm,
                   data_dirs=[s for s in sources or () if os.path.isdir(s)],
                   overwrite=bool(opts["overwrite"])), sources


def _load_data(plan: RunPlan, sources, opts: dict, tokenizer, on_event) -> None:
    """plan.corpus from the data sources (None: the default corpus), every output checked
    against the paths before and after reading (rank 0): a bad path fails before any data is
    read, an output that is a data file by another name (a link) once the files are known;
    then a new run's folder holding another run's files (`runfiles.check_no_other_run`)."""
    from .batches import check_same_data
    from .corpus import load_corpus
    writer = plan.comm.rank == 0  # the one rank that writes
    if writer:  # before reading any data: a bad path fails now
        runfiles.check_output_paths(plan.outputs, data_dirs=plan.data_dirs)
        if opts["init_from"] is not None:  # a fine-tune never replaces what it starts from
            runfiles.check_init_from_kept(plan.outputs, opts["init_from"])
    try:
        corpus = load_corpus(sources, plan.settings.seq_len, tokenizer=tokenizer)
    except FileNotFoundError as e:
        if plan.resume is None or opts["data"]:
            raise
        # the checkpoint's own sources: say how to point a resume at data that moved
        raise FileNotFoundError(f"{e} (the data --resume {opts['resume']} was trained on; if "
                                f"it moved, give its new path with --data)") from None
    plan.corpus = corpus
    for name, note in corpus.notes if writer and on_event is not None else ():
        on_event(CorpusNote(name, note))
    if writer:
        runfiles.check_output_paths(plan.outputs, inputs=corpus.input_files(),
                                    data_dirs=plan.data_dirs)
        if plan.resume is None and not plan.overwrite:  # a new run never eats an old one
            runfiles.check_no_other_run(plan.paths, keep=plan.inputs())
    if plan.resume is not None:
        check_same_data(plan.resume.data, corpus.train, corpus.val,
                        where=f"--resume {opts['resume']}")


def _model_config(plan: RunPlan, opts: dict, given: dict):
    """The Config of the run: the checkpoint's, the fine-tuned model's, or a new one."""
    from ..config import Config
    if plan.resume is not None:
        return Config.from_dict(plan.resume.config)
    if plan.initial_model is not None:
        cfg = plan.initial_model.cfg
        if plan.settings.seq_len > cfg.max_len:
            raise ValueError(f"--seq-len {plan.settings.seq_len} exceeds the max_len "
                             f"{cfg.max_len} of --init-from {opts['init_from']}")
        return cfg
    return new_model_config(given, plan.corpus.tokenizer.vocab_size, plan.settings.seq_len)


def _new_settings(given: dict, opts: dict) -> TrainSettings:
    """The TrainSettings of a new run: defaults, the setting options given, output options."""
    try:
        return TrainSettings(**{k: v for k, v in given.items() if k in SETTING_OPTIONS},
                             log_csv=absolute(opts["log_csv"]),
                             checkpoint_every=opts["checkpoint_every"])
    except (TypeError, ValueError) as e:
        raise ValueError(flag_spelling(str(e))) from None


def _option_dict(options) -> dict:
    """{name: value} of every OPTIONS name (None where not given), from a mapping or an
    object with attributes (an argparse Namespace).

    Raises:
        ValueError: a mapping key that is no option."""
    if isinstance(options, Mapping):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r}: not an option of glassllm train")
        return {name: options.get(name) for name in OPTIONS}
    return {name: getattr(options, name, None) for name in OPTIONS}


def check_kinds(opts: dict) -> None:
    """Every option given (not None) against its kind in OPTIONS, as the command line's parser
    checks its flags, so that a plan built in Python from a mapping gets the same one-line
    error naming the option ("--steps must be an integer, got '10'"), not a TypeError deep
    inside. Integers may be NumPy's (numbers.Integral), numbers any real; a path a string or
    an os.PathLike (made a string here), --data one path or a non-empty list of them (made a
    list), integers and numbers Python's own.

    Raises:
        ValueError: the first option of the wrong kind, named as its flag."""
    for name, value in opts.items():
        if value is None:
            continue
        what = _wrong_kind(value, OPTIONS[name])
        if what is not None:
            raise ValueError(f"--{name.replace('_', '-')} must be {what}, got {value!r}")
        if OPTIONS[name] == "paths":
            opts[name] = [os.fspath(v) for v in
                          ([value] if isinstance(value, (str, os.PathLike)) else value)]
        elif OPTIONS[name] is str:
            opts[name] = os.fspath(value)
        elif OPTIONS[name] in (int, float):  # NumPy's scalars would not go into JSON metadata
            opts[name] = OPTIONS[name](value)


def _wrong_kind(value, kind) -> str | None:
    """What `value` should be for an option of `kind` (OPTIONS), or None when it is that.
    Every str option names a file."""
    def is_path(v) -> bool:
        return isinstance(v, (str, os.PathLike))
    if kind == "paths":
        ok = is_path(value) or isinstance(value, (list, tuple)) and bool(value) and all(
            map(is_path, value))
        return None if ok else "a path or a non-empty list of paths"
    if kind is bool:
        return None if isinstance(value, bool) else "true or false"
    if kind is int:
        return None if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
            else "an integer"
    if kind is float:
        return None if isinstance(value, numbers.Real) and not isinstance(value, bool) \
            else "a number"
    if isinstance(kind, tuple):
        return None if isinstance(value, str) and value in kind else \
            f"one of {', '.join(kind)}"
    return None if is_path(value) else "a path"


def train_command(ranks: int) -> str:
    """The command that runs `glassllm train` on `ranks` ranks (a checkpoint resumes only
    under the number of ranks that wrote it)."""
    return f"mpiexec -n {ranks} glassllm train" if ranks > 1 else "glassllm train"


def flag_spelling(message: str) -> str:
    """"TrainSettings.batch_size must ..." -> "--batch-size must ...": the user typed flags."""
    return re.sub(r"TrainSettings\.(\w+)", lambda m: "--" + m.group(1).replace("_", "-"),
                  message)


def check_bounds(options, int_bounds: dict = INT_BOUNDS, float_bounds: dict = FLOAT_BOUNDS):
    """Every numeric option given (a mapping, or an object with attributes), against its
    bounds: ValueError "--flag must be ..." else. Integers in [lo, hi]; floats finite, > lo
    when hi is None (e.g. --lr), else in [lo, hi)."""
    get = options.get if isinstance(options, Mapping) else \
        (lambda name: getattr(options, name, None))
    for name, (lo, hi) in int_bounds.items():
        value = get(name)
        if value is not None and not lo <= value <= hi:
            shown = str(value) if abs(value) < 10**30 else f"{str(value)[:12]}... " \
                                                          f"({len(str(value))} digits)"
            raise ValueError(f"--{name.replace('_', '-')} must be an integer in [{lo}, {hi}], "
                             f"got {shown}")
    for name, (lo, hi) in float_bounds.items():
        value = get(name)
        if value is None:
            continue
        if not (math.isfinite(value) and (value > lo if hi is None else lo <= value < hi)):
            want = f"a finite number > {lo:g}" if hi is None else f"a number in [{lo:g}, {hi:g})"
            raise ValueError(f"--{name.replace('_', '-')} must be {want}, got {value!r}")


def absolute(path: str | None) -> str | None:
    """An absolute path (a resumed run may start elsewhere); None and "" stay as they are, so
    that an empty path is refused rather than turned into the current directory."""
    return os.path.abspath(path) if path else path


def first_given(*values):
    """The first value that is not None (an empty string counts as given: it is then refused
    as a path, not silently replaced by a default)."""
    return next((v for v in values if v is not None), None)


def _resumed_extra(resume, path: str) -> dict:
    """What `glassllm train` stored in a checkpoint's extra (out, threads, data sources),
    type-checked: ValueError naming the checkpoint for a field of the wrong type."""
    from ..checks import check_int
    extra, found = resume.extra, {}
    where = f"checkpoint {path!r}"
    for key in ("out", "log_csv"):
        if key in extra:
            if not isinstance(extra[key], str) or not extra[key]:
                raise ValueError(f"{where}: extra.{key} must be a file path, got "
                                 f"{extra[key]!r}")
            found[key] = extra[key]
    if "threads" in extra:
        lo, hi = INT_BOUNDS["threads"]
        found["threads"] = check_int(extra["threads"], f"{where}: extra.threads", lo, hi)
    data = extra.get("data", {})
    sources = data.get("sources") if isinstance(data, dict) else []
    if not isinstance(data, dict) or not (sources is None or isinstance(sources, list) and all(
            isinstance(s, str) for s in sources)):
        raise ValueError(f"{where}: extra.data.sources must be null or a list of paths, got "
                         f"{sources!r}")
    found["sources"] = sources
    return found


def new_model_config(given: dict, vocab_size: int, seq_len: int):
    """The Config of a new run: the defaults, the model options given, the data's vocabulary.

    Raises:
        ValueError: gpt2 with grouped heads, or a Config the options make invalid."""
    from ..config import Config
    model_args = {**TRAIN_MODEL_DEFAULTS, **{k: v for k, v in given.items()
                                             if k in MODEL_OPTIONS}}
    model_args.setdefault("n_kv_heads", default_kv_heads(model_args))
    if model_args["family"] == "gpt2" and model_args["n_kv_heads"] != model_args["n_heads"]:
        raise ValueError(f"--family gpt2 has no grouped-query attention: --n-kv-heads "
                         f"{model_args['n_kv_heads']} must equal --n-heads "
                         f"{model_args['n_heads']} (or be left out)")
    return Config(vocab_size=vocab_size, max_len=seq_len, **model_args)


def default_kv_heads(model_args: dict) -> int:
    """Grouped-query attention with 2 KV heads when n_heads is even (the default 4 heads ->
    2), else plain multi-head attention; GPT-2, GPT-NeoX and GPT-Neo never group their heads."""
    n_heads = model_args["n_heads"]
    if model_args["family"] not in NO_GQA_FAMILIES and isinstance(n_heads, int) and \
            n_heads % 2 == 0:
        return 2
    return n_heads


def _init_from(opts: dict, given: dict):
    """(model, tokenizer) of init_from, or (None, None) without it. A weights-only file of 257
    ids gets the byte tokenizer.

    Raises:
        ValueError: with resume, with model options, a model without a tokenizer, or a file
            that does not load (the loader's one-line reason).
    """
    if opts["init_from"] is None:
        return None, None
    from ..formats.lm import load_model_and_tokenizer
    from ..tokenizers import ByteTokenizer
    if opts["resume"] is not None:
        raise ValueError("--init-from starts a new run; --resume continues one: give one")
    flags = [f"--{k.replace('_', '-')}" for k in MODEL_OPTIONS if k in given]
    if flags:
        raise ValueError(f"--init-from {opts['init_from']} brings its own architecture; drop "
                         f"{', '.join(flags)}")
    try:
        model, tokenizer = load_model_and_tokenizer(opts["init_from"])
    except (OSError, ValueError) as e:
        raise ValueError(f"--init-from: {e}") from None
    if tokenizer is None:
        if model.cfg.vocab_size != ByteTokenizer.vocab_size:
            raise ValueError(f"--init-from {opts['init_from']} has no tokenizer, and its "
                             f"{model.cfg.vocab_size} ids are not bytes")
        tokenizer = ByteTokenizer()
    return model, tokenizer


def _resumed_tokenizer(resume, path: str):
    """The tokenizer a --init-from run stored in its checkpoint (its data is encoded with it)."""
    from ..tokenizers import tokenizer_from_json
    text = resume.extra.get("tokenizer")
    if not isinstance(text, str):
        raise ValueError(f"checkpoint {path!r}: a --init-from run without extra.tokenizer")
    return tokenizer_from_json(text)


def _resumed_settings(resume, given: dict, opts: dict, saved_log_csv: str | None = None):
    """The checkpoint's settings; options that would change them are refused (the result
    would no longer equal an uninterrupted run), output options may change.

    steps cannot grow either: lr_schedule(step, steps, ...) decays over the whole run, so
    the updates already done used a schedule that a longer run would not have used; a
    "continued" run would equal no uninterrupted run."""
    # a checkpoint older than a setting holds that setting's default (grad_accum: 1)
    saved = {**TrainSettings().to_dict(), **resume.settings}
    conflicts = [f"--{k.replace('_', '-')} {v} (checkpoint: {saved.get(k)})"
                 for k, v in given.items() if k in SETTING_OPTIONS and saved.get(k) != v]
    conflicts += [f"--{k.replace('_', '-')} {v} (checkpoint: {resume.config.get(k)})"
                  for k, v in given.items() if k in MODEL_OPTIONS and resume.config.get(k) != v]
    if conflicts:
        why = ("; the learning-rate schedule spans --steps, so a longer run is a new run"
               if "steps" in given and saved.get("steps") != given["steps"] else "")
        raise ValueError("--resume continues the saved run unchanged; drop "
                         + ", ".join(conflicts) + why)
    try:
        TrainSettings.from_dict(saved)
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {opts['resume']!r}: invalid settings: {e}") from None
    if opts["log_csv"] is not None:
        saved["log_csv"] = absolute(opts["log_csv"])
    elif saved_log_csv is not None:  # where it is now, beside the (maybe moved) checkpoint
        saved["log_csv"] = saved_log_csv
    if opts["checkpoint_every"] is not None:
        saved["checkpoint_every"] = opts["checkpoint_every"]
    try:
        return TrainSettings.from_dict(saved)
    except (TypeError, ValueError) as e:
        raise ValueError(flag_spelling(str(e))) from None


def read_small_file(path: str, option: str) -> bytes:
    """The bytes of a file an option names (a regular file, a pipe such as /dev/stdin or a
    shell's <(...)), read up to SMALL_FILE_BYTES: a longer file, or an endless device such as
    /dev/zero, is refused instead of read until memory runs out.

    Raises:
        ValueError: cannot be read, or longer than SMALL_FILE_BYTES (option and path named).
    """
    try:
        with open(path, "rb") as f:
            data = f.read(SMALL_FILE_BYTES + 1)
    except OSError as e:
        reason = f"{e.filename}: {e.strerror}" if e.filename is not None and e.strerror \
            else str(e)
        raise ValueError(f"{option} {' '.join(reason.splitlines())}") from None
    if len(data) > SMALL_FILE_BYTES:
        raise ValueError(f"{option} {path}: longer than {SMALL_FILE_BYTES >> 20} MiB; not "
                         f"read (is it the file you meant?)")
    return data


def read_options_file(path) -> dict:
    """{option: value} of a TOML file of run options (read by the standard library's tomllib),
    one key per option (d_model = 128, data = ["input.txt"]; dashes or underscores), each
    checked against its kind in OPTIONS. A BOM (Windows editors) is skipped.

    Raises:
        ValueError: the file cannot be read or is not TOML; a key that is no option, an option
            given twice, or a value of the wrong kind (the file and the key named).
    """
    import tomllib
    data = read_small_file(path, "--config")
    try:
        table = tomllib.loads(data.decode("utf-8-sig"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--config {path}: not valid TOML: {e}") from None
    seen, found = {}, {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in OPTIONS:
            raise ValueError(f"{path}: unknown key {key!r}: not an option of glassllm "
                             f"train (see glassllm train --help)")
        if name in seen:  # "d-model" and "d_model": one option set twice
            raise ValueError(f"{path}: keys {seen[name]!r} and {key!r} are the same "
                             f"option; give one")
        seen[name] = key
        found[name] = option_value(path, key, value, OPTIONS[name])
    return found


def option_value(path, key: str, value, kind):
    """`value` of `key` in an options file, checked against its kind in OPTIONS."""
    def wrong(what: str) -> ValueError:
        return ValueError(f"{path}: key {key!r} must be {what}, got {value!r}")
    if kind is bool:  # a switch
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if kind == "paths":
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not values or \
                not all(isinstance(v, str) for v in values):
            raise wrong("a string or a list of strings")
        return values
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise wrong("an integer")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
        value = float(value)
    if (kind is str or isinstance(kind, tuple)) and not isinstance(value, str):
        raise wrong("a string")
    if isinstance(kind, tuple) and value not in kind:
        raise wrong(f"one of {', '.join(map(str, kind))}")
    return value
