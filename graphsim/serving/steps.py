"""Step times of a serving simulation from graphsim's own compiled program (issue 27): never a second cost model.

A continuous-batching step runs ``B`` decodes (one position each at their contexts) and prefill chunks (``n_i`` new
positions after ``p_i`` earlier ones each) in one forward. The simulator asks for millions of steps, so the program
is evaluated once, vectorized, on a *response surface* over the step's coordinates and interpolated:

- decode-only steps: (B, mean decode context C) on a fine geometric grid;
- mixed steps: (B, C, N = Σ n_i, P) on a coarser grid, where the chunks are priced as one sequence of N positions
  after P earlier ones with P chosen so that the attention pairs Σ (n_i·p_i + n_i(n_i+1)/2) match
  (N·P + N(N+1)/2; P >= 0);
- a bounded SWA replay (DeepSeek-V4.1, a prefix hit without its SWA state) adds its own cost, the program's forward
  with the replayed positions minus the same forward without them, as a curve over the cached positions.

The interpolation is multilinear over the grid's raw coordinates (the forward is monotone and piecewise-smooth in
each); :meth:`StepTimes.exact` evaluates recorded steps with one workload group per chunk and per context quartile of
the decodes, so a simulation states its surface's error on its own step mix (``SimResult.surface_error``).
"""
from __future__ import annotations

import bisect
import itertools

import numpy as np

from ..core.errors import require

#: groups of the exact evaluation: prefill chunks (more are merged into the last) and decode context quartiles
EXACT_PREFILL_GROUPS = 8
EXACT_DECODE_GROUPS = 4
#: the NumPy evaluator's sweet spot (lowering.evaluate.NUMPY_POINTS): chunks never trigger a JAX compile
_CHUNK = 4096


def _geom(lo: float, hi: float, ratio: float, *, zero: bool = False, integer: bool = True) -> np.ndarray:
    """lo, lo·ratio, ... up to and including hi (whole numbers when ``integer``), with 0 first when ``zero``."""
    hi = max(hi, lo)
    vals = [lo]
    while vals[-1] * ratio < hi:
        vals.append(vals[-1] * ratio)
    vals.append(hi)
    a = np.unique(np.round(vals) if integer else np.asarray(vals, dtype=np.float64))
    if zero:
        a = np.unique(np.concatenate([[0.0], a]))
    if a.size < 2:
        a = np.array([a[0], a[0] + 1.0])
    return a.astype(np.float64)


def interp(grids: tuple, table: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Multilinear interpolation of ``table`` (shape = grid lengths) at the rows of ``q`` (n, d), clipped to the
    grid's box."""
    q = np.atleast_2d(np.asarray(q, dtype=np.float64))
    idx, w = [], []
    for d, g in enumerate(grids):
        x = np.clip(q[:, d], g[0], g[-1])
        i = np.clip(np.searchsorted(g, x, side="right") - 1, 0, len(g) - 2)
        idx.append(i)
        w.append((x - g[i]) / (g[i + 1] - g[i]))
    out = np.zeros(q.shape[0])
    for corner in itertools.product((0, 1), repeat=len(grids)):
        ww = np.ones(q.shape[0])
        for d, c in enumerate(corner):
            ww = ww * (w[d] if c else 1.0 - w[d])
        out += ww * table[tuple(idx[d] + c for d, c in enumerate(corner))]
    return out


class _Point:
    """:func:`interp` at one point in plain Python (the simulator asks one step at a time: NumPy's per-call cost
    would be most of the simulation). The same multilinear interpolation, the same clipping."""

    def __init__(self, grids: tuple, table: np.ndarray):
        self.grids = [list(map(float, g)) for g in grids]
        self.flat = list(map(float, np.ascontiguousarray(table).ravel()))
        self.strides = [int(np.prod(table.shape[d + 1:])) for d in range(table.ndim)]
        self.corners = list(itertools.product((0, 1), repeat=table.ndim))

    def __call__(self, *q) -> float:
        base, ws = 0, []
        for g, x, st in zip(self.grids, q, self.strides):
            x = g[0] if x < g[0] else g[-1] if x > g[-1] else x
            i = min(max(bisect.bisect_right(g, x) - 1, 0), len(g) - 2)
            ws.append(((x - g[i]) / (g[i + 1] - g[i]), st))
            base += i * st
        flat, out = self.flat, 0.0
        for corner in self.corners:
            w, k = 1.0, base
            for c, (t, st) in zip(corner, ws):
                if c:
                    w *= t
                    k += st
                else:
                    w *= 1.0 - t
            out += w * flat[k]
        return out


def effective_past(n: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """P with N·P + N(N+1)/2 = pairs (>= 0): the past of one sequence of N positions with the chunks' pairs."""
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, (pairs - n * (n + 1) / 2) / np.maximum(n, 1.0), 0.0)
    return np.maximum(p, 0.0)


class StepTimes:
    """Forward seconds of serving steps of one deployment (``compiled``: a program with a prefill and a decode
    request, in that order, at the deployment's mapping and policies, in any view)."""

    def __init__(self, compiled, *, max_batch: int, max_context: int, budget: int, replay_window: int = 128,
                 swa: bool = False, exact_program=None, serving=None, hot_program=None, moe=None, verify: int = 0,
                 role: str = "mixed"):
        require(compiled.plan.kinds == ("prefill", "decode"), "compiled", "the step program is one prefill and one "
                                                                          "decode request")
        self.c, self.exact_program = compiled, exact_program
        #: the engine's step terms (graphsim.serving.EngineTerms: host launches, CUDA graphs, scheduler time) when
        #: the step times are a prediction; None: the GPU's time alone (the SOL view)
        self.serving, self.dp = serving, compiled.plan.mapping.dp
        if serving is not None:
            from .engines import kernels

            self.kernels = kernels(compiled)
        self.max_batch, self.max_context, self.budget = int(max_batch), int(max_context), int(budget)
        self.window, self.swa = int(replay_window), bool(swa)
        self.verify = int(verify)  # speculative decoding: each decode request verifies 1 + verify positions
        self.points = 0
        cmax = float(max(self.max_context, 2))
        self.d_grids = (_geom(1, max(self.max_batch, 2), 1.5), _geom(16, cmax, 1.5))
        self.m_grids = (_geom(1, max(self.max_batch, 2), 2.0, zero=True), _geom(64, cmax, 4.0),
                        _geom(1, max(self.budget, 2), 1.5), _geom(256, cmax, 4.0, zero=True))
        # a disaggregated pool prices only its own steps: a decode replica never prefills, a prefill replica never
        # decodes (its mixed steps have B = 0)
        if role == "prefill":
            self.d_grids = (np.array([0.0, 1.0]), np.array([16.0, 32.0]))
            self.m_grids = (np.array([0.0, 1.0]),) + self.m_grids[1:]
        if role == "decode":
            self.m_grids = tuple(np.array([g[0], g[-1]]) for g in self.m_grids)
        self.d_table = self._surface(self.d_grids, decode_only=True)
        self.m_table = self._surface(self.m_grids, decode_only=False)
        self.r_grids = (_geom(1, max(self.budget, 2), 2.0), _geom(1, cmax, 2.0))
        self.r_table = self._replay_table(self.r_grids) if self.swa and role != "decode" else None
        self._d1, self._m1 = _Point(self.d_grids, self.d_table), _Point(self.m_grids, self.m_table)
        self._r1 = _Point(self.r_grids, self.r_table) if self.r_table is not None else None
        # MoE load imbalance (a prediction's engine term, graphsim.serving.moe): the same surfaces with the hottest
        # EP rank at twice the mean load; a step of T routed tokens is t1 + (factor(T) - 1)·(t2 - t1)
        self.moe, self._factors = None, {}
        if hot_program is not None and moe is not None and serving is not None:
            base, self.c = self.c, hot_program
            try:
                d_hot = self._surface(self.d_grids, decode_only=True)
                m_hot = self._surface(self.m_grids, decode_only=False)
            finally:
                self.c = base
            self.moe = tuple(moe)  # (top_k, experts, ep, load_ratio, eplb)
            self._d2, self._m2 = _Point(self.d_grids, d_hot), _Point(self.m_grids, m_hot)
            self._d_hot = d_hot

    # -- building -----------------------------------------------------------------------------------------
    def _forward(self, count, new, past, replay=None) -> np.ndarray:
        from ..core.workload import Workload

        count, new, past = (np.asarray(a, dtype=np.float64) for a in (count, new, past))
        replay = np.zeros_like(count) if replay is None else np.asarray(replay, dtype=np.float64)
        out = np.empty(count.shape[0])
        for s in range(0, count.shape[0], _CHUNK):
            sl = slice(s, s + _CHUNK)
            wl = Workload(("prefill", "decode"), count[sl], new[sl], past[sl], replay=replay[sl],
                          tier=np.zeros_like(count[sl]))
            out[sl] = np.asarray(self.c.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64)
        self.points += count.shape[0]
        require(bool(np.all(np.isfinite(out))), "view", "the view has no time for some serving steps of this "
                                                         "deployment (see graphsim estimate for the same requests)")
        return out

    def _surface(self, grids, decode_only: bool) -> np.ndarray:
        mesh = np.meshgrid(*grids, indexing="ij")
        flat = [m.ravel() for m in mesh]
        if decode_only:
            b, c = flat
            n = np.zeros_like(b)
            p = np.zeros_like(b)
        else:
            b, c, n, p = flat
        count = np.stack([(n > 0).astype(np.float64), b], axis=1)
        new = np.stack([np.maximum(n, 1.0), np.full_like(b, 1.0 + self.verify)], axis=1)
        past = np.stack([p, c], axis=1)
        return self._forward(count, new, past).reshape(mesh[0].shape)

    def _replay_table(self, grids) -> np.ndarray:
        """Seconds a bounded replay of min(K, W) positions adds to a prefill of N positions after K cached ones
        (the replayed positions batch with the chunk's: the marginal cost at the step's size)."""
        mesh = np.meshgrid(*grids, indexing="ij")
        n, k = (m.ravel() for m in mesh)
        count = np.stack([np.ones_like(k), np.zeros_like(k)], axis=1)
        new = np.stack([n, np.ones_like(k)], axis=1)
        past = np.stack([k, np.zeros_like(k)], axis=1)
        rep = np.stack([np.minimum(k, self.window), np.zeros_like(k)], axis=1)
        d = self._forward(count, new, past, rep) - self._forward(count, new, past)
        return np.maximum(d, 0.0).reshape(mesh[0].shape)

    # -- queries ------------------------------------------------------------------------------------------
    def decode(self, batch, context, host: bool = True) -> np.ndarray:
        """Seconds of decode-only steps of ``batch`` requests at mean context ``context`` (arrays); ``host``: as the
        engine runs them (a CUDA graph replay up to its batch, else eager launches, plus scheduler time)."""
        b = np.asarray(batch, dtype=np.float64)
        c = np.broadcast_to(np.asarray(context, dtype=np.float64), b.shape)
        q = np.stack([b.ravel(), c.ravel()], axis=1)
        gpu = interp(self.d_grids, self.d_table, q).reshape(b.shape)
        if host and self.moe is not None:
            hot = interp(self.d_grids, self._d_hot, q).reshape(b.shape)
            gpu = gpu + (np.vectorize(self._factor)(b) - 1.0) * (hot - gpu)
        if host and self.serving is not None:
            return self.serving.step_time(gpu, self.kernels, self.serving.graphed(b / self.dp))
        return gpu

    def _factor(self, tokens) -> float:
        """The hottest EP rank's expected load over the mean for a step routing ``tokens`` tokens (memoized)."""
        t = int(tokens)
        f = self._factors.get(t)
        if f is None:
            from .moe import hottest_rank_factor

            top_k, experts, ep, ratio, eplb = self.moe
            f = self._factors[t] = float(np.asarray(hottest_rank_factor(np.array([float(max(t, 1))]), top_k, experts,
                                                                        ep, ratio, eplb)).ravel()[0])
        return f

    def step(self, batch: int, context: float, new: float, pairs: float, host: bool = True) -> float:
        """Seconds of one step: ``batch`` decodes at mean context ``context`` and prefill chunks of ``new``
        positions in all with ``pairs`` causal attention pairs (``host``: plus the engine's eager launches and
        scheduler time)."""
        if new <= 0:
            if batch <= 0:
                return 0.0
            gpu = self._d1(float(batch), float(context))
            if host and self.moe is not None:
                gpu += (self._factor(batch) - 1.0) * (self._d2(float(batch), float(context)) - gpu)
            if host and self.serving is not None:
                return float(self.serving.step_time(gpu, self.kernels, self.serving.graphed(batch / self.dp)))
            return gpu
        p = max((pairs - new * (new + 1) / 2) / new, 0.0)  # effective_past, for one point
        gpu = self._m1(float(batch), float(context), float(new), p)
        if host and self.moe is not None:
            gpu += (self._factor(batch + new) - 1.0) * (self._m2(float(batch), float(context), float(new), p) - gpu)
        if host and self.serving is not None:
            return float(self.serving.step_time(gpu, self.kernels))
        return gpu

    def replay(self, new, cached) -> float:
        """Seconds the bounded SWA replay of a request with ``cached`` positions adds to a step prefilling
        ``new`` positions (0 for a model without SWA)."""
        if self._r1 is None:
            return 0.0
        return self._r1(float(new), float(cached))

    # -- validation ---------------------------------------------------------------------------------------
    def exact(self, steps: list) -> np.ndarray:
        """Forward seconds of recorded ``steps`` — each (chunks [(new, past, replay)], decode contexts) — from
        the exact program: one group per prefill chunk (the 8th holds the rest) and per decode context quartile."""
        from ..core.workload import Workload

        require(self.exact_program is not None, "steps", "no exact program to validate the surface against")
        gp, gd = EXACT_PREFILL_GROUPS, EXACT_DECODE_GROUPS
        n = len(steps)
        count, new, past, rep = (np.zeros((n, gp + gd)) for _ in range(4))
        for i, (chunks, ctxs) in enumerate(steps):
            for j, (nn, pp, rr) in enumerate(chunks[:gp]):
                count[i, j], new[i, j], past[i, j], rep[i, j] = 1, nn, pp, rr
            if len(chunks) > gp:  # the rest as one more sequence (pairs kept)
                rest = np.asarray(chunks[gp - 1:], dtype=np.float64)
                nn = rest[:, 0].sum()
                pairs = (rest[:, 0] * rest[:, 1] + rest[:, 0] * (rest[:, 0] + 1) / 2).sum()
                count[i, gp - 1], new[i, gp - 1] = 1, nn
                past[i, gp - 1] = np.floor(effective_past(nn, pairs))
                rep[i, gp - 1] = min(rest[:, 2].sum(), past[i, gp - 1])
            new[i, :gp] = np.maximum(new[i, :gp], 1)
            if len(ctxs):
                for j, part in enumerate(np.array_split(np.sort(np.asarray(ctxs, dtype=np.float64)), gd)):
                    if part.size:
                        count[i, gp + j], past[i, gp + j] = part.size, np.round(part.mean())
            new[i, gp:] = 1 + self.verify
        out = np.empty(n)
        kinds = ("prefill",) * gp + ("decode",) * gd
        for s in range(0, n, _CHUNK):
            sl = slice(s, s + _CHUNK)
            wl = Workload(kinds, count[sl], new[sl], past[sl], replay=rep[sl], tier=np.zeros_like(count[sl]))
            out[sl] = np.asarray(self.exact_program.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64)
        return out


class FixedSteps:
    """Every step takes ``seconds`` whatever it runs: the simulator's closed-form checks (an M/D/1 queue)."""

    exact_program = None
    points = 0

    def __init__(self, seconds: float):
        require(float(seconds) > 0, "seconds", f"must be > 0, got {seconds!r}")
        self.seconds = float(seconds)

    def decode(self, batch, context, host: bool = True) -> np.ndarray:
        return np.full(np.shape(batch), self.seconds)

    def step(self, batch, context, new, pairs, host: bool = True) -> float:
        return self.seconds

    def replay(self, new, cached) -> float:
        return 0.0


__all__ = ["StepTimes", "FixedSteps", "interp", "effective_past", "EXACT_PREFILL_GROUPS", "EXACT_DECODE_GROUPS"]
