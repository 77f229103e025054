"""OP / Hybrid view speed against the SOL view, measured in one run (ratios, no assertions; by the wall clock and
by CPU time, the steadier of the two on a shared machine).

1. The kernel: DeepSeek-V3 decode on GB200 (TP4/EP4) and DeepSeek-V4.1-Flash on GB200 (TP4/EP4, Hybrid), a
   batch x context grid evaluated by one vectorized ``Compiled.evaluate`` per view, warm (the first call's JIT
   is timed apart).
2. The sweep: the same DeepSeek-V3 grid through ``graphsim.sweep`` (grid chunks, validation, metrics, the
   table), one spec per view, in memory.

    python benchmarks/bench_measured.py [DIR] [--points 1000000] [--backend trtllm@1.3.0rc20]

DIR: a folder of measured tables (default: the tests' fixture, tests/data/measured).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import graphsim as gs
from graphsim.views.measured.view import ViewSpec

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured"


def grid(points: int) -> gs.Workload:
    n = int(round(points ** 0.5))
    b, ctx = np.meshgrid(np.linspace(1, 1024, n).round(), np.geomspace(1024, 131072, n).round())
    b, ctx = b.ravel(), ctx.ravel()
    return gs.Workload(("decode",), b[:, None], np.ones((len(b), 1)), ctx[:, None])


def rate(c, wl) -> tuple[float, float, float, np.ndarray]:
    """Warm points/s by the wall clock (one call) and by CPU time (best of 3: steadier on a shared machine),
    the first calls' time (JIT) and the forward times."""
    small = gs.Workload(wl.kinds, wl.count[:8], wl.new[:8], wl.past[:8])
    t0 = time.perf_counter()
    c.evaluate(small, outputs=("forward",))
    c.evaluate(wl, outputs=("forward",))  # JIT for the chunk shape
    t1 = time.perf_counter()
    out = c.evaluate(wl, outputs=("forward",))["forward"]
    t2 = time.perf_counter()
    cpu = []
    for _ in range(3):
        p = time.process_time()
        c.evaluate(wl, outputs=("forward",))
        cpu.append(time.process_time() - p)
    return wl.points / (t2 - t1), wl.points / min(cpu), t1 - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("measured", nargs="?", default=str(FIXTURE))
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--backend", default="trtllm@1.3.0rc20")
    a = ap.parse_args()
    wl = grid(a.points)
    print(f"{wl.points:,} decode points (batch 1..1024 x context 1K..128K), warm points/s")
    for model, views in (("deepseek-v3", ("sol", "op", "hybrid")), ("deepseek-v4.1-flash", ("sol", "hybrid"))):
        base = None
        for view in views:
            spec = None if view == "sol" else ViewSpec(view, a.measured, a.backend)
            t0 = time.perf_counter()
            c = gs.compile_plan(model, gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=4, ep=4)), "gb200", view=spec)
            build = time.perf_counter() - t0
            r, rc, jit, out = rate(c, wl)
            base = base or (r, rc)
            print(f"  {model:<20} {view:<7} {r:>12,.0f} pts/s  ({r / base[0]:5.2f} of SOL; by CPU time "
                  f"{rc:>10,.0f}, {rc / base[1]:5.2f})  compile+bind {build:5.2f} s, first calls {jit:5.2f} s, "
                  f"classes {c.program.n_classes}, median forward {np.median(out) * 1e3:.3f} ms")
    sweep_rates(a.measured, a.backend, int(round(a.points ** 0.5)))


def sweep_rates(measured: str, backend: str, n: int) -> None:
    from graphsim.sweep import run

    print(f"sweep path, DeepSeek-V3 GB200 TP4/EP4, {n * n:,} points (batch x context), points/s")
    base = None
    for view in ("sol", "op", "hybrid"):
        structure = {"model": "deepseek-v3", "hw": "gb200", "mapping": {"tp": 4, "ep": 4}, "view": view}
        if view != "sol":
            structure.update(measured=measured, backend=backend)
        spec = {"name": f"bench-{view}", "structure": structure,
                "axes": {"decode.count": {"start": 1, "stop": 1024, "num": n},
                         "decode.context": {"start": 1024, "stop": 131072, "num": n, "scale": "log"}}}
        run(spec)  # compile outside the timing
        t0 = time.perf_counter()
        res = run(spec)
        r = n * n / (time.perf_counter() - t0)
        base = base or r
        print(f"  {view:<7} {r:>12,.0f} pts/s  ({r / base:5.2f} of SOL)  rows {len(res.to_pandas()):,}")


if __name__ == "__main__":
    main()
