"""Issue 27 item 3: a grid of serving simulations (graphsim.serving.grid) — each row is the simulate() call of its
point, a refused point is an error row and the rest completes, parts resume and are recomputed when an input
changes, every executor gives the same table, and ``serve-sim --grid`` writes it."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import attrs
import pandas as pd
import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.serving import Deployment, TierSpec, load_trace, simulate, synthetic
from graphsim.serving import grid as grid_mod
from graphsim.serving.grid import grid
from graphsim.serving.steps import FixedSteps

EXCERPT = Path(__file__).resolve().parent / "data" / "traces" / "mooncake_synthetic_trace_head300.jsonl"
AGENT = {"turns": {"dist": "uniform", "low": 2, "high": 6}, "think_s": 2, "tool_tokens": 300, "system_tokens": 1000}
V3 = Deployment("deepseek-v3", "gb200", gs.ParallelMapping(tp=8, ep=8))


@pytest.fixture(scope="module")
def sessions():
    """40 agent requests re-reading their history: hits in HBM, the host pool and on disk."""
    return synthetic(requests=40, rate=1, input={"dist": "lognormal", "mean": 1500, "cv": 1},
                     output={"dist": "lognormal", "mean": 60, "cv": 1}, sessions=AGENT, seed=7)


@pytest.fixture(scope="module")
def head30():
    return load_trace(EXCERPT).head(30)


def test_a_2x2_grid_is_the_simulate_call_of_each_point(sessions):
    df = grid(sessions, V3, {"hbm_kv_gib": [0.2, 1.0], "host_fraction": [0.0, 0.1]}, cache_design="host-disk",
              validate=0)
    assert list(df.columns[:4]) == ["hbm_kv_gib", "host_fraction", "error_field", "error"]
    assert [(r.hbm_kv_gib, r.host_fraction) for r in df.itertuples()] == [(0.2, 0.0), (0.2, 0.1), (1.0, 0.0),
                                                                           (1.0, 0.1)]
    host_bytes = gs.load_hw("gb200").host_mem_bytes * 8  # one replica of 8 GPUs pools its machines' DRAM
    for r in df.to_dict("records"):
        # the host-disk design, built by hand: 10 % -> fraction of the pooled DRAM, 300 s; disk unbounded, 72 h
        tiers = (TierSpec("host", r["host_fraction"] * host_bytes, 300.0, ("global",)),
                 TierSpec("disk", math.inf, 72 * 3600.0, ("global",)))
        res = simulate(sessions, attrs.evolve(V3, hbm_kv_gib=r["hbm_kv_gib"]), tiers=tiers, validate=0)
        s = res.summary
        t = {x["name"]: x for x in s["cache"]["tiers"]}
        assert pd.isna(r["error"])
        assert r["ttft_p50_ms"] == s["latency"]["ttft_ms"]["p50"]
        assert r["ttft_p99_ms"] == s["latency"]["ttft_ms"]["p99"]
        assert r["tpot_p90_ms"] == s["latency"]["tpot_ms"]["p90"]
        assert r["e2e_p99_ms"] == s["latency"]["e2e_ms"]["p99"]
        assert r["goodput_fraction"] == s["goodput"]["fraction"]
        assert r["out_tok_per_s_per_gpu"] == s["throughput"]["output_tokens_per_s_per_gpu"]
        assert r["hit_ratio"] == s["cache"]["hit_ratio"]
        assert [r[f"hit_tokens_{k}"] for k in ("hbm", "host", "disk")] == \
            [s["cache"]["hit_tokens"][k] for k in ("hbm", "host", "disk")]
        assert (r["host_gib_hours"], r["host_peak_gib"]) == (t["host"]["gib_hours"], t["host"]["peak_gib"])
        assert (r["disk_gib_hours"], r["disk_peak_gib"]) == (t["disk"]["gib_hours"], t["disk"]["peak_gib"])
        assert (r["served"], r["rejected"], r["preemptions"]) == \
            (s["requests"]["served"], s["requests"]["rejected"], s["requests"]["preemptions"])
        assert r["littles_law_rel_error"] == res.checks["littles_law"]["relative_error"]
    # the axes did something: without a host pool every tier hit is read from disk; with one, some from host
    assert (df[df.host_fraction == 0.0].hit_tokens_host == 0).all()
    assert (df[df.host_fraction == 0.0].hit_tokens_disk > 0).all()
    assert (df[df.host_fraction == 0.1].hit_tokens_host > 0).all()
    assert df.hit_tokens_hbm.iloc[0] < df.hit_tokens_hbm.iloc[2]  # a larger HBM pool keeps more


def test_a_refused_point_is_an_error_row_and_the_rest_completes(head30):
    df = grid(head30, V3, {"mapping": ["tp8-dp1-ep8-pp1", "tp3-dp1-ep1-pp1"], "cache_design": ["hbm", "host-disk"]},
              validate=0)
    bad = df[df.mapping == "tp3-dp1-ep1-pp1"]
    assert (bad.error_field == "mapping.tp").all() and bad.error.str.contains("attention heads").all()
    assert bad.ttft_p50_ms.isna().all()
    good = df[df.mapping == "tp8-dp1-ep8-pp1"]
    assert good.error.isna().all() and (good.served == 30).all() and (good.ttft_p50_ms > 0).all()
    # a tier parameter of a design without that tier: this point's error, named by its axis
    df = grid(head30, V3, {"cache_design": ["hbm", "host-disk"], "host_fraction": [0.05]}, validate=0)
    assert df.error_field.iloc[0] == "grid.host_fraction" and pd.isna(df.error_field.iloc[1])
    assert df.served.iloc[1] == 30


def test_a_malformed_axis_fails_before_any_point(head30):
    with pytest.raises(GraphsimError, match="grid: unknown axis 'tp'"):
        grid(head30, V3, {"tp": [4, 8]})
    with pytest.raises(GraphsimError, match="grid.replicas"):
        grid(head30, V3, {"replicas": ["two"]})
    with pytest.raises(GraphsimError, match="grid.mapping"):
        grid(head30, V3, {"mapping": ["tp4-xx2"]})


def _counting(monkeypatch) -> list:
    """The points a local grid computes (each simulate() call it makes)."""
    calls: list = []
    real = grid_mod.simulate

    def counted(trace, dep, **kw):
        calls.append(dep.replicas)
        return real(trace, dep, **kw)

    monkeypatch.setattr(grid_mod, "simulate", counted)
    return calls


def test_resume_skips_finished_points_and_recomputes_stale_ones(head30, tmp_path, monkeypatch):
    out = tmp_path / "grid.parquet"
    calls = _counting(monkeypatch)
    first = grid(head30, V3, {"replicas": [1, 2]}, output=out, validate=0)
    assert len(calls) == 2 and first.attrs["grid"]["computed"] == 2
    pd.testing.assert_frame_equal(pd.read_parquet(out), first)
    parts = sorted((tmp_path / "grid.parquet.parts").glob("*.json"))
    assert len(parts) == 2 and all(Path(str(p) + ".sum").is_file() for p in parts)

    calls.clear()  # a rerun: nothing computed, the same table
    again = grid(head30, V3, {"replicas": [1, 2]}, output=out, validate=0)
    assert calls == [] and again.attrs["grid"]["reused"] == 2
    pd.testing.assert_frame_equal(again, first)

    calls.clear()  # a grown grid computes only its new point
    grown = grid(head30, V3, {"replicas": [1, 2, 3]}, output=out, validate=0)
    assert calls == [3]
    pd.testing.assert_frame_equal(grown.iloc[:2], first)

    calls.clear()  # an edited part is never trusted: that point alone is recomputed
    row = json.loads(parts[0].read_text())
    parts[0].write_text(json.dumps({**row, "ttft_p50_ms": 1e9}))
    grid(head30, V3, {"replicas": [1, 2]}, output=out, validate=0)
    assert len(calls) == 1

    calls.clear()  # an input every point shares changed (the SLA, the trace): every point is recomputed
    res = grid(head30, V3, {"replicas": [1, 2]}, output=out, validate=0, sla=gs.serving.SLA(ttft_ms=200))
    assert len(calls) == 2 and [why for _, why in res.attrs["grid"]["stale"]] == ["settings changed"] * 2
    assert (res.goodput_fraction < first.goodput_fraction).all()
    calls.clear()
    res = grid(load_trace(EXCERPT).head(31), V3, {"replicas": [1, 2]}, output=out, validate=0,
               sla=gs.serving.SLA(ttft_ms=200))
    assert len(calls) == 2 and {why for _, why in res.attrs["grid"]["stale"]} == {"trace changed"}

    calls.clear()  # resume=False starts over
    grid(head30, V3, {"replicas": [1, 2]}, output=out, validate=0, resume=False)
    assert len(calls) == 2


def test_every_input_enters_the_digests_a_part_is_sealed_with(head30):
    from graphsim.serving.grid import input_digests

    base = input_digests(head30, V3, {})
    assert base == input_digests(load_trace(EXCERPT).head(30), Deployment("deepseek-v3", "gb200",
                                                                           gs.ParallelMapping(tp=8, ep=8)), {})
    changed = {
        "model": input_digests(head30, attrs.evolve(V3, model="deepseek-v4.1-flash"), {}),
        "hw": input_digests(head30, attrs.evolve(V3, hw="gb300"), {}),
        "trace": input_digests(head30.scale_rate(2.0), V3, {}),
        "acceptance": input_digests(head30, attrs.evolve(V3, policies=gs.Policies(acceptance=(0.7,))), {}),
        "reserve": input_digests(head30, attrs.evolve(V3, reserve_gib=4.0), {}),
        "seed": input_digests(head30, V3, {"seed": 1}),
        "prices": input_digests(head30, V3, {"prices": {"disk": 1e-4}}),
    }
    for what, d in changed.items():
        assert d != base, what
    assert changed["model"]["model"] != base["model"] and changed["hw"]["hw"] != base["hw"]
    assert changed["trace"]["trace"] != base["trace"] and changed["seed"]["settings"] != base["settings"]
    # a loaded model / hardware object: its state, the same for the same files
    loaded = attrs.evolve(V3, model=gs.load_model("deepseek-v3"), hw=gs.load_hw("gb200"))
    assert input_digests(head30, loaded, {}) == input_digests(
        head30, attrs.evolve(V3, model=gs.load_model("deepseek-v3"), hw=gs.load_hw("gb200")), {})


def test_a_second_grid_on_the_same_output_is_refused(head30, tmp_path):
    from graphsim.core.outputs import exclusive

    out = tmp_path / "grid.csv"
    with exclusive(out):
        with pytest.raises(GraphsimError, match="being written by another graphsim run"):
            grid(head30, V3, {"replicas": [1]}, output=out, validate=0)


def test_processes_give_the_local_table(head30, tmp_path):
    axes = {"replicas": [1, 2]}  # two points on two spawned workers
    local = grid(head30, V3, axes, validate=8)
    procs = grid(head30, V3, axes, executor="processes", jobs=2, output=tmp_path / "grid.csv", validate=8)
    pd.testing.assert_frame_equal(procs, local)
    back = pd.read_csv(tmp_path / "grid.csv")
    assert back.columns.tolist() == local.columns.tolist() and back.error.isna().all()
    metrics = ["replicas", *grid_mod.METRICS]
    pd.testing.assert_frame_equal(back[metrics], local[metrics], check_dtype=False, rtol=1e-15)


class DiesInWorker(FixedSteps):
    """Fixed steps that end the process running them unless it is the test's own (a worker killed mid-point)."""

    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.parent = os.getpid()

    def step(self, *args, **kw):
        if os.getpid() != self.parent:
            os._exit(1)
        return super().step(*args, **kw)


def test_a_dead_worker_is_an_error_row_that_is_not_a_part(head30, tmp_path):
    out = tmp_path / "grid.parquet"
    df = grid(head30, V3, {"replicas": [1, 2]}, executor="processes", jobs=2, output=out, validate=0,
              steps=DiesInWorker(0.01))
    assert (df.error_field == "executor").all() and df.error.str.contains("died").all()
    assert list((tmp_path / "grid.parquet.parts").glob("*.json")) == []  # a rerun retries them
    # one worker for three points: each death is its point's row, and a fresh worker takes the next
    df = grid(head30, V3, {"replicas": [1, 2, 3]}, executor="processes", jobs=1, validate=0, steps=DiesInWorker(0.01))
    assert (df.error_field == "executor").all()
    # the same steps in this process run
    assert grid(head30, V3, {"replicas": [1]}, validate=0, steps=DiesInWorker(0.01)).served.iloc[0] == 30


@pytest.mark.slow
def test_ray_gives_the_local_table(head30, tmp_path, ray_local):
    axes = {"mapping": ["tp8-dp1-ep8-pp1", "tp3-dp1-ep1-pp1"]}  # a point and a refused one
    local = grid(head30, V3, axes, validate=0)
    pd.testing.assert_frame_equal(grid(head30, V3, axes, executor="ray", validate=0), local)
    pd.testing.assert_frame_equal(grid(head30, V3, axes, executor="ray", output=tmp_path / "g.parquet",
                                       validate=0), local)


def _cli(*args):
    from graphsim.cli import main

    return main([str(a) for a in args])


def test_cli_names_the_grid_axes_and_executors():
    from graphsim.cli import serve as cmd_serve

    assert cmd_serve.GRID_AXES == tuple(grid_mod.AXES) and grid_mod.EXECUTORS == ("local", "processes", "ray")


def test_cli_grid_round_trip(tmp_path, capsys):
    out = tmp_path / "grid.csv"
    args = ["serve-sim", "--model", "deepseek-v3", "--hw", "gb200", "--tp", "8", "--ep", "8", "--trace", EXCERPT,
            "--head", "30", "--validate", "0", "--no-progress", "--view", "sol",
            "--grid", "mapping=tp8-dp1-ep8-pp1,tp3-dp1-ep1-pp1", "--grid", "cache-design=hbm,host-disk", "-o", out]
    assert _cli(*args) == 0
    text = capsys.readouterr().out
    assert "4 points: 4 computed, 0 reused" in text and "error: mapping.tp: 3 does not divide" in text
    df = pd.read_csv(out)
    assert df[["mapping", "cache_design"]].values.tolist() == [
        ["tp8-dp1-ep8-pp1", "hbm"], ["tp8-dp1-ep8-pp1", "host-disk"], ["tp3-dp1-ep1-pp1", "hbm"],
        ["tp3-dp1-ep1-pp1", "host-disk"]]
    # the CLI's rows are the library's
    lib = grid(load_trace(EXCERPT).head(30), V3, {"mapping": ["tp8-dp1-ep8-pp1"], "cache_design": ["hbm"]},
               validate=0)
    assert df.ttft_p99_ms.iloc[0] == pytest.approx(lib.ttft_p99_ms.iloc[0], rel=1e-12)
    assert _cli(*args) == 0
    assert "4 points: 0 computed, 4 reused" in capsys.readouterr().out
    assert _cli(*args, "--fresh") == 0
    assert "4 computed" in capsys.readouterr().out
    # a grid needs a table to write, and one simulation's outputs do not apply
    assert _cli(*args[:-2]) == 2
    assert "-o FILE.parquet" in capsys.readouterr().err
    assert _cli(*args, "--json") == 2
    assert "--json" in capsys.readouterr().err
