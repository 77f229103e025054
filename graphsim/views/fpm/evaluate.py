"""Held-out error of the three views against the same measured forwards (``graphsim fpm eval``).

For every held-out sample that ran (status ok): the FPM prediction of its partition (in domain or
extrapolated), its SOL forward (recorded when it was collected, on the fit's descriptor), and — given
measured operator tables — the OP view of the same compiled plan. Errors are relative to the measured
median: |view − measured| / measured; SOL is also reported as a ratio (SOL / measured, which must stay
≤ 1: a held-out forward faster than its SOL is a **violation**). Samples that did not run keep their
failure category; samples no partition or curve covers are counted as ``no_partition`` / ``no_curve``.
"""
from __future__ import annotations

import numpy as np

from graphsim.core.errors import GraphsimError

from .fit import FPMModel, predict
from .schema import COORDS, IDENTITY


def _stats(err: np.ndarray) -> dict:
    if not len(err):
        return {"n": 0, "median": None, "p90": None, "worst": None}
    return {"n": int(len(err)), "median": float(np.median(err)), "p90": float(np.quantile(err, 0.9)),
            "worst": float(err.max())}


def evaluate(model: FPMModel, holdout, *, op_view=None, log=None) -> dict:
    """Error report of SOL, OP (when ``op_view`` = (model, hw, ViewSpec)) and FPM on ``holdout`` rows."""
    rows = []
    failures: dict = {}
    for s in holdout["status"][holdout["status"] != "ok"]:
        failures[str(s)] = failures.get(str(s), 0) + 1
    ok = holdout[holdout["status"] == "ok"].reset_index(drop=True)
    by_part: dict = {}
    for i in range(len(ok)):
        r = ok.iloc[i]
        ident = {k: r[k] for k in IDENTITY}
        try:
            part = model.find(ident)
        except GraphsimError:
            failures["no_partition"] = failures.get("no_partition", 0) + 1
            continue
        by_part.setdefault(part.key, (part, []))[1].append(i)
    for key, (part, idx) in by_part.items():
        sub = ok.iloc[idx]
        cols = {c: sub[c].to_numpy() for c in COORDS}
        sol = sub["sol_s"].to_numpy(np.float64)
        meas = sub["latency_s"].to_numpy(np.float64)
        pr = predict(part, cols, sol)
        inside = pr.inside
        for j in range(len(sub)):
            if not np.isfinite(pr.t[j]):
                failures["no_curve"] = failures.get("no_curve", 0) + 1
                continue
            rows.append({"partition": key, "requests": str(sub["requests"].iloc[j]), "mix": str(pr.mixes[j]),
                         "domain": "in" if inside[j] else "out", "outside": pr.outside_names(j),
                         "measured_s": float(meas[j]), "sol_s": float(sol[j]), "fpm_s": float(pr.t[j]), "op_s": None})
    if op_view is not None and rows:
        _op_times(rows, ok, op_view, log)
    out = {"views": [], "partitions": [], "failures": failures, "sol_bound": {}, "rows": rows}
    views = [("sol", "sol_s"), ("op", "op_s"), ("fpm", "fpm_s")]
    for name, col in views:
        for dom in ("in", "out"):
            sel = [r for r in rows if r["domain"] == dom and r[col] is not None]
            err = np.array([abs(r[col] - r["measured_s"]) / r["measured_s"] for r in sel])
            st = _stats(err)
            if len(sel):
                w = int(np.argmax(err))
                st["worst_sample"] = sel[w]["requests"]
            out["views"].append({"view": name, "domain": dom, **st})
    ratio = np.array([r["sol_s"] / r["measured_s"] for r in rows])
    out["sol_bound"] = {"n": int(len(ratio)), "violations": int((ratio > 1.0).sum()),
                        "ratio_median": float(np.median(ratio)) if len(ratio) else None,
                        "ratio_max": float(ratio.max()) if len(ratio) else None}
    for key, (part, _) in by_part.items():
        pr = [r for r in rows if r["partition"] == key]
        ent = {"partition": key, "failures_in_training": part.failures}
        for dom in ("in", "out"):
            err = np.array([abs(r["fpm_s"] - r["measured_s"]) / r["measured_s"] for r in pr if r["domain"] == dom])
            ent[f"fpm_{dom}"] = _stats(err)
        out["partitions"].append(ent)
    return out


def _op_times(rows, ok, op_view, log) -> None:
    """The OP view of each held-out plan (compiled on the fit's descriptor from the model the user names)."""
    from graphsim import Plan, compile_plan

    model, hw, spec = op_view
    for r in rows:
        try:
            c = compile_plan(model, Plan(r["requests"].split("+")), hw, view=spec)
            r["op_s"] = float(c.report().forward_s)
        except GraphsimError as e:
            r["op_s"] = None
            r["op_error"] = str(e)
            if log:
                log(f"OP view: {r['requests']}: {e}")


def to_text(rep: dict) -> str:
    def pct(v):
        return "      -" if v is None else f"{100 * v:6.1f}%"

    lines = ["held-out forwards: relative error |view - measured| / measured",
             f"{'view':<5} {'domain':<7} {'n':>4} {'median':>7} {'p90':>7} {'worst':>7}  worst sample"]
    for v in rep["views"]:
        lines.append(f"{v['view']:<5} {v['domain']:<7} {v['n']:>4} {pct(v['median'])} {pct(v['p90'])} "
                     f"{pct(v['worst'])}  {v.get('worst_sample', '')}")
    b = rep["sol_bound"]
    if b.get("n"):
        lines.append(f"SOL bound: SOL/measured median {b['ratio_median']:.3f}, max {b['ratio_max']:.3f}; "
                     f"{b['violations']} of {b['n']} held-out forwards beat their SOL" +
                     ("  <-- SOL VIOLATION" if b["violations"] else ""))
    for p in rep["partitions"]:
        fi, fo = p["fpm_in"], p["fpm_out"]
        lines.append(f"partition {p['partition']}: FPM in-domain n={fi['n']} median {pct(fi['median']).strip()} "
                     f"worst {pct(fi['worst']).strip()}; out-of-domain n={fo['n']} median {pct(fo['median']).strip()} "
                     f"worst {pct(fo['worst']).strip()}" + (f"; training failures {p['failures_in_training']}"
                                                            if p["failures_in_training"] else ""))
    f = rep["failures"]
    lines.append("failures: " + (", ".join(f"{k} {v}" for k, v in sorted(f.items())) if f else "none"))
    return "\n".join(lines)


__all__ = ["evaluate", "to_text"]
