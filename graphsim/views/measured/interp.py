"""Interpolation inside one partition, in log space over shape coordinates.

A lookup fixes the coordinates an op's shape decides at compile time (GEMM n and k, head counts) and leaves
one or two to vary with the workload point (tokens; batch and context). :func:`build_curve` reads the
partition's rows into a small grid over the varying coordinates at the fixed ones — categorical
coordinates (head counts, head dims, expert layouts) must match exactly, the others are interpolated
log-linearly between the neighbouring measured values; :func:`eval_curve` then interpolates that grid at
every point (NumPy or JAX), exactly returning a row's latency at its measured shape.

Beyond the measured range the rule is physical and marked as extrapolation. A varying coordinate: below the
smallest measured value the latency stays at that row's (a smaller problem is not timed faster than the
kernel's floor), above the largest it grows with the op's *work* between the edge row and the point
(:data:`WORK`): for a context attention's sequence length the causal (query, key) pairs of a prompt, at the
efficiency trend the kernel's own rows show there — time ∝ work^γ, γ = the last measured segment's time
growth over its work growth, clipped to [0, 1] (a kernel never gets less efficient beyond its last row; its
per-query linear costs amortize as pairs grow, which is why a FlashAttention row's time grows slower than its
pairs), and never less than in proportion to the coordinate; in proportion for every other coordinate
(tokens, batch, context, bytes: throughput-bound). A fixed coordinate (a dimension the work is
proportional to): in proportion both ways, never below the fastest row of the partition (its launch floor).
The view holds an extrapolated time at or above the op's SOL at the point.
"""
from __future__ import annotations

import attrs
import numpy as np

from .schema import FAMILIES
from .store import Partition

MEASURED, INTERPOLATED, EXTRAPOLATED = 0, 1, 2


def _causal_pairs(n, window: float, xp):
    """(query, key) pairs of one prompt of ``n`` new tokens attending causally (within ``window`` keys when
    > 0): n(n+1)/2, or W(W+1)/2 + (n - W)·W beyond the window."""
    full = n * (n + 1.0) / 2.0
    if not window:
        return full
    return xp.where(n <= window, full, window * (window + 1.0) / 2.0 + (n - window) * window)


#: per family, the varying coordinate whose work grows faster than in proportion (the prompt length of a context
#: attention: its causal pairs, :func:`_causal_pairs`) and the fixed coordinate holding its window (or None)
WORK = {
    "attention_context": ("seq", "window"),
    "mla_context": ("seq", None),
}


def _beyond(rule, q, top: float, xp):
    """The factor from the grid's last value ``top`` to ``q`` (>= 1): in proportion to the coordinate, or with a
    work rule time ∝ work^γ, never slower-growing than the coordinate itself."""
    qq = xp.maximum(q, top)
    if rule is None:
        return qq / top
    _, window, gamma = rule
    return xp.maximum((_causal_pairs(qq, window, xp) / _causal_pairs(top, window, np)) ** gamma, qq / top)


def _grows(family: str, varying: tuple, fixed: dict, axes: list, grid: np.ndarray, filled: np.ndarray) -> tuple:
    """Per varying coordinate: None (in proportion beyond the grid) or (a key naming the rule, the window of its
    causal pairs (0: none), γ: the measured time's growth over the pairs' on the last segment)."""
    coord, wcol = WORK.get(family, (None, None))
    window = float(fixed.get(wcol, 0) or 0) if wcol else 0.0

    def work(q):
        return _causal_pairs(q, window, np)

    out = []
    for a, c in enumerate(varying):
        if c != coord:
            out.append(None)
            continue
        g = np.asarray(axes[a], dtype=np.float64)
        lines = np.moveaxis(grid, a, -1).reshape(-1, len(g))
        meas = np.moveaxis(~filled, a, -1).reshape(-1, len(g))
        gammas, top = [], []
        for t, ok in zip(lines, meas):
            k = np.nonzero(ok & np.isfinite(t) & (t > 0))[0]
            if len(k) < 2:
                continue
            top.append(k[-1] == len(g) - 1)
            i, j = k[-2], k[-1]
            dw = np.log(work(g[j]) / work(g[i]))
            if dw > 0:
                gammas.append(float(np.clip(np.log(t[j] / t[i]) / dw, 0.0, 1.0)))
        # the trend where the rows end: the lines measured up to the axis's last value (the edge a point beyond
        # the grid is scaled from), else every line's own last segment
        edge = [x for x, at_top in zip(gammas, top) if at_top]
        gamma = float(np.median(edge or gammas)) if gammas else 1.0
        out.append(((family, window, gamma), window, gamma))
    return tuple(out)


@attrs.frozen(eq=False)
class Curve:
    partition: Partition
    rule: str  # how the partition was admitted ("" = the named backend)
    axes: tuple  # 1 or 2 sorted float arrays: the varying coordinates' measured values
    t: np.ndarray  # latency on the grid (seconds), shape = axis lengths
    filled: np.ndarray  # bool, same shape: cell filled by the extrapolation rule
    fixed_flag: int  # MEASURED when every fixed coordinate hit a measured value, else INTERPOLATED / EXTRAPOLATED
    #: evaluation tables (from :func:`_prepare`): per axis (log grid, 1/segment width, bucket -> first knot,
    #: buckets per log unit); per cell the log-space differences to its neighbours
    search: tuple = ()
    cells: np.ndarray = None
    #: per axis, None (in proportion beyond the grid) or (rule key, the window of the prompt's causal pairs
    #: (0: none), γ: time ∝ pairs^γ beyond the last row)
    grow: tuple = ()


def _prepare(axes: tuple, t: np.ndarray, filled: np.ndarray) -> tuple[tuple, np.ndarray]:
    """Per axis: log grid, inverse segment widths (a last, empty segment so the last knot is a cell's
    corner 0 too) and a bucketed search (uniform buckets in log space, at most one knot strictly inside
    each, so finding a segment is one gather and one comparison). Per cell: t at its corner 0 and the
    log-space differences to the other corners (so a point on a knot returns the row's t exactly) and
    whether each corner was filled by the extrapolation rule."""
    search = []
    for g in axes:
        lg = np.log(g)
        inv = np.append(1.0 / np.diff(lg), 0.0) if len(g) > 1 else np.zeros(1)
        span = lg[-1] - lg[0]
        gap = np.diff(lg).min() if len(g) > 1 else 1.0
        nb = int(min(max(np.ceil(span / gap) + 1, 1), 1 << 16)) if len(g) > 1 else 1
        per = nb / span if span > 0 else 0.0
        starts = lg[0] + np.arange(nb) / per if per else np.zeros(1)
        first = np.clip(np.searchsorted(lg, starts, side="right") - 1, 0, len(g) - 1)
        exact_buckets = len(g) <= 1 or (np.diff(lg) > 1.0 / per).all() if per else True
        search.append((lg, inv, first, per, bool(exact_buckets)))
    return tuple(search), _cells(t, filled)


def _cells(t: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """Per cell of a 1-D or 2-D grid: t at its corner 0, the log-space differences to the other corners and
    whether each corner was filled by the extrapolation rule (a last, constant knot per axis)."""
    lt = np.log(t)
    lt_p, f_p = lt, filled.astype(np.float64)
    for a in range(lt.ndim):  # one extra (constant) knot per axis: the last knot is a corner 0 too
        lt_p = np.concatenate([lt_p, np.take(lt_p, [-1], axis=a)], axis=a)
        f_p = np.concatenate([f_p, np.take(f_p, [-1], axis=a)], axis=a)
    if lt.ndim == 1:
        return np.stack([t, lt_p[1:] - lt_p[:-1], f_p[:-1], f_p[1:]], axis=1)
    d0 = lt_p[1:, :-1] - lt_p[:-1, :-1]
    d1 = lt_p[:-1, 1:] - lt_p[:-1, :-1]
    d01 = lt_p[1:, 1:] - lt_p[1:, :-1] - lt_p[:-1, 1:] + lt_p[:-1, :-1]
    return np.stack([t.ravel(), d0.ravel(), d1.ravel(), d01.ravel(), f_p[:-1, :-1].ravel(), f_p[1:, :-1].ravel(),
                     f_p[:-1, 1:].ravel(), f_p[1:, 1:].ravel()], axis=1)


def _median(t: np.ndarray) -> float:
    return float(np.median(t)) if len(t) > 1 else float(t[0])


def _interp_fixed(x: np.ndarray, t: np.ndarray, dims: list, query: list, floor: float) -> tuple[float, int] | None:
    """Latency at the fixed coordinates (multilinear in log space over measured neighbours, proportional
    beyond the measured range, never below ``floor``) and its source flag; None when a neighbour is
    missing."""
    if not dims:
        return (_median(t), MEASURED) if len(t) else None
    d, q = dims[0], query[0]
    col = x[:, d]
    vals = np.unique(col)
    if q in vals:
        sel = col == q
        return _interp_fixed(x[sel], t[sel], dims[1:], query[1:], floor)
    if q <= 0:
        return None
    lo, hi = vals[vals < q], vals[vals > q]
    if not len(lo) or not len(hi):  # outside the measured range: in proportion to the nearest
        edge = hi.min() if not len(lo) else lo.max()
        r = _interp_fixed(x[col == edge], t[col == edge], dims[1:], query[1:], floor)
        return None if r is None else (max(r[0] * q / edge, floor), EXTRAPOLATED)
    lo, hi = lo.max(), hi.min()
    a = _interp_fixed(x[col == lo], t[col == lo], dims[1:], query[1:], floor)
    b = _interp_fixed(x[col == hi], t[col == hi], dims[1:], query[1:], floor)
    if a is None or b is None:
        return None
    w = (np.log(q) - np.log(lo)) / (np.log(hi) - np.log(lo))
    return float(np.exp((1 - w) * np.log(a[0]) + w * np.log(b[0]))), max(INTERPOLATED, a[1], b[1])


def build_curve(part: Partition, rule: str, fixed: dict, varying: tuple) -> Curve | str:
    """The grid over ``varying`` at ``fixed`` coordinates, or why the partition cannot serve them."""
    fam = FAMILIES[part.family]
    idx = {c: j for j, c in enumerate(part.coords)}
    sel = np.ones(len(part.t), dtype=bool)
    for c in fam.exact:
        if c in fixed:
            sel &= part.x[:, idx[c]] == fixed[c]
            if not sel.any():
                have = sorted(set(part.x[:, idx[c]].tolist()))
                return f"{c}={fixed[c]} not measured (has {have[:8]})"
    x, t = part.x[sel], part.t[sel]
    dims = [idx[c] for c in fixed if c not in fam.exact]
    query = [fixed[c] for c in fixed if c not in fam.exact]
    vdims = [idx[c] for c in varying]
    axes = [np.unique(x[:, d]) for d in vdims]
    shape = tuple(len(a) for a in axes)
    grid = np.full(shape, np.nan)
    fixed_flag = MEASURED
    floor = float(part.t.min())
    for cell in np.ndindex(*shape):
        s = np.ones(len(t), dtype=bool)
        for d, a, i in zip(vdims, axes, cell):
            s &= x[:, d] == a[i]
        r = _interp_fixed(x[s], t[s], dims, query, floor) if s.any() else None
        if r is not None:
            grid[cell] = r[0]
            fixed_flag = max(fixed_flag, r[1])
    if not np.isfinite(grid).any():
        rng = {c: (int(x[:, idx[c]].min()), int(x[:, idx[c]].max())) for c in fixed if c not in fam.exact} if len(x) else {}
        return f"no rows around {', '.join(f'{c}={fixed[c]}' for c in fixed if c not in fam.exact)} (measured {rng})"
    filled = ~np.isfinite(grid)
    grow = _grows(part.family, tuple(varying), fixed, list(axes), grid, filled)
    if len(shape) == 1:
        keep = np.isfinite(grid)
        axes, grid, filled = [axes[0][keep]], grid[keep], filled[keep]
    else:  # fill holes along the inner axis of each row by the extrapolation rule; drop empty rows
        rows = [i for i in range(shape[0]) if np.isfinite(grid[i]).any()]
        a1 = axes[1]
        for i in rows:
            ok = np.isfinite(grid[i])
            g, v = a1[ok], grid[i, ok]
            for j in np.where(~ok)[0]:
                q = a1[j]
                if q < g[0]:
                    grid[i, j] = v[0]
                elif q > g[-1]:
                    grid[i, j] = v[-1] * float(_beyond(grow[1], q, g[-1], np))
                else:
                    k = np.searchsorted(g, q) - 1
                    w = (np.log(q) - np.log(g[k])) / (np.log(g[k + 1]) - np.log(g[k]))
                    grid[i, j] = np.exp((1 - w) * np.log(v[k]) + w * np.log(v[k + 1]))
        axes, grid, filled = [axes[0][rows], a1], grid[rows], filled[rows]
    axes = tuple(np.asarray(a, dtype=np.float64) for a in axes)
    search, cells = _prepare(axes, grid, filled)
    return Curve(part, rule, axes, grid, filled, fixed_flag, search, cells, grow)


def _segment(lq, search: tuple, xp):
    """(knot index at or below log-coordinate ``lq`` (clipped to the grid), its log value, 1/segment width):
    the bucket's first knot, plus one if the next knot is at or below ``lq`` — two row gathers."""
    lg, inv, first, per, exact_buckets = search
    n = len(lg)
    if n == 1:
        z = 0.0 * lq
        return z.astype(np.int64), z + lg[0], z
    seg = xp.asarray(np.stack([lg, inv], axis=1))
    if not exact_buckets:  # knots closer than a bucket (more than 65,536 of them): binary search
        if xp is np:
            i = np.clip(np.searchsorted(lg, lq, side="right") - 1, 0, n - 1)
        else:
            i = xp.clip(xp.searchsorted(xp.asarray(lg), lq, side="right", method="scan_unrolled") - 1, 0, n - 1)
    else:
        table = xp.asarray(np.stack([first.astype(np.float64), np.append(lg[1:], np.inf)[first]], axis=1))
        b = xp.clip(xp.floor((lq - lg[0]) * per), 0, len(first) - 1).astype(np.int64)
        row = table[b]
        i = row[:, 0].astype(np.int64) + xp.where(lq >= row[:, 1], 1, 0)
    r = seg[i]
    return i, r[:, 0], r[:, 1]


def _locate(curve: Curve, a: int, q, lq, xp):
    """Where ``q`` falls on axis ``a``: (segment, weight, scale beyond the grid, outside the grid)."""
    g = curve.axes[a]
    lg = curve.search[a][0]
    lqc = xp.clip(lq, lg[0], lg[-1])
    i, lgi, inv = _segment(lqc, curve.search[a], xp)
    # above the grid: with the op's work (in proportion unless the family says otherwise); below: the edge's value
    rule = curve.grow[a] if a < len(curve.grow) else None
    if rule is None:
        scale = xp.maximum(q / g[-1], 1.0)
    else:
        scale = _beyond(rule, q, float(g[-1]), xp)
    return i, (lqc - lgi) * inv, scale, (q < g[0]) | (q > g[-1])


def eval_curve(curve: Curve, qs: list, xp=np):
    """Latency (P,) and source flag (P,) of ``curve`` at varying coordinates ``qs`` (one (P,) array each):
    multilinear in log space, one exponential per point; a point on a measured shape returns its row
    exactly. (A program's curves are evaluated together by graphsim.views.measured.bank, which equals this.)"""
    shape = curve.t.shape
    idx, ws, scale, outside, on_knot = [], [], 1.0, False, True
    for a, q in enumerate(qs):
        lq = xp.log(xp.maximum(q, 1e-300))
        i, w, sc, out = _locate(curve, a, q, lq, xp)
        idx.append(i)
        ws.append(w)
        scale = scale * sc
        outside = outside | out
        on_knot = on_knot & (w == 0.0)
    cells = xp.asarray(curve.cells)
    if len(shape) == 1:
        r = cells[idx[0]]
        val = r[:, 0] * xp.exp(ws[0] * r[:, 1])
        filled = (r[:, 2] > 0) | ((ws[0] > 0) & (r[:, 3] > 0))
    else:
        w0, w1 = ws
        r = cells[idx[0] * shape[1] + idx[1]]
        val = r[:, 0] * xp.exp(w0 * r[:, 1] + w1 * r[:, 2] + w0 * w1 * r[:, 3])
        filled = (r[:, 4] > 0) | ((w0 > 0) & (r[:, 5] > 0)) | ((w1 > 0) & (r[:, 6] > 0)) | ((w0 * w1 > 0) & (r[:, 7] > 0))
    val = val * scale
    flag = xp.where(outside | filled, EXTRAPOLATED, xp.where(on_knot, MEASURED, INTERPOLATED))
    return val, xp.maximum(flag, curve.fixed_flag)
