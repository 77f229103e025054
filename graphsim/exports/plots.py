"""Matplotlib pictures of sweeps and schedules, written to files (Agg backend: no display needed).

* :func:`plot_latency` — forward time vs context, stacked by stage;
* :func:`plot_pareto` — throughput per GPU vs per-user throughput with the Pareto frontier;
* :func:`plot_kinds` — busy time by op kind (from a sweep with ``outputs = ["kinds"]`` or from a Report);
* :func:`plot_memory` — memory per device vs context, with the HBM capacity line;
* :func:`plot_roofline` — arithmetic intensity vs achieved FLOP/s of every op of a Schedule.

Sweep plots take a DataFrame of :mod:`graphsim.sweep` rows. A line plot needs the other inputs fixed: unless
``where`` (:mod:`graphsim.filters`: column comparisons joined by and/or/not) already does, rows are sliced at
the first value of every other varying input and of the structural identity, and the title says which.
"""
from __future__ import annotations

import re

import numpy as np

from graphsim.errors import GraphsimError
from graphsim.filters import apply_filter

_INPUT = re.compile(r"^(prefill|decode|g\d+|hw|profile)\.")
_STRUCT = ("struct_id",)


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def input_columns(df) -> list[str]:
    """The continuous input axes of a sweep table (``decode.context``, ``hw.hbm_bw``…)."""
    return [c for c in df.columns if _INPUT.match(c)]


def pareto_front(df, x: str, y: str, maximize: tuple = (True, True)):
    """Rows not dominated by any other row in (x, y), sorted by x. A row dominates another when it is at least
    as good in both and strictly better in one (``maximize`` says which direction is better per axis)."""
    d = df[[x, y]].dropna()
    if d.empty:
        return df.iloc[0:0]
    sx = 1.0 if maximize[0] else -1.0
    sy = 1.0 if maximize[1] else -1.0
    vx, vy = sx * d[x].to_numpy(float), sy * d[y].to_numpy(float)
    # Sweep by x descending (ties: y descending); a row is on the front when its y beats every row before it.
    order = np.lexsort((-vy, -vx))
    keep, best = [], -np.inf
    for i in order:
        if vy[i] > best:
            keep.append(i)
            best = vy[i]
    front = d.iloc[keep]
    return df.loc[front.index].sort_values(x)


def _default_x(df) -> str:
    cols = [c for c in input_columns(df) if not c.startswith(("hw.", "profile.")) and df[c].nunique() > 1]
    for suffix in ("context", "prompt"):
        for c in cols:
            if c.endswith(suffix):
                return c
    if cols:
        return cols[0]
    raise GraphsimError("x", "no varying length axis in the table; pass x=<column>")


def slice_rows(df, x: str, where: str | None = None):
    """Rows for a line over ``x``: filter with ``where``, drop error rows, then fix every other varying input
    and the structural identity at their first value. Returns (rows sorted by x, description of the fixing)."""
    df = apply_filter(df, where)
    if "error" in df.columns:
        df = df[df["error"].isna()]
    if x not in df.columns:
        raise GraphsimError("x", f"no column {x!r}; inputs: {input_columns(df)}")
    fixed = []
    for c in [*_STRUCT, *input_columns(df)]:
        if c == x or c not in df.columns or df[c].nunique() <= 1:
            continue
        v = df[c].iloc[0]
        df = df[df[c] == v]
        fixed.append(f"{c}={v:g}" if isinstance(v, (float, np.floating)) else f"{c}={v}")
    return df.sort_values(x), ", ".join(fixed)


def _title(df, extra: str = "") -> str:
    r = df.iloc[0]
    t = f"{r.get('model', '')} on {r.get('hw', '')} {r.get('mapping', '')} [{r.get('requests', '')}] {r.get('profile', '')}"
    return t + (f"\n{extra}" if extra else "")


#: Image types matplotlib writes here.
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def _save(fig, path) -> str:
    from graphsim.outputs import atomic_target

    fig.tight_layout()
    try:
        with atomic_target(path, suffixes=IMAGE_SUFFIXES) as tmp:
            fig.savefig(tmp, dpi=120, format=(str(path).rsplit(".", 1)[-1].lower() if "." in str(path) else None))
    finally:
        _plt().close(fig)
    return str(path)


def require_columns(df, field: str, cols, what: str) -> None:
    """A one-line error naming ``field`` when a results table lacks the columns a plot draws."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise GraphsimError(field, f"{what} needs the column(s) {', '.join(cols)}; this table lacks "
                            f"{', '.join(missing)} (a graphsim sweep writes them)")


def plot_latency(df, path, x: str | None = None, where: str | None = None) -> str:
    """Forward time vs ``x`` (default: the context/prompt axis), stacked by stage (``stage_s.*``)."""
    require_columns(df, "kind", ("forward_s",), "a latency plot")
    plt = _plt()
    x = x or _default_x(df)
    d, fixed = slice_rows(df, x, where)
    stages = [c for c in d.columns if c.startswith("stage_s.") and d[c].notna().any()]
    fig, ax = plt.subplots(figsize=(8, 5))
    if stages:
        ax.stackplot(d[x], *(d[c] * 1e3 for c in stages), labels=[c[len("stage_s."):] for c in stages], alpha=0.85)
    ax.plot(d[x], d["forward_s"] * 1e3, "k-", lw=1.5, label="forward (critical path)")
    ax.set_xlabel(x)
    ax.set_ylabel("ms")
    if d[x].min() > 0 and d[x].max() / d[x].min() > 20:
        ax.set_xscale("log")
    ax.set_title(_title(d, fixed), fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_pareto(df, path, x: str = "tokens_per_s_per_user", y: str = "tokens_per_s_per_gpu",
                color: str | None = "mapping", where: str | None = None, fits_only: bool = True) -> str:
    """Every valid point as a dot (coloured by ``color``) and the (max x, max y) Pareto frontier as a line.
    With ``fits_only`` points whose weights + KV exceed HBM are drawn as grey crosses and kept off the front."""
    require_columns(df, "x", (x,), "the Pareto plot's x axis")
    require_columns(df, "y", (y,), "the Pareto plot's y axis")
    plt = _plt()
    d = apply_filter(df, where)
    d = d[d["error"].isna()] if "error" in d.columns else d
    d = d.dropna(subset=[x, y])
    fig, ax = plt.subplots(figsize=(8, 5))
    if fits_only and "fits" in d.columns:
        fits = d["fits"].astype(bool)
        if (~fits).any():
            ax.scatter(d.loc[~fits, x], d.loc[~fits, y], s=10, marker="x", c="0.7", label="does not fit in HBM")
        d = d[fits]
    if color and color in d.columns and d[color].nunique() > 1:
        for key, g in d.groupby(color, sort=True):
            ax.scatter(g[x], g[y], s=8, alpha=0.5, label=f"{color}={key}")
    else:
        ax.scatter(d[x], d[y], s=8, alpha=0.5, label="points")
    front = pareto_front(d, x, y)
    ax.plot(front[x], front[y], "r.-", lw=2, label=f"Pareto frontier ({len(front)})")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title("throughput per GPU vs per user", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_memory(df, path, x: str | None = None, where: str | None = None, series: str | None = "auto") -> str:
    """Weights + KV + workspace per device vs ``x`` (stacked), with the HBM capacity as a dashed line; with a
    ``series`` column (default: the one other varying length/batch input, if exactly one) one total-memory line
    per value of it is drawn too (e.g. one per batch size)."""
    require_columns(df, "kind", ("weights_gib", "kv_gib", "workspace_gib", "total_gib", "capacity_gib"),
                    "a memory plot")
    plt = _plt()
    x = x or _default_x(df)
    if series == "auto":
        others = [c for c in input_columns(df) if c != x and not c.startswith(("hw.", "profile."))
                  and df[c].nunique() > 1]
        series = others[0] if len(others) == 1 else None
    d, fixed = slice_rows(df, x, where)
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.stackplot(d[x], d["weights_gib"], d["kv_gib"], d["workspace_gib"],
                 labels=["weights", "KV cache", "workspace"], alpha=0.85)
    if series:
        base = apply_filter(df, where)
        base = base[base["error"].isna()] if "error" in base.columns else base
        keep = base["struct_id"] == d["struct_id"].iloc[0] if "struct_id" in base.columns else True
        for v in sorted(base.loc[keep, series].unique())[:10]:
            g, _ = slice_rows(base[keep & (base[series] == v)], x)
            ax.plot(g[x], g["total_gib"], lw=1, label=f"total, {series}={v:g}")
    ax.plot(d[x], d["capacity_gib"], "r--", lw=1.5, label="HBM capacity")
    ax.set_xlabel(x)
    ax.set_ylabel("GiB per device")
    if d[x].min() > 0 and d[x].max() / d[x].min() > 20:
        ax.set_xscale("log")
    if series and d["total_gib"].max() > 0:
        ax.set_ylim(0, max(d["capacity_gib"].max() * 1.6, d["total_gib"].max() * 1.1))
    ax.set_title(_title(d, fixed), fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def plot_kinds(source, path, rows: int = 8, where: str | None = None) -> str:
    """Horizontal stacked bars of busy seconds per op kind: one bar per Report, or per sweep row (the first
    ``rows`` valid rows after ``where``)."""
    plt = _plt()
    if hasattr(source, "breakdown"):  # a Report
        labels = [f"{source.identity['model']} {source.identity['mapping']}"]
        kinds = sorted(source.breakdown, key=lambda k: -source.breakdown[k])
        values = np.array([[source.breakdown[k] for k in kinds]])
    else:
        d = apply_filter(source, where)
        d = d[d["error"].isna()] if "error" in d.columns else d
        cols = [c for c in d.columns if c.startswith("kind_s.") and d[c].notna().any()]
        if not cols:
            raise GraphsimError("kinds", "the table has no kind_s.* columns; run the sweep with outputs = [\"kinds\"]")
        d = d.head(rows)
        kinds = [c[len("kind_s."):] for c in sorted(cols, key=lambda c: -d[c].sum())]
        values = d[[f"kind_s.{k}" for k in kinds]].fillna(0.0).to_numpy()
        ins = input_columns(d)
        labels = [" ".join([str(r.get("mapping", ""))] + [f"{c.split('.')[-1]}={r[c]:g}" for c in ins])
                  for _, r in d.iterrows()]
    fig, ax = plt.subplots(figsize=(9, 2.2 + 0.45 * len(labels)))
    left = np.zeros(len(labels))
    for j, k in enumerate(kinds):
        ax.barh(labels, values[:, j] * 1e3, left=left * 1e3, label=k)
        left += values[:, j]
    ax.set_xlabel("busy ms (sum over ops)")
    ax.invert_yaxis()
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.1 - 0.6 / (1 + len(labels))))
    ax.set_title("time by op kind", fontsize=10)
    return _save(fig, path)


def roofline_points(schedule, point: int = 0) -> dict:
    """Per op with FLOPs: arithmetic intensity (FLOP per HBM byte), achieved FLOP/s, kind, name and the
    roofs (peak FLOP/s per precision used, HBM bytes/s) from the schedule's unit times."""
    from graphsim.ir import COMPONENTS, HBM_COMPONENTS

    comp, dur, ut = schedule.components[point], schedule.duration[point], schedule.unit_time[point]
    fl = [k for k, c in enumerate(COMPONENTS) if c.startswith("flops_")]
    hb = [COMPONENTS.index(c) for c in HBM_COMPONENTS]
    flops, hbm = comp[:, fl].sum(axis=1), comp[:, hb].sum(axis=1)
    ok = (flops > 0) & (hbm > 0) & (dur > 0)
    used = [COMPONENTS[k] for k in fl if comp[:, k].any()]
    with np.errstate(divide="ignore"):
        peaks = {c[len("flops_"):]: 1.0 / ut[COMPONENTS.index(c)] for c in used}
        bw = 1.0 / ut[hb[0]]
    ops = schedule.graph.ops
    return {"intensity": flops[ok] / hbm[ok], "achieved": flops[ok] / dur[ok],
            "kind": [ops[i].kind for i in np.flatnonzero(ok)], "name": [ops[i].name for i in np.flatnonzero(ok)],
            "peaks": peaks, "hbm_bw": bw}


def plot_roofline(schedule, path, point: int = 0, title: str = "") -> str:
    """Log-log roofline: ops as dots coloured by kind; the HBM slope and one flat roof per precision."""
    plt = _plt()
    r = roofline_points(schedule, point)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    kinds = np.array(r["kind"])
    for k in dict.fromkeys(r["kind"]):
        m = kinds == k
        ax.scatter(r["intensity"][m], r["achieved"][m], s=14, alpha=0.7, label=k)
    if len(r["intensity"]):
        lo, hi = r["intensity"].min() / 4, r["intensity"].max() * 4
        ai = np.geomspace(min(lo, 1e-1), max(hi, 1e4), 200)
        for p, peak in r["peaks"].items():
            ax.plot(ai, np.minimum(peak, r["hbm_bw"] * ai), "--", lw=1, label=f"roof {p} {peak / 1e12:,.0f} TFLOP/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(title or f"roofline: {schedule.graph.name}", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


PLOTS = {"latency": plot_latency, "pareto": plot_pareto, "memory": plot_memory, "kinds": plot_kinds}

__all__ = ["pareto_front", "slice_rows", "input_columns", "plot_latency", "plot_pareto", "plot_memory",
           "plot_kinds", "plot_roofline", "roofline_points", "PLOTS"]
