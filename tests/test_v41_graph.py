"""DeepSeek-V4.1-Flash graph: stages, sharing edges, indexer scaling, resident weights (V41_FACTS §2–§8, §12)."""
import json

import pytest

import graphsim as gs
from graphsim.cli import main
from graphsim.core.ir import COMPONENTS


@pytest.fixture(scope="module")
def v41():
    return gs.load_model("deepseek-v4.1-flash")


def test_stages_in_ced_order(v41):
    # V41_FACTS §4: Encoder -> global KV projection -> Decoder (then the head)
    g = v41.build(("prefill",))
    assert g.stages == ("restore", "encoder", "global_kv", "decoder", "head")  # restore: prefix-cache copies
    layers = {op.layer for op in g.ops if op.stage == "global_kv"}
    assert layers == {20}  # the Decoder's KV source (kv_source_layer_ids ∩ decoder)


def test_kv_owner_and_topk_edges(v41):
    # V41_FACTS §2: layer 29 reads KV owned by 20 and Top-K produced by 28; 21–23 reuse 20's Top-K
    g = v41.build(("decode",))
    preds = {(e.src, e.kind) for e in g.edges if e.dst == "layers.29.attn.sparse"}
    assert ("layers.20.indexer.k_write", "cache_read") in preds
    assert ("layers.28.indexer.topk", "topk_reuse") in preds
    for L in (21, 22, 23):
        assert ("layers.20.indexer.topk", "topk_reuse") in {(e.src, e.kind) for e in g.edges if e.dst == f"layers.{L}.attn.sparse"}
    # the shared KV is stored once per owner: only owners write main KV
    writers = sorted(op.layer for op in g.ops if op.name.endswith("kv.quant_write"))
    assert writers == [2, 8, 14, 20]
    # every trunk layer attends (Reuse layers do not reuse the layer output)
    assert sum(1 for op in g.ops if op.name.endswith("attn.sparse")) == 40


def _indexer_pairs(v41, ctx):
    c = gs.compile_plan(v41, gs.Plan([f"decode:{ctx}"]), "gb200")
    s = c.schedule()
    out = {}
    for i, op in enumerate(c.graph.ops):
        if op.name.endswith("indexer.score"):
            # §12: score = Σ_h relu(q_h·k)·w_h over 32 heads x 128 dims -> 2·32·128 + 3·32 flops per entry,
            # at the FP4 rate: index Q/K are MXFP4 (§8)
            out[op.layer] = s.components[0, i, COMPONENTS.index("flops_fp4")] / (2 * 32 * 128 + 3 * 32)
    return out


def test_indexer_work_bounds(v41):
    # V41_FACTS §3: a Decoder Reindex query scores <= 16,384 candidates however long the context;
    # the Decoder's first Full scan and the three Encoder Full scans still grow with context.
    a, b = _indexer_pairs(v41, 100_000), _indexer_pairs(v41, 1_000_000)
    for L in (24, 28, 32, 36):
        assert a[L] == b[L] == 16_384
    assert b[20] == 1_000_001 and a[20] == 100_001  # m=1: every visible position (context + the new token)
    for L in (2, 8, 14):
        assert b[L] == 1_000_001 // 2 and a[L] == 100_001 // 2  # m=2: floor(visible/2)


def test_resident_weights_independent_of_workload(v41):
    # V41_FACTS §10: resident memory never depends on work
    g1 = v41.build(("decode",))
    g2 = v41.build(("prefill", "decode", "prefill"))
    assert g1.weights() == g2.weights()
    r1 = gs.compile_plan(v41, gs.Plan(["decode:1"], gs.ParallelMapping(tp=4)), "gb200").report()
    r2 = gs.compile_plan(v41, gs.Plan(["prefill:1000000"], gs.ParallelMapping(tp=4)), "gb200").report()
    assert r1.memory["weights_gib"] == r2.memory["weights_gib"]


def test_attention_reads_scale_with_selection_not_context(v41):
    # sparse attention: <= 128 SWA + <= min(512, visible/m) entries per query, read per consumer layer
    c = gs.compile_plan(v41, gs.Plan(["decode:1000000"]), "gb200")
    s = c.schedule()
    i = c.graph.op_index["layers.29.attn.sparse"]
    kv = s.components[0, i, COMPONENTS.index("bytes_kv")]
    assert kv == 128 * 512 + 512 * 288  # SWA window (FP8) + 512 selected FP4 entries (V41_FACTS §8)


@pytest.mark.parametrize("req", ["prefill:32768", "decode:8192x16"])
def test_estimate_cli_v41(req, capsys):
    rc = main(["estimate", "--model", "deepseek-v4.1-flash", "--hw", "gb200", "--request", req, "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0
    stages = {s["stage"]: s for s in d["stages"]}
    assert {"encoder", "global_kv", "decoder"} <= set(stages)
    assert all(stages[s]["busy_s"] > 0 for s in ("encoder", "global_kv", "decoder"))


def test_layers_and_memory_cli(capsys):
    assert main(["layers", "deepseek-v4.1-flash", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["path"] for r in d["layers"]].count("reuse") == 30 == d["path_counts"]["reuse"]  # §2: path counts 2 / 4 / 4 / 30
    assert main(["memory", "deepseek-v4.1-flash", "--context", "1048576", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # V41_FACTS §8: 890.00 MiB global + 2.50 MiB SWA = 892.50 MiB at N = 1,048,576
    assert d["kv_capacity"]["global_bytes"] == 890 * 2**20
    assert d["kv_capacity"]["global_bytes"] + d["kv_capacity"]["swa_bytes"] == 892.5 * 2**20
    assert d["kv_capacity"]["total_bytes"] == 892.5 * 2**20 + 3 * 8192  # + the m=2 owners' state buffers
    assert {g["group"]: g["bytes"] for g in d["weights"]["by_group"]}["engram"] > 202_758_032_400  # tables + projections (§6)


def test_v4_baseline_graph_compares():
    # V4-Flash: every compressed layer owns its KV; V4.1's per-token global KV is ~1/4 of it (§5)
    v4 = gs.load_model("deepseek-v4-flash")
    g = v4.build(("decode",))
    assert sum(1 for op in g.ops if op.name.endswith("kv.quant_write")) == 41
    r4 = gs.compile_plan(v4, gs.Plan(["decode:131072"]), "gb200").report()
    r41 = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:131072"]), "gb200").report()
    # §5: "V4.1 global KV ≈ 1/4 of V4 Flash" (the semantics test pins the exact 890 / 3,850.25 = 0.231)
    assert 0.20 < r41.memory["kv_gib"] / r4.memory["kv_gib"] < 0.30


@pytest.mark.parametrize("model,op", [("deepseek-v4.1-flash", "layers.30.attn.sparse"),
                                      ("deepseek-v3", "layers.30.attn_decode")])
def test_single_kv_head_is_read_whole_on_every_tp_rank(model, op):
    # one shared latent (MQA / MLA) is replicated across TP: every rank reads all of it; FLOPs split by heads
    k = COMPONENTS.index
    s = {}
    for tp in (1, 4):
        c = gs.compile_plan(model, gs.Plan(["decode:65536x64"], gs.ParallelMapping(tp=tp)), "gb200")
        s[tp] = c.schedule().components[0, c.graph.op_index[op]]
    assert s[4][k("bytes_kv")] == s[1][k("bytes_kv")]
    assert s[4][k("flops_bf16")] == pytest.approx(s[1][k("flops_bf16")] / 4)
