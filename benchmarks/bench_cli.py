"""CLI answer times, wall clock of a fresh process (min and median of N runs; printed, no assertions).

    python benchmarks/bench_cli.py [--runs 7]

Each command runs as ``python -m graphsim ...`` in a new interpreter, so the time includes Python start-up,
imports, the build and the answer. Python writes no bytecode cache when PYTHONDONTWRITEBYTECODE is set (some
CI images do): every module is then compiled from source at each start. Both are measured — with the
environment as it is, and with a bytecode cache in a temporary PYTHONPYCACHEPREFIX (what an installed
package has).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "hw list": ["hw", "list"],
    "--help": ["--help"],
    "estimate v4.1-flash gb300 decode": ["estimate", "--model", "deepseek-v4.1-flash", "--hw", "gb300",
                                         "--request", "decode:4096x8"],
    "estimate deepseek-v3 gb200 tp4/ep4": ["estimate", "--model", "deepseek-v3", "--hw", "gb200", "--tp", "4",
                                           "--ep", "4", "--request", "decode:4096x64"],
    "memory v4.1-flash": ["memory", "deepseek-v4.1-flash", "--context", "4096"],
}


def wall(args: list, env: dict, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "graphsim", *args], env=env, capture_output=True, text=True)
        out.append(time.perf_counter() - t0)
        if r.returncode:
            raise SystemExit(f"graphsim {' '.join(args)} failed: {r.stderr.strip().splitlines()[-1:]}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    base = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        cached = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = tmp
        envs = {"bytecode cached": cached}
        if base.get("PYTHONDONTWRITEBYTECODE"):
            envs["no bytecode (as set here)"] = base
        print(f"{'command':<38} {'environment':<26} {'min':>7} {'median':>7}   (load average {os.getloadavg()[0]:.1f})")
        for name, args in COMMANDS.items():
            for env_name, env in envs.items():
                if env_name == "bytecode cached":
                    wall(args, env, 1)  # fills the cache
                t = wall(args, env, a.runs)
                print(f"{name:<38} {env_name:<26} {min(t):>6.3f}s {statistics.median(t):>6.3f}s", flush=True)
        code = ("import sys, graphsim; heavy = [m for m in ('jax', 'networkx', 'pyarrow', 'pandas', 'matplotlib') "
                "if m in sys.modules]; print(heavy)")
        r = subprocess.run([sys.executable, "-c", code], env=cached, capture_output=True, text=True)
        print(f"heavy modules loaded by `import graphsim`: {r.stdout.strip()}")


if __name__ == "__main__":
    main()
