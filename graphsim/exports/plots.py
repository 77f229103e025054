"""Matplotlib pictures of sweeps and schedules, written to files (Agg backend: no display needed).

* :func:`plot_latency` — forward time vs context, stacked by stage;
* :func:`plot_pareto` — throughput per GPU vs per-user throughput with the Pareto frontier;
* :func:`plot_kinds` — busy time by op kind (from a sweep with ``outputs = ["kinds"]`` or from a Report);
* :func:`plot_memory` — memory per device vs context, with the HBM capacity line;
* :func:`plot_roofline` — arithmetic intensity vs achieved FLOP/s of every op of a Schedule.

Sweep plots take a DataFrame of :mod:`graphsim.sweep` rows (the Pareto plot any table with its x and y
columns, e.g. ``graphsim search``'s). No plot shows a silent subset of its rows: every structural column that
varies (:data:`FACETS`, :data:`ESTIMATES`, :data:`CHOICES`: model, hw, request structure, profile, view, mapping,
each policy…) gets its own panel, marker series or colour, and whatever is left out — error rows, a line
plot's other inputs fixed at their first value, rows past a bar chart's limit — is said in one note per cause
(the figure's title, and ``notes`` when a list is passed: the plot command prints them). ``where``
(:mod:`graphsim.exports.filters`: column comparisons joined by and/or/not) selects rows first.

Every plot labels a known result column with its unit and draws its values in that unit (:data:`AXES`,
:func:`axis`), colours an op kind the same in every plot (:data:`OP_KINDS`, :func:`kind_colour`), and puts its
legends outside the axes, titled, with the figure grown to hold them. ``path=None`` returns the Figure
(notebooks, tests) instead of writing a file.
"""
from __future__ import annotations

import re

import numpy as np

from graphsim.core.errors import GraphsimError
from graphsim.exports.filters import apply_filter

_INPUT = re.compile(r"^(prefill|decode|g\d+|hw|profile)\.")
_STRUCT = ("struct_id",)
#: Structural columns by what a plot does with them when they vary. FACETS are never compared on one set of axes
#: (another model, GPU or request mix is another question): one panel each. ESTIMATES are ways of pricing one
#: deployment (efficiency profile, SOL / measured view): one marker series and one Pareto front each. CHOICES are
#: what a deployment chooses (mapping, engine mode, every policy): one colour each, compared on one front.
FACETS = ("model", "hw", "requests", "sweep")
ESTIMATES = ("profile", "view", "backend", "measured")
#: the identity columns that repeat another (mapping's axes, its GPU count) or only name it (hashes, digests)
_NOT_STRUCTURAL = ("struct_id", "graphsim_version", "inputs_digest", "model_digest", "hw_digest", "profile_digest",
                   "view_digest", "tp", "dp", "ep", "pp", "cp", "gpus")
#: Panels of one figure at most; more are a note naming how many were left out (narrow them with ``where``).
MAX_PANELS = 12


def _choices() -> tuple:
    from graphsim.sweep.spec import identity_columns

    return ("mapping", "mode", "policies", *(c for c in identity_columns() if c not in (
        *FACETS, *ESTIMATES, *_NOT_STRUCTURAL, "mapping")))


def varying(d, columns) -> list[str]:
    """The columns of ``columns`` the table has that hold more than one value in ``d`` (None and NaN are one)."""
    return [c for c in columns if c in d.columns and d[c].astype(str).nunique() > 1]


def structural_columns(d) -> list[str]:
    """Every structural column that varies in ``d``: facets, estimates, then choices."""
    return varying(d, (*FACETS, *ESTIMATES, *_choices()))


def _say(notes, text: str) -> None:
    if notes is not None and text not in notes:
        notes.append(text)


def _valid(df, where, notes):
    """Rows after ``where``, error rows left out with a note."""
    d = apply_filter(df, where)
    if "error" in d.columns:
        bad = d["error"].notna()
        if bad.any():
            _say(notes, f"{int(bad.sum())} error row(s) not drawn")
        d = d[~bad]
    return d


def _combo(d, cols: list[str]):
    """One value per row naming its values of ``cols`` (the column itself when there is one)."""
    if len(cols) == 1:
        return d[cols[0]]
    return d[cols].apply(lambda r: ", ".join(_text(v) for v in r), axis=1) if len(d) else d.index.to_series()


def _panels(d, cols: list[str], notes) -> list[tuple[str, object]]:
    """(label, rows) per combination of ``cols`` (one unlabelled panel when none varies), at most
    :data:`MAX_PANELS` (a note says how many more there were)."""
    if not cols:
        return [("", d)]
    key = _combo(d, cols).astype(str)
    out = [(f"{', '.join(cols)}: {k}" if len(cols) > 1 else f"{cols[0]}={k}", d[key == k]) for k in _keys(key)]
    if len(out) > MAX_PANELS:
        _say(notes, f"{len(out) - MAX_PANELS} of {len(out)} panels ({', '.join(cols)}) not drawn; "
                    "narrow them with where / --where")
        out = out[:MAX_PANELS]
    return out


def _grid(width: float, height: float, n: int):
    """A figure of ``n`` panels (three to a row), constrained layout."""
    cols = min(n, 3)
    rows = -(-n // cols)
    scale = (1.0, 1.0) if n == 1 else (0.7, 0.75)
    fig = _plt().figure(figsize=(width * scale[0] * cols, height * scale[1] * rows), layout="constrained")
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]


def _headline(fig, axes, title, shared: str, panels: list, notes_here: list) -> None:
    """The title: one panel's own (``title`` or what its rows share, and the notes); several panels: a figure
    title with what they share, which columns split them, and the notes; each panel titled by its values."""
    note = "; ".join(notes_here)
    if len(axes) == 1:
        axes[0].set_title("\n".join(x for x in (title or shared, "" if title else panels[0][0], note) if x), fontsize=9)
        return
    for ax, (label, _) in zip(axes, panels):
        ax.set_title(label, fontsize=8)
    fig.suptitle("\n".join(x for x in (title or shared, note) if x), fontsize=9)

#: Every op kind the model builders emit (``Op.kind``), in a fixed order: a kind's colour is its place here, so
#: it is the same in every plot and every run whatever subset a plot shows. graphsim.core.ir keeps no registry of op
#: kinds (they are free strings); tests/test_plots.py holds this tuple to the kinds of every shipped model's graph.
OP_KINDS = ("gemm", "moe_experts", "attention", "collective", "indexer", "norm", "activation", "cache_write",
            "router", "elementwise", "sparse_attention", "topk", "quant", "mhc", "engram", "compressor",
            "recurrent", "cache_read", "host_copy", "data_movement", "embedding", "sampling")
#: 30 colours at least 0.14 apart in RGB: tab10, most of tab20's light halves, dark hues of tab20b, Dark2 and
#: Set2. The heavy kinds (first in OP_KINDS) get the strong tab10 hues; colours past OP_KINDS are spares for
#: kinds not listed there.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#f0027f",
           "#dbdb8d", "#01665e", "#393b79", "#637939", "#e7ba52", "#7b4173", "#1b9e77", "#6b6ecf", "#ffd92f",
           "#bd9e39", "#d95f02", "#66a61e")
#: The colour of each listed op kind.
KIND_COLOURS = dict(zip(OP_KINDS, PALETTE))


def kind_colour(kind: str) -> str:
    """The colour of an op kind: its :data:`KIND_COLOURS` entry, else a spare colour picked by a checksum of the
    name (the same in every run, unlike ``hash``)."""
    if kind in KIND_COLOURS:
        return KIND_COLOURS[kind]
    import zlib

    spare = PALETTE[len(OP_KINDS):]
    return spare[zlib.crc32(str(kind).encode()) % len(spare)]


_GiB = float(2**30)
#: Result column -> (axis label with its unit, factor that puts the column's values in that unit), for the
#: columns a sweep (graphsim.driver.metrics, graphsim.sweep.spec) or a search writes. See :func:`axis` for the input
#: axes (``decode.context``, ``hw.hbm_bw``…) and the ``stage_s.*`` / ``kind_s.*`` columns.
AXES = {
    "forward_s": ("forward time (ms)", 1e3),
    "ttft_s": ("TTFT (ms)", 1e3),
    "itl_s": ("ITL / TPOT (ms per token)", 1e3),
    "tokens_per_s": ("tokens/s (all GPUs)", 1.0),
    "tokens_per_s_per_gpu": ("tokens/s per GPU", 1.0),
    "output_tokens_per_s_per_gpu": ("output tokens/s per GPU", 1.0),
    "tokens_per_s_per_user": ("tokens/s per user", 1.0),
    "energy_j": ("energy per forward (J, all GPUs)", 1.0),
    "tokens_per_joule": ("tokens per joule", 1.0),
    "output_tokens_per_joule": ("output tokens per joule", 1.0),
    "prefill_tokens": ("prefill tokens per forward", 1.0),
    "decode_tokens": ("decode tokens per forward", 1.0),
    "decode_requests": ("decode requests per forward", 1.0),
    "weights_gib": ("weights (GiB per device)", 1.0),
    "kv_gib": ("KV cache (GiB per device)", 1.0),
    "workspace_gib": ("workspace (GiB per device)", 1.0),
    "total_gib": ("memory (GiB per device)", 1.0),
    "capacity_gib": ("HBM capacity (GiB per device)", 1.0),
    "headroom_gib": ("HBM headroom (GiB per device)", 1.0),
    "gpus": ("GPUs", 1.0),
}
#: Fields of a request group's axes (``decode.context``, ``prefill.prompt``, ``g1.count``…); ``{}`` is the group.
_GROUP_AXES = {
    "context": ("context (tokens)", 1.0), "prompt": ("prompt (tokens)", 1.0), "count": ("{} requests", 1.0),
    "cached": ("cached prefix (tokens)", 1.0), "new": ("new tokens per request", 1.0),
    "image": ("image tokens", 1.0), "patches": ("image patches", 1.0), "swa_cached": ("SWA window cached (0/1)", 1.0),
    "tier": ("prefix-cache tier (0 HBM, 1 host, 2 disk)", 1.0),
}
#: Hardware axes (``hw.<field>``, per GPU and direction: graphsim.hw.descriptor.HardwareSpec).
_HW_AXES = {
    "hbm_bw": ("HBM bandwidth (TB/s)", 1e-12), "nvlink_bw": ("NVLink bandwidth (GB/s)", 1e-9),
    "scaleout_bw": ("scale-out bandwidth (GB/s)", 1e-9), "c2c_bw": ("C2C bandwidth (GB/s)", 1e-9),
    "disk_bw": ("disk bandwidth (GB/s)", 1e-9), "exp_rate": ("SFU exponentials (Texp/s)", 1e-12),
    "nvlink_latency_s": ("NVLink latency (µs)", 1e6), "nvlink_ll_latency_s": ("NVLink LL latency (µs)", 1e6),
    "nvlink_simple_latency_s": ("NVLink Simple latency (µs)", 1e6),
    "scaleout_latency_s": ("scale-out latency (µs)", 1e6),
    "hbm_capacity_bytes": ("HBM capacity (GiB)", 1 / _GiB),
}


def axis(column: str) -> tuple[str, float]:
    """(label with unit, scale) of a results column: plots draw ``values * scale`` under ``label``. A column
    not known here is labelled by its own name and drawn as it is."""
    if column in AXES:
        return AXES[column]
    head, _, field = column.partition(".")
    if head in ("stage_s", "kind_s"):
        return (f"{field} {'stage' if head == 'stage_s' else 'busy'} time (ms)", 1e3)
    if head in ("prefill", "decode") or re.fullmatch(r"g\d+", head):
        if field in _GROUP_AXES:
            label, scale = _GROUP_AXES[field]
            if "{}" in label:
                return label.format(head), scale
            return (label if head in ("prefill", "decode") else f"{head} {label}"), scale
    if head == "hw":
        if field in _HW_AXES:
            return _HW_AXES[field]
        if field.startswith("peak_flops."):
            return f"{field[len('peak_flops.'):]} peak (PFLOP/s)", 1e-15
    if head == "profile":
        if field == "op_overhead_s":
            return "per-op overhead (µs)", 1e6
        what = field[len("compute_overrides."):] + " compute" if field.startswith("compute_overrides.") else field
        return f"{what} efficiency (fraction of peak)", 1.0
    return column, 1.0


def _values(d, column: str):
    """A column's values in the unit :func:`axis` labels."""
    return d[column] * axis(column)[1]


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
    """What the rows share — model on hw, mapping, [requests], profile, view — from the identity columns the
    table has and that hold one value (a search table or a Pareto plot over mappings lacks some), then ``extra``."""
    one = {}
    for c in ("model", "hw", "mapping", "requests", "profile", "view"):
        if c in df.columns and len(df) and df[c].nunique(dropna=False) == 1:
            v = df[c].iloc[0]
            if v is not None and v == v and str(v) != "":  # v == v: not NaN
                one[c] = f"view {v}" if c == "view" else str(v)
    head = " on ".join(one[c] for c in ("model", "hw") if c in one)
    t = " ".join(x for x in (head, one.get("mapping", ""), f"[{one['requests']}]" if "requests" in one else "",
                             one.get("profile", ""), one.get("view", "")) if x)
    return "\n".join(x for x in (t, extra) if x)


#: Image types matplotlib writes here.
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def _figure(width: float, height: float):
    """A figure with one axes and constrained layout (which makes room for legends outside the axes)."""
    fig = _plt().figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def _legend(fig, handles, labels, title: str, where: str = "right", fontsize: float = 8):
    """A titled figure legend outside the axes — ``right`` (one column per 24 entries) or ``below`` (up to 4
    columns) — with the figure grown by the legend's size so the axes keep theirs and nothing is clipped."""
    if not handles:
        return None
    n = len(handles)
    right = where == "right"
    leg = fig.legend(handles, labels, loc="outside right upper" if right else "outside lower center",
                     ncols=-(-n // 24) if right else min(n, 4), title=title, fontsize=fontsize,
                     title_fontsize=fontsize + 1, alignment="left")
    ext = leg.get_window_extent(fig.canvas.get_renderer())
    w, h = fig.get_size_inches()
    lw, lh = ext.width / fig.dpi, ext.height / fig.dpi
    if right:
        fig.set_size_inches(w + lw + 0.15, max(h, lh + 0.5))
    else:
        fig.set_size_inches(max(w, lw + 0.5), h + lh + 0.15)
    return leg


def _save(fig, path):
    """Write the figure (the legends included: ``bbox_inches="tight"``) and return the path; ``path`` None
    returns the Figure itself."""
    if path is None:
        return fig
    from graphsim.core.outputs import atomic_target

    try:
        with atomic_target(path, suffixes=IMAGE_SUFFIXES) as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight", pad_inches=0.1,
                        format=(str(path).rsplit(".", 1)[-1].lower() if "." in str(path) else None))
    finally:
        _plt().close(fig)
    return str(path)


def require_columns(df, field: str, cols, what: str) -> None:
    """A one-line error naming ``field`` when a results table lacks the columns a plot draws."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise GraphsimError(field, f"{what} needs the column(s) {', '.join(cols)}; this table lacks "
                            f"{', '.join(missing)} (a graphsim sweep writes them)")


def _line_panel(sub, x: str, mine: list):
    """A panel's rows for a line over ``x`` (other inputs fixed at their first value, said in ``mine``)."""
    d, fixed = slice_rows(sub, x)
    if fixed:
        _say(mine, f"fixed at the first value: {fixed} ({len(sub) - len(d)} of {len(sub)} rows not drawn)")
    return d, fixed


def _legend_of(fig, axes, title: str, where: str = "right"):
    """One figure legend of every panel's labelled artists (each label once)."""
    seen: dict = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    return _legend(fig, list(seen.values()), list(seen), title=title, where=where)


def plot_latency(df, path, x: str | None = None, where: str | None = None, title: str | None = None,
                 notes: list | None = None):
    """Forward time vs ``x`` (default: the context/prompt axis), stacked by stage (``stage_s.*``): one panel
    per combination of the structural columns that vary (:func:`structural_columns`)."""
    require_columns(df, "kind", ("forward_s",), "a latency plot")
    x = x or _default_x(df)
    mine: list = []
    base = _valid(df, where, mine)
    if x not in base.columns:
        raise GraphsimError("x", f"no column {x!r}; inputs: {input_columns(base)}")
    panels = _panels(base, structural_columns(base), mine)
    fig, axes = _grid(8, 5, len(panels))
    log = False
    for ax, (_, sub) in zip(axes, panels):
        d, _ = _line_panel(sub, x, mine)
        stages = [c for c in d.columns if c.startswith("stage_s.") and d[c].notna().any()]
        xs = _values(d, x)
        if stages:
            ax.stackplot(xs, *(d[c] * 1e3 for c in stages), labels=[c[len("stage_s."):] for c in stages], alpha=0.85)
        ax.plot(xs, _values(d, "forward_s"), "k-", lw=1.5, label="forward (critical path)")
        ax.set_xlabel(axis(x)[0])
        ax.set_ylabel(axis("forward_s")[0])
        log = log or (len(xs) and xs.min() > 0 and xs.max() / xs.min() > 20)
    for ax in axes if log else ():
        ax.set_xscale("log")
    _headline(fig, axes, title, _title(base), panels, mine)
    _legend_of(fig, axes, "stage")
    for n in mine:
        _say(notes, n)
    return _save(fig, path)


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
_FRONT_STYLES = ("-", "--", ":", "-.")


def better_lower(column: str) -> bool:
    """Whether a smaller value of the column is the better one on a Pareto front: times (forward, TTFT, ITL,
    stage and kind times) and memory; anything else (throughput) is better larger."""
    return column in ("forward_s", "ttft_s", "itl_s") or column.endswith("_gib") or column.startswith(
        ("stage_s.", "kind_s."))


def _text(v) -> str:
    """A legend entry's value: whole floats as integers (1048576, not 1.04858e+06), others as ``:g``."""
    if isinstance(v, (float, np.floating)):
        return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"
    return str(v)


def _keys(values) -> list:
    """The distinct values of a column, sorted (as text when they do not compare)."""
    u = list(dict.fromkeys(values.dropna()))
    try:
        return sorted(u)
    except TypeError:
        return sorted(u, key=str)


def _series_columns(d, name: str | None, field: str, auto: tuple) -> list[str]:
    """The columns a plot splits its points by: none for None/"", for ``"auto"`` every column of ``auto`` that
    holds more than one value in ``d``; a named column must exist (a one-line error naming ``field``)."""
    if not name:
        return []
    if name == "auto":
        return varying(d, auto)
    if name not in d.columns:
        few = [c for c in d.columns if d[c].dtype.kind not in "fc" and 1 < d[c].nunique() <= 20][:8]
        raise GraphsimError(field, f"no column {name!r} in the table" + (f"; e.g. {', '.join(few)}" if few else ""))
    return [name]


def plot_pareto(df, path, x: str = "tokens_per_s_per_user", y: str = "tokens_per_s_per_gpu",
                color: str | None = "auto", marker: str | None = "auto", where: str | None = None,
                title: str | None = None, fits_only: bool = True, notes: list | None = None):
    """Every valid point, its colour by the ``color`` column and its marker shape by the ``marker`` column, and
    the Pareto front (better is larger, or smaller for times and memory: :func:`better_lower`).

    * One panel per combination of the :data:`FACETS` that vary (model, hw, request structure): a front never
      spans two models or two GPUs.
    * ``color``: ``"auto"`` is every :data:`CHOICES <_choices>` column that varies (mapping, mode, each policy;
      their combination when several do); a numeric column of more than 12 values is drawn on a colour scale
      (with a colour bar), any other column one colour per value (legend on the right).
    * ``marker``: ``"auto"`` is every :data:`ESTIMATES` column that varies (profile, view…); any column works
      (``mode`` of a ``graphsim search`` table). None/"" for one marker.
    * The front is computed **per marker series** (one per profile / view / mode: which points are best under
      each), or over all points when there is no marker column. Each front is a black step line — the edge of
      the region its points dominate, one line style per series — and its points are enlarged with a black edge
      (legend below the axes).
    * A structural column that varies and is shown by none of these (``marker=None`` while profiles vary, a
      ``color`` that is not the mapping) gets its own panels, so no front mixes it; a note says so.
    * With ``fits_only``, points whose weights + KV exceed HBM (``fits`` false) are grey crosses, off the front.

    Only the ``x`` and ``y`` columns are required (no sweep-specific ones), so a ``graphsim search`` table
    (``tokens_per_s_per_user``, ``tokens_per_s_per_gpu``, ``mode``, ``mapping``, ``profile``…) plots as is.
    """
    require_columns(df, "x", (x,), "the Pareto plot's x axis")
    require_columns(df, "y", (y,), "the Pareto plot's y axis")
    from matplotlib.lines import Line2D

    mine: list = []
    d = _valid(df, where, mine)
    d = d.dropna(subset=[x, y]).reset_index(drop=True)
    colour_cols = _series_columns(d, color, "color", _choices())
    marker_cols = [c for c in _series_columns(d, marker, "marker", ESTIMATES) if c not in colour_cols or marker != "auto"]
    colour_cols = [c for c in colour_cols if c not in marker_cols or color != "auto"]
    shown = {*colour_cols, *marker_cols}
    facets = [c for c in structural_columns(d) if c not in shown and (c in FACETS or c in ESTIMATES)]
    hidden = [c for c in structural_columns(d) if c not in shown and c not in facets]
    if hidden:  # a choice that varies and is not the colour: its points share a front, unmarked
        _say(mine, f"{', '.join(hidden)} also {'varies' if len(hidden) == 1 else 'vary'}, shown by neither colour nor "
                   "marker (one front over them)")
    (xl, xs), (yl, ys) = axis(x), axis(y)
    maximize = (not better_lower(x), not better_lower(y))
    panels = _panels(d, facets, mine)
    fig, axes = _grid(8, 5, len(panels))
    color_name = ", ".join(colour_cols) or None
    marker_name = ", ".join(marker_cols) or None
    if colour_cols:
        d = d.assign(**{color_name: _combo(d, colour_cols)}) if len(colour_cols) > 1 else d
    if marker_cols:
        d = d.assign(**{marker_name: _combo(d, marker_cols)}) if len(marker_cols) > 1 else d
    shown_fits = d
    if fits_only and "fits" in d.columns:
        shown_fits = d[d["fits"].fillna(False).astype(bool)]
    colours = {i: PALETTE[0] for i in d.index}
    numeric = color_name is not None and d[color_name].dtype.kind in "iuf" and d[color_name].nunique() > 12
    if numeric:
        import matplotlib as mpl

        v = _values(shown_fits, color_name)
        norm, cmap = mpl.colors.Normalize(v.min(), v.max()), mpl.colormaps["viridis"]
        colours.update(zip(shown_fits.index, (tuple(c) for c in cmap(norm(v.to_numpy(float))))))
        fig.colorbar(mpl.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, label=axis(color_name)[0])
    elif color_name is not None:
        table = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(_keys(shown_fits[color_name]))}
        colours.update((i, table.get(k, "0.5")) for i, k in zip(d.index, d[color_name]))
        _legend(fig, [Line2D([], [], ls="", marker="o", ms=6, color=c) for c in table.values()],
                [_text(k) for k in table], title=color_name)
    keys = _keys(d[marker_name].astype(object).where(d[marker_name].notna(), "(none)")) if marker_name else [None]
    below: dict = {}  # legend under the axes: (label -> handle) of the fronts, then the crosses
    unfit = []
    for ax, (label, sub) in zip(axes, panels):
        g0 = d.loc[sub.index]
        if fits_only and "fits" in g0.columns:
            fits = g0["fits"].fillna(False).astype(bool)
            if (~fits).any():
                ax.scatter(g0.loc[~fits, x] * xs, g0.loc[~fits, y] * ys, s=10, marker="x", c="0.75", linewidths=0.8)
                unfit = [(Line2D([], [], ls="", marker="x", color="0.75"), "does not fit in HBM")]
            g0 = g0[fits]
        series = g0[marker_name].astype(object).where(g0[marker_name].notna(), "(none)") if marker_name else None
        for j, key in enumerate(keys):
            g = g0[series == key] if marker_name else g0
            sym, style = _MARKERS[j % len(_MARKERS)], _FRONT_STYLES[j % len(_FRONT_STYLES)]
            ax.scatter(g[x] * xs, g[y] * ys, s=14, alpha=0.55, marker=sym, c=[colours[i] for i in g.index],
                       linewidths=0)
            front = pareto_front(g, x, y, maximize)
            if len(front):  # the staircase bounding the region the front dominates
                ax.step(front[x] * xs, front[y] * ys, where="pre" if maximize[0] else "post", color="k", ls=style,
                        lw=1.3, zorder=3)
                ax.scatter(front[x] * xs, front[y] * ys, s=44, marker=sym, c=[colours[i] for i in front.index],
                           edgecolors="k", linewidths=1.0, zorder=4)
            if len(panels) == 1:
                text = f"{_text(key)} (front: {len(front)})" if marker_name else f"Pareto front ({len(front)} points)"
            else:
                text = f"{_text(key)} (front per panel)" if marker_name else "Pareto front (per panel)"
            below.setdefault(text, Line2D([], [], color="k", ls=style, lw=1.3, marker=sym, ms=7, mfc="0.6", mec="k"))
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
    _headline(fig, axes, title, "\n".join(t for t in (f"{yl} vs {xl}", _title(d)) if t), panels, mine)
    handles = [*below.values(), *(h for h, _ in unfit)]
    _legend(fig, handles, [*below, *(t for _, t in unfit)], title=marker_name or "Pareto front", where="below")
    for n in mine:
        _say(notes, n)
    return _save(fig, path)


def plot_memory(df, path, x: str | None = None, where: str | None = None, series: str | None = "auto",
                title: str | None = None, notes: list | None = None):
    """Weights + KV + workspace per device vs ``x`` (stacked), with the HBM capacity as a dashed line, one panel
    per combination of the structural columns that vary; with a ``series`` column (default: the one other
    varying length/batch input, if exactly one) one total-memory line per value of it too (e.g. one per batch
    size; at most 10, a note says how many more)."""
    require_columns(df, "kind", ("weights_gib", "kv_gib", "workspace_gib", "total_gib", "capacity_gib"),
                    "a memory plot")
    x = x or _default_x(df)
    if series == "auto":
        others = [c for c in input_columns(df) if c != x and not c.startswith(("hw.", "profile."))
                  and df[c].nunique() > 1]
        series = others[0] if len(others) == 1 else None
    mine: list = []
    base = _valid(df, where, mine)
    if x not in base.columns:
        raise GraphsimError("x", f"no column {x!r}; inputs: {input_columns(base)}")
    panels = _panels(base, structural_columns(base), mine)
    fig, axes = _grid(8, 5, len(panels))
    for ax, (_, sub) in zip(axes, panels):
        if series:  # the stack at the first value of the series column, its totals at every value
            d, fixed = slice_rows(sub, x)
            other = [f for f in fixed.split(", ") if f and not f.startswith(f"{series}=")]
            if other:
                _say(mine, f"fixed at the first value: {', '.join(other)}")
        else:
            d, _ = _line_panel(sub, x, mine)
        xs = _values(d, x)
        ax.stackplot(xs, d["weights_gib"], d["kv_gib"], d["workspace_gib"],
                     labels=["weights", "KV cache", "workspace"], alpha=0.85)
        if series:
            keep = sub["struct_id"] == d["struct_id"].iloc[0] if "struct_id" in sub.columns and len(d) else True
            values = sorted(sub.loc[keep, series].unique())
            if len(values) > 10:
                _say(mine, f"total memory drawn for the first 10 of {len(values)} values of {series}")
            for v in values[:10]:
                g, _ = slice_rows(sub[keep & (sub[series] == v)], x)
                ax.plot(_values(g, x), g["total_gib"], lw=1,
                        label=f"total, {axis(series)[0]} = {v * axis(series)[1]:g}")
        ax.plot(xs, d["capacity_gib"], "r--", lw=1.5, label="HBM capacity")
        ax.set_xlabel(axis(x)[0])
        ax.set_ylabel("memory per device (GiB)")
        if len(xs) and xs.min() > 0 and xs.max() / xs.min() > 20:
            ax.set_xscale("log")
        if series and len(d) and d["total_gib"].max() > 0:
            ax.set_ylim(0, max(d["capacity_gib"].max() * 1.6, d["total_gib"].max() * 1.1))
    _headline(fig, axes, title, _title(base), panels, mine)
    _legend_of(fig, axes, "per device")
    for n in mine:
        _say(notes, n)
    return _save(fig, path)


def plot_kinds(source, path, rows: int = 8, where: str | None = None, title: str | None = None,
               notes: list | None = None):
    """Horizontal stacked bars of busy time per op kind, each kind in its :func:`kind_colour`: one bar per
    Report, or per sweep row (the first ``rows`` valid rows after ``where``; a note says how many more there
    were), each bar labelled by its values of the structural columns and inputs that vary."""
    mine: list = []
    if hasattr(source, "breakdown"):  # a Report
        labels = [f"{source.identity['model']} {source.identity['mapping']}"]
        kinds = sorted(source.breakdown, key=lambda k: -source.breakdown[k])
        values = np.array([[source.breakdown[k] for k in kinds]])
        shared = ""
    else:
        d = _valid(source, where, mine)
        cols = [c for c in d.columns if c.startswith("kind_s.") and d[c].notna().any()]
        if not cols:
            raise GraphsimError("kinds", "the table has no kind_s.* columns; run the sweep with outputs = [\"kinds\"]")
        if len(d) > rows:
            _say(mine, f"the first {rows} of {len(d)} rows drawn; choose others with where / --where")
        shared = _title(d)
        struct = structural_columns(d) or (["mapping"] if "mapping" in d.columns else [])
        ins = [c for c in input_columns(d) if d[c].nunique() > 1] or input_columns(d)
        d = d.head(rows)
        kinds = [c[len("kind_s."):] for c in sorted(cols, key=lambda c: -d[c].sum())]
        values = d[[f"kind_s.{k}" for k in kinds]].fillna(0.0).to_numpy()
        labels = [" ".join([_text(r[c]) for c in struct] + [f"{c.split('.')[-1]}={r[c]:g}" for c in ins])
                  for _, r in d.iterrows()]
    fig, ax = _figure(9, 1.6 + 0.45 * len(labels))
    left = np.zeros(len(labels))
    for j, k in enumerate(kinds):
        ax.barh(labels, values[:, j] * 1e3, left=left * 1e3, label=k, color=kind_colour(k))
        left += values[:, j]
    ax.set_xlabel("busy time (ms, summed over ops)")
    ax.invert_yaxis()
    ax.set_title("\n".join(x for x in (title or "time by op kind" + (f": {shared}" if shared else ""),
                                        "; ".join(mine)) if x), fontsize=10)
    _legend(fig, *ax.get_legend_handles_labels(), title="op kind")
    for n in mine:
        _say(notes, n)
    return _save(fig, path)


def roofline_points(schedule, point: int = 0) -> dict:
    """Per op with FLOPs: arithmetic intensity (FLOP per HBM byte), achieved FLOP/s, kind, name and the
    roofs (peak FLOP/s per precision used, HBM bytes/s) from the schedule's unit times."""
    from graphsim.core.ir import COMPONENTS, HBM_COMPONENTS

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


_ROOF_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)))


def plot_roofline(schedule, path, point: int = 0, title: str = ""):
    """Log-log roofline: ops as dots in their kind's :func:`kind_colour` (legend: op kinds by FLOPs' share, on
    the right); the HBM slope and one flat roof per precision (legend below)."""
    r = roofline_points(schedule, point)
    fig, ax = _figure(8, 5.5)
    kinds, tflops = np.array(r["kind"]), r["achieved"] / 1e12
    dots = []
    rank = {k: i for i, k in enumerate(OP_KINDS)}
    for k in sorted(dict.fromkeys(r["kind"]), key=lambda k: (rank.get(k, len(rank)), k)):
        m = kinds == k
        dots.append(ax.scatter(r["intensity"][m], tflops[m], s=14, alpha=0.7, color=kind_colour(k), label=k))
    roofs = []
    if len(r["intensity"]):
        lo, hi = r["intensity"].min() / 4, r["intensity"].max() * 4
        ai = np.geomspace(min(lo, 1e-1), max(hi, 1e4), 200)
        for j, (p, peak) in enumerate(r["peaks"].items()):  # grey, one dash each: colours are the kinds'
            roofs += ax.plot(ai, np.minimum(peak, r["hbm_bw"] * ai) / 1e12, color="0.3", lw=1,
                             ls=_ROOF_STYLES[j % len(_ROOF_STYLES)], label=f"{p}: {peak / 1e12:,.0f} TFLOP/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title or f"roofline: {schedule.graph.name}", fontsize=10)
    _legend(fig, dots, [h.get_label() for h in dots], title="op kind")
    _legend(fig, roofs, [h.get_label() for h in roofs], title=f"roofs (HBM {r['hbm_bw'] / 1e12:.1f} TB/s)",
            where="below")
    return _save(fig, path)


PLOTS = {"latency": plot_latency, "pareto": plot_pareto, "memory": plot_memory, "kinds": plot_kinds}

__all__ = ["pareto_front", "slice_rows", "input_columns", "structural_columns", "varying", "FACETS", "ESTIMATES", "plot_latency", "plot_pareto", "plot_memory",
           "plot_kinds", "plot_roofline", "roofline_points", "PLOTS", "OP_KINDS", "PALETTE", "KIND_COLOURS",
           "kind_colour", "AXES", "axis", "better_lower"]


def plot_serving(res, path=None, title: str | None = None):
    """A serving simulation (graphsim.serving.SimResult): TTFT and TPOT CDFs on the left, bytes held per KV tier
    and the queue over time on the right."""
    import numpy as np

    plt = _plt()
    fig = plt.figure(figsize=(12, 4.2), layout="constrained")
    a1, a2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "end-to-end")):
        v = np.sort(np.asarray(res.requests[key], dtype=np.float64))
        v = v[np.isfinite(v)]
        if v.size:
            a1.plot(v, np.arange(1, v.size + 1) / v.size, label=label)
    a1.set_xscale("log")
    a1.set_xlabel("ms")
    a1.set_ylabel("fraction of requests")
    a1.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=8)
    tl = res.timeline
    t = np.asarray(tl["t_s"], dtype=np.float64)
    if t.size:
        t = t - t[0]
        for key, label in (("hbm_bytes", "HBM (all replicas)"), ("hbm_cached_bytes", "HBM prefix cache"),
                           ("host_bytes", "host pool"), ("disk_bytes", "disk")):
            v = np.asarray(tl[key], dtype=np.float64) / 2.0**30
            if v.any():
                a2.plot(t, v, label=label)
        a2.set_xlabel("s since the first arrival")
        a2.set_ylabel("GiB held")
        a2.grid(True, alpha=0.3)
        q = a2.twinx()
        q.plot(t, tl["waiting"], color="grey", linestyle=":", label="waiting requests")
        q.set_ylabel("waiting requests")
        h1, l1 = a2.get_legend_handles_labels()
        h2, l2 = q.get_legend_handles_labels()
        a2.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    d = res.deployment
    fig.suptitle(title or f"{d['model']} on {d['replicas']}x {d['mapping']} ({d['hw']}, view {d['view']})")
    return _save(fig, path)
