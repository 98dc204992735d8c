"""`glassllm serve`: the browser app on a model and/or a training run; and the server that
`glassllm train --serve` starts on the run's folder (`RunPlan.run_dir`)."""
from __future__ import annotations

import os
import sys

from .common import (TOKENIZER_HELP, UsageError, add_device_option, model_with_tokenizer,
                     non_negative_int, path_arg)

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
    p.add_argument("--features", metavar="DIR", type=path_arg,
                   help="the Features view's dictionaries: a SAELens directory (cfg.json + "
                        "sae_weights.safetensors), or a directory of them; the page opens "
                        "these only, by name")
    p.add_argument("--features-data", metavar="D", type=path_arg,
                   help="the corpus of the Features view's top contexts and histograms: a "
                        "UTF-8 text file or a `glassllm prepare` token file/directory (its "
                        "first 16,384 tokens)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; "
                        "0.0.0.0 opens it to the network, with a warning)")
    p.add_argument("--port", type=non_negative_int, default=SERVE_PORT,
                   help=f"port (default {SERVE_PORT}; 0 takes a free one, the URL says which)")
    p.add_argument("--open", action="store_true", help="open the page in the web browser")
    p.add_argument("--threads", type=int, metavar="N",
                   help="threads the analyses compute on (default: one per core, or the cores "
                        "other processes leave free when the machine is busy)")
    add_device_option(p)  # the --model given; models opened from --run stay on the CPU
    p.set_defaults(func=run_serve)


def run_serve(args) -> int:
    """`glassllm serve`: load the model, start the server, print its URL, serve until Ctrl-C."""
    try:
        from ..serve.app import Server, run
    except ImportError as e:
        if getattr(e, "name", None) in ("aiohttp", "multidict", "yarl"):
            raise UsageError("glassllm serve needs aiohttp: pip install 'glassllm[serve]'") \
                from None
        raise
    from ..serve.models import Loaded, ModelStore

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
    from ..serve.security import is_loopback
    if not is_loopback(args.host):
        print(f"glassllm serve: warning: --host {args.host} lets other machines reach this "
              f"server (plain HTTP, no TLS); anyone with its URL and token can use it",
              file=sys.stderr, flush=True)
    server = Server(ModelStore(main_model, args.run), run_dir=args.run, bind=args.host,
                    features=_feature_store(args))

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


def training_server(port: int):
    """`glassllm train --serve`: a function of the run's plan giving the context (`execute`'s
    `around`) in which `glassllm serve --run RUN_DIR` runs as a child process on the writing
    rank, RUN_DIR the plan's `run_dir`; its URL printed. Stopped (SIGINT, then killed after
    5 s) at the end. Ctrl-C in the terminal reaches both."""
    import contextlib

    def around(plan):
        if plan.comm.rank != 0:
            return contextlib.nullcontext()
        return _served(_start_server(plan.run_dir, port))
    return around


def _start_server(run_dir: str, port: int):
    """The `glassllm serve --run run_dir` child, once it has printed its URL (which is printed
    here as "serve: URL").

    Raises:
        UsageError: it printed no URL within 60 s (it is killed)."""
    import select
    import subprocess
    command = [sys.executable, "-m", "glassllm.cli", "serve", "--run", run_dir,
               "--port", str(port), "--threads", "1"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([child.stdout], [], [], 60)
    line = child.stdout.readline().strip() if ready else ""
    if not line.startswith("glassllm serve: http"):
        child.kill()
        child.wait()
        raise UsageError(f"--serve: the server did not start ({line or 'no URL in 60 s'})")
    print(f"serve: {line.split(': ', 1)[1]}", flush=True)
    return child


def _served(child):
    """Context: `child` (the server) is stopped on exit: SIGINT, then killed after 5 s."""
    import contextlib
    import signal
    import subprocess

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


def _feature_store(args):
    """The Features view's dictionaries (`glassllm.serve.features.FeatureStore`), or None."""
    if args.features is None:
        if args.features_data is not None:
            raise UsageError("--features-data needs --features DIR (the dictionaries)")
        return None
    if not os.path.isdir(args.features):
        raise UsageError(f"--features {args.features}: not a directory")
    if args.features_data is not None and not os.path.exists(args.features_data):
        raise UsageError(f"--features-data {args.features_data}: no such file or directory")
    from ..serve.features import MAX_DICTIONARIES, FeatureStore
    store = FeatureStore(args.features, args.features_data)
    found = len(store.all_names())
    if not found:
        raise UsageError(f"--features {args.features}: no dictionary there (a directory "
                         f"holding cfg.json, or sub-directories that do)")
    if found > MAX_DICTIONARIES:
        print(f"glassllm serve: warning: --features {args.features} holds {found} "
              f"dictionaries; the Features view lists the first {MAX_DICTIONARIES} by name",
              flush=True)
    return store
