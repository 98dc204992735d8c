"""What the glass box's taps cost when no trace is open: GlassLM with them vs without.

    python bench/trace_overhead.py                  # config M, forward and training step
    python bench/trace_overhead.py --config S --repeats 5

The tap-free model is glassllm/model.py itself with its taps taken out by an AST rewrite
(`tap(name, value)` -> `value`, `attend(i, q, k, v, start)` -> `F.causal_attention(q, k, v,
q_start=start)`, `with watch(...): body` -> `body`, `hook_for(...)` -> `None`), loaded as a
second module: the same code, minus the taps. Both models get the same weights (their logits
are checked to be bit-identical), and their steps are interleaved A/B/A/B in one process so a
busy machine slows both alike. Prints the median time of each and the median of the per-pair
ratios, plus a bound that does not depend on noise: the taps one forward passes (counted by a
hook) times the measured cost of one untraced tap (its f-string name included), plus one
`watch`, over the forward's time. On a busy machine the timed ratios scatter by several
percent either way; instructions do not: `--one hooked` / `--one plain` run one side alone,
for

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python bench/trace_overhead.py \
        --one hooked --repeats 1 --threads 1      # and --one plain: compare the totals
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import ast
import importlib.util
import inspect
import json
import os
import sys
import time
import timeit

import numpy as np

import glassllm
from glassllm import model as traced_module
from glassllm import taps
from glassllm.tensor import no_grad

TAP_NAMES = {"tap", "attend", "watch", "hook_for"}


class _DropTaps(ast.NodeTransformer):
    def visit_Call(self, node):
        self.generic_visit(node)
        name = getattr(node.func, "id", None)
        if name == "tap":
            return node.args[1]
        if name == "attend":
            _, q, k, v, start = node.args
            func = ast.Attribute(ast.Name("F", ast.Load()), "causal_attention", ast.Load())
            return ast.copy_location(ast.Call(func, [q, k, v], [ast.keyword("q_start", start)]),
                                     node)
        if name == "hook_for":
            return ast.copy_location(ast.Constant(None), node)
        return node

    def visit_With(self, node):
        self.generic_visit(node)
        calls = [item.context_expr for item in node.items]
        if len(calls) == 1 and getattr(calls[0].func, "id", None) == "watch":
            return node.body
        return node


def untraced_model_module():
    """glassllm.model rebuilt without its taps."""
    tree = _DropTaps().visit(ast.parse(inspect.getsource(traced_module)))
    ast.fix_missing_locations(tree)
    spec = importlib.util.spec_from_loader("glassllm._model_without_taps", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "glassllm"
    sys.modules[spec.name] = module
    exec(compile(tree, "<model.py without taps>", "exec"), module.__dict__)
    for cls in (module.Attention, module.MLP, module.Block, module.GlassLM):
        for method in ("__call__", "forward", "embed", "loss"):
            code = getattr(getattr(cls, method, None), "__code__", None)
            if code is not None and TAP_NAMES & set(code.co_names):
                raise RuntimeError(f"the rewrite left a tap in {cls.__name__}.{method}")
    return module


class _CountTaps(taps.Hook):
    def __init__(self, model):
        super().__init__(model)
        self.calls = 0

    def tap(self, name, value):
        self.calls += 1
        return value

    def attend(self, layer, q, k, v, q_start):
        self.calls += 1
        return super().attend(layer, q, k, v, q_start)


def taps_per_forward(model, x) -> int:
    """How many tap/attend calls one forward makes (a counting hook bound to the model)."""
    counter = _CountTaps(model)
    taps.install(counter)
    try:
        with no_grad():
            model(x[:, :8])
    finally:
        taps.uninstall(counter)
    return counter.calls


def untraced_costs(model, x) -> tuple[float, float]:
    """Seconds of one tap with no hook (f-string name included) and of one `watch`."""
    names = dict(tap=taps.tap, watch=taps.watch, model=model, x=x, i=3)
    tap_s = min(timeit.repeat('tap(f"blocks.{i}.mlp.hidden_post", x)', globals=names,
                              number=200_000, repeat=5)) / 200_000
    watch_s = min(timeit.repeat("with watch(model, x, 0, None): pass", globals=names,
                                number=50_000, repeat=5)) / 50_000
    return tap_s, watch_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="M", choices=sorted(common.CONFIGS))
    parser.add_argument("--repeats", type=int, default=15, help="A/B pairs per measurement")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads on both sides (default: all cores)")
    parser.add_argument("--one", choices=("hooked", "plain"), default=None,
                        help="only run that model's training step --repeats times, untimed: "
                             "for an instruction count, e.g. under valgrind --tool=callgrind")
    args = parser.parse_args()
    common.set_threads(args.threads)
    spec = common.CONFIGS[args.config]
    cfg = glassllm.Config(**spec["model"])
    plain_module = untraced_model_module()
    hooked = traced_module.GlassLM(cfg, seed=0)
    plain = plain_module.GlassLM(plain_module.Config(**spec["model"]), seed=0)
    plain.load_state_dict(hooked.state_dict())
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (spec["batch"], spec["seq"] + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    with no_grad():
        assert np.array_equal(hooked(x).data, plain(x).data), "rewrite changed the model"

    def forward(m):
        with no_grad():
            m(x)

    def train_step(m):
        loss = m.loss(x, y)
        m.zero_grad()
        loss.backward()

    if args.one is not None:
        for _ in range(args.repeats):
            train_step(hooked if args.one == "hooked" else plain)
        return
    results = {"config": args.config, "load_before": os.getloadavg()[0]}
    for label, fn in (("forward", forward), ("forward+backward", train_step)):
        for m in (hooked, plain):  # warm-up
            fn(m)
        times = {"hooked": [], "plain": []}
        for i in range(args.repeats):
            order = (hooked, plain) if i % 2 == 0 else (plain, hooked)
            for m in order:
                t0 = time.perf_counter()
                fn(m)
                times["hooked" if m is hooked else "plain"].append(time.perf_counter() - t0)
        ratios = np.array(times["hooked"]) / np.array(times["plain"])
        results[label] = dict(hooked_s=common.median(times["hooked"]),
                              plain_s=common.median(times["plain"]),
                              overhead_pct=100 * (float(np.median(ratios)) - 1))
    # the noise-free bound: taps per forward x cost of one untraced tap, + one watch
    tap_s, watch_s = untraced_costs(hooked, x)
    checks = taps_per_forward(hooked, x)
    results["taps_per_forward"] = checks
    results["ns_per_tap"] = tap_s * 1e9
    results["ns_per_watch"] = watch_s * 1e9
    results["bound_pct"] = 100 * (checks * tap_s + watch_s) / results["forward"]["plain_s"]
    results["load_after"] = os.getloadavg()[0]
    print(f"config {args.config}: B={spec['batch']} T={spec['seq']}, {args.repeats} A/B pairs, "
          f"load {results['load_before']:.2f} -> {results['load_after']:.2f}")
    for label in ("forward", "forward+backward"):
        r = results[label]
        print(f"  {label:17s} hooks {r['hooked_s'] * 1e3:8.1f} ms, without {r['plain_s'] * 1e3:8.1f}"
              f" ms, median ratio {r['overhead_pct']:+.2f}%")
    print(f"  {checks} taps per forward x {results['ns_per_tap']:.0f} ns + one watch "
          f"{results['ns_per_watch']:.0f} ns = {results['bound_pct']:.5f}% of the forward")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
