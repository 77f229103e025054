"""Closed-form workload features against brute-force sums over positions (lowering/features.py)."""
import numpy as np
import jax.numpy as jnp
from hypothesis import given, settings, strategies as st

from graphsim.core.ir import Feature, TokenSet
from graphsim.lowering.features import feature_matrix, per_request


def brute(kind, params, lo, hi):
    v = np.arange(lo + 1, hi + 1, dtype=float)  # query i sees i+1 positions
    if kind == "causal_pairs":
        return v.sum()
    if kind == "window_pairs":
        return np.minimum(v, params[0]).sum()
    if kind == "compressed_pairs":
        return np.floor(v / params[0]).sum()
    if kind == "topk_pairs":
        return np.minimum(params[1], np.floor(v / params[0])).sum()
    if kind == "sparse_read":
        return min(np.minimum(params[1], np.floor(v / params[0])).sum(), np.floor(hi / params[0]) if hi > lo else 0)
    if kind == "new_groups":
        return np.floor(hi / params[0]) - np.floor(lo / params[0])
    if kind == "window_read":  # union of the windows of queries lo..hi-1
        return len({p for i in range(lo, hi) for p in range(max(0, i - params[0] + 1), i + 1)})
    if kind == "chunk_pairs":  # query i sees the positions of its aligned chunk up to itself
        return ((v - 1) % params[0] + 1).sum()
    if kind == "chunk_read":  # union of the chunk prefixes queries lo..hi-1 see
        return len({p for i in range(lo, hi) for p in range(i - i % params[0], i + 1)})
    if kind == "block_pairs":  # the set's positions in consecutive blocks of B, each attending within itself
        return sum(len(range(s, min(s + params[0], hi - lo))) ** 2 for s in range(0, hi - lo, params[0]))
    raise AssertionError(kind)


CASES = [("causal_pairs", ()), ("window_pairs", (128,)), ("window_pairs", (1,)), ("compressed_pairs", (2,)),
         ("compressed_pairs", (1,)), ("compressed_pairs", (4,)), ("topk_pairs", (2, 512)), ("topk_pairs", (1, 512)),
         ("topk_pairs", (4, 3)), ("sparse_read", (2, 512)), ("sparse_read", (1, 8)), ("new_groups", (2,)),
         ("new_groups", (128,)), ("window_read", (128,)), ("window_read", (3,)), ("chunk_pairs", (1,)),
         ("chunk_pairs", (7,)), ("chunk_pairs", (8192,)), ("chunk_read", (5,)), ("chunk_read", (64,)),
         ("block_pairs", (1,)), ("block_pairs", (7,)), ("block_pairs", (577,))]


def test_registry_is_the_one_list_of_feature_kinds():
    from graphsim.core.features import FEATURES, QUERY_FEATURES
    from graphsim.core.ir import FEATURE_KINDS
    from graphsim.core.errors import GraphsimError
    import pytest

    assert FEATURE_KINDS == tuple(FEATURES)
    assert {"tokens", "causal_pairs", "chunk_pairs"} <= set(QUERY_FEATURES) and "kv_len" not in QUERY_FEATURES
    for kind, rule in FEATURES.items():  # every per-request kind is brute-forced above
        assert rule.per_request is None or kind in {k for k, _ in CASES} | {"tokens", "requests", "kv_len",
                                                                            "full_pairs", "compressed"}, kind
    with pytest.raises(GraphsimError, match=r"feature\[window_pairs\].params: takes \(W\)"):
        Feature("window_pairs", "all", ())


@settings(max_examples=60, deadline=None)
@given(lo=st.integers(0, 3000), n=st.integers(0, 600))
def test_closed_forms_match_brute_force(lo, n):
    hi = lo + n
    for kind, params in CASES:
        got = float(per_request(kind, params, np.array([lo], float), np.array([hi], float), np)[0])
        assert got == brute(kind, params, lo, hi), (kind, params, lo, hi)


def test_edges_127_128_129():
    # window W=128 over a fresh prompt of N: Σ min(v,128) (V41_FACTS §4 boundary cases)
    for n, want in [(127, 127 * 128 / 2), (128, 128 * 129 / 2), (129, 128 * 129 / 2 + 128)]:
        assert per_request("window_pairs", (128,), np.array([0.0]), np.array([float(n)]), np)[0] == want


def test_token_set_rules_per_request_and_summed():
    # Two prefill groups [300 x1, 100 x1]: the 128-tail is per request (V41_FACTS §4): 128 + 100, never min(400,128)
    ts = {"tail": TokenSet("tail", prefill="tail:128", decode="all"), "all": TokenSet("all")}
    a = {"count": np.array([[1.0, 1.0, 64.0]]), "new": np.array([[300.0, 100.0, 1.0]]),
         "past": np.array([[0.0, 0.0, 8192.0]]), "image": np.zeros((1, 3)), "patches": np.zeros((1, 3)), "replay": np.zeros((1, 3))}
    kinds = ("prefill", "prefill", "decode")
    f = feature_matrix([Feature("tokens", "tail"), Feature("tokens", "all"), Feature("kv_len", "all")], ts, kinds, a, np)
    assert f[0, 0] == 128 + 100 + 64
    assert f[0, 1] == 400 + 64
    assert f[0, 2] == 300 + 100 + 64 * 8193


def test_numpy_and_jax_agree():
    rng = np.random.default_rng(0)
    ts = {"t": TokenSet("t", prefill="tail:128", decode="all"), "r": TokenSet("r", prefill="replay+all", decode="none")}
    feats = [Feature(k, s, p) for s in ("t", "r") for k, p in CASES if k != "new_groups"]
    feats += [Feature("experts_touched", "t", (384, 6)), Feature("experts_touched", "t", (384, 6), 0.5)]
    P = 50
    past = rng.integers(0, 9000, (P, 2)).astype(float)
    a = {"count": rng.integers(1, 5, (P, 2)).astype(float), "new": rng.integers(1, 5000, (P, 2)).astype(float),
         "past": past, "image": np.zeros((P, 2)), "patches": np.zeros((P, 2)), "replay": np.minimum(past, 128.0)}
    n = feature_matrix(feats, ts, ("prefill", "decode"), a, np)
    import jax

    with jax.enable_x64(True):  # graphsim enables float64 only inside its own calls, as here
        j = np.asarray(feature_matrix(feats, ts, ("prefill", "decode"), {k: jnp.asarray(v) for k, v in a.items()},
                                      jnp))
    np.testing.assert_allclose(j, n, rtol=1e-12)


def test_experts_touched_expectation():
    # E·(1-(1-k/E)^T): T=1 -> exactly k experts; large T -> all E
    ts = {"a": TokenSet("a")}
    for t, want in [(1, 8.0), (10**6, 256.0)]:
        a = {"count": np.array([[1.0]]), "new": np.array([[float(t)]]), "past": np.zeros((1, 1)),
             "image": np.zeros((1, 1)), "patches": np.zeros((1, 1)), "replay": np.zeros((1, 1))}
        got = feature_matrix([Feature("experts_touched", "a", (256, 8))], ts, ("prefill",), a, np)[0, 0]
        assert abs(got - want) < 1e-9
