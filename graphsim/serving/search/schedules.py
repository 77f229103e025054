"""The schedule arithmetic of a search: how an aggregated replica places its prefills between decode steps
(TTFT, mean and p99 TPOT per schedule), an engine's split steps summed, the largest batch that fits, and the
Pareto filter of candidate pools. Pure functions of arrays; :mod:`.evaluate` calls them."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...core.workload import Workload
from .space import MIXED_BLOCKS


def agg_schedules(mix, t_dec: np.ndarray, w: np.ndarray, dp: int):
    """(step, prompts per step, TTFT, mean TPOT, p99 TPOT) per way an aggregated replica prefills, each an
    array over the mixed group's rows (NaN where a schedule does not apply). Every step gives each request E
    tokens; f = B·E/(OSL·dp) prompts per DP group and step; a step's prompts are of one class (weights ``w``):

    * ``mixed``: dp·⌊f⌋ (share 1 − φ, φ = f − ⌊f⌋) or dp·⌈f⌉ (share φ) prompts ride with the decodes;
      TTFT = the ⌈f⌉ step;
    * ``prefill``: a prefill-only step of dp·n prompts (n = max(1, ⌈f⌉)) before a share f/n of the decode
      steps (the decodes wait); TTFT = that step;
    * ``lone``: each prompt in a step of its own (g = f·dp of them per decode step, ⌊g⌋ or ⌈g⌉); TTFT = one
      prompt's forward — graphsim spreads a DP-split op's work over the DP groups, so this is a lower bound of
      the one group that runs it (exact at dp = 1; omitted there when it equals ``prefill``).

    TPOT p99 is the 99th percentile of the step times a token waits (a step with prompts is a spike)."""
    C = w.size
    blk = {name: mix.forward_s[:, i * C:(i + 1) * C] for i, name in enumerate(MIXED_BLOCKS)}
    e, f = mix.emitted, mix.prompts
    td = np.asarray(t_dec, dtype=np.float64)[:, None]
    fl = np.floor(f)
    phi = (f - fl)[:, None]
    t_lo = np.where((fl == 0)[:, None], td, blk["mixed_lo"])
    n = np.maximum(1.0, np.ceil(f))
    q = (f / n)[:, None]
    g = f * dp
    gl = np.floor(g)[:, None]
    phg = g[:, None] - gl
    lone = blk["lone"]
    out = []
    for step, pb, ttft, vals, probs in (
            ("mixed", dp * n, blk["mixed"].max(axis=1), [t_lo, blk["mixed"]], [(1 - phi) * w, phi * w]),
            ("prefill", dp * n, blk["prefill"].max(axis=1), [td + np.zeros_like(lone), td + blk["prefill"]],
             [(1 - q) * w, q * w]),
            ("lone", np.ones_like(f), lone.max(axis=1), [td + gl * lone, td + (gl + 1) * lone],
             [(1 - phg) * w, phg * w])):
        v, p = np.concatenate(vals, axis=1), np.concatenate(probs, axis=1)
        mean, p99 = (v * p).sum(axis=1) / e, _quantile(v, p, 0.99) / e
        if step == "lone":
            same = (dp == 1) & (n == 1)
            mean, p99 = np.where(same, np.nan, mean), np.where(same, np.nan, p99)
        out.append((step, pb, ttft, mean, p99))
    return out


def _sum_steps(out: np.ndarray, plan: dict, c, kinds: tuple, scale: float, sv, k: int) -> np.ndarray:
    """``out`` with each ``plan`` entry ((row, column) -> steps, each a tuple of (count, new, past) per group of
    ``kinds``; counts times ``scale``) replaced by the sum of its steps' forwards on ``c``, each a step as engine
    ``sv`` runs it (``k`` kernels, eager)."""
    pieces = np.array([st for steps in plan.values() for st in steps], dtype=np.float64)  # (S, groups, 3)
    wl = Workload(kinds, pieces[:, :, 0] * scale, pieces[:, :, 1], pieces[:, :, 2])
    t = sv.step_time(np.asarray(c.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64), k)
    out = out.copy()
    at = 0
    for key, steps in plan.items():
        out[key] = float(t[at:at + len(steps)].sum())
        at += len(steps)
    return out


def _quantile(v: np.ndarray, p: np.ndarray, q: float) -> np.ndarray:
    """Per row, the smallest value of a discrete distribution (values ``v``, probabilities ``p``, both (R, K))
    whose cumulative probability reaches ``q``."""
    order = np.argsort(v, axis=1, kind="stable")
    vs, cs = np.take_along_axis(v, order, axis=1), np.cumsum(np.take_along_axis(p, order, axis=1), axis=1)
    idx = np.minimum((cs < q * cs[:, -1:] * (1 - 1e-12)).sum(axis=1), v.shape[1] - 1)
    return vs[np.arange(v.shape[0]), idx]


def _largest_between(room: Callable, grid: list) -> list:
    """The most requests per DP rank between the largest value of ``grid`` that fits (``room`` >= 0) and the
    next, which does not: [] when every value or none fits. ``room`` is monotone (memory grows with the
    batch) and vectorized; the bracket is evaluated whole."""
    grid = sorted(grid)
    ok = np.asarray(room(grid)) >= 0
    if ok.all() or not ok[0]:
        return []
    i = int(np.flatnonzero(~ok)[0])
    inner = np.arange(grid[i - 1] + 1, grid[i])
    if inner.size == 0:
        return []
    fit = inner[np.asarray(room(inner)) >= 0]
    return [int(fit[-1])] if fit.size else []


def _largest_fit(room: Callable, cap: int) -> int:
    """The largest count in [1, cap] with ``room`` >= 0 (monotone, vectorized); 0 if not even 1 fits."""
    pow2 = [1 << k for k in range(cap.bit_length()) if 1 << k <= cap]
    ok = np.asarray(room(pow2)) >= 0
    if not ok[0]:
        return 0
    if ok.all():
        last = pow2[-1]
        inner = np.arange(last + 1, cap + 1)
    else:
        i = int(np.flatnonzero(~ok)[0])
        last, inner = pow2[i - 1], np.arange(pow2[i - 1] + 1, pow2[i])
    fit = inner[np.asarray(room(inner)) >= 0] if inner.size else inner
    return int(fit[-1]) if fit.size else last


def _pareto_min_max(items: list, lo: Callable, hi: Callable) -> list:
    """Items no other item beats on both: lower ``lo`` and higher ``hi``."""
    out, best = [], -math.inf
    for it in sorted(items, key=lambda c: (lo(c), -hi(c))):
        if hi(it) > best:
            out.append(it)
            best = hi(it)
    return out
