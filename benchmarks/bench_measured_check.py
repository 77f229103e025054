"""`graphsim measured check` speed: rows priced per second over a store (no assertions).

Cold (probes built: each fixed shape's op made with graphsim's rules, sharded and lowered once) and warm
(probes cached: the vectorized pricing and the mapping's read-back alone), in one process.

    python benchmarks/bench_measured_check.py [DIR] [--device h200] [--family gemm]

DIR: a folder of measured tables (default: the tests' fixture, tests/data/measured). On the full
aiconfigurator 0.12 import (10.4 M rows) the whole store is one `graphsim measured check DIR`.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from graphsim.views.measured import check

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("measured", nargs="?", default=str(FIXTURE))
    ap.add_argument("--device", action="append", default=None)
    ap.add_argument("--family", action="append", default=None)
    a = ap.parse_args()
    t0 = time.perf_counter()
    cold = check.scan(a.measured, devices=a.device, families=a.family)
    t1 = time.perf_counter()
    priced = sum(s["checked"] for s in cold.summary)
    print(f"cold: {cold.rows:,} rows ({priced:,} priced) in {t1 - t0:.2f} s = {cold.rows / (t1 - t0):,.0f} rows/s; "
          f"{cold.n_violations:,} below SOL")
    probes: dict = {}
    orig = check._scan_partition

    def cached(part, hwut, _probes, tol, count):  # the second pass reuses the first pass's probes
        return orig(part, hwut, probes, tol, count)

    check._scan_partition = cached
    try:
        check.scan(a.measured, devices=a.device, families=a.family)  # fills the probe cache
        t2 = time.perf_counter()
        warm = check.scan(a.measured, devices=a.device, families=a.family)
        t3 = time.perf_counter()
    finally:
        check._scan_partition = orig
    print(f"warm: {warm.rows:,} rows in {t3 - t2:.2f} s = {warm.rows / (t3 - t2):,.0f} rows/s (probes cached; reading "
          "the Parquet files included)")


if __name__ == "__main__":
    main()
