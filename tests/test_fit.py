"""Memory per device and fit: the parts add up, Engram in HBM vs on host, largest batch and context are the
exact edges, and ``graphsim fit`` prints the comparison."""
import json

import pytest

import graphsim as gs
from graphsim.cli import main
from graphsim.serving.fit import DEFAULT_RESERVE_GIB, MemoryModel, fit

GiB = 2.0**30
TABLES = 202_758_032_400  # V41_FACTS §6: (384,006,168 + 384,016,682) x 256 x (1 + 1/32) B


@pytest.fixture(scope="module")
def v41_tp4():
    return {mode: MemoryModel("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(tp=4), gs.Policies(engram=mode))
            for mode in ("hbm", "host")}


def test_engram_hbm_vs_host(v41_tp4):
    hbm, host = (v41_tp4[m].fit(1, 131072) for m in ("hbm", "host"))
    assert hbm.tables_bytes == pytest.approx(TABLES / 4)  # rows sharded over tp=4
    assert hbm.total_bytes - host.total_bytes == pytest.approx(TABLES / 4)
    assert host.host_bytes == pytest.approx(TABLES / 4) and hbm.host_bytes == 0
    assert hbm.weights["engram"] - host.weights["engram"] == pytest.approx(TABLES / 4)  # projections stay in HBM
    assert "dspark" not in hbm.weights  # DSpark off: its weights are not loaded
    assert hbm.fits and host.fits
    assert hbm.reserve_bytes == DEFAULT_RESERVE_GIB * GiB
    m = gs.load_model("deepseek-v4.1-flash")
    assert hbm.kv_bytes == pytest.approx(m.kv_bytes(131072))  # MQA latent replicated across TP


def test_largest_batch_and_context_are_exact_edges(v41_tp4):
    for mm in v41_tp4.values():
        b = mm.max_batch(131072)
        assert b > 0 and mm.fit(b, 131072).fits and not mm.fit(b + 1, 131072).fits
    assert v41_tp4["host"].max_batch(131072) > v41_tp4["hbm"].max_batch(131072)
    mm = v41_tp4["hbm"]
    n = mm.max_context(600)
    assert mm.fit(600, n).fits and not mm.fit(600, n + 1).fits
    assert mm.max_context(1) == mm.context_cap == 1_048_576  # one request fits at the model's longest context


def test_tables_alone_do_not_fit_one_gpu():
    r = fit("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(), context=4096, policies=gs.Policies(engram="hbm"))
    assert r.tables_bytes == pytest.approx(TABLES) and TABLES / GiB == pytest.approx(188.83, abs=0.01)
    assert not r.fits and "does NOT fit by" in r.verdict()
    assert r.headroom_bytes == pytest.approx(r.capacity_bytes - r.total_bytes)


def test_kv_divides_over_dp_and_reserve_is_a_parameter():
    m = gs.load_model("deepseek-v3")
    a = fit(m, "h800", gs.ParallelMapping(dp=8, ep=8), context=4096, batch=64)
    b = fit(m, "h800", gs.ParallelMapping(dp=8, ep=8), context=4096, batch=64, reserve_gib=2.0)
    assert a.kv_bytes == pytest.approx(64 * m.kv_bytes(4096) / 8)
    assert b.headroom_bytes - a.headroom_bytes == pytest.approx((DEFAULT_RESERVE_GIB - 2.0) * GiB)
    assert a.workspace_bytes > 0
    with pytest.raises(gs.GraphsimError, match="reserve_gib"):
        fit(m, "h800", gs.ParallelMapping(), context=16, reserve_gib=-1)


def test_pipeline_stage_holds_its_own_layers():
    m = gs.load_model("llama-3.1-70b")
    one = fit(m, "h200", gs.ParallelMapping(tp=8), context=4096)
    two = fit(m, "h200", gs.ParallelMapping(tp=4, pp=2), context=4096)
    w1, w2 = sum(one.weights.values()), sum(two.weights.values())
    assert w2 == pytest.approx(w1, rel=0.03)  # half the layers on twice the TP share, ± the embed/head stage


def test_cli_fit(capsys):
    rc = main(["fit", "--model", "deepseek-v4.1-flash", "--hw", "gb200", "--tp", "4"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "engram=hbm" in out and "engram=host" in out and "188.83 GiB" in out
    assert "largest decode batch at 131,072 tokens" in out and "fits" in out
    rc = main(["fit", "--model", "deepseek-v4.1-flash", "--hw", "gb200", "--tp", "4", "--json"])
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["engram"] for r in rows] == ["hbm", "host"] and rows[1]["max_batch"] > rows[0]["max_batch"]
    rc = main(["fit", "--model", "deepseek-v3", "--hw", "h800", "--tp", "3"])
    assert rc == 2 and "mapping.tp" in capsys.readouterr().err


# ---- disaggregated serving --------------------------------------------------------------------------------

def test_kv_handover_bytes():
    from graphsim.serving.disagg import handover_bytes

    v3, v41 = gs.load_model("deepseek-v3"), gs.load_model("deepseek-v4.1-flash")
    assert handover_bytes(v3, 4096) == v3.kv_bytes(4096) == 4096 * 61 * 576 * 2  # the MLA cache
    n = 8192
    glob = (3 * (n // 2) + n) * (288 + 68)  # V41_FACTS §8: C(N) entries x (main KV + index K)
    assert handover_bytes(v41, n, "global") == pytest.approx(glob)
    assert handover_bytes(v41, n, "global+swa") == pytest.approx(glob + 40 * 128 * 512)


def test_disagg_point_by_hand():
    from graphsim.serving.disagg import Pool, disagg

    h800 = gs.load_hw("h800")
    pre = Pool(gs.ParallelMapping(dp=32, ep=32), batch=128)
    dec = Pool(gs.ParallelMapping(dp=128, ep=128), batch=4096, replicas=2)
    r = disagg("deepseek-v3", h800, pre, dec, isl=4096, osl=1024)
    kv = 4096 * 61 * 576 * 2
    # each prefill DP rank holds 4 prompts and hands them over one NIC (MLA is not split by TP)
    assert r.transfer_s == pytest.approx(4 * kv / 50e9 + 10e-6)
    step = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4608x4096"], dec.mapping), h800).schedule().forward[0]
    assert r.itl_s == pytest.approx(step)  # at the mean context 4096 + 1024/2
    pf = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:4096x128"], pre.mapping), h800).schedule().forward[0]
    assert r.ttft_s == pytest.approx(pf + r.transfer_s)
    assert r.gpus == 32 + 256
    assert r.decode_rate == pytest.approx(2 * 4096 / (1024 * step))
    assert r.tokens_per_s_per_gpu == pytest.approx(min(r.prefill_rate, r.decode_rate) * 1024 / 288)
    assert r.tokens_per_s_per_user == pytest.approx(1 / step)


def test_disagg_frontier_and_cli(capsys):
    from graphsim.serving.disagg import Pool, frontier, sweep

    pre = Pool(gs.ParallelMapping(tp=4, ep=4), batch=4)
    decs = [Pool(gs.ParallelMapping(tp=4, ep=4), b) for b in (16, 64, 256)] + \
           [Pool(gs.ParallelMapping(dp=8, ep=8), b) for b in (64, 512)]
    res = sweep("deepseek-v4.1-flash", "gb200", [pre], decs, isl=8192, osl=1024, kv="global+swa", link="nvlink")
    best = frontier(res)
    assert best and len(best) <= len(res)
    for r in res:  # nothing on the frontier is dominated, everything off it is
        xy = (r.tokens_per_s_per_user, r.tokens_per_s_per_gpu)
        dominated = any(o.tokens_per_s_per_user >= xy[0] and o.tokens_per_s_per_gpu >= xy[1] and
                        (o.tokens_per_s_per_user, o.tokens_per_s_per_gpu) != xy for o in res)
        assert (r in best) != dominated
    itl = {r.decode.batch: r.itl_s for r in res if r.decode.mapping.tp == 4}
    assert itl[16] < itl[64] < itl[256]
    rc = main(["disagg", "--model", "deepseek-v3", "--hw", "h800", "--isl", "2048", "--osl", "256",
               "--prefill", "dp=32,ep=32", "--prefill-batch", "64", "--decode", "dp8-ep8",
               "--decode-batch", "256,1024"])
    out = capsys.readouterr().out
    assert rc == 0 and "tok/s/GPU" in out and "*" in out


def test_vectorized_headroom_is_fit_over_arrays():
    """MemoryModel.headroom (what graphsim search uses per batch) equals fit()'s headroom point by point; with
    host-resident Engram tables too."""
    import numpy as np

    from graphsim import ParallelMapping, Policies
    from graphsim.serving.fit import MemoryModel

    for model, pol in (("deepseek-v3", Policies()), ("deepseek-v4.1-flash", Policies(engram="host"))):
        mm = MemoryModel(model, "gb200", ParallelMapping(tp=4, ep=4), pol)
        b = np.array([1.0, 64.0, 4096.0])
        room = mm.headroom(b, 8192, mm.workspace(b, 8192))
        ref = [mm.fit(int(x), 8192) for x in b]
        np.testing.assert_allclose(room, [r.headroom_bytes for r in ref], rtol=1e-12)
        assert [bool(x >= 0) for x in room] == [r.fits for r in ref]
