"""DSpark acceptance model and verify-length scheduler (graphsim.models.dspark)."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphsim.models.dspark import AcceptanceProfile, VerifyPlan, block_size_from_config, choose_verify_lengths
from graphsim.core.errors import GraphsimError

CONFIG = Path(__file__).resolve().parents[1] / "graphsim" / "configs" / "deepseek-v4.1-flash.json"
D = block_size_from_config(json.loads(CONFIG.read_text()))

# a = [0.9, 0.8, 0.7, 0.6, 0.5]
# s_1..s_5 = 0.9, 0.72, 0.504, 0.3024, 0.1512
# E[emitted | k] = 1 + sum_{j<=k} s_j:
#   k=0: 1;  k=1: 1.9;  k=2: 2.62;  k=3: 3.124;  k=4: 3.4264;  k=5: 3.5776
# P(emitted = 1+j | k=5) = s_j - s_{j+1} (j<5), s_5 (j=5):
#   0.1, 0.18, 0.216, 0.2016, 0.1512, 0.1512   (sums to 1; mean 3.5776)
A_HAND = [0.9, 0.8, 0.7, 0.6, 0.5]
E_HAND = [1.0, 1.9, 2.62, 3.124, 3.4264, 3.5776]
P_HAND_K5 = [0.1, 0.18, 0.216, 0.2016, 0.1512, 0.1512]
P_HAND_K2 = [0.1, 0.18, 0.72, 0.0, 0.0, 0.0]


def test_block_size_from_config():
    assert D == 5
    with pytest.raises(GraphsimError) as e:
        block_size_from_config({"text_config": {}})
    assert e.value.field == "text_config.dspark_block_size"


def test_hand_computed_expected_emitted():
    p = AcceptanceProfile.constant(A_HAND)
    np.testing.assert_allclose(p.survival[0], [1, 0.9, 0.72, 0.504, 0.3024, 0.1512])
    np.testing.assert_allclose(p.expected_emitted_table()[0], E_HAND)
    for k, e in enumerate(E_HAND):
        np.testing.assert_allclose(p.expected_emitted(k), [e])
        np.testing.assert_allclose(p.expected_accepted(k), [e - 1])
    # Not "rate x 5": the mean rate 0.7 would give 1 + 0.7*5 = 4.5.
    assert p.expected_emitted(5)[0] < 1 + np.mean(A_HAND) * 5


def test_hand_computed_distribution():
    p = AcceptanceProfile.constant(A_HAND)
    np.testing.assert_allclose(p.emitted_distribution(5)[0], P_HAND_K5, atol=1e-12)
    np.testing.assert_allclose(p.emitted_distribution(2)[0], P_HAND_K2, atol=1e-12)
    np.testing.assert_allclose(p.emitted_distribution(0)[0], [1, 0, 0, 0, 0, 0])
    for k in range(D + 1):
        dist = p.emitted_distribution(k)[0]
        assert dist.sum() == pytest.approx(1.0)
        assert (dist * np.arange(1, D + 2)).sum() == pytest.approx(E_HAND[k])


def test_edge_vectors():
    ones = AcceptanceProfile.constant(1.0, block_size=D)
    zeros = AcceptanceProfile.constant(0.0, block_size=D)
    assert ones.expected_emitted(5)[0] == 6.0  # all accepted + bonus token
    assert ones.expected_emitted(3)[0] == 4.0
    assert zeros.expected_emitted(5)[0] == 1.0  # first draft rejected: the correction token only
    for p in (ones, zeros, AcceptanceProfile.constant(A_HAND)):
        assert p.expected_emitted(0)[0] == 1.0  # k = 0 is plain decode
    np.testing.assert_allclose(ones.emitted_distribution(5)[0], [0, 0, 0, 0, 0, 1])
    np.testing.assert_allclose(zeros.emitted_distribution(5)[0], [1, 0, 0, 0, 0, 0])
    # A zero in the middle stops survival: positions after it never count.
    mid = AcceptanceProfile.constant([1, 1, 0, 1, 1])
    np.testing.assert_allclose(mid.expected_emitted_table()[0], [1, 2, 3, 3, 3, 3])


def test_vectorized_over_requests_and_k():
    p = AcceptanceProfile.from_table([A_HAND, [1] * 5, [0] * 5])
    assert p.n_requests == 3 and p.block_size == 5
    np.testing.assert_allclose(p.expected_emitted([2, 5, 3]), [2.62, 6.0, 1.0])
    cands = np.array([[0, 0, 0], [5, 5, 5], [1, 4, 2]])
    np.testing.assert_allclose(p.expected_emitted(cands), [[1, 1, 1], [3.5776, 6, 1], [1.9, 5, 1]])
    dist = p.emitted_distribution([5, 5, 5])
    assert dist.shape == (3, 6)
    np.testing.assert_allclose(dist.sum(axis=1), 1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=5, max_size=5), st.lists(st.floats(0, 1), min_size=5, max_size=5))
def test_monotone_in_k_and_in_a(a, b):
    p = AcceptanceProfile.constant(a)
    table = p.expected_emitted_table()[0]
    assert np.all(np.diff(table) >= 0)  # verifying more never emits fewer in expectation
    assert np.all(np.diff(table) <= 1 + 1e-12)  # ...and at most one more per extra draft
    hi = np.maximum(a, b)  # raise a position-wise
    assert np.all(AcceptanceProfile.constant(hi).expected_emitted_table()[0] >= table - 1e-12)
    assert 1.0 <= table[-1] <= D + 1


def test_beta_is_exact():
    # p ~ Beta(2, 1): E[p^j] = 2 / (j + 2) = 2/3, 1/2, 2/5, 1/3, 2/7
    p = AcceptanceProfile.from_beta(2.0, 1.0, block_size=D, n_requests=2)
    expected = [1, 2 / 3, 1 / 2, 2 / 5, 1 / 3, 2 / 7]
    np.testing.assert_allclose(p.survival, [expected, expected])
    np.testing.assert_allclose(p.expected_emitted(5), 1 + 2 / 3 + 1 / 2 + 2 / 5 + 1 / 3 + 2 / 7)
    # Monte Carlo sanity check of the same expectation.
    rng = np.random.default_rng(0)
    rates = rng.beta(2.0, 1.0, size=200_000)
    mc = 1 + sum(np.mean(rates**j) for j in range(1, 6))
    assert p.expected_emitted(5)[0] == pytest.approx(mc, rel=5e-3)
    # A shared rate beats the plug-in mean rate (Jensen): E[p^j] >= (E p)^j.
    plug = AcceptanceProfile.constant(2 / 3, block_size=D)
    assert p.expected_emitted(5)[0] > plug.expected_emitted(5)[0]


def test_mixture_is_exact():
    p = AcceptanceProfile.from_mixture([[1] * 5, [0] * 5], [1, 1])
    # E[s_j] = 0.5 for every j -> E[emitted | 5] = 1 + 5 * 0.5 = 3.5 (plug-in mean a = 0.5 would give 1.96875)
    np.testing.assert_allclose(p.survival[0], [1, 0.5, 0.5, 0.5, 0.5, 0.5])
    assert p.expected_emitted(5)[0] == pytest.approx(3.5)
    np.testing.assert_allclose(p.emitted_distribution(5)[0], [0.5, 0, 0, 0, 0, 0.5])
    q = AcceptanceProfile.from_mixture([A_HAND, [0.5] * 5], [3, 1])
    s_hand = np.cumprod(A_HAND)
    s_half = 0.5 ** np.arange(1, 6)
    np.testing.assert_allclose(q.survival[0, 1:], 0.75 * s_hand + 0.25 * s_half)


def test_stack():
    p = AcceptanceProfile.stack([AcceptanceProfile.constant(A_HAND), AcceptanceProfile.constant(1.0, block_size=5, n_requests=2)])
    assert p.n_requests == 3
    with pytest.raises(GraphsimError) as e:
        AcceptanceProfile.stack([AcceptanceProfile.constant(A_HAND), AcceptanceProfile.constant([1, 1])])
    assert e.value.field == "profiles"


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: AcceptanceProfile.constant([0.9, 1.2, 0.5, 0.5, 0.5]), "a"),
        (lambda: AcceptanceProfile.constant([0.9, -0.1]), "a"),
        (lambda: AcceptanceProfile.constant([0.9, float("nan")]), "a"),
        (lambda: AcceptanceProfile.constant(0.5), "block_size"),
        (lambda: AcceptanceProfile.constant(0.5, block_size=5, n_requests=0), "n_requests"),
        (lambda: AcceptanceProfile.from_table([[0.5, 0.5], [0.5, 2.0]]), "table"),
        (lambda: AcceptanceProfile.from_table([[0.5, 0.5], [0.5]]), "table"),
        (lambda: AcceptanceProfile.from_table(np.zeros((2, 2, 2))), "table"),
        (lambda: AcceptanceProfile.from_beta(0.0, 1.0, block_size=5), "alpha"),
        (lambda: AcceptanceProfile.from_beta(1.0, -1.0, block_size=5), "beta"),
        (lambda: AcceptanceProfile.from_mixture([[0.5] * 5], [1, 1]), "weights"),
        (lambda: AcceptanceProfile.from_mixture([[0.5] * 5, [1] * 5], [0, 0]), "weights"),
        (lambda: AcceptanceProfile.constant(A_HAND).expected_emitted(6), "k"),
        (lambda: AcceptanceProfile.constant(A_HAND).expected_emitted(-1), "k"),
        (lambda: AcceptanceProfile.constant(A_HAND).expected_emitted(1.5), "k"),
        (lambda: AcceptanceProfile.constant(A_HAND, n_requests=3).expected_emitted([1, 2]), "k"),
    ],
)
def test_validation_errors(make, field):
    with pytest.raises(GraphsimError) as e:
        make()
    assert e.value.field == field


def test_array_is_read_only():
    p = AcceptanceProfile.constant(A_HAND)
    with pytest.raises(ValueError):
        p.a[0, 0] = 0.1


# --------------------------------------------------------------------------------------------------
# Scheduler
# --------------------------------------------------------------------------------------------------


def affine_step(t0: float, c: float):
    """Synthetic engine curve: t = t0 + c * sum_r (1 + k_r) (weights/launch floor + per-verify-token cost)."""

    def step_time(k: np.ndarray) -> np.ndarray:
        assert k.ndim == 2 and k.dtype.kind == "i"
        return t0 + c * np.sum(1 + k, axis=1)

    return step_time


def context_step(t0: float, c: float, per_ctx: float, ctx):
    """t = t0 + sum_r (c + per_ctx * ctx_r) * (1 + k_r): verifying a long-context request costs more."""
    ctx = np.asarray(ctx, dtype=float)

    def step_time(k: np.ndarray) -> np.ndarray:
        return t0 + np.sum((c + per_ctx * ctx) * (1 + k), axis=1)

    return step_time


def throughput(prof: AcceptanceProfile, step_time, k) -> float:
    k = np.atleast_2d(np.asarray(k, dtype=np.int64))
    return float(prof.expected_emitted(k).sum(axis=1)[0] / step_time(k)[0])


def brute_force(prof: AcceptanceProfile, step_time, k_max: int = D):
    grid = np.array(list(itertools.product(range(k_max + 1), repeat=prof.n_requests)), dtype=np.int64)
    thr = prof.expected_emitted(grid).sum(axis=1) / step_time(grid)
    return grid, thr


def assert_local_optimum(prof, step_time, plan: VerifyPlan, k_max: int = D):
    """Each chosen k_r beats (or ties) its -1 and +1 neighbours, evaluated explicitly."""
    base = throughput(prof, step_time, plan.k)
    assert base == pytest.approx(plan.throughput, rel=1e-12)
    for r in range(prof.n_requests):
        for dk in (-1, +1):
            k = np.array(plan.k)
            k[r] += dk
            if 0 <= k[r] <= k_max:
                assert throughput(prof, step_time, k) <= base * (1 + 1e-9), (r, dk, k)


MIXED = AcceptanceProfile.from_table([[0.95] * 5, A_HAND, [0.3] * 5])


def test_scheduler_gives_different_k_for_different_acceptance():
    step = affine_step(t0=10e-3, c=0.5e-3)
    plan = choose_verify_lengths(MIXED, step)
    assert plan.k[0] > plan.k[1] > plan.k[2]
    assert plan.k[0] == 5 and plan.k[2] <= 1
    assert_local_optimum(MIXED, step, plan)
    # Hand check for the chosen k: t = t0 + c * sum(1 + k); throughput = sum E / t.
    e = MIXED.expected_emitted(plan.k)
    np.testing.assert_allclose(plan.expected_emitted, e)
    t = 10e-3 + 0.5e-3 * np.sum(1 + plan.k)
    assert plan.step_time == pytest.approx(t)
    assert plan.throughput == pytest.approx(e.sum() / t)
    assert plan.verify_tokens == int(np.sum(1 + plan.k))


def test_scheduler_matches_brute_force_3_requests():
    step = affine_step(t0=10e-3, c=0.5e-3)
    plan = choose_verify_lengths(MIXED, step)
    grid, thr = brute_force(MIXED, step)
    assert plan.throughput == pytest.approx(thr.max(), rel=1e-12)
    # throughput = E[emitted] / E[step time] at the chosen k, recomputed by enumeration
    row = np.flatnonzero(np.all(grid == plan.k, axis=1))[0]
    assert thr[row] == pytest.approx(plan.throughput, rel=1e-12)


@pytest.mark.parametrize("per_ctx", [0.0, 1e-8, 5e-8])
def test_scheduler_context_dependent_cost(per_ctx):
    prof = AcceptanceProfile.constant(A_HAND, n_requests=3)
    ctx = [1_000, 30_000, 120_000]
    step = context_step(5e-3, 0.2e-3, per_ctx, ctx)
    plan = choose_verify_lengths(prof, step)
    assert_local_optimum(prof, step, plan)
    assert np.all(np.diff(plan.k) <= 0)  # longer context -> costlier verify -> never a longer k
    _, thr = brute_force(prof, step)
    assert plan.throughput == pytest.approx(thr.max(), rel=1e-12)
    if per_ctx == 5e-8:
        assert plan.k[0] > plan.k[2]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.floats(0, 1), min_size=5, max_size=5), min_size=1, max_size=3),
    st.floats(1e-4, 1e-1),
    st.floats(1e-6, 1e-2),
)
def test_scheduler_local_and_global_optimum_affine(rows, t0, c):
    prof = AcceptanceProfile.from_table(rows)
    step = affine_step(t0, c)
    plan = choose_verify_lengths(prof, step)
    assert_local_optimum(prof, step, plan)
    _, thr = brute_force(prof, step)
    # Affine time + concave E[emitted | k]: the local optimum is the global one.
    assert plan.throughput == pytest.approx(thr.max(), rel=1e-9)


def test_scheduler_nonlinear_curve_local_optimum():
    # A saturating-then-linear engine curve (flat while memory-bound, then compute-bound).
    def step(k):
        n = np.sum(1 + k, axis=1)
        return 8e-3 + 1e-3 * np.maximum(0, n - 16) + 1e-5 * n**2

    prof = AcceptanceProfile.from_table(np.random.default_rng(1).uniform(0.3, 1.0, size=(8, 5)))
    plan = choose_verify_lengths(prof, step)
    assert_local_optimum(prof, step, plan)
    assert plan.throughput >= throughput(prof, step, np.zeros(8, dtype=int))  # never worse than plain decode


def test_scheduler_edges():
    ones = AcceptanceProfile.constant(1.0, block_size=D, n_requests=2)
    zeros = AcceptanceProfile.constant(0.0, block_size=D, n_requests=2)
    cheap = affine_step(10e-3, 1e-6)
    np.testing.assert_array_equal(choose_verify_lengths(ones, cheap).k, [5, 5])
    np.testing.assert_array_equal(choose_verify_lengths(zeros, cheap).k, [0, 0])  # drafts never pay
    np.testing.assert_array_equal(choose_verify_lengths(ones, cheap, k_max=3).k, [3, 3])
    np.testing.assert_array_equal(choose_verify_lengths(ones, cheap, k_max=0).k, [0, 0])
    # Plain decode: 2 tokens / 3 ms = 667/s; one more draft adds s_1 = 0.5 tokens for 1 ms: 2.5 / 4 ms = 625/s.
    dear = affine_step(1e-3, 1e-3)
    half = AcceptanceProfile.constant(0.5, block_size=D, n_requests=2)
    np.testing.assert_array_equal(choose_verify_lengths(half, dear).k, [0, 0])


def test_plan_bursts_and_itl():
    step = affine_step(10e-3, 0.5e-3)
    plan = choose_verify_lengths(MIXED, step)
    bursts = plan.requests()
    assert len(bursts) == 3
    for r, b in enumerate(bursts):
        assert b.k == plan.k[r]
        assert b.step_time == plan.step_time
        # mean ITL = step time / E[emitted]; a verify step's time is not the ITL
        assert b.mean_time_per_token == pytest.approx(plan.step_time / plan.expected_emitted[r])
        assert b.mean_time_per_token <= plan.step_time
        assert sum(b.burst_distribution) == pytest.approx(1.0)
        assert sum((1 + j) * p for j, p in enumerate(b.burst_distribution)) == pytest.approx(b.tokens_per_step)
    np.testing.assert_allclose(plan.mean_time_per_token, plan.step_time / plan.expected_emitted)
    # k=5 with a=0.95: bursts of 6 tokens with probability 0.95^5
    if plan.k[0] == 5:
        assert bursts[0].burst_distribution[5] == pytest.approx(0.95**5)


def test_scheduler_is_deterministic_and_accepts_profile_list():
    step = affine_step(10e-3, 0.5e-3)
    a = choose_verify_lengths(MIXED, step)
    b = choose_verify_lengths([AcceptanceProfile.constant(r) for r in MIXED.a], step)
    np.testing.assert_array_equal(a.k, b.k)
    assert a.throughput == b.throughput and a.evaluations == b.evaluations


@pytest.mark.parametrize(
    "step, kw, field",
    [
        (lambda k: np.ones(3), {}, "step_time"),  # wrong shape
        (lambda k: -np.ones(k.shape[0]), {}, "step_time"),  # negative
        (lambda k: np.full(k.shape[0], np.inf), {}, "step_time"),
        ("not callable", {}, "step_time"),
        (affine_step(1e-3, 1e-4), {"k_max": 6}, "k_max"),
        (affine_step(1e-3, 1e-4), {"k_max": -1}, "k_max"),
    ],
)
def test_scheduler_validation(step, kw, field):
    with pytest.raises(GraphsimError) as e:
        choose_verify_lengths(MIXED, step, **kw)
    assert e.value.field == field
