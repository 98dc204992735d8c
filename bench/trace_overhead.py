"""What the glass box's hooks cost when no trace is active: GlassLM with them vs without.

    python bench/trace_overhead.py                  # config M, forward and training step
    python bench/trace_overhead.py --config S --repeats 5

The hook-free model is glassllm/model.py itself with every `_trace` check taken out by an AST
rewrite (`if _trace is not None: ...` dropped, `if _trace is None: A else: B` -> A), loaded
as a second module: the same code, minus the hooks. Both models get the same weights (their
logits are checked to be bit-identical), and their steps are interleaved A/B/A/B in one
process so a busy machine slows both alike. Prints the median time of each and the median
of the per-pair ratios, plus a bound that does not depend on noise: the number of hook
checks one forward makes times the measured cost of one check, over the forward's time.
On a busy machine the timed ratios scatter by several percent either way; instructions do
not: `--one hooked` / `--one plain` run one side alone, for

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
from glassllm.tensor import no_grad


class _DropHooks(ast.NodeTransformer):
    @staticmethod
    def _hook_test(node):
        """True for `_trace is None`, False for `_trace is not None`, else None."""
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name)
                and node.left.id == "_trace" and len(node.ops) == 1
                and isinstance(node.comparators[0], ast.Constant)
                and node.comparators[0].value is None):
            return isinstance(node.ops[0], ast.Is)
        return None

    def visit_If(self, node):
        value = self._hook_test(node.test)  # before generic_visit rewrites the test
        self.generic_visit(node)
        if value is None:
            return node
        return (node.body if value else node.orelse) or None

    def visit_Compare(self, node):
        value = self._hook_test(node)
        return node if value is None else ast.copy_location(ast.Constant(value), node)


def untraced_model_module():
    """glassllm.model rebuilt without its trace hooks."""
    module = rewritten_model_module(_DropHooks(), "_model_without_hooks")
    if "_trace" in {n for n in module.GlassLM.forward.__code__.co_names}:
        raise RuntimeError("the rewrite left a `_trace` check in GlassLM.forward")
    return module


class _CountHooks(_DropHooks):
    """Each `_trace` check becomes `_hook_count(value)`: counts, and answers "no trace"."""

    def visit_If(self, node):
        self.generic_visit(node)
        return node

    def visit_Compare(self, node):
        value = self._hook_test(node)
        if value is None:
            return node
        call = ast.Call(ast.Name("_hook_count", ast.Load()), [ast.Constant(value)], [])
        return ast.copy_location(call, node)


def rewritten_model_module(transformer, name):
    """glassllm.model with `transformer` applied to its source, as module glassllm.<name>."""
    tree = transformer.visit(ast.parse(inspect.getsource(traced_module)))
    ast.fix_missing_locations(tree)
    spec = importlib.util.spec_from_loader(f"glassllm.{name}", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "glassllm"
    sys.modules[spec.name] = module
    exec(compile(tree, f"<model.py: {name}>", "exec"), module.__dict__)
    return module


def hook_checks_per_forward(spec, x) -> int:
    """How many `_trace` checks one forward makes (a rewritten copy counts them)."""
    counted = rewritten_model_module(_CountHooks(), "_model_counting_hooks")
    calls = []
    counted._hook_count = lambda value: calls.append(1) or value
    with no_grad():
        counted.GlassLM(counted.Config(**spec["model"]))(x[:, :8])
    return len(calls)


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
    # the noise-free bound: checks per forward x cost of one check
    traced_module._trace = None
    per_check = min(timeit.repeat("_trace is not None", globals=vars(traced_module),
                                  number=1_000_000, repeat=5)) / 1_000_000
    checks = hook_checks_per_forward(spec, x)
    results["checks_per_forward"] = checks
    results["ns_per_check"] = per_check * 1e9
    results["bound_pct"] = 100 * checks * per_check / results["forward"]["plain_s"]
    results["load_after"] = os.getloadavg()[0]
    print(f"config {args.config}: B={spec['batch']} T={spec['seq']}, {args.repeats} A/B pairs, "
          f"load {results['load_before']:.2f} -> {results['load_after']:.2f}")
    for label in ("forward", "forward+backward"):
        r = results[label]
        print(f"  {label:17s} hooks {r['hooked_s'] * 1e3:8.1f} ms, without {r['plain_s'] * 1e3:8.1f}"
              f" ms, median ratio {r['overhead_pct']:+.2f}%")
    print(f"  {checks} hook checks per forward x {results['ns_per_check']:.0f} ns = "
          f"{results['bound_pct']:.5f}% of the forward")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
