"""Evaluation speed of the kernel, measured in one run (printed, no assertions: the machine is shared).

Per workload: ops / cost classes / segments / levels, the first call at the chunk shape (JIT + one pass),
warm points/s over 1M decode-step (or prefill) points, in "exact" (float64) and "fast" (float32) precision,
and the largest relative difference of both against the NumPy full-graph reference on sampled points.

    python benchmarks/bench_eval.py [--points 1000000] [--check 200] [--only NAME]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import graphsim as gs
from graphsim.lowering.evaluate import reference_outputs

CASES = {  # name: (model, hw, mapping, policies, request kind)
    "v3-chain": ("deepseek-v3", "gb200", {"tp": 4, "ep": 4}, {}, "decode"),
    "v41-chain": ("deepseek-v4.1-flash", "gb300", {"tp": 4, "ep": 4}, {}, "decode"),
    "v41-tbo": ("deepseek-v4.1-flash", "gb300", {"tp": 4, "ep": 4}, {"overlap": "two-batch"}, "decode"),
    "v41-prefill": ("deepseek-v4.1-flash", "gb300", {"tp": 4, "ep": 4}, {}, "prefill"),
    "v41-dspark": ("deepseek-v4.1-flash", "gb300", {"tp": 4, "ep": 4}, {"dspark": "on"}, "dspark"),
}


def workload(kind: str, P: int, rng) -> gs.Workload:
    if kind == "prefill":  # prompts 256..32K tokens, 1..8 requests
        return gs.Workload(("prefill",), rng.integers(1, 8, (P, 1)), rng.integers(256, 32768, (P, 1)), np.zeros((P, 1)))
    new = 4.0 if kind == "dspark" else 1.0  # DSpark: verify 3 drafts per step
    return gs.Workload(("decode",), rng.integers(1, 512, (P, 1)), np.full((P, 1), new),
                       rng.integers(1024, 131072, (P, 1)))


def plan_for(kind: str, mapping: dict, policies: dict) -> gs.Plan:
    req = {"prefill": "prefill:8192x2", "decode": "decode:4096x64", "dspark": "decode:8192x64v3"}[kind]
    return gs.Plan([req], gs.ParallelMapping(**mapping), gs.Policies(**policies))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--check", type=int, default=200, help="points compared with the NumPy full-graph reference")
    ap.add_argument("--only", default=None, help="comma-separated case names: " + ", ".join(CASES))
    a = ap.parse_args()
    names = a.only.split(",") if a.only else list(CASES)
    import jax  # start JAX's backend outside the timings (once per process, not per program)

    jax.numpy.ones(1).block_until_ready()
    print(f"{'workload':<12} {'ops':>5} {'classes':>7} {'segments':>8} {'levels':>6}  {'precision':<9} "
          f"{'first call':>10} {'warm':>12} {'max rel err':>11}")
    for name in names:
        model, hw, mapping, policies, kind = CASES[name]
        c = gs.compile_plan(model, plan_for(kind, mapping, policies), hw)
        rng = np.random.default_rng(0)
        wl = workload(kind, a.points, rng)
        sample = gs.Workload(wl.kinds, *(x[: a.check] for x in (wl.count, wl.new, wl.past)))
        ref = reference_outputs(c.program, sample, c.unit_time(), c.overhead, None, ("forward", "stages"))
        lay = c.evaluator.layout
        for precision in ("exact", "fast"):
            t0 = time.perf_counter()
            c.evaluator(wl, c.unit_time(), c.overhead, ("forward", "stages"), precision)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = c.evaluator(wl, c.unit_time(), c.overhead, ("forward", "stages"), precision)
            warm = time.perf_counter() - t0
            err = max(float(np.max(np.abs(out[k][: a.check] - ref[k]) / np.maximum(np.abs(ref[k]), 1e-300)))
                      for k in ref)
            print(f"{name:<12} {c.program.n_ops:>5} {c.program.n_classes:>7} {c.program.n_segments:>8} "
                  f"{lay.n_levels:>6}  {precision:<9} {first - warm:>8.2f} s {a.points / warm / 1e6:>8.2f} M/s "
                  f"{err:>11.1e}", flush=True)


if __name__ == "__main__":
    main()
