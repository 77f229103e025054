"""`graphsim serve-sim` speed and memory: requests simulated per second (no assertions).

Targets (issue 27): a one-hour trace of ~12 k requests in < 30 s on 2 cores; 1 M requests in minutes with bounded
memory. Each size runs DeepSeek-V4.1-Flash on GB200 TP4, one replica per 12 k requests an hour, on a synthetic
agent-session trace (prompts re-reading their history, so the prefix cache works), and reports the wall time of the
simulation (the surface build included), the step count and the peak resident memory.

    python benchmarks/bench_serve_sim.py [--requests 12000,100000] [--mooncake PATH]
"""
from __future__ import annotations

import argparse
import resource
import time

import graphsim as gs
from graphsim.serving import Deployment, load_trace, simulate, synthetic

SESSIONS = {"turns": {"dist": "uniform", "low": 2, "high": 8}, "think_s": {"dist": "lognormal", "mean": 30, "cv": 1},
            "tool_tokens": {"dist": "lognormal", "mean": 800, "cv": 1}, "system_tokens": 2000}


def run(trace, replicas: int, label: str) -> None:
    t0 = time.perf_counter()
    res = simulate(trace, Deployment("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(tp=4), replicas=replicas),
                   validate=64)
    dt = time.perf_counter() - t0
    s = res.summary
    steps = s["steps"]["decode_only"] + s["steps"]["mixed"]
    print(f"{label}: {len(trace):,} requests on {replicas} replica(s) in {dt:.1f} s = {len(trace) / dt:,.0f} req/s; "
          f"{steps:,} steps; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB; "
          f"surface max error {res.surface_error['max_abs_rel']:.2%}; Little {res.checks['littles_law']['relative_error']:.1e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", default="12000,100000")
    ap.add_argument("--mooncake", default=None, help="also the Mooncake trace at this path")
    a = ap.parse_args()
    if a.mooncake:
        run(load_trace(a.mooncake), 1, "mooncake")
    for n in (int(x) for x in a.requests.split(",")):
        per_hour = 12000
        trace = synthetic(requests=n, rate=n / 3600.0 / 5, seed=1, sessions=SESSIONS,
                          input={"dist": "lognormal", "mean": 4000, "cv": 1, "max": 100000},
                          output={"dist": "lognormal", "mean": 300, "cv": 1, "max": 8000})
        run(trace, max(1, n // per_hour), f"synthetic {n:,}")


if __name__ == "__main__":
    main()
