"""MTP-K on every family that ships an MTP module (DeepSeek-V3/R1, V3.1/V3.2 and their NVFP4 re-quantizations,
GLM-5 — the DeepSeek-V3 class with and without DeepSeek Sparse Attention): each draft depth is its own pass
of the module, so it owns its latent cache, its DSA index-key cache and its Top-K selection (issue 24 item
6: V3.2 with MTP-2/3 failed with "tensors written by two ops: mtp.index_k, mtp.attn.topk"). Families
without an MTP drafter in graphsim refuse ``policies.mtp`` with a one-line error. Test data:
graphsim/configs/hf (the bundled public HF configs, see its NOTICE.md)."""
from __future__ import annotations

from pathlib import Path

import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.models import load_model

DATA = Path(__file__).resolve().parents[1] / "graphsim" / "configs" / "hf"
ACC = (0.8, 0.6, 0.4)
#: every checkpoint in the test data with num_nextn_predict_layers >= 1 that graphsim drafts with
MTP_CONFIGS = ["deepseek-ai--DeepSeek-V3", "deepseek-ai--DeepSeek-R1", "deepseek-ai--DeepSeek-V3.2",
               "nvidia--DeepSeek-V3.1-NVFP4", "nvidia--DeepSeek-V3.2-NVFP4", "zai-org--GLM-5",
               "zai-org--GLM-5-FP8", "nvidia--GLM-5-NVFP4"]


def _model(name: str):
    return load_model(str(DATA / f"{name}_config.json"))


def _mtp_plan(k: int, tp: int = 8) -> gs.Plan:
    # the CLI's --mtp K: each decode step verifies 1 + K positions
    return gs.Plan([gs.Request("decode", 4096, 8, new=1 + k)], gs.ParallelMapping(tp=tp),
                   gs.Policies(mtp=k, acceptance=ACC[:k]))


@pytest.mark.parametrize("name", MTP_CONFIGS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_each_mtp_depth_owns_its_caches_and_selection(name, k):
    m = _model(name)
    g = gs.compile_plan(m, _mtp_plan(k), "gb200").graph
    writers: dict[str, list[str]] = {}
    for op in g.ops:
        for t in op.writes:
            writers.setdefault(t, []).append(op.name)
    assert all(len(w) == 1 for w in writers.values())
    sparse = m.cfg.sparse
    for j in range(k):
        # depth j writes its own latent entries and (DSA) its own index keys and Top-K
        assert writers[f"mtp.kv.{j}"] == [f"mtp.{j}.kv_write"]
        if sparse:
            assert writers[f"mtp.{j}.index_k"] == [f"mtp.{j}.indexer.k_write"]
            assert writers[f"mtp.{j}.attn.topk"] == [f"mtp.{j}.indexer.topk"]
            readers = [op.name for op in g.ops if f"mtp.{j}.index_k" in op.reads]
            assert readers == [f"mtp.{j}.indexer.score"]
        att = [op.name for op in g.ops if f"mtp.kv.{j}" in op.reads]
        assert att == [f"mtp.{j}.attn_decode"]
    assert not any(t.startswith(f"mtp.{k}.") or t == f"mtp.kv.{k}" for t in writers)  # exactly K depths
    # the depths run in sequence: depth j + 1 embeds the token depth j sampled
    order = {op.name: i for i, op in enumerate(g.ops)}
    for j in range(k - 1):
        assert order[f"mtp.{j}.sample"] < order[f"mtp.{j + 1}.embed"]
    # one MTP module resident however deep the drafting: weights do not grow with K
    assert {t.name for t in g.weights() if t.group == "mtp"} == {t.name for t in m.weights() if t.group == "mtp"}


@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v4.1-flash", "moonshotai--Kimi-K2-Instruct"])
def test_families_without_an_mtp_drafter_refuse_it(name):
    m = load_model(name) if name.startswith("deepseek-v4") else _model(name)
    with pytest.raises(GraphsimError, match="policies.mtp"):
        gs.compile_plan(m, _mtp_plan(1, tp=4), "gb200")


def test_search_keeps_every_mtp_depth_of_v32():
    """`graphsim search --acceptance a1,a2,a3` on DeepSeek-V3.2 prices MTP-1..3: rows at every depth, no program
    skipped (before the fix, every MTP-2/3 program failed to build and the search dropped it)."""
    from graphsim.serving.search import SLA, Space, Traffic, search

    res = search(str(DATA / "deepseek-ai--DeepSeek-V3.2_config.json"), "gb200", gpus=8,
                 traffic=Traffic.of(4000, 1000), sla=SLA(2000, 30),
                 space=Space(tp=(1,), ep=(8,), batches=(8, 64), modes=("agg",), acceptance=ACC, refine=1))
    assert not res.skipped
    assert {"mtp=1", "mtp=2", "mtp=3"} <= set(res.table["policies"])


def test_search_mtp_flag_names_the_acceptances_it_needs(capsys):
    """`graphsim search --mtp K` (as estimate's) takes K per-position acceptances: a count that differs is a one-line
    error naming --acceptance, before any program is built."""
    from graphsim.cli import main

    args = ["search", "--model", str(DATA / "deepseek-ai--DeepSeek-V3.2_config.json"), "--hw", "gb200", "--gpus",
            "8", "--isl", "2000", "--osl", "500", "--mtp", "3", "--acceptance", "0.8"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphsim: error: acceptance:") and "got 1" in err[0]
