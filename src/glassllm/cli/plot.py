"""`glassllm plot`: a run's loss and learning-rate curves (and health panels) as images."""
from __future__ import annotations

import os

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
    from ..lens.plots import find_history, plot_health, plot_history

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
