"""DSpark in the graph (commit + draft stages) and verify lengths chosen on graphsim's own step-time curve.

E[emitted | k] for hand-computed acceptance vectors is covered in tests/test_dspark_math.py
(A_HAND = [0.9, 0.8, 0.7, 0.6, 0.5] -> E = 1, 1.9, 2.62, 3.124, 3.4264, 3.5776); here the same vector is
checked end to end through the priced step.
"""
from __future__ import annotations

import numpy as np
import pytest

import graphsim as gs
from graphsim.models.dspark import AcceptanceProfile
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import COMPONENT_INDEX, Feature
from graphsim.lowering.features import feature_matrix
from graphsim.models.deepseek_v41 import compressor_state_row_bytes, swa_entry_bytes
from graphsim.core.plan import Request
from graphsim.serving.speculative import (DecodeBatch, StepCurve, bucket_contexts, merge_classes, price_verify,
                                  schedule_verify)

MODEL = gs.load_model("deepseek-v4.1-flash")
CFG = MODEL.cfg
D = CFG.dspark_block_size
W = CFG.sliding_window
HIGH = [0.9, 0.85, 0.8, 0.75, 0.7]
LOW = [0.5, 0.4, 0.3, 0.2, 0.1]
A_HAND, E_HAND = [0.9, 0.8, 0.7, 0.6, 0.5], [1.0, 1.9, 2.62, 3.124, 3.4264, 3.5776]
MAPPING = gs.ParallelMapping(tp=4, ep=4)
ON = gs.Policies(dspark="on", acceptance=HIGH)  # reports turn verified positions into E[emitted]


def compile_(requests, policies=ON, mapping=gs.ParallelMapping()):
    return gs.compile_plan(MODEL, gs.Plan(requests, mapping, policies), "gb200")


def feature(compiled, kind, ts, params=()):
    g, wl = compiled.graph, compiled.plan.workload()
    return float(feature_matrix([Feature(kind, ts, params)], g.token_set_map, wl.kinds, wl.arrays(), np)[0, 0])


def op_component(compiled, name, component):
    sched = compiled.schedule()
    return float(sched.components[0, compiled.graph.op_index[name], COMPONENT_INDEX[component]])


@pytest.fixture(scope="module")
def curve():
    return StepCurve.compile(MODEL, "gb200", [8192, 32768], mapping=MAPPING)


# ---- graph structure --------------------------------------------------------------------------------


def test_stages_only_when_on():
    off = compile_(["decode:8192x4"], gs.Policies())
    assert "draft" not in off.graph.stages and "commit" not in off.graph.stages
    assert not any(ts.name.startswith("ds_") for ts in off.graph.token_sets)
    on = compile_(["decode:8192x4"])
    assert on.graph.stages[-2:] == ("commit", "draft")
    # the trunk stages are the verify forward, unchanged in structure
    trunk = [o.name for o in off.graph.ops]
    assert [o.name for o in on.graph.ops if o.stage not in ("commit", "draft")] == trunk
    # a prefill-only batch drafts (first drafter forward after prefill) but has nothing to commit
    pre = compile_(["prefill:1000"])
    assert "draft" in pre.graph.stages and "commit" not in pre.graph.stages


def test_draft_and_commit_token_counts():
    k, n, ctx = 3, 16, 8192
    c = compile_([Request("decode", ctx, n, new=1 + k), "prefill:1000", "prefill:60"])
    assert feature(c, "tokens", "ds_verify") == n * (1 + k)  # the verified positions; prefill has none
    assert feature(c, "requests", "ds_verify") == n
    assert feature(c, "tokens", "ds_ctx") == n * (1 + k) + W + 60  # prefill: last min(N, W) prompt tokens
    assert feature(c, "tokens", "ds_draft") == (n + 2) * D  # block_size positions per request
    # each draft position attends to <= W positions; they sit after the verified ones
    assert feature(c, "window_pairs", "ds_draft", (W,)) == n * D * W + sum(
        sum(min(i + 1, W) for i in range(p, p + D)) for p in (1000, 60))
    draft_sets = {o.token_set for o in c.graph.ops if o.stage == "draft" and o.stream == "compute"}
    assert draft_sets == {"ds_ctx", "ds_draft"}


def test_commit_bytes_closed_form():
    k, n = 4, 8
    c = compile_([Request("decode", 8192, n, new=1 + k)])
    L = CFG.num_hidden_layers
    assert op_component(c, "commit.swa", "bytes_kv") == n * (1 + k) * 2 * L * swa_entry_bytes(CFG)
    pooled = sum(1 for li in MODEL.layers if li.kv_source and li.ratio > 1)
    assert pooled == 3  # the three Encoder Full layers (m=2); the Decoder owner (m=1) has no partial group
    assert op_component(c, "commit.compressor_state", "bytes_kv") == n * pooled * 2 * compressor_state_row_bytes(CFG)
    assert op_component(c, "commit.accept", "bytes_act") == n * (1 + k) * CFG.vocab_size * 4.0


def test_drafter_reads_its_target_layers_and_own_weights():
    c = compile_(["decode:8192x4"])
    g = c.logical
    preds = {e.src for e in g.edges if e.dst == "dspark.main_proj"}
    assert {f"layers.{L}.hc_attn.premix" for L in CFG.dspark_target_layer_ids} <= preds
    assert tuple(CFG.dspark_target_layer_ids) == (37, 38, 39)
    main = g.op("dspark.main_proj").param_dict
    assert (main["k"], main["n"]) == (3 * CFG.hidden_size, CFG.hidden_size)
    experts = g.op("dspark.blocks.0.ffn.experts").param_dict
    assert (experts["experts"], experts["top_k"]) == (128, 3)
    reads = {t for o in g.ops if o.stage in ("draft", "commit") for t in o.reads}
    assert {t for t in reads if not t.startswith("dspark.")} == {"embed.weight", "head.weight"}  # shared
    conf = g.op("dspark.confidence").param_dict
    assert (conf["k"], conf["n"], conf["weight_format"]) == (CFG.hidden_size + CFG.dspark_markov_rank, 1, "fp32")
    # the drafter leaves unread exactly what the trunk leaves unread (sinks, mHC base/scale)
    read = {t for o in g.ops for t in o.reads}
    leaf = lambda t: t.name.rsplit(".", 1)[-1]
    unread = {grp: {leaf(t) for t in g.weights() if t.group == grp and t.name not in read} for grp in ("trunk", "dspark")}
    assert unread["dspark"] <= unread["trunk"]
    # the drafter blocks are SWA-only: no compressor, indexer or main-KV reads
    assert not any(o.stage == "draft" and o.kind in ("indexer", "compressor", "topk") for o in g.ops)


def test_dspark_weights_counted_once():
    one = compile_([Request("decode", 8192, 1, new=2)])
    many = compile_([Request("decode", 8192, 100, new=6)])
    off = compile_([Request("decode", 8192, 100, new=1)], gs.Policies())
    assert one.graph.weights() == many.graph.weights() == off.graph.weights()  # fixed inventory
    m1, m100, moff = (c.report().memory["weights_gib"] for c in (one, many, off))
    assert "dspark" in m1 and "dspark" not in moff
    assert m1["dspark"] == m100["dspark"] > 0
    # per step, each dense drafter weight is read once, not once per draft or verified position
    dense = ("dspark.main_proj", "dspark.blocks.0.attn.wq_b", "dspark.markov.proj", "dspark.head")
    for name in dense:
        assert op_component(one, name, "bytes_weight") == op_component(many, name, "bytes_weight") > 0
    # 100 steps of one request = 100x the work of one step, never more resident weights
    curve = StepCurve.compile(MODEL, "gb200", [8192])
    wl = curve.workload(curve.histogram([0], [1], [[1]] * 100))
    assert wl.points == 100 and curve.compiled.graph.weights() == one.graph.weights()


# ---- the step-time curve and the scheduler ----------------------------------------------------------


def test_curve_structure_is_independent_of_batch(curve):
    assert curve.compiled.plan.kinds == ("decode",) * (2 * (D + 1))
    small = price_verify(curve, DecodeBatch.uniform(8192, 1, HIGH), 2)
    big = price_verify(curve, DecodeBatch.uniform(8192, 256, HIGH), 2)
    assert big.step_time > small.step_time > 0


def test_expected_emitted_hand_vector(curve):
    batch = DecodeBatch.uniform(8192, 4, A_HAND)
    for k, e in enumerate(E_HAND):
        r = price_verify(curve, batch, k)
        assert r.expected_emitted[0] == pytest.approx(e)
        assert r.throughput == pytest.approx(4 * e / r.step_time)


def test_throughput_matches_an_explicit_evaluation(curve):
    prof = AcceptanceProfile.from_table([HIGH, LOW, HIGH])
    batch = DecodeBatch([8192, 8192, 30000], [24, 8, 4], prof)
    r = schedule_verify(curve, batch)
    # the same step as an ordinary plan at the chosen k, priced by the reference (NumPy, full graph) path
    reqs = [Request("decode", ctx, n, new=1 + int(k)) for ctx, n, k in zip([8192, 8192, 32768], batch.counts, r.k)]
    report = compile_(reqs, mapping=MAPPING).report()
    assert report.forward_s == pytest.approx(r.step_time, rel=1e-9)
    e = prof.expected_emitted(r.k)
    assert r.throughput == pytest.approx(np.dot(batch.counts, e) / report.forward_s, rel=1e-9)
    assert r.tokens_per_s_per_gpu == pytest.approx(r.throughput / 4)
    assert sum(r.stages.values()) >= r.step_time * 0.99 and r.stages["draft"] > 0 and r.stages["commit"] > 0


def test_verify_lengths_differ_and_beat_their_neighbours(curve):
    batch = DecodeBatch([8192, 8192], [32, 32], AcceptanceProfile.from_table([HIGH, LOW]))
    r = schedule_verify(curve, batch)
    assert r.k[0] > r.k[1]  # higher acceptance -> longer verify
    for c in range(2):
        for step in (-1, 1):
            k = r.k.copy()
            k[c] += step
            if 0 <= k[c] <= D:
                assert price_verify(curve, batch, k).throughput <= r.throughput * (1 + 1e-12)
    # never "rate x D": E[emitted] is the prefix-survival sum
    assert r.expected_emitted[0] < 1 + np.mean(HIGH) * r.k[0]


def test_bursts_and_itl(curve):
    r = schedule_verify(curve, DecodeBatch.uniform(8192, 16, HIGH))
    (b,) = r.bursts()
    assert b.step_time == r.step_time and b.tokens_per_step == pytest.approx(r.expected_emitted[0])
    assert sum(b.burst_distribution) == pytest.approx(1.0)
    assert np.dot(np.arange(1, D + 2), b.burst_distribution) == pytest.approx(b.tokens_per_step)
    itl = r.itl()
    assert itl["mean_s"][0] == pytest.approx(r.step_time / r.expected_emitted[0])
    assert itl["mean_s"][0] < r.step_time  # a verify step's time is not the ITL
    assert itl["zero_gap_fraction"][0] == pytest.approx(1 - 1 / r.expected_emitted[0])
    assert "tok/s" in r.to_text()


def test_plain_decode_curve(curve):
    off = StepCurve.compile(MODEL, "gb200", [8192], mapping=MAPPING, policies=gs.Policies())
    batch = DecodeBatch.uniform(8192, 16, HIGH)
    base = price_verify(off, batch, 0)
    assert off.k_max == 0 and base.expected_emitted[0] == 1.0 and set(base.stages) == {"verify"}
    assert base.step_time == pytest.approx(compile_(["decode:8192x16"], gs.Policies(), MAPPING).report().forward_s)
    # DSpark at k = 0 only adds drafter and commit work to the same verify
    assert price_verify(curve, batch, 0).step_time > base.step_time
    with pytest.raises(GraphsimError) as e:
        schedule_verify(off, batch)
    assert e.value.field == "curve"


def test_buckets_and_classes():
    rep, upper = bucket_contexts([1000, 2000, 3000])
    assert list(rep) == [1000, 2000, 3000] == list(upper)
    rep, upper = bucket_contexts([1000, 1100, 50000, 52000], [1, 3, 1, 1], max_buckets=2)
    assert list(rep) == [1075, 51000] and list(upper) == [1100, 52000]
    batch = DecodeBatch.from_requests([8192, 8192, 4096, 8192], AcceptanceProfile.from_table([HIGH, LOW, HIGH, HIGH]))
    assert batch.contexts == (8192, 8192, 4096) and batch.counts == (2, 1, 1) and batch.n_requests == 4
    with pytest.raises(GraphsimError) as e:
        DecodeBatch([8192], [1, 2], AcceptanceProfile.constant(HIGH))
    assert e.value.field == "counts"


def test_merged_classes_keep_expected_tokens_exact(curve):
    rng = np.random.default_rng(0)
    prof = AcceptanceProfile.from_table(rng.uniform(0.2, 0.95, (40, D)))
    batch = DecodeBatch.from_requests(rng.choice([8192, 30000], 40), prof)
    merged, class_of = merge_classes(curve, batch, 6)
    assert merged.n_classes <= 6 and merged.n_requests == batch.n_requests == 40
    assert set(curve.bucket_of(merged.contexts)) == set(curve.bucket_of(batch.contexts))
    r = schedule_verify(curve, batch, max_classes=6)
    assert r.batch.n_classes == merged.n_classes and np.array_equal(r.class_of, class_of)
    # the merged plan priced on the original requests: same step, same expected tokens (exact mixture)
    orig = price_verify(curve, batch, r.k[r.class_of])
    assert orig.step_time == pytest.approx(r.step_time, rel=1e-12)
    assert orig.emitted_per_step == pytest.approx(r.emitted_per_step, rel=1e-12)
    # sharing k inside a merged class costs little against one k per original class
    assert r.throughput >= 0.97 * schedule_verify(curve, batch).throughput


def test_example_runs(capsys):
    import runpy
    from pathlib import Path

    ex = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "dspark_decode.py"))
    table = ex["main"](batches=(1, 64))
    out = capsys.readouterr().out
    assert "tok/s/user" in out and len(table) == 4
    for n, name, off, on in table:
        assert on.k[0] >= 1 and on.tokens_per_s_per_user[0] > 0 and off.expected_emitted[0] == 1
