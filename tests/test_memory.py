"""Memory per device: one definition for the report, the sweep metrics and fit (graphsim/driver/memory.py)."""
import pytest

import graphsim as gs
from graphsim.serving.fit import MemoryModel
from graphsim.driver.memory import kv_layer_bytes, kv_per_device

M = gs.load_model("deepseek-v4.1-flash")
MiB = 2**20


@pytest.mark.parametrize("n", [1, 127, 128, 999, 131072, 1048576])
def test_per_layer_kv_sums_to_the_capacity(n):
    # V41_FACTS §8: C(N) per owner + SWA on every layer (+ DSpark's 3 SWA blocks when it runs)
    assert sum(kv_layer_bytes(M, n).values()) == M.kv_capacity(n).total
    assert sum(kv_layer_bytes(M, n, gs.Policies(dspark="on")).values()) == M.kv_capacity(n, dspark=True).total


def test_pipeline_stage_holds_its_owners_and_copies_of_what_it_reads():
    # N = 131072, pp = 4 (10 layers per stage): stage 0 owns layers 2 and 8 (m=2: 65,536 entries x 356 B
    # each = 22.25 MiB, + a [2,512] fp32 kv and score buffer each, §12); stage 3 owns nothing but its layers
    # read layer 20's KV (131,072 x 356 B = 44.5 MiB), kept as a copy; every stage holds 10 SWA windows
    n, swa, state = 131072, 10 * 128 * 512 / MiB, 2 * 2 * 2 * 512 * 4 / MiB
    assert kv_per_device(M, n, gs.ParallelMapping(pp=4)) / MiB == pytest.approx(44.5 + state + swa)
    whole = M.kv_capacity(n).total
    assert kv_per_device(M, n, gs.ParallelMapping()) == whole
    assert kv_per_device(M, n, gs.ParallelMapping(pp=4)) > whole / 4  # not an even split of a shared cache


def test_context_parallel_ranks_hold_the_whole_cache():
    # CP all-gathers each layer's new KV: every CP rank keeps the request's whole cache
    assert kv_per_device(M, 65536, gs.ParallelMapping(tp=2, cp=2)) == M.kv_capacity(65536).total


def test_report_and_fit_agree():
    mapping = gs.ParallelMapping(tp=4, pp=2)
    r = gs.compile_plan(M, gs.Plan(["decode:131071x8"], mapping), "gb200").report()
    f = MemoryModel(M, "gb200", mapping).fit(8, 131072)
    assert r.memory["kv_gib"] * 2**30 == pytest.approx(f.kv_bytes)
    assert r.memory["weights_total_gib"] * 2**30 == pytest.approx(sum(f.weights.values()))
