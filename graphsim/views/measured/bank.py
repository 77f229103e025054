"""A program's table curves evaluated together: one knot grid per coordinate, one row gather for all its curves.

Timing a program's curves one by one (:func:`graphsim.views.measured.interp.eval_curve`) costs, per curve and
point, a segment search, three row gathers and an exponential: 15-30 ns per point on a CPU, 20-30 curves per
program. Here the curves that read one coordinate — at any scale: an all-reduce's bytes are 14,336 x the tokens a
GEMM reads — are resampled onto the union of their knots in the coordinate's base units. A multilinear
interpolation in log space reproduces them there exactly: a log-linear piece restricted to a sub-segment is
log-linear, and so are a curve's floor below its first row (flat) and its in-proportion growth beyond its last
(slope 1). A point's segment is then found once per coordinate, and one row gather gives every curve's corner
value, log slopes and source flags on that segment.

A work rule beyond a curve's last row (:data:`graphsim.views.measured.interp.WORK`: time ∝ pairs^γ) is not
log-linear: such a curve's table holds its last row's value beyond it, and the rule's factor is applied per point,
as :func:`~graphsim.views.measured.interp.eval_curve` does.

The source flags are the curves' own (a merged knot that is not one of a curve's rows is *interpolated* for it).
"""
from __future__ import annotations

import attrs
import numpy as np

from graphsim.lowering.xla import apart, exp, log

from .interp import EXTRAPOLATED, INTERPOLATED, MEASURED, Curve, _beyond, _cells

#: a coordinate's search: buckets of 2^-b of an octave (b the least with at most MAX_INSIDE knots strictly inside a
#: bucket), at most MAX_BUCKETS of them; knots closer than that are found by a binary search
MAX_BUCKETS, MAX_INSIDE = 1 << 14, 3


@attrs.frozen(eq=False)
class Axis:
    """The union of several curves' knots on one base coordinate, and the search that finds a point's segment.

    A positive float's bits, read as an integer, grow with it: ``bits >> s`` numbers buckets of 2^(s - 52) of an
    octave with no logarithm. Per bucket (point-minor rows): the last knot at or below its start, then the next
    ``m`` knots' values (+inf past the last), which a point is compared with."""

    knots: np.ndarray  # (n,) sorted, positive, base units
    shift: int  # s: bucket = (bits of the point >> s) - base
    base: int
    buckets: np.ndarray  # (1 + m, nb): first knot index, then the next m knots' values; (1, 0): a binary search
    seg: np.ndarray  # (2, n): knot value, 1 / log width of the segment starting there (0 for the last)

    @classmethod
    def build(cls, knots: np.ndarray) -> "Axis":
        g = np.asarray(knots, dtype=np.float64)
        n = len(g)
        inv = np.append(1.0 / np.diff(np.log(g)), 0.0) if n > 1 else np.zeros(1)
        seg = np.stack([g, inv])
        bits = g.view(np.int64)
        best = None
        for b in range(0, 24):
            s = 52 - b
            lo, hi = int(bits[0] >> s), int(bits[-1] >> s)
            nb = hi - lo + 1
            if nb > MAX_BUCKETS:
                break
            k = np.arange(lo, hi + 2, dtype=np.int64) << s
            edges = k.view(np.float64)  # bucket starts, then the last bucket's end
            first = np.clip(np.searchsorted(g, edges[:-1], side="right") - 1, 0, n - 1)
            inside = np.searchsorted(g, edges[1:], side="left") - 1 - first  # knots after the first, below the end
            best = (s, lo, first, max(int(inside.max()), 1))
            if best[3] <= MAX_INSIDE:
                break
        if n == 1 or best is None or best[3] > 4 * MAX_INSIDE:
            return cls(g, 0, 0, np.zeros((1, 0)), seg)
        s, lo, first, m = best
        nxt = first[None, :] + np.arange(1, m + 1)[:, None]
        vals = np.where(nxt < n, g[np.minimum(nxt, n - 1)], np.inf)
        return cls(g, s, lo, np.concatenate([first[None, :].astype(np.float64), vals]), seg)

    def locate(self, q, xp):
        """(segment index, weight in [0, 1) in log space, outside the knots) of every point ``q`` (P,): the
        weight is log(q / knot) x 1/width, exactly 0 on a knot whatever the platform's log."""
        g = self.knots
        n = len(g)
        qc = xp.clip(q, g[0], g[-1])
        outside = (q < g[0]) | (q > g[-1])
        if n == 1:
            return xp.zeros(q.shape, dtype=np.int32), 0.0 * q, outside
        if not self.buckets.shape[1]:
            i = xp.searchsorted(xp.asarray(g), qc, side="right") - 1
        else:
            b = xp.clip((_bits(qc, xp) >> self.shift) - self.base, 0, self.buckets.shape[1] - 1).astype(np.int32)
            row = apart(lambda b: _take(self.buckets, b, xp), b, xp)
            i = row[0].astype(np.int32) + xp.sum((qc[None, :] >= row[1:]).astype(np.int32), axis=0)
        i = xp.clip(i, 0, n - 1).astype(np.int32)
        s = apart(lambda i: _take(self.seg, i, xp), i, xp)
        return i, log(qc / s[0], xp) * s[1], outside


def _bits(x, xp):
    """A float64 array's bits as int64 (monotonic in x for x > 0)."""
    if xp is np:
        return np.asarray(x, dtype=np.float64).view(np.int64)
    from jax import lax

    return lax.bitcast_convert_type(x.astype(np.float64), np.int64)


def _axis_map(own: np.ndarray, G: np.ndarray):
    """Where each merged knot ``G`` (and the open segment after it) falls on a curve's own knots ``own`` (both in
    base units; ``own`` a subset of ``G``): (own segment, log weight in it, on one of its knots, below its first,
    above its last) at the knots, and whether the open segment after each is above its last (below its first is
    the knot's own answer: ``own[0]`` is a merged knot)."""
    n = len(own)
    j = np.clip(np.searchsorted(own, G, side="right") - 1, 0, n - 1)
    below, above = G < own[0], G > own[-1]
    on = own[j] == G
    inside = ~below & ~above
    w = np.zeros(len(G))
    mid = inside & ~on & (j < n - 1)
    jj = np.minimum(j + 1, n - 1)
    w[mid] = np.log(G[mid] / own[j[mid]]) / np.log(own[jj[mid]] / own[j[mid]])
    return j, w, on & inside, below, above, G >= own[-1]


@attrs.frozen(eq=False)
class Group:
    """The curves on one tuple of base coordinates (one or two), on their merged knots (point-minor tables)."""

    coords: tuple  # base coordinates (mapping.Coord), one per axis
    axes: tuple  # Axis per coordinate
    rows: np.ndarray  # (K,) the curves' rows in the bank's output
    values: np.ndarray  # (V x K, cells): per cell the curves' corner values, then their log slopes (V - 1 blocks)
    flags: np.ndarray  # (2^d x K, cells): per cell the curves' source flags per pattern of weights (on knot or not)
    #: per axis (K,): the merged index of each curve's first and last own row (outside them: extrapolated)
    first: tuple
    last: tuple
    always: np.ndarray  # (K,) bool: extrapolated everywhere (a fixed coordinate outside its measured range)
    filled: bool  # some curve has cells filled by the extrapolation rule (its flags are then read from ``flags``)
    scales: tuple  # per axis (K,): a curve's coordinate / the base coordinate
    work: tuple  # (column, axis, rule, top in the curve's units) for each curve with a work rule on an axis
    tops: tuple  # per axis (K,) bool: the columns growing in proportion beyond the merged knots (no work rule)

    def evaluate(self, Q: dict, located: dict, xp, flags: bool = True, post=None):
        """(values (K, P), flags (K, P)) at the base coordinates' values ``Q``: the source flags as floats, or
        with ``flags=False`` only whether each is extrapolated (bool). ``located`` shares the searches between
        groups on the same knots."""
        K = len(self.rows)
        loc = []
        for co, ax in zip(self.coords, self.axes):
            key = (co, ax.knots.tobytes())
            if key not in located:
                located[key] = ax.locate(Q[co], xp)
            loc.append(located[key])
        if len(loc) == 1:
            (i, w, outside), = loc
            cell = i
        else:
            (i0, w0, out0), (i1, w1, out1) = loc
            cell, outside = i0 * len(self.axes[1].knots) + i1, out0 | out1
        want = flags or self.filled
        r, f = apart(lambda c: (_take(self.values, c, xp), _take(self.flags, c, xp) if want else None), cell, xp)
        # the curves' rows computed once, on their own (their readers are many rows, each its own loop)
        return apart(lambda _: self._rows(Q, loc, outside, r, f, want, flags, xp, post), cell, xp)

    def _rows(self, Q, loc, outside, r, f, want, flags, xp, post=None):
        K = len(self.rows)
        if len(loc) == 1:
            (i, w, _), = loc
            x = w[None, :] * r[K:]
        else:
            (i0, w0, _), (i1, w1, _) = loc
            x = w0[None, :] * r[K:2 * K] + w1[None, :] * r[2 * K:3 * K] + (w0 * w1)[None, :] * r[3 * K:]
        val = r[:K] * exp(x, xp)
        if want:
            if len(loc) == 1:
                flag = xp.where((w > 0)[None, :], f[K:], f[:K])
            else:
                p0, p1 = (w0 > 0)[None, :], (w1 > 0)[None, :]
                fs = [f[p * K:(p + 1) * K] for p in range(4)]  # patterns (w0 > 0, w1 > 0): 00, 10, 01, 11
                flag = xp.where(p0, xp.where(p1, fs[3], fs[1]), xp.where(p1, fs[2], fs[0]))
            flag = xp.where(outside[None, :], float(EXTRAPOLATED), flag)
            if not flags:
                flag = flag == EXTRAPOLATED
        else:  # extrapolated: outside a curve's own rows on some axis (or everywhere)
            flag = outside[None, :] | self.always[:, None]
            for (i, w, _), lo, hi in zip(loc, self.first, self.last):
                ii = i[None, :]
                flag = flag | (ii < lo[:, None]) | (ii > hi[:, None]) | ((ii == hi[:, None]) & (w > 0)[None, :])
        # beyond the merged knots: in proportion (the tables grow so up to the last knot), or by a work rule
        for a, (co, ax) in enumerate(zip(self.coords, self.axes)):
            mask = self.tops[a]
            if not mask.any():
                continue
            s = xp.maximum(Q[co] / ax.knots[-1], 1.0)[None, :]
            val = val * (s if mask.all() else xp.where(xp.asarray(mask)[:, None], s, 1.0))
        if self.work:
            fac = {c: _beyond(rule, Q[self.coords[a]] * self.scales[a][c], top, xp) for c, a, rule, top in self.work}
            val = xp.stack([val[k] * fac[k] if k in fac else val[k] for k in range(K)])
        if post is None:
            return val, flag
        k, fn = post  # the first k rows through fn; the others (if any) as they are, apart: (head, tail)
        return (fn(val, flag) if k == K else (fn(val[:k], flag[:k]), val[k:])), flag

    @classmethod
    def build(cls, coords: tuple, members: list, rows: np.ndarray) -> "Group":
        """``members``: (curve, scales per axis) — a curve's axis a reads scales[a] x the base coordinate."""
        d = len(coords)
        G = [np.unique(np.concatenate([cv.axes[a] / sc[a] for cv, sc in members])) for a in range(d)]
        K = len(members)
        cells = int(np.prod([len(g) for g in G]))
        nv = 2 if d == 1 else 4
        values, flags = np.zeros((nv * K, cells)), np.zeros((2 ** d * K, cells))
        first, last = np.zeros((d, K), dtype=np.int32), np.zeros((d, K), dtype=np.int32)
        work, tops, filled = [], [[] for _ in range(d)], False
        for k, (cv, sc) in enumerate(members):
            maps, facs = [], []
            for a in range(d):
                own = cv.axes[a] / sc[a]
                first[a, k], last[a, k] = np.searchsorted(G[a], own[0]), np.searchsorted(G[a], own[-1])
                mp = _axis_map(own, G[a])
                rule = cv.grow[a] if a < len(cv.grow) else None
                if rule is None:  # in proportion beyond its last row (and beyond the merged knots, at run time)
                    facs.append(np.where(mp[4], G[a] / own[-1], 1.0))
                    tops[a].append(k)
                else:  # its last row's value here; the rule's factor at run time, from its own last row
                    facs.append(np.ones(len(G[a])))
                    work.append((k, a, rule, float(cv.axes[a][-1])))
                maps.append(mp)
            vals, fl = _resample(cv, maps, facs)
            c = _cells(vals, np.zeros(vals.shape, dtype=bool))
            for v in range(nv):
                values[v * K + k] = c[:, v]
            for p, f in enumerate(fl):
                flags[p * K + k] = f.ravel()
            filled = filled or bool(cv.filled.any())
        return cls(tuple(coords), tuple(Axis.build(g) for g in G), np.asarray(rows), values, flags,
                   tuple(first), tuple(last), np.array([cv.fixed_flag == EXTRAPOLATED for cv, _ in members]), filled,
                   tuple(np.array([sc[a] for _, sc in members]) for a in range(d)), tuple(work),
                   tuple(np.isin(np.arange(K), t) for t in tops))


def _take(table: np.ndarray, i, xp):
    """Columns ``i`` of a constant point-minor table (indices in range: a clipped take, XLA's fast gather)."""
    if xp is np:
        return table[:, i]
    return xp.take(xp.asarray(np.ascontiguousarray(table.T)), i, axis=0, mode="clip").T


def _resample(cv: Curve, maps: list, facs: list):
    """A curve's value at every merged knot (its own multilinear log interpolation, floor below its first row,
    the growth beyond its last row in ``facs``), and its source flag per cell for each pattern of weights (on the
    knot / inside the segment after it, per axis)."""
    d = len(maps)
    cells = cv.cells
    n1 = cv.t.shape[1] if d == 2 else 1
    if d == 1:
        j, w, on, below, above, sa = maps[0]
        r = cells[j]
        vals = r[:, 0] * np.exp(w * r[:, 1]) * facs[0]
        filled_knot = (r[:, 2] > 0) | ((w > 0) & (r[:, 3] > 0))
        ext = below | above | filled_knot
        knot = np.where(ext, EXTRAPOLATED, np.where(on, MEASURED, INTERPOLATED))
        # inside the open segment after a knot: the own segment's weight is > 0 (unless outside its rows)
        filled_seg = (r[:, 2] > 0) | (r[:, 3] > 0)
        seg = np.where(below | sa | filled_seg, EXTRAPOLATED, INTERPOLATED)
        flags = [np.maximum(knot, cv.fixed_flag), np.maximum(seg, cv.fixed_flag)]
        return vals, [f.astype(np.float64) for f in flags]
    (j0, w0, on0, b0, a0, sa0), (j1, w1, on1, b1, a1, sa1) = maps
    r = cells[j0[:, None] * n1 + j1[None, :]]  # (n0, n1, 8)
    W0, W1 = w0[:, None], w1[None, :]
    vals = (r[..., 0] * np.exp(W0 * r[..., 1] + W1 * r[..., 2] + W0 * W1 * r[..., 3])
            * facs[0][:, None] * facs[1][None, :])
    flags = []
    for p1 in (0, 1):  # pattern order 00, 10, 01, 11 (axis 0 varies fastest)
        for p0 in (0, 1):
            out0 = (b0 | sa0) if p0 else (b0 | a0)
            out1 = (b1 | sa1) if p1 else (b1 | a1)
            # a positive own weight on an axis: inside the segment, or on a merged knot that is not an own row
            wp0 = ~out0 & (np.ones_like(on0) if p0 else ~on0)
            wp1 = ~out1 & (np.ones_like(on1) if p1 else ~on1)
            WP0, WP1 = wp0[:, None], wp1[None, :]
            filled = ((r[..., 4] > 0) | (WP0 & (r[..., 5] > 0)) | (WP1 & (r[..., 6] > 0))
                      | (WP0 & WP1 & (r[..., 7] > 0)))
            ext = out0[:, None] | out1[None, :] | filled
            fl = np.where(ext, EXTRAPOLATED, np.where(~WP0 & ~WP1, MEASURED, INTERPOLATED))
            flags.append(np.maximum(fl, cv.fixed_flag).astype(np.float64))
    return vals, flags


@attrs.frozen(eq=False)
class Bank:
    """Curves evaluated together. ``build`` from (curve, its varying coordinates (mapping.Coord)) per curve;
    ``evaluate`` returns their values and source flags as rows (K, P), in the order given."""

    groups: tuple
    n: int

    @classmethod
    def build(cls, items: list) -> "Bank":
        by: dict = {}
        for k, (cv, coords) in enumerate(items):
            bases = [co.base() for co in coords]
            key = tuple(b for b, _ in bases)
            by.setdefault(key, []).append((k, cv, tuple(s for _, s in bases)))
        groups = tuple(Group.build(key, [(cv, sc) for _, cv, sc in ms], np.array([k for k, _, _ in ms]))
                       for key, ms in by.items())
        return cls(groups, len(items))

    def coords(self) -> list:
        return list(dict.fromkeys(co for g in self.groups for co in g.coords))

    def evaluate_groups(self, col, xp, Q: dict | None = None, flags: bool = True, posts=None) -> list:
        """Per group, its curves' values and source flags as rows ``(K_g, P)`` (in ``group.rows`` order): flags as
        floats, or with ``flags=False`` whether extrapolated (bool). ``col(feature)`` -> (P,) reads the workload's
        features (or ``Q``: base coordinate -> (P,) values, when the caller has them). ``posts``: per group None
        or (k, ``fn(values, flags)`` -> values) for its first k rows, run with the group's arithmetic (one loop);
        the group's values are then ``fn``'s rows when k is all of them, else (``fn``'s rows, the other rows)."""
        if Q is None:
            Q = {co: co.value(col, xp) for co in self.coords()}
        located: dict = {}
        posts = posts or [None] * len(self.groups)
        return [g.evaluate(Q, located, xp, flags, p) for g, p in zip(self.groups, posts)]

    def evaluate(self, col, xp, Q: dict | None = None, flags: bool = True) -> tuple[list, list]:
        """Per curve (in the order given) its values (P,) and source flags (P,) (see :meth:`evaluate_groups`)."""
        vals, fls = [None] * self.n, [None] * self.n
        for g, (v, f) in zip(self.groups, self.evaluate_groups(col, xp, Q, flags)):
            for j, k in enumerate(g.rows):
                vals[k], fls[k] = v[j], f[j]
        return vals, fls


__all__ = ["Bank", "Group", "Axis"]
