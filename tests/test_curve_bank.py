"""Issue 25 item 5: a program's table curves are evaluated together (graphsim.views.measured.bank) — one knot grid
per base coordinate, one gather for all of its curves — and must give what each curve gives alone
(:func:`~graphsim.views.measured.interp.eval_curve`, the definition): the same times (to rounding) and the same
source flags, in NumPy and in the jitted kernel, on measured knots, between them, below and beyond them."""
from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import graphsim as gs
from graphsim.core.ir import Feature
from graphsim.lowering.xla import exp, log
from graphsim.views.measured.bank import Axis, Bank
from graphsim.views.measured.interp import EXTRAPOLATED, build_curve, eval_curve
from graphsim.views.measured.mapping import Coord
from graphsim.views.measured.schema import COMMON
from graphsim.views.measured.store import Store
from graphsim.views.measured.view import ViewSpec

FIX = str(Path(__file__).parent / "data" / "measured")
TRT = "trtllm@1.3.0rc20"


def _points(bank: Bank, rng, P: int = 3000) -> dict:
    """Feature values: log-uniform over and past every curve's range, small integers (0 included: no work),
    and every merged knot exactly (in the base coordinate's units)."""
    feats = {f for g in bank.groups for co in g.coords for f in co.features()}
    cols = {f: np.exp(rng.uniform(np.log(0.3), np.log(3e9), P)).round() for f in feats}
    for f in feats:
        cols[f][:200] = rng.integers(0, 5, 200)
    for g in bank.groups:
        for co, ax in zip(g.coords, g.axes):
            if len(co.num) == 1 and not co.den:
                cols[co.num[0][0]][200:200 + len(ax.knots)] = ax.knots
    return cols


def _check(items, cols):
    """The bank against each curve alone: NumPy and JAX, values and flags (and flags=False: extrapolated)."""
    bank = Bank.build(items)
    col = cols.__getitem__
    V, F = map(np.stack, bank.evaluate(col, np))
    for k, (cv, coords) in enumerate(items):
        t, fl = eval_curve(cv, [co.value(col, np) for co in coords], np)
        np.testing.assert_allclose(V[k], np.broadcast_to(t, V[k].shape), rtol=1e-12, atol=0)
        assert (F[k] == np.broadcast_to(fl, F[k].shape)).all(), cv.partition.key
        on = F[k] == 0  # a measured row's time comes back exactly
        assert (V[k][on] == np.broadcast_to(t, V[k].shape)[on]).all()
    _, E = map(np.stack, bank.evaluate(col, np, flags=False))
    assert (E == (F == EXTRAPOLATED)).all()
    names = list(cols)
    with jax.enable_x64(True):
        arrays = [jnp.asarray(cols[f]) for f in names]
    for flags in (True, False):
        with jax.enable_x64(True):  # as the evaluator runs its kernel
            Vj, Fj = jax.jit(lambda a: bank.evaluate(lambda f: a[names.index(f)], jnp, flags=flags))(arrays)
        np.testing.assert_allclose(np.stack(Vj), V, rtol=1e-13, atol=0)
        assert (np.stack(Fj) == (F if flags else F == EXTRAPOLATED)).all()
    return bank


@pytest.mark.parametrize("model,request_,hw", [("deepseek-v3", "decode:1024x16", "gb200"),
                                              ("deepseek-v3", "prefill:2x3000", "gb200"),
                                              ("deepseek-v4.1-flash", "decode:512x64", "gb200")])
def test_the_bank_equals_each_curve_of_a_program(model, request_, hw):
    c = gs.compile_plan(model, gs.Plan([request_], gs.ParallelMapping(tp=4, ep=4)), hw,
                        view=ViewSpec("hybrid", FIX, TRT))
    v = c.evaluator.view
    items = [(cv, tuple(co for _, co in lk.varying)) for cv, lk in v.curves.values()]
    bank = _check(items, _points(Bank.build(items), np.random.default_rng(7)))
    # curves on one feature at any scale share its grid: fewer searches than curves
    assert len(bank.groups) < len(items)


def _table(tmp_path, family, op, rows):
    base = {c: "" for c in COMMON}
    base.update(device="h200", framework="mine", version="1", kernel_source="k", family=family, op=op,
                dtype="bfloat16", boundary="kernel")
    d = tmp_path / "h200" / family / "mine@1"
    d.mkdir(parents=True)
    pd.DataFrame([{**base, **r} for r in rows]).to_parquet(d / "t.parquet", index=False)
    return Store(tmp_path).partitions("h200", family)[0]


def test_the_bank_keeps_work_rules_holes_and_extrapolated_fixed_shapes(tmp_path):
    """A 2-D context attention with a window (time ∝ pairs^γ beyond its last length: not log-linear, applied per
    point), holes in its grid (cells filled by the rule: extrapolated), a GEMM queried outside its measured n
    (extrapolated everywhere), and curves of one feature at three scales."""
    W = 4096
    rows = [dict(batch=b, seq=s, heads=8, kv_heads=8, head_dim=128, window=W, latency_s=1e-6 * b * s ** 1.3)
            for b in (1, 2, 8) for s in (1024, 4096, 8192) if not (b == 8 and s == 8192)]
    attn = build_curve(_table(tmp_path / "a", "attention_context", "context", rows), "",
                       {"heads": 8, "kv_heads": 8, "head_dim": 128, "window": W}, ("batch", "seq"))
    assert attn.filled.any() and attn.grow[1] is not None
    gemm = _table(tmp_path / "g", "gemm", "gemm", [dict(m=m, n=n, k=4096, latency_s=1e-8 * m * n / 4096 + 2e-6)
                                                   for m in (1, 8, 64, 512, 4096) for n in (1024, 4096)])
    inside = build_curve(gemm, "", {"n": 4096, "k": 4096}, ("m",))
    outside = build_curve(gemm, "", {"n": 16384, "k": 4096}, ("m",))
    assert outside.fixed_flag == EXTRAPOLATED
    tok, req, pairs = Feature("tokens", "all"), Feature("requests", "pf"), Feature("causal_pairs", "pf")
    items = [(attn, (Coord(((req, 1.0),)), Coord(((pairs, 1.0),), ((req, 1.0),), tri=True))),
             (inside, (Coord(((tok, 1.0),)),)), (outside, (Coord(((tok, 0.25),)),)),
             (inside, (Coord(((tok, 14336.0),)),))]
    rng = np.random.default_rng(3)
    P = 4000
    r = rng.integers(0, 12, P).astype(float)
    n = np.exp(rng.uniform(np.log(100), np.log(70000), P)).round()
    n[:300] = rng.choice([1024.0, 4096.0, 8192.0], 300)
    cols = {req: r, pairs: r * n * (n + 1) / 2, tok: np.exp(rng.uniform(0, np.log(5e4), P)).round()}
    cols[tok][:5] = [1.0, 8.0, 64.0, 512.0, 4096.0]
    bank = _check(items, cols)
    assert len(bank.groups) == 2  # the GEMMs at three scales share one grid
    assert bank.groups[0].work  # the attention's rule runs per point


@pytest.mark.parametrize("seed", range(4))
def test_the_search_finds_every_segment(seed):
    """Buckets of the floats' bits and the comparisons after them give searchsorted's segment (a binary search
    where knots crowd a bucket), exactly 0 weight on a knot, in NumPy and JAX."""
    rng = np.random.default_rng(seed)
    knots = np.unique(np.concatenate([np.exp(rng.uniform(0, 20, 40)).round(), rng.integers(1, 50, 10),
                                      1e6 + np.arange(0, 100 * (seed == 3), 1.0)]).astype(float))
    ax = Axis.build(knots)
    assert (ax.buckets.shape[1] == 0) == (seed == 3)  # a million-wide run of unit steps: binary search
    q = np.concatenate([knots, np.nextafter(knots, 0), np.nextafter(knots, np.inf),
                        np.exp(rng.uniform(-1, 21, 2000)), [0.0]])
    want = np.clip(np.searchsorted(knots, np.clip(q, knots[0], knots[-1]), side="right") - 1, 0, len(knots) - 1)
    for xp in (np, jnp):
        if xp is jnp:
            with jax.enable_x64(True):
                i, w, out = (np.asarray(a) for a in jax.jit(lambda q: ax.locate(q, jnp))(jnp.asarray(q)))
        else:
            i, w, out = ax.locate(q, np)
        assert (i == want).all()
        assert (w[: len(knots)] == 0).all() and (w >= 0).all() and (w <= 1 + 1e-8).all()  # 1 ± rounding: the next knot
        assert (out == ((q < knots[0]) | (q > knots[-1]))).all()


def test_the_vectorized_exponential_is_numpy_s_to_two_ulp_and_exact_at_zero():
    x = np.concatenate([np.linspace(-40, 40, 20001), [0.0, -0.0, 1e-300, -1e-17]])
    with jax.enable_x64(True):
        got = np.asarray(jax.jit(lambda x: exp(x, jnp))(jnp.asarray(x)))
    assert got[-4] == 1.0 and got[-3] == 1.0
    np.testing.assert_allclose(got, np.exp(x), rtol=4.5e-16, atol=0)


def test_the_vectorized_logarithm_is_numpy_s_to_two_ulp_and_exact_at_one():
    x = np.concatenate([np.exp(np.random.default_rng(0).uniform(-690, 690, 20000)),
                        [1.0, np.nextafter(1.0, 2), np.nextafter(1.0, 0), 2.0, 0.5, np.sqrt(2.0), 1e-300, 1e300]])
    with jax.enable_x64(True):
        got = np.asarray(jax.jit(lambda x: log(x, jnp))(jnp.asarray(x)))
    want = np.log(x)
    assert got[-8] == 0.0
    assert (np.abs(got - want) <= 2 * np.spacing(np.abs(want))).all()


def test_a_family_efficiency_is_np_interp_without_a_search():
    from graphsim.views.measured.view import _efficiency_at

    rng = np.random.default_rng(1)
    centres, meds = np.sort(rng.uniform(-16, -2, 11)), rng.uniform(1, 3, 11)
    sol = np.exp(rng.uniform(-20, 0, 5000))
    np.testing.assert_allclose(_efficiency_at((centres, meds, 9), sol, np), np.interp(np.log(sol), centres, meds),
                               rtol=1e-14)
    assert (_efficiency_at((centres[:1], meds[:1], 9), sol, np) == meds[0]).all()
