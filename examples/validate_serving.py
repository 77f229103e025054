"""Predictions against published serving results (issue 25 item 6): for every published DeepSeek-V3/R1 serving
figure (shared/reference/measurements.md, the setups of examples/validate_published.py), the setup as graphsim
runs it, its SOL, graphsim's prediction, measured / prediction and — when NVIDIA's aiconfigurator is installed in a
scratch environment — aiconfigurator's estimate of the same setup from the same tables.

The prediction is the measured view (``hybrid``: each op from the tables of the case's device and backend, the
rest fitted per op family) when ``--measured DIR`` holds tables for that device and backend, else the
practitioner efficiency profile (hw/data/profiles/practitioner.toml), and the table says which. Nothing here is
fitted to the published figures: the view reads kernel tables, the profile cites its fractions.

    python examples/validate_serving.py                                   # SOL + profile only
    python examples/validate_serving.py --measured tables   # graphsim measured import aiconfigurator -o tables
    python examples/validate_serving.py --measured tables --aiconfigurator /venv/bin/aiconfigurator

aiconfigurator is never imported: its CLI (``aiconfigurator cli estimate``) runs as a subprocess when a path is
given, and a setup it cannot estimate (no tables for the device, cross-node EP without DeepEP data) says why.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_published as vp  # noqa: E402  (the published setups, one definition)

import graphsim as gs  # noqa: E402


@attrs.frozen
class ServingCase:
    case: vp.Case
    backend: str  #: the engine that produced the figure, as the tables name it (framework@version)
    #: aiconfigurator: (system, backend, mode, {flag: value}) for ``aiconfigurator cli estimate``; None: no data
    aic: tuple | None = None


def _aic_static(system: str, backend: str, mode: str, **flags) -> tuple:
    return (system, backend, mode, flags)


#: the published figures with the engine each came from; aiconfigurator ships no H800 tables
SERVING = (
    ServingCase(vp.CASES[0], "deepseek"),
    ServingCase(vp.CASES[1], "deepseek"),
    ServingCase(vp.CASES[2], "sglang@0.5.14", _aic_static("h100_sxm", "sglang", "static_ctx", isl=1024, osl=1,
                                                            batch_size=16, attention_dp_size=32, moe_ep_size=32)),
    ServingCase(vp.CASES[3], "sglang@0.5.14", _aic_static("h100_sxm", "sglang", "static_ctx", isl=2048, osl=1,
                                                            batch_size=8, attention_dp_size=32, moe_ep_size=32)),
    ServingCase(vp.CASES[4], "sglang@0.5.14", _aic_static("h100_sxm", "sglang", "static_ctx", isl=4096, osl=1,
                                                            batch_size=4, attention_dp_size=32, moe_ep_size=32)),
    ServingCase(vp.CASES[5], "sglang@0.5.14", _aic_static("h100_sxm", "sglang", "static_gen", isl=2000, osl=2,
                                                            batch_size=256, attention_dp_size=72, moe_ep_size=72)),
    ServingCase(vp.CASES[6], "trtllm@1.3.0rc20", _aic_static("h200_sxm", "trtllm", "agg", isl=1024, osl=2048,
                                                               batch_size=128, attention_dp_size=8, moe_ep_size=8)),
)


@attrs.frozen
class Row:
    case: ServingCase
    sol: float  #: tokens/s in the case's unit
    predicted: float
    source: str  #: "hybrid view (trtllm@1.3.0rc20 tables)" or "practitioner profile"
    aic: float | None = None
    aic_note: str = ""

    @property
    def measured(self) -> float:
        return self.case.case.published


def _has_tables(measured: str | None, device: str, backend: str) -> bool:
    fw, _, ver = backend.partition("@")
    return bool(measured) and ver != "" and any(Path(measured, device).glob(f"*/{fw}@{ver}/*.parquet"))


def _view_throughput(sc: ServingCase, model, view) -> float:
    """Tokens/s of the case with every forward evaluated under ``view`` (its own schedule, measured ops)."""
    case = sc.case
    c = gs.compile_plan(model, gs.Plan(case.requests, case.mapping, gs.Policies(overlap=case.overlap)), case.hw,
                        view=view)
    t = float(c.schedule().forward[0])
    kind = "prefill" if case.counts == "input" else "decode"
    tokens = sum(r.count * r.new_tokens for r in c.plan.requests if r.kind == kind)
    if case.amortized_prefill:
        spec, steps = case.amortized_prefill
        pre = gs.compile_plan(model, gs.Plan([spec], case.mapping, gs.Policies(overlap=case.overlap)), case.hw,
                              view=view)
        t += float(pre.schedule().forward[0]) / steps
    return tokens / t / case.mapping.gpus * (8 if case.unit == "node" else 1)


def aiconfigurator_estimate(sc: ServingCase, exe: str) -> tuple[float | None, str]:
    """aiconfigurator's estimate in the case's unit, from its CLI's printed summary; (None, why) when it has
    no estimate for the setup."""
    if sc.aic is None:
        return None, "no tables for this device"
    system, backend, mode, f = sc.aic
    argv = [exe, "cli", "estimate", "--model-path", "deepseek-ai/DeepSeek-V3", "--system", system, "--backend",
            backend, "--estimate-mode", mode, "--tp-size", "1", "--moe-tp-size", "1"]
    for k, v in f.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        out = done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"not run ({type(e).__name__})"
    err = re.search(r"Error: (.*)", out)
    if err:
        return None, err.group(1).split(",")[0][:80]

    def num(label: str) -> float | None:
        m = re.search(rf"{re.escape(label)}:\s+([\d,.]+)", out)
        return float(m.group(1).replace(",", "")) if m else None

    per_gpu = None
    if mode == "static_ctx":  # input tokens/s: the batch's prompts over the prefill time, per GPU
        ttft = num("TTFT")
        per_gpu = f["batch_size"] * f["isl"] / (ttft / 1e3) if ttft else None
    elif mode == "static_gen":  # output tokens/s: one token per request per step
        tpot = num("TPOT")
        per_gpu = f["batch_size"] / (tpot / 1e3) if tpot else None
    else:
        per_gpu = num("tokens/s/gpu")
    if per_gpu is None:
        return None, "no figure in its output"
    return per_gpu * (8 if sc.case.unit == "node" else 1), ""


def validate(cases=SERVING, measured: str | None = None, aiconfigurator: str | None = None) -> list[Row]:
    from graphsim.views.measured.view import ViewSpec

    prof = gs.load_profile("practitioner")
    rows = []
    for sc in cases:
        case = sc.case
        model = vp.v3_model(case.experts)
        sol = vp.throughput(case, model)
        if _has_tables(measured, case.hw, sc.backend):
            pred = _view_throughput(sc, model, ViewSpec("hybrid", measured, sc.backend))
            source = f"hybrid view ({sc.backend} tables)"
        else:
            pred, source = vp.throughput(case, model, prof), "practitioner profile"
        aic, note = aiconfigurator_estimate(sc, aiconfigurator) if aiconfigurator else (None, "")
        rows.append(Row(sc, sol, pred, source, aic, note))
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| case | measured | SOL | prediction | from | measured / prediction | aiconfigurator | "
             "measured / aiconfigurator |", "|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        c = r.case.case
        aic = f"{r.aic:,.0f}" if r.aic else (f"– ({r.aic_note})" if r.aic_note else "–")
        ratio = f"{r.measured / r.aic:.2f}" if r.aic else "–"
        lines.append(f"| {c.name} | {r.measured:,.0f} {c.counts} tok/s/{c.unit} | {r.sol:,.0f} | {r.predicted:,.0f} | "
                     f"{r.source} | {r.measured / r.predicted:.2f} | {aic} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measured", default=None, help="folder of measured tables (graphsim measured import ...)")
    p.add_argument("--aiconfigurator", default=None, help="path of an installed aiconfigurator executable")
    a = p.parse_args(argv)
    rows = validate(measured=a.measured, aiconfigurator=a.aiconfigurator)
    print(table(rows))
    low = [r.case.case.name for r in rows if r.sol < r.measured]
    assert not low, f"SOL below a measurement (a cost is missing or a peak too high): {low}"
    within = sum(abs(r.measured / r.predicted - 1) <= 0.25 for r in rows)
    closer = sum(abs(r.measured / r.predicted - 1) < abs(r.measured / r.aic - 1) for r in rows if r.aic)
    print(f"\nwithin ±25 %: {within} of {len(rows)}" + (
        f"; closer than aiconfigurator: {closer} of {sum(1 for r in rows if r.aic)}" if a.aiconfigurator else ""))


if __name__ == "__main__":
    main()
