"""Issue 25 item 3 (memory part): an engine's documented memory rule and KV paging decide which batches a
prediction fits (graphsim.serving); the SOL bound keeps every byte."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import graphsim as gs
from graphsim.serving.fit import MemoryModel
from graphsim.serving.search import SLA, Space, Traffic, search
from graphsim.serving import ENGINES, engine_terms

GiB = 2 ** 30
FIX = str(Path(__file__).resolve().parents[1] / "tests" / "data" / "measured")


def test_pages_and_memory_rules_in_closed_form():
    v, t, s = ENGINES["vllm"], ENGINES["trtllm"], ENGINES["sglang"]
    assert (v.paged(1), v.paged(16), v.paged(17), t.paged(4000), s.paged(4001)) == (16, 16, 32, 4000, 4001)
    cap, res, fixed, kv = 192.0, 2.0, 100.0, 50.0
    # vLLM CacheConfig.gpu_memory_utilization default 0.92 x HBM (docs.vllm.ai, vllm/config/cache.py)
    assert v.room(cap, res, fixed, kv) == pytest.approx(0.92 * 192 - 150)
    # TensorRT-LLM KvCacheConfig.free_gpu_memory_fraction default 0.9 of what weights and activations leave
    assert t.room(cap, res, fixed, kv) == pytest.approx(0.9 * (190 - 100) - 50)
    assert s.room(cap, res, fixed, kv) == pytest.approx(190 - 150)  # no fixed documented fraction
    with pytest.raises(gs.GraphsimError, match="engine: unknown engine 'tgi'"):
        engine_terms("tgi")
    assert engine_terms("none") is None


def test_memory_model_headroom_under_an_engine():
    m = gs.ParallelMapping(tp=8)
    base = MemoryModel("deepseek-v3", "gb200", m, kind="decode")
    eng = MemoryModel("deepseek-v3", "gb200", m, kind="decode", engine=ENGINES["vllm"])
    b, ctx, ws = np.array([64.0]), 4001, np.array([1.0 * GiB])
    w = sum(base.weights.values())
    kv = base.kv_per_request(4016)  # 4001 positions in 16-token blocks
    assert eng.kv_per_request(ctx) == pytest.approx(kv)
    cap = base.hw.hbm_capacity_bytes
    want = min(cap - base.reserve, 0.92 * cap) - w - ws - 64 * kv  # vLLM's gpu_memory_utilization rule
    np.testing.assert_allclose(eng.headroom(b, ctx, ws), want, rtol=1e-12)
    assert eng.headroom(b, ctx, ws)[0] < base.headroom(b, ctx, ws)[0]


SPACE = Space(tp=(4,), ep=(4,), batches=(8, 64), prefill_batches=(1,), modes=("agg",), refine=0)
ARGS = dict(gpus=8, traffic=Traffic.of(4000, 1000), sla=SLA(2000, 30), space=SPACE)


def test_search_takes_the_engine_of_the_tables_and_none_at_sol():
    pred = search("deepseek-v3", "gb200", view=gs.ViewSpec("hybrid", FIX, "trtllm@1.3.0rc20"), **ARGS)
    assert pred.space["engine"] == "trtllm" and pred.space["engine_terms"]["kv_block_tokens"] == 32
    sol = search("deepseek-v3", "gb200", **ARGS)
    assert sol.space["engine"] == "none" and sol.space["engine_terms"] is None
    forced = search("deepseek-v3", "gb200", engine="vllm", **ARGS)
    key = ["mapping", "decode_batch", "ttft_step"]
    a = sol.table.set_index(key)["memory_headroom_gib"]
    b = forced.table.set_index(key)["memory_headroom_gib"]
    common = a.index.intersection(b.index)
    assert len(common) and (b.loc[common] < a.loc[common]).all()  # the engine holds back what it documents
