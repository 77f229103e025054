"""Each mapping's collectives, byte for byte (the README's table): attention TP and MoE EP on the same GPUs move
the data once; sequence parallelism; Engram row sharding; the candidate pool's dependency edge.

Per-rank link bytes of an n-rank collective on payload S inside one NVLink domain (passes/sharding.py):
ring all-reduce 2(n-1)/n·S, reduce-scatter / all-gather (n-1)/n·S, all-to-all with per-rank dedup
(n-1)(1-(1-1/n)^k)/k·S for a k-expert dispatch (DeepEP sends a token once to each rank holding its experts)."""
from __future__ import annotations

import pytest

import graphsim as gs
from graphsim.core.ir import COMPONENTS

NV = COMPONENTS.index("bytes_nvlink")
H3, K3 = 7168, 8  # DeepSeek-V3 hidden, top-k (V41_FACTS §13)
H41, K41, N41 = 5120, 6, 4  # DeepSeek-V4.1 hidden, top-k, mHC streams (V41_FACTS §1)


#: The table counts the data each collective moves: rings and (deduplicated) all-to-alls at the Simple protocol
#: (every wire byte is data). Without this the op runs at its fastest algorithm x protocol at the point, and an
#: LL protocol's flags double its wire bytes (tests/test_algorithms.py holds that choice).
DATA_MOVED = {"all_reduce": "ring/simple", "all_gather": "ring/simple", "reduce_scatter": "ring/simple",
              "all_to_all": "hierarchical/simple"}


def _layer(model, mapping, request="decode:4096x64", layer=5, hw="gb200", **pol):
    """Per collective of one layer: (collective, NVLink bytes per token of the batch) and the compiled plan."""
    pol.setdefault("algorithms", DATA_MOVED)
    c = gs.compile_plan(model, gs.Plan([request], mapping, gs.Policies(**pol)), hw)
    s = c.schedule()
    T = sum(r.count * r.new_tokens for r in c.plan.requests)
    rows = [(op.info.collective, s.components[0, i, NV] / T, op.name) for i, op in enumerate(c.graph.ops)
            if op.layer == layer and op.kind == "collective" and s.components[0, i, NV] > 0]
    return rows, c


def _ring_ar(n, s):
    return 2 * (n - 1) / n * s


def _half(n, s):  # reduce-scatter or all-gather
    return (n - 1) / n * s


def _a2a(n, k, s):
    return (n - 1) * (1 - (1 - 1 / n) ** k) / k * s


def _v3_layouts(tp, dp, ep):
    """DeepSeek-V3 MoE layer, bytes per batch token on one rank: the two ways the data can move once."""
    dp_tokens = 1 / dp  # a TP group holds 1/dp of the batch
    out = 2 * H3 * dp_tokens  # BF16 layer output of the TP group's tokens
    owner = 1 / (tp * dp)  # tokens a rank owns once they are scattered / sent from
    scatter = (_half(tp, out) + _a2a(ep, K3, owner * K3 * H3 * 1.0) + _a2a(ep, K3, owner * K3 * H3 * 2.0)
               + _half(tp, out))
    replicated = 2 * _ring_ar(tp, out) if dp == 1 else float("inf")
    return scatter, replicated


@pytest.mark.parametrize("tp,dp,ep", [(4, 1, 4), (8, 1, 8), (2, 2, 4), (2, 4, 8)])
def test_v3_tp_and_ep_on_the_same_gpus_move_the_data_once(tp, dp, ep):
    rows, c = _layer("deepseek-v3", gs.ParallelMapping(tp=tp, dp=dp, ep=ep))
    scatter, replicated = _v3_layouts(tp, dp, ep)
    kinds = [r[0] for r in rows]
    # never two full all-reduces plus two all-to-alls for one layer's data
    assert not (kinds.count("all_reduce") >= 2 and kinds.count("all_to_all") >= 2), rows
    assert sum(r[1] for r in rows) == pytest.approx(min(scatter, replicated), rel=1e-12)
    want = "scatter" if scatter < replicated else "replicated"
    assert c.graph.meta.moe_layout == (want,)
    if want == "scatter":  # reduce-scatter into dispatch, combine into all-gather
        assert kinds == ["reduce_scatter", "all_to_all", "all_to_all", "all_gather"]
    else:
        assert kinds == ["all_reduce", "all_reduce"]


def test_v41_tp4_ep4_keeps_tokens_replicated():
    """V4.1's residual state is 4 mHC streams: gathering it back (4·5120·2 B) costs more than a second
    all-reduce, so the experts run on the replicated tokens and their partial sums ride the shared expert's
    all-reduce: two all-reduces of the 5120-wide BF16 output, no all-to-all."""
    rows, c = _layer("deepseek-v4.1-flash", gs.ParallelMapping(tp=4, ep=4))
    assert [r[0] for r in rows] == ["all_reduce", "all_reduce"]
    assert sum(r[1] for r in rows) == pytest.approx(2 * _ring_ar(4, 2 * H41))
    scatter = (_half(4, 2 * H41) + _a2a(4, K41, H41 * (1 + 1 / 32) * K41 / 4) + _a2a(4, K41, 2 * H41 * K41 / 4)
               + _half(4, 2 * H41 * N41))  # RS of the output, FP8 dispatch + BF16 combine, AG of 4 streams
    assert sum(r[1] for r in rows) < scatter
    assert c.graph.meta.moe_layout == ("replicated",)


def test_scattered_block_runs_on_the_owner_tokens():
    """TP8 + EP8 on one node: after the reduce-scatter each rank norms and routes 1/8 of the tokens and runs
    the shared expert on them with its weights whole (3·7168·2048 FP8 + 128x128 block scales per rank)."""
    m = gs.ParallelMapping(tp=8, ep=8)
    c = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], m), "gb200")
    s = c.schedule()
    g = c.graph
    norm = s.components[0, g.op_index["layers.5.mlp_norm"], COMPONENTS.index("bytes_act")]
    assert norm == pytest.approx(64 / 8 * H3 * (2 + 2))  # bf16 in, bf16 out, 1/8 of the 64 tokens
    up = s.components[0, g.op_index["layers.5.moe.shared.gate_up"], COMPONENTS.index("bytes_weight")]
    assert up == pytest.approx(2 * H3 * 2048 * (1 + 4 / (128 * 128)))
    attn = s.components[0, g.op_index["layers.5.attn_norm"], COMPONENTS.index("bytes_act")]
    assert attn == pytest.approx(64 * H3 * 4)  # the attention side keeps every token replicated
    # memory per device holds the shared experts whole too, the attention weights split 8 ways
    from graphsim.driver.memory import _reference_splits

    div = _reference_splits(c.model, m, c.plan.policies, c.hw)
    assert div["layers.5.moe.shared.gate_up"] == 1.0 and div["layers.5.attn.wq_b"] == 8.0
    assert div["layers.5.moe.experts"] == 8.0


def test_attention_dp_with_ep_only_all_to_alls():
    rows, _ = _layer("deepseek-v3", gs.ParallelMapping(dp=8, ep=8))
    assert [r[0] for r in rows] == ["all_to_all", "all_to_all"]
    assert rows[0][1] == pytest.approx(_a2a(8, K3, K3 * H3 * 1.0 / 8))


def test_sequence_parallel_llama():
    """Llama-3.1-70B TP8 with --sp: each row-parallel all-reduce becomes a reduce-scatter, the norm after it
    runs on 1/8 of the tokens, and an all-gather of its output (8192 BF16) feeds the next GEMM: per layer
    2·(RS + AG) = 2 x all-reduce bytes, with the norms' traffic divided by 8."""
    off, c0 = _layer("llama-3.1-70b", gs.ParallelMapping(tp=8))
    on, c1 = _layer("llama-3.1-70b", gs.ParallelMapping(tp=8), sp="on")
    s = 2 * 8192
    assert [r[0] for r in off] == ["all_reduce", "all_reduce"]
    assert sorted(r[0] for r in on) == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    assert all(r[1] == pytest.approx(_half(8, s)) for r in on)
    assert sum(r[1] for r in on) == pytest.approx(sum(r[1] for r in off))
    k = COMPONENTS.index("bytes_act")
    n0 = c0.schedule().components[0, c0.graph.op_index["layers.5.mlp_norm"], k]
    n1 = c1.schedule().components[0, c1.graph.op_index["layers.5.mlp_norm"], k]
    assert n1 == pytest.approx(n0 / 8)
    assert c1.schedule().forward[0] <= c0.schedule().forward[0]
    assert gs.Policies().sp == "off"  # an option: the default is unchanged


def test_sequence_parallel_v41_gathers_the_fp8_norm_output():
    """V4.1 TP4 --sp: the mHC residual/pre-ops after wo_b run on 1/4 of the tokens; the gather before the
    router is the FP8 pre-norm output, 5120 B per token."""
    rows, _ = _layer("deepseek-v4.1-flash", gs.ParallelMapping(tp=4), sp="on")
    gathers = {r[2].split("layers.5.")[1]: r[1] for r in rows if r[0] == "all_gather"}
    assert gathers["ffn.router.all_gather"] == pytest.approx(_half(4, H41 * 1.0))
    assert gathers["attn.wq_a.all_gather"] == pytest.approx(_half(4, H41 * 1.0))


def test_engram_rows_shard_over_every_rank():
    """--engram-shard world: each of the 8 ranks holds 1/8 of the tables (TP2 x EP4 instead of TP2 alone);
    a lookup fetches its 24 rows (6,336 B, V41_FACTS §6) from their owners and the TP pair gathers them."""
    m = gs.ParallelMapping(tp=2, dp=4, ep=8)
    base = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:4096x64"], m), "gb200")
    world = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:4096x64"], m, gs.Policies(engram_shard="world")),
                            "gb200")
    tables = 202_758_032_400  # V41_FACTS §6 resident Engram tables
    assert base.report().memory["engram_tables_gib"] == pytest.approx(tables / 2 / 2**30, rel=1e-6)
    assert world.report().memory["engram_tables_gib"] == pytest.approx(tables / 8 / 2**30, rel=1e-6)
    rows, _ = _layer("deepseek-v4.1-flash", m, layer=1, engram_shard="world")
    kinds = {r[2].split("layers.1.")[1]: r[1] for r in rows}
    assert kinds["engram.lookup.all_to_all.0"] == pytest.approx((8 - 1) / 8 * 6336 / 8)
    assert kinds["engram.lookup.all_gather.1"] == pytest.approx(_half(2, 6336 / 4))


def test_engram_projection_column_split():
    m = gs.ParallelMapping(tp=4)
    k = COMPONENTS.index("bytes_weight")
    rep = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:4096x8"], m), "gb200")
    col = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:4096x8"], m, gs.Policies(engram_proj="tp")), "gb200")
    w = lambda c: c.schedule().components[0, c.graph.op_index["layers.1.engram.proj"], k]
    assert w(col) == pytest.approx(w(rep) / 4)
    rows, _ = _layer("deepseek-v4.1-flash", m, request="decode:4096x8", layer=1, engram_proj="tp")
    assert {r[2].split("layers.1.")[1]: r[1] for r in rows}["engram.proj.all_gather"] == pytest.approx(
        _half(4, 25600 * 2))


def test_candidate_pool_has_its_dependency_edge():
    """V41_FACTS §3: the Decoder Reindex layers score the candidate pool layer 20 selected."""
    g = gs.load_model("deepseek-v4.1-flash").build(("decode",))
    cand = {(e.src, e.dst) for e in g.edges if e.kind == "candidates"}
    assert cand == {("layers.20.indexer.candidates", f"layers.{L}.indexer.score") for L in (24, 28, 32, 36)}
    assert "layers.20.candidates" in g.op("layers.28.indexer.score").reads
