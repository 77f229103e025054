"""The OP and Hybrid views against aiconfigurator's SILICON estimate and published measurements.

    graphsim measured import aiconfigurator --system gb200 --system h200_sxm -o tables
    python examples/validate_measured.py tables [--aic-python PATH]

(without a folder it runs on the tests' small fixture, which covers only the plans it was cut for)

1. DeepSeek-V3 decode steps (GB200 TP4/EP4, H200 TP8/EP8; batch 1..256 x context 1K/8K) in graphsim's OP view
   on TRT-LLM 1.3.0rc20 tables, next to aiconfigurator's SILICON estimate of the same step (``cli_estimate``
   static_gen, its TPOT) when ``--aic-python`` names an interpreter with ``aiconfigurator`` installed (a scratch
   virtualenv: it is a reference, not a dependency).
2. The published TensorRT-LLM DeepSeek-R1 max-throughput run on 8 x H200 (shared/reference/measurements.md
   §3) in the SOL, OP and Hybrid views (the setup of examples/validate_published.py).
3. DeepSeek-V4.1-Flash on GB200 in the Hybrid view: its coverage.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import graphsim as gs
from graphsim.views.measured.view import ViewSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_published import CASES, v3_model  # noqa: E402

BACKEND = "trtllm@1.3.0rc20"
GRID = [(hw, tp, b, ctx) for hw, tp in (("gb200", 4), ("h200", 8)) for b in (1, 16, 64, 256) for ctx in (1024, 8192)]
AIC = r"""
import json, logging, sys
logging.disable(logging.WARNING)
from aiconfigurator.cli.api import cli_estimate
out = []
for hw, tp, b, ctx in json.loads(sys.argv[1]):
    try:
        r = cli_estimate("deepseek-ai/DeepSeek-V3", {"gb200": "gb200", "h200": "h200_sxm"}[hw], mode="static_gen",
                         database_mode="SILICON", isl=int(ctx), osl=2, batch_size=int(b), tp_size=tp, moe_ep_size=tp,
                         moe_tp_size=1, backend_name="trtllm", backend_version="1.3.0rc20")
        out.append(r.tpot / 1e3)
    except Exception as e:  # noqa: BLE001
        out.append(None)
print(json.dumps(out))
"""


def op_grid(measured: str) -> list[float]:
    out, cache = [], {}
    for hw, tp, b, ctx in GRID:
        if (hw, tp) not in cache:
            cache[hw, tp] = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=tp, ep=tp)),
                                            hw, view=ViewSpec("op", measured, BACKEND))
        wl = gs.Plan([f"decode:{ctx}x{b}"]).workload()
        out.append(float(cache[hw, tp].evaluate(wl, outputs=("forward",))["forward"][0]))
    return out


def aic_grid(python: str | None) -> list | None:
    if not python:
        return None
    r = subprocess.run([python, "-c", AIC, json.dumps(GRID)], capture_output=True, text=True, timeout=1800)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None


def published(measured: str) -> list[tuple]:
    case = next(c for c in CASES if c.hw == "h200")
    model = v3_model(case.experts)
    rows = []
    for view in ("sol", "op", "hybrid"):
        spec = None if view == "sol" else ViewSpec(view, measured, BACKEND)
        try:
            t = 0.0
            for reqs, steps in ((case.requests, 1), (case.amortized_prefill[:1], case.amortized_prefill[1])):
                c = gs.compile_plan(model, gs.Plan(reqs, case.mapping, gs.Policies(overlap=case.overlap)), case.hw,
                                    view=spec)
                t += float(c.schedule().forward[0]) / steps
            tokens = sum(r.count * r.new_tokens for r in gs.Plan(case.requests).requests)
            rows.append((view, tokens / t / case.mapping.gpus, case.published, ""))
        except gs.GraphsimError as e:
            rows.append((view, None, case.published, str(e)[:160]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("measured", nargs="?", default=str(Path(__file__).resolve().parent.parent / "tests" / "data"
                                                          / "measured"),
                    help="folder of measured tables (default: the tests' small fixture)")
    ap.add_argument("--aic-python", default=None)
    a = ap.parse_args()
    g = op_grid(a.measured)
    aic = aic_grid(a.aic_python)
    print("| hw | mapping | batch | context | graphsim OP ms | aiconfigurator SILICON ms | OP / SILICON |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ratios = []
    for (hw, tp, b, ctx), x, y in zip(GRID, g, aic or [None] * len(g)):
        r = x / y if y else None
        ratios += [r] if r else []
        print(f"| {hw} | TP{tp}/EP{tp} | {b} | {ctx} | {x * 1e3:.2f} | {y * 1e3 if y else float('nan'):.2f} | "
              f"{r if r else float('nan'):.2f} |")
    if ratios:
        print(f"\nOP / SILICON: median {np.median(ratios):.3f}, range {min(ratios):.3f} .. {max(ratios):.3f}")
    print("\n| view | graphsim output tok/s/GPU | published | published / graphsim |")
    print("|---|---:|---:|---:|")
    for view, x, p, err in published(a.measured):
        print(f"| {view} | {x:,.0f} | {p:,} | {p / x:.2f} |" if x else f"| {view} | error: {err} | {p:,} | |")
    c = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:1024x16"], gs.ParallelMapping(tp=4, ep=4)), "gb200",
                        view=ViewSpec("hybrid", a.measured, BACKEND))
    r = c.report()
    print(f"\nDeepSeek-V4.1-Flash hybrid, GB200 TP4/EP4, decode 1024 x 16: forward {r.forward_s * 1e3:.3f} ms")
    from graphsim.driver.report import coverage_text

    print("\n".join(coverage_text(r.coverage)))


if __name__ == "__main__":
    main()
