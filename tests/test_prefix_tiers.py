"""Prefix hits name their tier (HBM / host / disk) and chunked prefill never re-copies its own chunks."""
from __future__ import annotations

import numpy as np
import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import COMPONENTS
from graphsim.driver.ledger import chunk_prefill

C2C, DISK = COMPONENTS.index("bytes_c2c"), COMPONENTS.index("bytes_disk")


def _copies(c, wl=None):
    s = c.schedule(wl)
    idx = [i for i, op in enumerate(c.graph.ops) if op.stream == "host_copy"]
    return s, idx


def test_request_syntax_names_the_tier():
    assert gs.Request.parse("prefill:2048@1024").tier == "host"  # the default, as before
    assert gs.Request.parse("prefill:2048@1024:hbm").tier == "hbm"
    r = gs.Request.parse("prefill:2048@1024:disk/noswa")
    assert (r.tier, r.swa_cached, r.cached) == ("disk", False, 1024)
    assert gs.Request.parse(str(r)) == r
    with pytest.raises(GraphsimError, match="request.tier"):
        gs.Request.parse("prefill:2048@1024:tape")


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v4.1-flash", "llama-3.1-70b"])
def test_tiers_copy_over_their_links(model):
    """host: C2C/PCIe bytes; disk: the same bytes from NVMe and then over the host link; hbm: nothing. DeepSeek-V3
    host bytes = cached tokens x 61 layers x 576 x 2 B (V41_FACTS §13 latent, BF16)."""
    got = {}
    for tier in ("hbm", "host", "disk"):
        c = gs.compile_plan(model, gs.Plan([f"prefill:12000@10000:{tier}"]), "h200")
        s, idx = _copies(c)
        got[tier] = (s.components[0][idx, C2C].sum(), s.components[0][idx, DISK].sum(), s.duration[0][idx].sum())
    assert got["hbm"] == (0.0, 0.0, 0.0)
    assert got["host"][1] == 0.0 and got["host"][0] > 0
    assert got["disk"][0] == got["disk"][1] == got["host"][0]
    h200 = gs.load_hw("h200")
    assert got["disk"][2] == pytest.approx(got["host"][0] / h200.disk_bw)  # NVMe is the slower link
    if model == "deepseek-v3":
        assert got["host"][0] == 10000 * 61 * 576 * 2


def test_only_each_layers_first_reader_waits_for_its_copy():
    c = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:40000@32000"]), "h200")
    s = c.schedule()
    g = c.graph
    first = g.op_index["layers.0.wkv_b"]
    assert s.start[0, first] == pytest.approx(s.finish[0, g.op_index["layers.0.restore"]])
    last_copy = s.finish[0, g.op_index["layers.60.restore"]]
    assert s.start[0, first] < last_copy  # layer 0 does not wait for layer 60's copy
    assert s.start[0, g.op_index["layers.60.wkv_b"]] >= last_copy


def test_v41_compressor_pool_waits_for_the_restored_partial_group():
    """A pooled compressor continues the partial group a prefix hit restores (its pending rows are part of the copy,
    the prefix_restore rule), so on every pooled KV owner the layer's restore is an ancestor of its
    ``compressor.pool`` — found missing by executing the graph (tests/test_exec_v41.py)."""
    c = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["prefill:4096@1027"]), "gb200")
    g = c.graph
    pools = [op.name for op in g.ops if op.name.endswith(".compressor.pool")]
    assert pools  # the CSA owners pool (V41_FACTS: m = 4 / 128)
    preds = {}
    for e in g.edges:
        preds.setdefault(e.dst, set()).add(e.src)
    for name in pools:
        layer = name.split(".")[1]
        assert f"layers.{layer}.restore" in preds.get(name, set()), name
    s = c.schedule()
    for name in pools:
        layer = name.split(".")[1]
        assert s.start[0, g.op_index[name]] >= s.finish[0, g.op_index[f"layers.{layer}.restore"]] - 1e-15


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v4.1-flash"])
def test_chunked_prefill_never_copies_its_own_chunks(model):
    """A 32K prompt in 4,096-token chunks on H200 (issue acceptance): no step copies anything."""
    steps = chunk_prefill(gs.Request.parse("prefill:32768"), 4096)
    assert len(steps) == 8 and all(r.tier == "hbm" for r in steps[1:])
    for r in steps:
        c = gs.compile_plan(model, gs.Plan([r]), "h200")
        s, idx = _copies(c)
        assert s.duration[0][idx].sum() == 0.0, str(r)
    # a host prefix hit is copied once, by the first chunk
    steps = chunk_prefill(gs.Request.parse("prefill:32768@8192"), 4096)
    moved = []
    for r in steps:
        s, idx = _copies(gs.compile_plan(model, gs.Plan([r]), "h200"))
        moved.append(s.components[0][idx, C2C].sum())
    assert moved[0] > 0 and not any(moved[1:])


def test_chunked_estimate_on_the_cli_spends_no_copy_time(capsys):
    import json

    from graphsim.cli import main

    assert main(["estimate", "--model", "deepseek-v4.1-flash", "--hw", "h200", "--chunk", "4096", "--view", "sol",
                 "--request", "prefill:32768", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["steps"]) == 8
    assert all(s["busy_s"] == 0.0 for step in out["steps"] for s in step["stages"] if s["stage"] == "restore")


def test_sweep_tier_codes_are_checked():
    wl = gs.Workload(("prefill",), [[1]], [[10]], [[5]], tier=[[2]])
    assert wl.tier[0, 0] == 2
    with pytest.raises(GraphsimError, match="workload.tier"):
        gs.Workload(("prefill",), [[1]], [[10]], [[5]], tier=[[3]])
    assert np.all(gs.Workload(("decode",), [[1]], [[1]], [[5]]).tier == 1)
