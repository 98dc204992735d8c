"""Busy start: a process whose first op runs while another program holds a core, against one
started idle.

    python bench/busy_start.py                    # S and M, a 2 s hog at the start
    python bench/busy_start.py --config M --steps 12
    python bench/busy_start.py --no-fixed         # skip the "count fixed at the first op" run

Each side is a fresh process training through the plain Python API (no thread settings: the
engine's process default, `glassllm.engine.cpu.apply_default_threads`), the model and batches
of bench/train_speed.py. For the busy side, a hog process spinning one core starts just
before the trainee and stops `--hog` seconds later (default 2 s); the trainee's first op
measures the load during the burst and starts on fewer threads. The figure is the median step
time of the steps that start after the hog has ended and the thread count has had time to
follow (`--settle`, default 3 s: the process default reads the load at most every
REVISIT_SECONDS and moves up after UP_READINGS idle readings), over the same median of the
process started idle. The target is within 10%.

The third run ("fixed") is the behaviour before the count was revisited: the same busy start,
then the count chosen at the first op pinned for the rest of the process
(`cpu.set_default_threads`), which used to cost an M run 1.8x per step for its whole life.

Each side reports the load of other processes over its whole child (in cores: /proc/stat busy
time of this process's CPUs minus the CPU time of this process and its waited-for children,
the hog among them), and says so when the machine was not quiet; `--require-quiet` waits for
a quiet machine before each side and repeats a disturbed one (bench/common.py).
Hog and trainee share this process's CPUs (affinity is
inherited), so `taskset -c 0,1 python bench/busy_start.py` gives the 2-core case on a bigger
machine.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import json
import subprocess
import sys
import time

from glassllm.engine import cpu, parallel

# enough steps that the idle side too has 20 or more after hog + settle (an S step ~0.1 s)
DEFAULT_STEPS = {"S64": 150, "S": 100, "M": 16, "L": 6}
HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def child(name: str, steps: int, fix_after_first: bool) -> None:
    """Train `steps` steps of config `name` through the plain API; print one JSON line: each
    step's wall-clock start (time.time()), seconds and the thread count after it."""
    from glassllm.model import Config, GlassLM
    from train_speed import glassllm_stepper, make_batches

    spec = common.CONFIGS[name]
    cfg = Config(**spec["model"])
    step = glassllm_stepper(GlassLM(cfg, seed=0))
    batches = make_batches(cfg, spec["batch"], spec["seq"], steps)
    rows = []
    for i, (x, y) in enumerate(batches):
        start, t0 = time.time(), time.perf_counter()
        step(x, y)
        seconds = time.perf_counter() - t0
        if i == 0 and fix_after_first:  # the old default: kept for the life of the process
            cpu.set_default_threads(parallel.get_num_threads())
        rows.append(dict(start=start, seconds=seconds, threads=parallel.get_num_threads()))
    print(json.dumps(rows))


def run_side(name: str, steps: int, hog_s: float, fixed: bool = False) -> tuple[list, float]:
    """(step rows, the wall-clock time the hog ended; with no hog, the child's start)."""
    command = [sys.executable, sys.argv[0], "--child", name, "--steps", str(steps)]
    if fixed:
        command.append("--fix-after-first")
    hog = None
    begin = time.time()
    if hog_s > 0:
        hog = subprocess.Popen([sys.executable, "-c", HOG.format(seconds=hog_s)])
        time.sleep(0.05)  # the hog spinning before the trainee's first op
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if hog is not None:
        hog.wait()
    if out.returncode:
        raise SystemExit(f"child {command[2:]} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1]), begin + hog_s


def after(rows: list, since: float) -> list:
    """The steps that started at or after wall-clock time `since`."""
    return [r for r in rows if r["start"] >= since]


def runs(values: list) -> str:
    """[1, 1, 1, 2, 2] as "1x3 2x2": the thread count over the steps, run by run."""
    out = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return " ".join(f"{v}x{n}" for v, n in out)


def describe(label: str, side: tuple, since: float, reference: float | None) -> float:
    """Print one side's line; return its median step seconds over the steps after `since`.
    side: ((rows, hog end), Load of other processes over the whole child, hog excluded)."""
    (rows, _), load = side
    kept = after(rows, since)
    if not kept:
        raise SystemExit(f"{label}: no step started after the hog and the settle time; "
                         f"use more --steps")
    median = common.median([r["seconds"] for r in kept])
    ratio = f" = {median / reference:.2f}x started idle" if reference else ""
    threads = runs([r["threads"] for r in rows])
    print(f"  {label:34} {median:7.3f} s/step over {len(kept):2} steps{ratio}; other "
          f"processes {common.load_text(load)} cores; threads (count x steps) {threads}")
    if load.other_cores is not None and load.other_cores >= cpu.BUSY_CORES:
        print(f"  {'':34} (not a quiet machine: this figure does not measure the busy start)")
    return median


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", choices=list(common.CONFIGS),
                        default=["S", "M"])
    parser.add_argument("--steps", type=int, help="steps per process (default: S 100, M 16)")
    parser.add_argument("--hog", type=float, default=2.0, help="seconds the hog spins")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds after the hog before the steps that count")
    parser.add_argument("--no-fixed", action="store_true",
                        help="skip the run with the count fixed at the first op")
    common.add_load_arguments(parser)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--fix-after-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.fix_after_first)
        return
    print(f"at start: {cpu.measure_load(1.0)}")
    print("each side's load: other processes over the whole child (the hog is this bench's "
          "own); --require-quiet waits for a quiet machine and repeats a disturbed side")
    print(f"revisit every {cpu.REVISIT_SECONDS} s, up after {cpu.UP_READINGS} idle readings; "
          f"hog {args.hog} s on one core, steps counted from {args.settle} s after it\n")
    results = {}
    for name in args.config:
        steps = args.steps or DEFAULT_STEPS[name]
        print(f"[{name}]")

        def side(hog_s, fixed=False, label=""):  # the hog is a waited-for child: not "other"
            return common.measure_quietly(lambda: run_side(name, steps, hog_s, fixed), args,
                                          f"{name} {label}")

        idle = side(0.0, label="idle")
        busy = side(args.hog, label="busy")
        # the idle side's steps from the same moment of its life as the busy side's
        idle_s = describe("started idle", idle, idle[0][1] + args.hog + args.settle, None)
        busy_s = describe(f"started during a {args.hog:g} s hog", busy,
                          busy[0][1] + args.settle, idle_s)
        results[name] = busy_s / idle_s
        if not args.no_fixed:
            fixed = side(args.hog, fixed=True, label="fixed")
            describe("same, count fixed at the first op", fixed, fixed[0][1] + args.settle,
                     idle_s)
    verdict = ", ".join(f"{n} {r:.2f}x" for n, r in results.items())
    print(f"\nafter the hog vs started idle: {verdict} (target: within 1.10x)")


if __name__ == "__main__":
    main()
