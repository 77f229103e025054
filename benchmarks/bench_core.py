"""Core speed: build+lower+compile time and points/s of one vectorized call vs a per-point Python loop,
for DeepSeek-V3 decode on GB200. Prints ratios measured in this run (no assertions: the machine is shared)."""
import argparse
import time

import numpy as np

import graphsim as gs
from graphsim.lowering.evaluate import evaluate_reference


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--loop-points", type=int, default=300, help="points timed in the per-point loops")
    a = ap.parse_args()
    t0 = time.perf_counter()
    c = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=4, ep=4)), "gb200")
    t1 = time.perf_counter()
    rng = np.random.default_rng(0)
    P = a.points
    wl = gs.Workload(("decode",), rng.integers(1, 512, (P, 1)), np.ones((P, 1)), rng.integers(1024, 131072, (P, 1)))
    c.evaluate(wl)  # first call at this chunk shape compiles
    t2 = time.perf_counter()
    out = c.evaluate(wl)["forward"]
    t3 = time.perf_counter()
    n = min(a.loop_points, P)
    ut = c.unit_time()
    t4 = time.perf_counter()
    loop_ref = [evaluate_reference(c.program, wl.point(i), ut).forward[0] for i in range(n)]
    t5 = time.perf_counter()
    loop_jit = [c.evaluate(wl.point(i))["forward"][0] for i in range(n)]
    t6 = time.perf_counter()
    assert np.allclose(loop_ref, out[:n], rtol=1e-9) and np.allclose(loop_jit, out[:n], rtol=1e-9)
    vec = P / (t3 - t2)
    ref = n / (t5 - t4)
    jit1 = n / (t6 - t5)
    g = c.program
    print(f"DeepSeek-V3 decode on GB200 tp4/ep4: {len(c.graph.ops)} ops -> {g.n_classes} cost classes, "
          f"{g.n_segments} segments, {len(g.features)} features")
    print(f"build+lower: {t1 - t0:.2f} s; first vectorized call incl. JAX compile: {t2 - t1:.2f} s")
    print(f"vectorized: {P:,} points in {t3 - t2:.3f} s = {vec:,.0f} points/s")
    print(f"per-point loop, NumPy full graph: {ref:,.0f} points/s  -> vectorized is {vec / ref:,.0f}x faster")
    print(f"per-point loop, one kernel call each: {jit1:,.0f} points/s  -> vectorized is {vec / jit1:,.0f}x faster")


if __name__ == "__main__":
    main()
