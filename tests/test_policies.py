"""Execution policies on DeepSeek-V4.1-Flash: the token ledger, decoder/encoder bounded replay, fusion passes
(V41_FACTS §4, §5, §7, §10)."""
import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import COMPONENTS
from graphsim.driver.ledger import ledger
from graphsim.passes.fusion import fuse_mhc
from graphsim.passes.pipeline import PassPipeline

M = gs.load_model("deepseek-v4.1-flash")
P = {name: gs.Policies(decoder_replay=name) for name in ("off", "sglang", "paper")}


@pytest.mark.parametrize("n", [1, 127, 128, 129, 1000, 1001, 131072])
def test_single_prompt_token_layer(n):
    # V41_FACTS §4: sglang 21N + 19·min(N,128); off 40N; paper N·L/2 + W·L/2 = 20N + 20·min(N,128)
    w = min(n, 128)
    assert ledger(M, [f"prefill:{n}"], P["sglang"]).trunk_total() == 21 * n + 19 * w
    assert ledger(M, [f"prefill:{n}"], P["off"]).trunk_total() == 40 * n
    assert ledger(M, [f"prefill:{n}"], P["paper"]).trunk_total() == 20 * n + 20 * w


def test_tails_are_per_request():
    # V41_FACTS §4: [300, 100] -> 21·400 + 19·(128 + 100), never 19·min(400, 128)
    led = ledger(M, ["prefill:300", "prefill:100"], P["sglang"])
    assert led.trunk_total() == 21 * 400 + 19 * (128 + 100)


def test_chunked_prefill_each_chunk_has_its_tail():
    # 1,000 tokens in chunks of 256, 256, 256, 232: every chunk runs layers 0–20 fully and its own
    # 128-token tail on 21–39: 21·1000 + 19·4·128 = 30,728
    led = ledger(M, ["prefill:1000"], P["sglang"], chunk=256)
    assert led.trunk_total() == 30_728
    late = [r for r in led.rows if r.stage == "decoder" and r.layer == 39]
    assert [r.tokens_per_request for r in late] == [128, 128, 128, 128]
    assert sorted({r.step for r in led.rows}) == [0, 1, 2, 3]


@pytest.mark.parametrize("profile", ["off", "sglang", "paper"])
def test_decode_tokens_cross_the_whole_trunk(profile):
    led = ledger(M, ["prefill:5000", "decode:8192x64"], P[profile])
    rows = [r for r in led.rows if r.request == "decode:8192x64" and r.stage in ("encoder", "decoder")]
    assert len(rows) == 40 and all(r.tokens == 64 for r in rows)


def test_replay_changes_work_not_weights_or_kv():
    reports = {p: gs.compile_plan(M, gs.Plan(["prefill:8192"], gs.ParallelMapping(tp=4), P[p]), "gb200").report()
               for p in ("off", "sglang")}
    assert reports["off"].memory["weights_gib"] == reports["sglang"].memory["weights_gib"]
    assert reports["off"].memory["kv_gib"] == reports["sglang"].memory["kv_gib"]
    assert reports["sglang"].forward_s < reports["off"].forward_s
    g_off = gs.compile_plan(M, gs.Plan(["prefill:8192"], policies=P["off"]), "gb200").graph
    g_on = gs.compile_plan(M, gs.Plan(["prefill:8192"], policies=P["sglang"]), "gb200").graph
    assert g_off.weights() == g_on.weights()


def _op_tokens(compiled, name, component="bytes_kv", per=1.0):
    s = compiled.schedule()
    i = compiled.graph.op_index[name]
    return s.components[0, i, COMPONENTS.index(component)] / per


def _restored(compiled, component="bytes_c2c"):
    """Bytes the prefix restore copies, summed over its per-layer copies."""
    s = compiled.schedule()
    return sum(s.components[0, i, COMPONENTS.index(component)] for i, op in enumerate(compiled.graph.ops)
               if op.name.endswith(".restore"))


def test_restore_replays_swa_only():
    # V41_FACTS §5: prefix 10,000 cached without SWA + suffix 500: the last 128 cached tokens are replayed,
    # they write SWA KV only; global KV is written for the 500 new positions alone
    c = gs.compile_plan(M, gs.Plan(["prefill:10500@10000/noswa"]), "gb200")
    assert _op_tokens(c, "layers.0.attn.swa_write", per=512) == 128 + 500
    assert _op_tokens(c, "layers.2.kv.quant_write", per=288) == 10500 // 2 - 10000 // 2  # entries of new groups
    assert _op_tokens(c, "layers.20.kv.quant_write", per=288) == 500
    # layer 20's input pre-mix covers the replayed positions its queries need too (prenorm: d·(2+1) B/token)
    assert _op_tokens(c, "layers.20.hc_attn.prenorm", "bytes_act", per=5120 * 3) == 128 + 500
    led = ledger(M, ["prefill:10500@10000/noswa"])
    assert {r.tokens_per_request for r in led.rows if r.stage == "global_kv"} == {500}
    # with the SWA cache present nothing is replayed
    c2 = gs.compile_plan(M, gs.Plan(["prefill:10500@10000"]), "gb200")
    assert _op_tokens(c2, "layers.0.attn.swa_write", per=512) == 500
    # with encoder replay off, a hit without SWA is recomputed from scratch
    c3 = gs.compile_plan(M, gs.Plan(["prefill:10500@10000/noswa"], policies=gs.Policies(encoder_replay="off")), "gb200")
    assert _op_tokens(c3, "layers.0.attn.swa_write", per=512) == 10500
    # the restore copies the cached global KV (+ the kept SWA window) over C2C, one copy per layer
    r_swa = _restored(c2)
    r_noswa = _restored(c)
    assert r_swa - r_noswa == 40 * 128 * 512  # §8: 40 layers x min(N,128) x 512 B SWA, restored only when kept
    assert r_noswa == (3 * (10000 // 2) + 10000) * (288 + 68)  # §8: C(N) = 3·⌊N/2⌋ + N entries x (288 + 68) B
    # an odd cached length leaves one pending position per m=2 owner: its compressor state rows are restored
    c4 = gs.compile_plan(M, gs.Plan(["prefill:10500@9999/noswa"]), "gb200")
    r_odd = _restored(c4)
    # §12: partial-group state [2, 512] fp32 per pending position of each of the 3 m=2 owners
    assert r_odd == (3 * (9999 // 2) + 9999) * (288 + 68) + 3 * 1 * 2 * 512 * 4


def test_mhc_fusion_traffic():
    # V41_FACTS §7 (n=4, d=5120): (4n+4)d = 102,400; (3n+2)d = 71,680; (2n+2)d = 51,200 elements per token
    # at an interior sub-block boundary (layer 5 attention residual -> layer 5 FFN pre-ops)
    g0 = M.build(("prefill",))
    elems = {}
    for prof in ("unfused", "two-pass", "single-pass"):
        g = PassPipeline([("fuse", fuse_mhc(prof, n=4, d=5120))]).run(g0)
        elems[prof] = sum(op.info.mhc_elems for op in g.ops
                          if op.name.startswith("layers.5.hc_attn.res")
                          or (op.name.startswith("layers.5.hc_ffn.") and op.info.role != "residual"))
    assert elems == {"unfused": 102_400, "two-pass": 71_680, "single-pass": 51_200}


def test_mhc_fusion_drops_bytes_by_exactly_the_difference():
    wl = gs.Plan(["prefill:4096"]).workload()
    from graphsim.lowering.evaluate import evaluate_reference, unit_time
    from graphsim.lowering.program import lower

    ut = unit_time(gs.load_hw("gb200").rates())
    totals, mhc_bytes = {}, {}
    for prof in ("unfused", "two-pass", "single-pass"):
        g = PassPipeline([("fuse", fuse_mhc(prof, n=4, d=5120))]).run(M.build(("prefill",)))
        s = evaluate_reference(lower(g), wl, ut)
        act = s.components[0, :, COMPONENTS.index("bytes_act")]
        totals[prof] = act.sum()
        mhc_bytes[prof] = sum(act[i] for i, op in enumerate(g.ops) if op.kind == "mhc")
        other = act.sum() - mhc_bytes[prof]
        totals[prof + "/other"] = other
    # no other op changes: all of the drop is mHC traffic (nothing charged twice)
    assert totals["unfused/other"] == totals["two-pass/other"] == totals["single-pass/other"]
    assert totals["unfused"] - totals["single-pass"] == mhc_bytes["unfused"] - mhc_bytes["single-pass"] > 0
    # interior boundaries: 2 B per element saved (streams bf16; the FP8 normalized output is written once in all)
    per_tok = (mhc_bytes["unfused"] - mhc_bytes["single-pass"]) / 4096
    assert per_tok > 2 * (102_400 - 51_200) * 70  # ~80 boundaries, a few at stage edges fuse partially


def test_pipeline_names_the_pass_that_breaks_an_invariant():
    import attrs

    g = M.build(("decode",))

    def shrink_weights(graph, ctx):
        return graph.evolve(tensors=tuple(attrs.evolve(t, elems=t.elems // 2) if t.resident else t for t in graph.tensors))

    with pytest.raises(GraphsimError, match=r"pass\[shrink\].*resident weights changed"):
        PassPipeline([("shrink", shrink_weights)]).run(g)

    def double_write(graph, ctx):
        ops = list(graph.ops)
        i = graph.op_index["layers.3.attn.swa_write"]
        ops[i + 1] = attrs.evolve(ops[i + 1], writes=ops[i].writes)
        return graph.evolve(ops=tuple(ops))

    with pytest.raises(GraphsimError, match=r"pass\[dup\].*written by two ops"):
        PassPipeline([("dup", double_write)]).run(g)


def test_policy_identity_recorded():
    pol = gs.Policies(decoder_replay="sglang", fusion="single-pass")
    r = gs.compile_plan(M, gs.Plan(["prefill:2048", "decode:4096x8"], policies=pol), "gb200").report()
    assert r.identity["policies"]["decoder_replay"] == "sglang"
    assert r.identity["policies"]["fusion"] == "single-pass"
    assert r.tokens["ttft_s"] == r.forward_s and r.tokens["itl_s"] == r.forward_s
    assert r.tokens["output_tokens_per_s_per_gpu"] == pytest.approx(8 / r.forward_s)


def test_decoder_replay_tail_swa_history_starts_at_the_tail():
    # V41_FACTS §4: the tail's SWA history is truncated at the replay start: a 1,000-token prompt's layer-30
    # tail (128 queries) sees 1..128 SWA slots (8,256 pairs) and reads the 128 entries it wrote, not 255
    c = gs.compile_plan(M, gs.Plan(["prefill:1000"], policies=P["sglang"]), "gb200")
    s = c.schedule()
    i = c.graph.op_index["layers.30.attn.sparse"]
    flops = s.components[0, i, COMPONENTS.index("flops_bf16")]
    per_pair = 2 * 64 * 2 * 512  # §12: QK and PV over the 512-d shared latent, 64 heads
    topk = sum(min(512, v) for v in range(1000 - 127, 1001))  # selected entries (m = 1) of the tail queries
    assert flops == per_pair * (128 * 129 // 2 + topk)
    kv = s.components[0, i, COMPONENTS.index("bytes_kv")]
    assert kv == 128 * 512 + min(topk, 1000) * 288


def test_ledger_counts_every_request_kind_when_a_layer_has_one_path_per_kind():
    """DeepSeek-V3's MLA runs an up-projected attention for prefill and an absorbed one for decode: a mixed
    batch's ledger has both (it used to drop the decode rows). Closed form: tokens x 61 layers."""
    from graphsim.driver.ledger import ledger

    led = ledger("deepseek-v3", ["prefill:512", "decode:1024x2"])
    assert led.trunk_total("prefill:512") == 512 * 61
    assert led.trunk_total("decode:1024x2") == 2 * 61
