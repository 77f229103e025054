"""DeepSeek-V4.1 (tiny-v41) executed op for op equals an independent reference forward (tests/reference/v41.py).

The executor runs graphsim's compiled graph (the priced ops, their token sets and data edges); the reference is
a plain JAX function of the token ids written from the model description. Both in fp32 with the format
emulation off (the brief's "fp32 at tight tolerance"); the shared inputs are only the checkpoint (weights by
name) and the token ids. With the format emulation on, the two agree bit for bit on some prompts (prefill:40)
and not on others (prefill:48 differs by up to 1.4 in a logit, the same for a batch of 1 or 2): the two
implementations round differently at the ulp level (e.g. ``x * (1/r)`` against ``x / r`` in RMSNorm), and an
FP8/FP4 rounding at a grid midpoint, a Top-K or an expert choice turns an ulp into a different value — so
equality is asserted in plain fp32, where it holds to ~1e-6.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

#: the whole set of execution checks compiles many ~650-op programs (minutes on 2 cores); the suite runs the core
#: equalities and the edge deletion, GRAPHSIM_EXEC_FULL=1 the policy and format variants too
FULL_ONLY = pytest.mark.skipif(not __import__("os").environ.get("GRAPHSIM_EXEC_FULL"),
                               reason="a variant of the execution checks: GRAPHSIM_EXEC_FULL=1 runs it")

jax = pytest.importorskip("jax")

from graphsim import ParallelMapping, Plan, Policies, compile_plan  # noqa: E402
from graphsim.views.collect import execute as E  # noqa: E402
from graphsim.views.collect import kernels_v41 as K  # noqa: E402
from graphsim.hw import load_hw  # noqa: E402
from graphsim.models import load_model  # noqa: E402

from reference import v41 as R  # noqa: E402

CFG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "tiny-v41.json"
TOL = 5e-5  # fp32, logits of scale ~3; observed ≤ 7e-6


@pytest.fixture(scope="module")
def model():
    return load_model(str(CFG)), json.loads(CFG.read_text())


def _run(model, reqs, policies=Policies(), caches=None, params=None):
    m, _ = model
    with K.formats(False):
        c = compile_plan(m, Plan(reqs, ParallelMapping(), policies), load_hw("gb200"))
        ex = E.lower_to_jax(c)
        params = params if params is not None else E.init_params(c)
        caches = caches if caches is not None else E.init_caches(ex)
        ids = E.init_ids(ex)
        logits, caches = ex.fn(params, caches, ids)
    return ex, params, np.asarray(ids), np.asarray(logits), caches


def _ref(model, params, ids, **kw):
    _, cfg = model
    return np.asarray(R.forward(params, cfg, np.asarray(ids), emulate=False, **kw))


def test_tiny_v41_keeps_the_layer_pattern(model):
    m, _ = model
    paths = [li.path for li in m.layers]
    assert paths.count("swa_only") == 2 and paths.count("full") == 4 and paths.count("reindex") == 4
    # a Reuse layer whose KV owner differs from its Top-K producer (layer 29 of the real model: KV 20, Top-K 28)
    li = m.layers[15]
    assert (li.path, li.kv_owner, li.topk_producer) == ("reuse", 10, 14)
    assert m.cfg.hc_mult == 4 and m.cfg.engram_layer_ids and m.cfg.num_nextn_predict_layers == 3


def test_prefill_then_decode_equal_the_reference(model):
    """A 40-token prompt (20 encoder entries > Top-K 16; 10 decoder blocks > 8 candidate blocks) and then two
    real decode steps carrying the executor's own caches (the second completes an m=2 group)."""
    N, B = 40, 2
    ex, params, ids, logits, caches = _run(model, [f"prefill:{N}x{B}"])
    seq = ids.reshape(B, N)
    for b in range(B):
        ref = _ref(model, params, seq[b])[-1]
        np.testing.assert_allclose(logits[b], ref, atol=TOL, rtol=0)
    for step in range(2):
        past = N + step
        with K.formats(False):
            c = compile_plan(model[0], Plan([f"decode:{past}x{B}"], ParallelMapping(), Policies()),
                             load_hw("gb200"))
            dx = E.lower_to_jax(c)
            carried = K.carry_caches(caches, dx)
            new_ids = E.init_ids(dx, seed=10 + step)
            out, caches = dx.fn(params, carried, new_ids)
        seq = np.concatenate([seq, np.asarray(new_ids).reshape(B, 1)], axis=1)
        for b in range(B):
            ref = _ref(model, params, seq[b])[-1]
            np.testing.assert_allclose(np.asarray(out)[b], ref, atol=TOL, rtol=0)


def _continue(model, params, caches, reqs, groups, seed):
    with K.formats(False):
        c = compile_plan(model[0], Plan(reqs, ParallelMapping(), Policies()), load_hw("gb200"))
        dx = E.lower_to_jax(c)
        kinds = [g.kind for g in dx.layout.groups]
        ids = E.init_ids(dx, seed=seed)
        out, caches = dx.fn(params, K.carry_caches(caches, dx, groups(kinds)), ids)
    return dx, np.asarray(ids), np.asarray(out), caches


@FULL_ONLY
def test_chunked_prefill_and_a_mixed_batch_equal_the_reference(model):
    """A 23-token chunk (an odd length: the m=2 compressors carry a pending row), its next 17-token chunk
    with the first resident (prefill:40@23), then one batch mixing a new 12-token prompt with a decode step
    of the first request."""
    _, params, ids1, _, caches = _run(model, ["prefill:23x1"])
    dx, ids2, out, caches = _continue(model, params, caches, ["prefill:40x1@23:hbm"], lambda k: {0: 0}, 21)
    seq = np.concatenate([ids1, ids2])
    np.testing.assert_allclose(out[0], _ref(model, params, seq)[-1], atol=TOL, rtol=0)
    dx, ids3, out, _ = _continue(model, params, caches, ["prefill:12x1", "decode:40x1"],
                                 lambda k: {k.index("decode"): 0}, 22)
    kinds = [g.kind for g in dx.layout.groups]
    rows = {k: i for i, k in enumerate(kinds)}
    new_prompt = ids3[:12] if kinds[0] == "prefill" else ids3[1:]
    step = ids3[12:13] if kinds[0] == "prefill" else ids3[:1]
    np.testing.assert_allclose(out[rows["prefill"]], _ref(model, params, new_prompt)[-1], atol=TOL, rtol=0)
    np.testing.assert_allclose(out[rows["decode"]], _ref(model, params, np.concatenate([seq, step]))[-1],
                               atol=TOL, rtol=0)


@FULL_ONLY
@pytest.mark.parametrize("replay", ["sglang", "paper"])
def test_decoder_replay_equals_a_reference_that_runs_the_tail(model, replay):
    """With decoder bounded replay, the replayed layers (SGLang: after the last KV source; paper: the whole
    Decoder) run only each prompt's last W tokens, their SWA history truncated at the tail: the logits equal a
    reference that does exactly that, and differ from the full forward."""
    m, _ = model
    N, B, W = 48, 2, 20
    first = m.cfg.replay_start_layer if replay == "sglang" else m.cfg.decoder_start
    _, params, ids, logits, _ = _run(model, [f"prefill:{N}x{B}"], Policies(decoder_replay=replay, replay_window=W))
    seq = ids.reshape(B, N)
    for b in range(B):
        tail = _ref(model, params, seq[b], swa_start=N - W, layers_from=first)[-1]
        np.testing.assert_allclose(logits[b], tail, atol=TOL, rtol=0)
        assert np.abs(logits[b] - _ref(model, params, seq[b])[-1]).max() > 100 * TOL


@FULL_ONLY
@pytest.mark.parametrize("fusion", ["two-pass", "single-pass"])
def test_fused_mhc_runs_the_same_forward(model, fusion):
    """The fused mHC profiles (single-pass: residual + coefficients + pre-mix + pre-norm in one op, fused
    q norm + quant) are different graphs of the same model: the same logits."""
    _, params, ids, logits, _ = _run(model, ["prefill:40x1"], Policies(fusion=fusion))
    np.testing.assert_allclose(logits[0], _ref(model, params, ids)[-1], atol=TOL, rtol=0)


def test_dspark_drafts_as_the_reference_drafter(model):
    """DSpark on a prefill: the executed graph's last op (the confidence head over the 5 draft positions)
    equals the reference drafter's, which runs after the reference forward of the same prompt."""
    _, params, ids, conf, _ = _run(model, ["prefill:40x1"], Policies(dspark="on"))
    _, ref_conf = R.draft(params, model[1], ids, emulate=False)
    assert conf.shape == (5, 1)
    np.testing.assert_allclose(conf, ref_conf, atol=TOL, rtol=0)


def test_deleting_a_dependency_edge_fails(model):
    """A seeded sample of the graph's edges that no other path implies (not the empty restore copies'):
    without any one of them the executor cannot bind its operand and refuses the graph (Unsupported names
    the missing dependency). An edge another path implies orders nothing new, so deleting it changes nothing."""
    import attrs

    m, _ = model
    c = compile_plan(m, Plan(["prefill:24x1"], ParallelMapping(), Policies()), load_hw("gb200"))
    ex = E.lower_to_jax(c)
    params, caches, ids = ex.init(0)
    jax.eval_shape(ex.fn, params, caches, ids)  # the intact graph traces
    g = c.graph
    succ: dict = {}
    for e in g.edges:
        succ.setdefault(e.src, []).append(e)

    def implied(cut) -> bool:  # dst reachable from src without the edge itself
        todo, seen = [e.dst for e in succ.get(cut.src, []) if e is not cut], set()
        while todo:
            n = todo.pop()
            if n == cut.dst:
                return True
            if n not in seen:
                seen.add(n)
                todo.extend(e.dst for e in succ.get(n, []))
        return False

    edges = [e for e in g.edges if g.op(e.src).kind != "host_copy" and not implied(e)]
    assert len(edges) > 0.8 * len(g.edges) - 24
    rng = np.random.default_rng(0)
    for i in rng.choice(len(edges), size=6, replace=False):
        cut = edges[i]
        g2 = attrs.evolve(g, edges=tuple(e for e in g.edges if e is not cut))
        c2 = attrs.evolve(c, graph=g2)
        with pytest.raises(E.Unsupported, match="missing dependency|no data input"):
            jax.eval_shape(E.lower_to_jax(c2).fn, params, caches, ids)
