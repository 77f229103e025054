"""Issue 27: request-level serving simulation (graphsim.serving.sim) — checks that cannot be tuned: Little's law, an
M/D/1 queue against its closed form, the infinite-cache identity (hit ratio = the trace's own prefix reuse), hit
ratio monotone in a tier's capacity, replayed tokens = min(hit, W) per SWA miss, the step surface against the exact
program, and the CLI on the shipped trace excerpt (DeepSeek-V4.1, DeepSeek-V3, a dense model)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.serving import SLA, Deployment, TierSpec, load_trace, simulate, synthetic
from graphsim.serving.kvcache import GiB, HBMPool, Store, design_tiers
from graphsim.serving.steps import FixedSteps, effective_past, interp

EXCERPT = Path(__file__).resolve().parent / "data" / "traces" / "mooncake_synthetic_trace_head300.jsonl"
AGENT = {"turns": {"dist": "uniform", "low": 2, "high": 6}, "think_s": {"dist": "lognormal", "mean": 20, "cv": 1},
         "tool_tokens": {"dist": "lognormal", "mean": 600, "cv": 1}, "system_tokens": 2000}
V41 = Deployment("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(tp=4))
V3 = Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, ep=8))
DENSE = Deployment("llama-3.1-70b", "h200", gs.ParallelMapping(tp=4), replicas=2)


@pytest.fixture(scope="module")
def excerpt():
    return load_trace(EXCERPT)


@pytest.fixture(scope="module")
def agent():
    return synthetic(requests=400, rate=0.5, input={"dist": "lognormal", "mean": 3000, "cv": 1},
                     output={"dist": "lognormal", "mean": 300, "cv": 1}, sessions=AGENT, seed=7)


def _little(res, tol=0.02):
    lit = res.checks["littles_law"]
    assert lit["relative_error"] < tol, lit


# ---- closed forms ---------------------------------------------------------------------------------------------------
def test_md1_queue_matches_its_closed_form():
    """One server, fixed service D, Poisson arrivals at rho/D: mean time in system D + rho·D / (2(1 - rho))
    (Pollaczek-Khinchine for deterministic service)."""
    d, rho = 0.01, 0.7
    tr = synthetic(requests=20000, rate=rho / d, input=500, output=1, seed=3)
    dep = Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, ep=8), max_running=1, hbm_kv_gib=math.inf)
    res = simulate(tr, dep, steps=FixedSteps(d), validate=0)
    w = float(np.nanmean(res.requests["e2e_ms"])) / 1e3
    assert w == pytest.approx(d + rho * d / (2 * (1 - rho)), rel=0.03)
    _little(res)


def test_one_request_alone_takes_its_steps():
    """An isolated request: TTFT = one prefill step (the prompt fits the budget), then output - 1 decode steps."""
    tr = synthetic(requests=1, rate=1.0, input=1000, output=5, seed=0)
    res = simulate(tr, Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, ep=8), hbm_kv_gib=math.inf),
                   steps=FixedSteps(0.02), validate=0)
    assert res.requests["ttft_ms"][0] == pytest.approx(20.0)
    assert res.requests["e2e_ms"][0] == pytest.approx(20.0 * 5)
    assert res.requests["tpot_ms"][0] == pytest.approx(20.0)


def test_chunked_prefill_takes_ceil_prompt_over_budget_steps():
    tr = synthetic(requests=1, rate=1.0, input=10000, output=1, seed=0)
    dep = Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, ep=8), hbm_kv_gib=math.inf, token_budget=4096)
    res = simulate(tr, dep, steps=FixedSteps(0.01), validate=0)
    assert res.requests["ttft_ms"][0] == pytest.approx(10.0 * math.ceil(10000 / 4096))


# ---- the identities on the shipped trace and on agent sessions -------------------------------------------------------
@pytest.mark.parametrize("dep", [V41, V3, DENSE], ids=["v4.1", "v3", "dense"])
def test_littles_law_and_infinite_cache_identity_on_the_trace(excerpt, dep):
    res = simulate(excerpt, dep, tiers=(TierSpec("disk"),), validate=64)
    _little(res)
    c = res.summary["cache"]
    # every global block any earlier request wrote is found again: the trace's own prefix reuse, exactly
    assert c["hit_ratio"] == pytest.approx(excerpt.prefix_reuse(), rel=1e-12)
    assert res.summary["requests"]["served"] + res.summary["requests"]["rejected"] == len(excerpt)
    # the step surface against the exact program on the simulation's own steps
    assert res.surface_error["steps"] == 64 and res.surface_error["max_abs_rel"] < 0.10


def test_littles_law_and_identity_on_agent_sessions(agent):
    res = simulate(agent, V41, tiers=(TierSpec("host", holds=("swa",)), TierSpec("disk", holds=("global",))),
                   validate=0)
    _little(res)
    assert res.summary["cache"]["hit_ratio"] == pytest.approx(agent.prefix_reuse(), rel=1e-12)
    assert agent.prefix_reuse() > 0.5  # sessions re-read their whole history


def test_hit_ratio_is_monotone_in_a_tier_capacity(excerpt):
    ratios = []
    for gib in (0.25, 1.0, 4.0, 16.0, math.inf):
        res = simulate(excerpt, V3, tiers=(TierSpec("disk", capacity_bytes=gib * GiB),), validate=0)
        ratios.append(res.summary["cache"]["hit_ratio"])
    assert all(b >= a for a, b in zip(ratios, ratios[1:])), ratios
    assert ratios[-1] == pytest.approx(excerpt.prefix_reuse())
    # and in the HBM pool's
    hbm = [simulate(excerpt, Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, ep=8), hbm_kv_gib=g),
                    cache_design="hbm", validate=0).summary["cache"]["hit_ratio"] for g in (8.0, 32.0, 128.0)]
    assert all(b >= a for a, b in zip(hbm, hbm[1:])), hbm


def test_replayed_tokens_are_the_window_per_swa_miss(agent):
    # no tier keeps the SWA state: once a request leaves HBM every hit misses its window
    res = simulate(agent, Deployment("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(tp=4), hbm_kv_gib=2.0),
                   tiers=(TierSpec("disk", holds=("global",)),), validate=0)
    r = res.requests
    miss = (r["hit_tokens"] > 0) & ~r["swa_hit"]
    assert miss.sum() > 0
    assert np.array_equal(r["replayed"][miss], np.minimum(r["hit_tokens"][miss], 128))
    assert r["replayed"][~miss].sum() == 0
    assert res.summary["cache"]["replayed_tokens"] == int(np.minimum(r["hit_tokens"][miss], 128).sum())
    # full recompute instead of the bounded replay: the missed hits are recomputed, nothing replayed
    off = Deployment("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(tp=4),
                     gs.Policies(encoder_replay="off"), hbm_kv_gib=2.0)
    res2 = simulate(agent, off, tiers=(TierSpec("disk", holds=("global",)),), validate=0)
    assert res2.summary["cache"]["replayed_tokens"] == 0 and res2.summary["cache"]["recomputed_hit_tokens"] > 0
    assert res2.summary["latency"]["ttft_ms"]["mean"] > res.summary["latency"]["ttft_ms"]["mean"]


def test_three_tier_keeps_fewer_persistent_bytes_than_swa_on_disk(agent):
    """The talk's design moves the SWA state off disk: disk holds only the global KV (strictly less)."""
    a = {t["name"]: t for t in simulate(agent, V41, cache_design="three-tier", validate=0).summary["cache"]["tiers"]}
    b = {t["name"]: t for t in simulate(agent, V41, cache_design="swa-on-disk", validate=0).summary["cache"]["tiers"]}
    assert a["disk"]["holds"] == ["global"] and b["disk"]["holds"] == ["global", "swa"]
    assert a["disk"]["gib_hours"] < b["disk"]["gib_hours"]
    assert a["host"]["present"] and a["host"]["holds"] == ["swa"] and not b["host"]["present"]


def test_deterministic_and_goodput_follows_the_sla(excerpt):
    a = simulate(excerpt, V3, sla=SLA(ttft_ms=200.0, tpot_ms=20.0), validate=16, seed=1)
    b = simulate(excerpt, V3, sla=SLA(ttft_ms=200.0, tpot_ms=20.0), validate=16, seed=1)
    assert json.dumps(a.to_json(), default=str) == json.dumps(b.to_json(), default=str)
    r = a.requests
    good = r["served"] & (r["ttft_ms"] <= 200.0) & ~(r["tpot_ms"] > 20.0)
    assert a.summary["goodput"]["requests"] == int(good.sum())
    loose = simulate(excerpt, V3, sla=SLA(ttft_ms=1e9), validate=0).summary["goodput"]["requests"]
    assert loose >= a.summary["goodput"]["requests"]


def test_dense_model_has_no_swa_tier():
    tiers = design_tiers("auto", 1e12, has_swa=False)
    assert [t.holds for t in tiers] == [("global",), ("global",)]
    assert [t.name for t in design_tiers("three-tier", 1e12, has_swa=True)] == ["host", "disk"]


# ---- pieces -----------------------------------------------------------------------------------------------------------
def test_store_lru_and_ttl():
    s = Store(TierSpec("host", capacity_bytes=30.0, ttl_s=10.0))
    for k in range(3):
        s.put(k, 10.0, now=float(k))
    s.has(0, 3.0)
    s.touch(0, 3.0)  # 0 is now the most recent
    s.put(3, 10.0, now=4.0)  # evicts 1, the least recently used
    assert [k for k in s.entries] == [2, 0, 3] and s.evicted == 1
    assert not s.has(2, 12.5) and s.expired == 1  # 2 was last used at t=2: expired after 12
    assert s.has(0, 12.5)


def test_hbm_pool_evicts_only_unreferenced():
    p = HBMPool(100.0)
    p.ref("a", 40.0)
    p.ref("b", 40.0)
    p.unref("b")
    assert p.cached == 40.0 and p.free() == 20.0
    assert p.make_room(20.0) and p.has("b")  # enough room: nothing evicted
    assert p.make_room(60.0) and not p.has("b") and p.has("a") and p.evicted == 1
    assert not p.make_room(61.0)  # "a" is held


def test_surface_interpolation_is_exact_on_linear_functions():
    g = (np.array([0.0, 1.0, 4.0]), np.array([1.0, 2.0, 8.0]))
    table = np.add.outer(2 * g[0], 3 * g[1])
    q = np.array([[0.5, 1.5], [3.0, 7.0], [10.0, 0.0]])  # the last is clipped into the box
    assert np.allclose(interp(g, table, q), [2 * 0.5 + 3 * 1.5, 2 * 3 + 3 * 7, 2 * 4 + 3 * 1])
    # one sequence with the chunks' attention pairs
    n = np.array([100.0, 50.0])
    p = np.array([1000.0, 0.0])
    pairs = float((n * p + n * (n + 1) / 2).sum())
    pe = float(effective_past(n.sum(), pairs))
    assert n.sum() * pe + n.sum() * (n.sum() + 1) / 2 == pytest.approx(pairs)


def test_bad_inputs_name_their_field(excerpt):
    with pytest.raises(GraphsimError, match="router"):
        simulate(excerpt, V3, router="random")
    with pytest.raises(GraphsimError, match="tier.host"):
        TierSpec.parse("host:fraction=2", 1e12)
    with pytest.raises(GraphsimError, match="tier"):
        TierSpec.parse("nvme:capacity_gib=1", 1e12)
    with pytest.raises(GraphsimError, match="replicas"):
        Deployment("deepseek-v3", replicas=0)
    with pytest.raises(GraphsimError, match="pp"):
        simulate(excerpt, Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, pp=2)))


# ---- the command ------------------------------------------------------------------------------------------------------
def _cli(*args):
    from graphsim.cli import main

    return main([str(a) for a in args])


def test_cli_json_and_requests_out(tmp_path, capsys):
    out = tmp_path / "req.parquet"
    assert _cli("serve-sim", "--model", "deepseek-v4.1-flash", "--hw", "gb200", "--tp", "4", "--trace", EXCERPT,
                "--json", "--requests-out", out, "--validate", "16", "--no-progress") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1 and doc["command"] == "serve-sim"
    assert {"p50", "p90", "p99"} <= set(doc["latency"]["ttft_ms"])
    assert [(t["name"], t["holds"]) for t in doc["cache"]["tiers"]] == [("host", ["swa"]), ("disk", ["global"])]
    import pandas as pd

    assert len(pd.read_parquet(out)) == 300


SEARCH = Path(__file__).resolve().parent / "data" / "search_v3_16gpu.json"  # graphsim search --model deepseek-v3
# --hw gb200 --gpus 16 --isl 4000 --osl 500 --ttft 2000 --tpot 50 --refine 0 --json ("best" kept)


@pytest.mark.parametrize("rank", [1, 5], ids=["agg", "disagg"])
def test_cli_runs_a_real_search_row(rank, capsys):
    doc = json.loads(SEARCH.read_text())
    row = next(b for b in doc["best"] if b["rank"] == rank)
    assert _cli("serve-sim", "--model", "deepseek-v3", "--hw", "gb200", "--from", SEARCH, "--rank", rank, "--trace",
                EXCERPT, "--head", 60, "--validate", "0", "--no-progress", "--json") == 0
    d = json.loads(capsys.readouterr().out)["deployment"]
    assert d["mode"] == row["mode"] and d["gpus"] == row["gpus"]
    assert d["mapping"] == row["decode_mapping"] and d["replicas"] == row["decode_replicas"]
    if row["mode"] == "disagg":
        assert d["prefill_mapping"] == row["prefill_mapping"] and d["prefill_replicas"] == row["prefill_replicas"]


def test_cli_runs_a_deployment_from_search_output(tmp_path, capsys):
    doc = {"best": [{"rank": 1, "mode": "agg", "decode_mapping": "tp8-dp1-ep8-pp1", "decode_replicas": 1,
                     "policies": "overlap=serial"}]}
    f = tmp_path / "search.json"
    f.write_text(json.dumps(doc))
    assert _cli("serve-sim", "--model", "deepseek-v3", "--hw", "gb200", "--from", f, "--trace", EXCERPT, "--head", 50,
                "--validate", "0", "--no-progress") == 0
    text = capsys.readouterr().out
    assert "1x tp8-dp1-ep8-pp1" in text and "Little's law" in text
    assert _cli("serve-sim", "--model", "deepseek-v3", "--hw", "gb200", "--from", f, "--rank", "3", "--trace",
                EXCERPT) == 2
    assert "rank" in capsys.readouterr().err


def test_point_interpolation_equals_the_vectorized_one():
    from graphsim.serving.steps import _Point

    rng = np.random.default_rng(0)
    grids = (np.array([0.0, 1, 2, 4, 8]), np.array([16.0, 64, 256]), np.array([1.0, 3, 9, 27]))
    table = rng.random((5, 3, 4))
    pt = _Point(grids, table)
    q = np.column_stack([rng.uniform(-1, 10, 50), rng.uniform(0, 300, 50), rng.uniform(0, 30, 50)])
    assert np.allclose([pt(*row) for row in q], interp(grids, table, q), rtol=1e-12, atol=0)


# ---- disaggregated pools ----------------------------------------------------------------------------------------------
def test_disaggregated_request_takes_prefill_handover_and_decode_steps():
    """One request: TTFT = one prefill step on the prefill pool; then its KV crosses to the decode pool (graphsim's
    disagg hand-over) and output - 1 decode steps follow there."""
    tr = synthetic(requests=1, rate=1.0, input=1000, output=5, seed=0)
    m = gs.ParallelMapping(tp=8, ep=8)
    dep = Deployment("deepseek-v3", "gb200", m, prefill_mapping=gs.ParallelMapping(tp=4, ep=4), prefill_replicas=1,
                     hbm_kv_gib=math.inf)
    res = simulate(tr, dep, steps=FixedSteps(0.02), validate=0)
    r = res.requests
    assert r["ttft_ms"][0] == pytest.approx(20.0)
    assert r["handover_ms"][0] > 0
    assert r["e2e_ms"][0] == pytest.approx(20.0 + r["handover_ms"][0] + 4 * 20.0)
    assert res.summary["deployment"]["mode"] == "disagg" and res.summary["deployment"]["gpus"] == 4 + 8


def test_disaggregated_trace_keeps_littles_law(excerpt):
    m = gs.ParallelMapping(tp=8, ep=8)
    res = simulate(excerpt, Deployment("deepseek-v3", "gb200", m, prefill_mapping=m, prefill_replicas=1), validate=16)
    _little(res)
    rq = res.summary["requests"]
    assert rq["served"] + rq["rejected"] == len(excerpt)
    assert res.surface_error["max_abs_rel"] < 0.10
    r = res.requests
    multi = r["served"] & (r["output_len"] > 1)
    assert (r["handover_ms"][multi] > 0).all() and (r["handover_ms"][~multi] == 0).all()


@pytest.mark.parametrize("prefill_replicas", [0, 1], ids=["agg-recompute", "disagg-swap"])
def test_preemption_when_decodes_outgrow_the_pool(prefill_replicas):
    """Long outputs admitted at their short prompts outgrow a small pool: the newest request is preempted
    (recompute when aggregated, swap on a decode replica) and every request still finishes, Little's law intact."""
    tr = synthetic(requests=40, rate=50.0, input=1000, output=3000, seed=2)
    m = gs.ParallelMapping(tp=8, ep=8)
    dep = Deployment("deepseek-v3", "gb200", m, prefill_mapping=m if prefill_replicas else None,
                     prefill_replicas=prefill_replicas, hbm_kv_gib=1.0)
    res = simulate(tr, dep, steps=FixedSteps(0.001), validate=0)
    rq = res.summary["requests"]
    assert rq["preemptions"] > 0 and rq["served"] == 40
    _little(res)


SHARED_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "mooncake_synthetic_trace.jsonl"


@pytest.mark.skipif(not SHARED_TRACE.is_file(), reason="the shared Mooncake trace (../shared/data/traces) is not here")
def test_acceptance_command_on_the_whole_mooncake_trace(capsys):
    """Issue 27's acceptance: V4.1-Flash on GB200 TP4 serves the public trace; percentiles, hit rates and bytes per
    tier come out; Little's law and the infinite-cache identity (unbounded disk, TTL 72 h > the trace) hold."""
    assert _cli("serve-sim", "--model", "deepseek-v4.1-flash", "--hw", "gb200", "--tp", "4", "--trace", SHARED_TRACE,
                "--validate", "32", "--no-progress", "--json") == 0
    d = json.loads(capsys.readouterr().out)
    assert d["requests"]["total"] == 3993 and d["latency"]["ttft_ms"]["p99"] > d["latency"]["ttft_ms"]["p50"] > 0
    assert d["checks"]["littles_law"]["relative_error"] < 0.02
    assert d["cache"]["hit_ratio"] == pytest.approx(d["cache"]["trace_prefix_reuse"], rel=1e-12)
    tiers = {t["name"]: t for t in d["cache"]["tiers"]}
    assert tiers["disk"]["peak_gib"] > 0 and tiers["host"]["peak_gib"] > 0 and d["surface_error"]["max_abs_rel"] < 0.1


# ---- found by the fuzz campaign (tests/fuzz: the serve_sim family) ------------------------------------------------
@pytest.mark.parametrize("content,name,what", [
    (b"PAR1\x00\x00junk", "t.parquet", "not a Parquet file"), (b"\xff\xfe{", "t.jsonl", "not UTF-8"),
    (b"\xff\xfe,\n", "t.csv", "not UTF-8")])
def test_unreadable_trace_files_are_one_line(tmp_path, content, name, what):
    # a junk Parquet file was an internal ArrowInvalid, a non-UTF-8 JSONL / CSV a UnicodeDecodeError
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(GraphsimError, match=f"^trace: {name}: {what}") as e:
        load_trace(p)
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(GraphsimError, match="^trace: .*cannot read it"):
        load_trace(tmp_path / "missing.jsonl")


def test_a_tier_price_must_be_finite():
    # an infinite price made every cost inf: serve-sim --json printed Infinity (not JSON)
    for text in ("disk:price=inf", "disk:price=nan"):
        with pytest.raises(GraphsimError, match="tier.disk.price"):
            TierSpec.parse(text, 1e12)
    with pytest.raises(GraphsimError, match="tier.disk.price"):
        simulate(load_trace(EXCERPT).head(2), V3, cache_design="swa-on-disk", prices={"disk": math.inf})


def test_arrivals_beyond_the_clocks_resolution_are_refused(excerpt):
    # --rate-scale 1e-300 put arrivals at 1e300 s, where a step no longer moves a float clock: the simulation
    # stopped with "replica 0 is stuck (an internal error)"
    with pytest.raises(GraphsimError, match="trace.arrival_s"):
        excerpt.head(3).scale_rate(1e-300)
    assert excerpt.head(3).scale_rate(1e-6).arrival_s[-1] < 2 ** 32  # the excerpt spans minutes: 1e6x slower fits


@pytest.mark.parametrize("kwargs,field", [
    ({"input": {"dist": "uniform", "low": 100, "high": 1e300}}, "synthetic.input.high"),  # was numpy's ValueError
    ({"input": {"dist": "lognormal", "mean": 2.0 ** 53, "cv": 3}}, "synthetic.input"),  # int64 wrap, then blocks
    ({"requests": 2 ** 70}, "synthetic.requests"),  # was a MemoryError
    ({"requests": None, "duration_s": 1e9, "rate": 1e9}, "synthetic.duration_s"),
    ({"seed": -1}, "synthetic.seed"),  # was numpy's ValueError
    ({"block_tokens": 2 ** 70}, "synthetic.block_tokens"),  # was an OverflowError
    ({"sessions": {"turns": {"dist": "lognormal", "mean": 2.0 ** 53, "cv": 1}}}, "synthetic.sessions.turns"),
    ({"sessions": {"turns": 3, "system_tokens": 2 ** 70}}, "synthetic.sessions.system_tokens"),
    ({"sessions": {"turns": 3, "tool_tokens": 2.0 ** 53}}, "synthetic.sessions.tool_tokens"),
])
def test_synthetic_sizes_beyond_the_limits_are_one_line(kwargs, field):
    # found by the fuzz campaign: each was an internal error, a MemoryError or a hang before any request ran
    with pytest.raises(GraphsimError, match=f"^{field}:"):
        synthetic(**{"requests": 10, "rate": 1.0, **kwargs})


def test_think_time_does_not_size_the_sessions():
    # sessions were sized by rate x think time: think_s 2^53 s asked for 2.7e16 sessions (a MemoryError); sessions
    # beyond the requests are never needed (each has a turn)
    tr = synthetic(requests=5, rate=1.0, sessions={"turns": 3, "think_s": 2.0 ** 53}, seed=1)
    assert len(tr) == 5 and np.all(tr.turn == 0)


@pytest.mark.parametrize("doc,field", [
    ({"best": [{"rank": 1, "mode": "agg", "decode_replicas": 1}]}, "from.decode_mapping"),  # was a KeyError
    ({"best": [{"rank": 1, "decode_mapping": "tp8-dp1-ep8-pp1", "decode_replicas": "x"}]}, "from.decode_replicas"),
    ({"best": [{"rank": 1, "decode_mapping": "tp8-dp1-ep8-pp1", "decode_replicas": None}]}, "from.decode_replicas"),
    ({"best": [{"rank": 1, "decode_mapping": "tp8-dp1-ep8-pp1", "decode_replicas": 1.5}]}, "from.decode_replicas"),
    ({"best": [{"rank": 1, "decode_mapping": "tp8-dp1-ep8-pp1", "policies": "prefetch_distance=x"}]}, "from.policies"),
    ({"best": [1]}, "from"),  # was an AttributeError
])
def test_search_documents_with_broken_rows(tmp_path, doc, field):
    from graphsim.cli.serve import deployment_from_search

    f = tmp_path / "search.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(GraphsimError, match=f"^{field}:"):
        deployment_from_search(str(f), 1)


@pytest.mark.parametrize("text", ["", '"\n'])
def test_search_tables_that_are_not_tables(tmp_path, text, capsys):
    # an empty or malformed --from CSV was pandas' EmptyDataError / ParserError: an internal error (exit 3)
    f = tmp_path / "search.csv"
    f.write_text(text)
    assert _cli("serve-sim", "--model", "deepseek-v3", "--hw", "gb200", "--from", f, "--rank", "0", "--trace", EXCERPT,
                "--head", 5, "--validate", 0, "--no-progress") == 2
    err = capsys.readouterr().err
    assert err.startswith("graphsim: error: from:") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("flag,value", [("--ttft", "nan"), ("--tpot", "inf"), ("--ttft", "-1"), ("--tpot", "0")])
def test_sla_bounds_are_finite_and_positive(flag, value, capsys):
    # --ttft nan / --tpot inf printed NaN / Infinity in the --json goodput (not JSON); -1 made every request bad
    assert _cli("serve-sim", "--model", "deepseek-v3", "--hw", "gb200", "--tp", 8, "--ep", 8, "--trace", EXCERPT,
                "--head", 5, "--validate", 0, "--no-progress", "--json", flag, value) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"graphsim: error: {flag[2:]}_ms:"), err
    assert SLA(ttft_ms=2000.0, tpot_ms=50).tpot_ms == 50


@pytest.mark.parametrize("flag,value,field", [("--classes", str(2 ** 70), "classes"), ("--classes", "-5", "classes"),
                                              ("--seed", "-1", "seed")])
def test_class_edges_and_seed_are_checked_before_the_run(flag, value, field, capsys):
    # a class edge beyond int64 was an OverflowError and a negative seed numpy's ValueError, both after the whole run
    assert _cli("serve-sim", "--model", "deepseek-v3", "--hw", "gb200", "--tp", 8, "--ep", 8, "--trace", EXCERPT,
                "--head", 5, "--validate", 0, "--no-progress", flag, value) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"graphsim: error: {field}:") and len(err.strip().splitlines()) == 1, err


def test_an_empty_synthetic_stream_is_one_line(capsys):
    # duration_s 0 draws no request: the new size checks' messages reduced an empty array (an internal error)
    assert len(synthetic(duration_s=0, rate=5.0)) == 0
    assert _cli("serve-sim", "--model", "deepseek-v3", "--hw", "gb200", "--tp", 8, "--ep", 8, "--synthetic",
                '{"rate": 5, "duration_s": 0}', "--no-progress") == 2
    assert capsys.readouterr().err.startswith("graphsim: error: trace: holds no requests")


def test_a_readmitted_requests_own_blocks_are_not_prefix_hits():
    # found by the fuzz campaign: with recompute preemption a readmitted request found its own prompt blocks in HBM
    # and counted them as hits, so the hit ratio (3.6 %) beat the trace's own prefix reuse (0: unique prompts)
    tr = synthetic(requests=36, rate=2.0, seed=0)
    dep = Deployment("llama-3.1-70b", "h200", gs.ParallelMapping(tp=2), engine="sglang", hbm_kv_gib=1.0)
    res = simulate(tr, dep, validate=0)
    c = res.summary["cache"]
    assert res.summary["requests"]["preemptions"] > 0 and c["trace_prefix_reuse"] == 0.0
    assert c["hit_ratio"] == 0.0 and sum(c["hit_tokens"].values()) == 0.0


def test_python_arguments_of_the_wrong_kind_are_one_line(excerpt):
    # found by the serve_sim family's Python cases: each was a ValueError / TypeError / AttributeError, and
    # samples=10**9 never ended (a pass over the replicas per sample)
    tr = excerpt.head(3)
    for call, field in ((lambda: Deployment("deepseek-v3", hbm_kv_gib="x"), "hbm_kv_gib"),
                        (lambda: TierSpec("nvme"), "tier"), (lambda: TierSpec("disk", ttl_s="x"), "tier.ttl_s"),
                        (lambda: TierSpec("disk", capacity_bytes="x"), "tier.capacity_gib"),
                        (lambda: TierSpec.parse("host:fraction=0.1", "4"), "tier.host_bytes"),
                        (lambda: simulate(tr, V3, validate=0, samples=10 ** 9), "samples"),
                        (lambda: simulate(tr, V3, validate=-1), "validate"),
                        (lambda: simulate(tr, V3, validate=0, prices={"disk": "x"}), "price"),
                        (lambda: simulate(tr, V3, validate=0, prices=1.5), "price"),
                        (lambda: simulate(tr, V3, validate=0, classes=None), "classes")):
        with pytest.raises(GraphsimError, match=f"^{field}:"):
            call()
    assert TierSpec("disk", holds="global").holds == ("global",)  # one kind by name, not its letters


def test_many_replicas_end_in_linear_time():
    # found probing the family's --replicas bound: the run's last loop took the latest replica clock once per
    # replica (quadratic: 65,536 replicas ran for minutes with 20 requests; 10 s after). No wall-clock assert (the
    # machine is shared): the run completing in the suite's budget is the check, bench_serve_sim.py the speed.
    tr = synthetic(requests=3, rate=1.0, input=500, output=2, seed=0)
    dep = Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, ep=8), replicas=20000, hbm_kv_gib=math.inf)
    res = simulate(tr, dep, steps=FixedSteps(0.01), validate=0, samples=0)  # ~1 s; the quadratic loop was ~4e8 steps
    assert res.summary["requests"]["served"] == 3


def test_a_prediction_pays_the_hottest_ep_rank_and_sol_does_not():
    """A prediction with an engine (the practitioner profile + vLLM terms) prices each step with the routing
    statistics' hottest EP rank (graphsim.serving.moe): t1 + (factor(T) - 1)(t2 - t1), factor > 1 for a few tokens,
    falling toward 1 as they grow; the SOL surfaces have no such term."""
    from graphsim.serving.sim import _pool_config

    m = gs.ParallelMapping(tp=8, ep=8)
    dep = Deployment("deepseek-v3", "gb200", m, profile=gs.load_profile("practitioner"), engine="vllm")
    model = gs.load_model("deepseek-v3")
    kw = dict(model=model, hw=gs.load_hw("gb200"), dep=dep, eng=None, view=None, trace=synthetic(requests=64, rate=1,
              seed=0), max_ctx=8192, swa_model=False, validate=0, steps=None)
    from graphsim.serving.engines import ENGINES

    eng = ENGINES["vllm"].on(gs.load_hw("gb200").hbm_capacity_bytes)
    st = _pool_config("mixed", m, gs.Policies(), **{**kw, "eng": eng, "serving": eng}).steps
    assert st.moe is not None and st.moe[:3] == (8, 256, 8)
    f8, f512 = st._factor(8), st._factor(512)
    assert f8 > f512 > 1.0
    t1, t2 = st._d1(8.0, 4096.0), st._d2(8.0, 4096.0)
    assert t2 > t1 and st.step(8, 4096.0, 0.0, 0.0, host=False) == pytest.approx(t1)
    with_terms = st.step(8, 4096.0, 0.0, 0.0)
    bare = float(eng.step_time(t1 + (f8 - 1) * (t2 - t1), st.kernels, eng.graphed(8 / m.dp)))
    assert with_terms == pytest.approx(bare, rel=1e-12)
    sol = _pool_config("mixed", m, gs.Policies(), **{**kw, "serving": None}).steps  # no prediction: no term
    assert sol.moe is None


def test_speculative_decoding_emits_the_expected_tokens_per_step():
    """MTP-1 at acceptance 0.8: each decode step verifies 2 positions and gives each request 1 + 0.8 = 1.8 tokens
    (graphsim.driver.metrics.emitted); a 9-token output is its prefill's first token then ceil(8 / 1.8) = 5 steps."""
    tr = synthetic(requests=1, rate=1.0, input=1000, output=9, seed=0)
    dep = Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, ep=8), gs.Policies(mtp=1, acceptance=(0.8,)),
                     hbm_kv_gib=math.inf)
    res = simulate(tr, dep, steps=FixedSteps(0.01), validate=0)
    assert res.requests["e2e_ms"][0] == pytest.approx(10.0 * (1 + 5))
    assert res.summary["latency"]["itl_ms"]["p50"] == pytest.approx(10.0 / 1.8, rel=0.01)  # per token (bin width)
    with pytest.raises(GraphsimError, match="policies.acceptance"):
        simulate(tr, Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, ep=8), gs.Policies(mtp=1)),
                 steps=FixedSteps(0.01), validate=0)


def test_dspark_steps_are_priced_with_their_verify_positions(excerpt):
    # V4.1 with DSpark: the step surface's decode rows verify 1 + D positions; the surface still matches the exact
    # program (built with the same verify rows) on the run's own steps, and Little's law holds
    pol = gs.Policies(dspark="on", acceptance=(0.9, 0.8, 0.7, 0.6, 0.5))  # a_1..a_D, D = the draft block
    res = simulate(excerpt.head(60), Deployment("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(tp=4), pol),
                   validate=32)
    assert res.surface_error["max_abs_rel"] < 0.10
    _little(res)
    base = simulate(excerpt.head(60), V41, validate=0)
    assert res.summary["latency"]["tpot_ms"]["mean"] < base.summary["latency"]["tpot_ms"]["mean"]


def test_restores_are_priced_as_the_programs_prefix_restore():
    """restore_seconds is the prefix_restore rule's links at the descriptor's rates: a 1-token prefill after K cached
    positions in host memory (or on disk) takes the program at least the copy and at most the copy plus the
    forward with them in HBM (the program issues every layer's copy up front and overlaps it with the compute)."""
    from graphsim.driver.memory import kv_per_device
    from graphsim.serving.sim import restore_seconds

    hw = gs.load_hw("gb200")
    m = gs.ParallelMapping(tp=8, ep=8)
    model = gs.load_model("deepseek-v3")
    k = 65536
    nbytes = kv_per_device(model, k, m, gs.Policies())
    fwd = {t: gs.compile_plan(model, gs.Plan([f"prefill:{k + 1}@{k}:{t}"], m), hw).report().forward_s
           for t in ("hbm", "host", "disk")}
    for t, (hb, db) in {"host": (nbytes, 0.0), "disk": (0.0, nbytes)}.items():
        copy = float(restore_seconds(hb, db, hw.rates()))
        assert copy * (1 - 1e-9) <= fwd[t] <= copy + fwd["hbm"], t
