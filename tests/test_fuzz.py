"""Fuzzing in the suite: every family of malformed (and well-formed) input ends in a result that is sane or in
one line that names a field — never a traceback, never silent nonsense. The budget is small in CI
(GRAPHSIM_FUZZ_EXAMPLES, default 8 per family: seconds); the isolated campaign with hangs and
memory is tests/fuzz/campaign.py. Property tests hold what any result must satisfy; the issue's reproducers
stay as regression tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphsim as gs
from fuzz import strategies as S
from fuzz import targets as T
from graphsim.cli import main

EXAMPLES = int(os.environ.get("GRAPHSIM_FUZZ_EXAMPLES", "8"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
GOOD = ("ok", "error")


@FUZZ
@given(S.api_case())
def test_fuzz_api(case):
    outcome, detail = T.run_api(case)
    assert outcome in GOOD, (case, detail)


@FUZZ
@given(S.cli_case())
def test_fuzz_cli(case):
    outcome, detail = T.run_cli(case["argv"], case["files"])
    assert outcome in GOOD, (case, detail)


@FUZZ
@given(S.config_case())
def test_fuzz_config(case):
    outcome, detail = T.run_config(*case)
    assert outcome in GOOD, (case[1] if not isinstance(case[1], dict) else case[0], detail)


@FUZZ
@given(st.one_of(S.toml_text("hw").map(lambda t: ("hw", t)), S.toml_text("profile").map(lambda t: ("profile", t))))
def test_fuzz_toml(case):
    outcome, detail = T.run_toml(*case)
    assert outcome in GOOD, (case, detail)


@FUZZ
@given(st.one_of(S.sweep_spec().map(lambda s: (s, None, ".json")), S.sweep_text().map(lambda t: (None, *t))))
def test_fuzz_sweep(case):
    outcome, detail = T.run_sweep(*case)
    assert outcome in GOOD, (case, detail)


@settings(FUZZ, max_examples=max(2, EXAMPLES // 2))
@given(S.serve_sim_case())
def test_fuzz_serve_sim(case):
    outcome, detail = T.run_serve_sim(case)
    assert outcome in GOOD, (case, detail)


def test_serve_sim_target_catches_what_it_should(monkeypatch):
    """The serve_sim target is not blind: a document whose cache beats the trace's own reuse, whose counts do not
    add up or whose percentile is negative is nonsense, and a one-line "internal error" is a crash."""
    doc = {"schema_version": 1, "command": "serve-sim", "requests": {"total": 3, "served": 2, "rejected": 1},
           "latency": {"ttft_ms": {"p50": 1.0, "p90": None, "p99": 2.0, "mean": 1.5}}, "classes": [],
           "checks": {"littles_law": {"relative_error": 0.0}}, "cache": {"hit_ratio": 0.2, "trace_prefix_reuse": 0.3}}
    assert T._serve_doc(doc) is None
    for path, value, says in ((("cache", "hit_ratio"), 0.31, "hit_ratio"), (("requests", "rejected"), 0, "total"),
                              (("latency", "ttft_ms", "p50"), -1.0, "p50"),
                              (("checks", "littles_law", "relative_error"), 0.5, "littles_law")):
        bad = json.loads(json.dumps(doc))
        d = bad
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
        assert says in (T._serve_doc(bad) or ""), (path, value)
    stuck = "serve_sim: replica 0 is stuck (an internal error: please report it)"
    monkeypatch.setattr(T, "_cli_capture", lambda argv: ("error", stuck, ""))
    assert T.run_serve_sim({"argv": ["serve-sim"], "files": {}})[0] == "crash"


# ---- properties any result satisfies ----------------------------------------------------------------

PROPERTY = settings(max_examples=max(EXAMPLES // 2, 4), deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@PROPERTY
@given(model=st.sampled_from(S.MODELS), ctx=st.integers(1, 100_000), batch=st.integers(1, 64))
def test_time_is_finite_positive_and_monotone(model, ctx, batch):
    """Forward time is finite and > 0, never shrinks with more requests or a longer context, and the
    vectorized kernel equals the reference report."""
    c = gs.compile_plan(model, gs.Plan([f"decode:{ctx}x{batch}"], gs.ParallelMapping(tp=4)), "gb200")
    wl = gs.Workload(("decode",), [[batch], [batch + 7], [batch]], [[1], [1], [1]], [[ctx], [ctx], [ctx + 999]])
    f = c.evaluate(wl)["forward"]
    assert np.all(np.isfinite(f)) and np.all(f > 0)
    assert f[1] >= f[0] and f[2] >= f[0]
    assert f[0] == pytest.approx(c.report().forward_s, rel=1e-9)


@PROPERTY
@given(model=st.sampled_from(S.MODELS), n=st.integers(0, 300_000), d=st.integers(0, 5000))
def test_kv_capacity_is_monotone(model, n, d):
    """KV held for one request never decreases as its context grows (compressor state is a per-request
    buffer, not the pending rows), for every model."""
    m = gs.load_model(model)
    assert m.kv_bytes(n + d) >= m.kv_bytes(n) >= 0


@PROPERTY
@given(n=st.integers(1, 200_000), replay=st.sampled_from(["off", "sglang", "paper"]))
def test_replay_never_changes_resident_bytes(n, replay):
    pol = gs.Policies(decoder_replay=replay)
    c = gs.compile_plan("deepseek-v4.1-flash", gs.Plan([f"prefill:{n}"], gs.ParallelMapping(tp=4), pol), "gb200")
    base = gs.compile_plan("deepseek-v4.1-flash", gs.Plan([f"prefill:{n}"], gs.ParallelMapping(tp=4)), "gb200")
    assert c.graph.weight_bytes() == base.graph.weight_bytes()
    assert c.report().memory["weights_total_gib"] == base.report().memory["weights_total_gib"]


# ---- the reproducers ----------------------------------------------------------------------------

def _cli(args, capsys):
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("args,field", [
    (["estimate", "--model", "deepseek-v3", "--request", "decode:9007199254740993", "--json"], "request.length"),
    (["estimate", "--model", "deepseek-v3", "--request", "decode:4294967296"], "request.length"),
    (["estimate", "--model", "deepseek-v3", "--request", "decode:200000"], "request.length"),  # > 163,840
    (["estimate", "--model", "deepseek-v3", "--chunk", "1", "--request", "prefill:100000"], "chunk"),
    (["estimate", "--model", "deepseek-v3", "--ep-imbalance", "inf", "--request", "decode:8"], "policies.ep_imbalance"),
    (["fit", "--model", "deepseek-v3", "--reserve-gib", "inf", "--json"], "reserve_gib"),
    (["estimate", "--model", "x" * 300, "--request", "decode:8"], "model"),
    (["estimate", "--model", "deepseek-v3", "--dp", "9" * 200, "--request", "decode:8"], "mapping.dp"),
    (["estimate", "--model", "deepseek-v3", "--tp", "x", "--request", "decode:8"], "tp"),
    (["bogus"], "command"),
])
def test_bad_input_is_one_line_naming_the_field(args, field, capsys):
    rc, out, err = _cli(args, capsys)
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"graphsim: error: {field}:"), err


def test_beyond_context_what_if_is_allowed_and_recorded(capsys):
    rc, out, err = _cli(["estimate", "--model", "deepseek-v3", "--beyond-context", "--request", "decode:200000",
                         "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["identity"]["policies"]["beyond_context"] == "allow"


def test_v4_flash_fits_under_pipeline_parallelism(capsys):
    rc, out, err = _cli(["fit", "--model", "deepseek-v4-flash", "--pp", "2", "--json"], capsys)
    assert rc == 0, err
    assert all(r["kv_bytes"] >= 0 for r in json.loads(out)["results"])


def test_v4_flash_kv_capacity_monotone_at_the_hca_boundary():
    m = gs.load_model("deepseek-v4-flash")
    assert m.kv_bytes(128) >= m.kv_bytes(127)  # was 3.95 MiB at 128 vs 14.43 MiB at 127


@pytest.mark.parametrize("content,name", [("[]", "c.json"), (b"\xff\xfe{", "c.json"), ("{", "c.json")])
def test_bad_config_files(tmp_path, content, name, capsys):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    rc, out, err = _cli(["estimate", "--model", str(p), "--request", "decode:8"], capsys)
    assert rc == 2 and err.startswith("graphsim: error: model:"), err


def test_configs_with_runaway_or_negative_sizes_are_refused():
    from graphsim.core.config import load_config

    v41 = load_config("deepseek-v4.1-flash")
    big = json.loads(json.dumps(v41))
    big["text_config"]["engram_max_ngram_size"] = 10**9
    with pytest.raises(gs.GraphsimError, match="engram_max_ngram_size"):
        gs.load_model(big)
    v3 = load_config("deepseek-v3")
    for key, value in (("num_hidden_layers", 61_000), ("hidden_size", -7168), ("vocab_size", 0)):
        with pytest.raises(gs.GraphsimError, match=key):
            gs.load_model({**v3, key: value})


@pytest.mark.parametrize("text,ext", [("a: [1, 2\n", ".yaml"), ("- a\n- b\n", ".yaml"), ("x = [", ".toml"),
                                      (b"\xff\xfe", ".json"), ("[1, 2]", ".json")])
def test_bad_sweep_spec_files(tmp_path, text, ext, capsys):
    p = tmp_path / f"s{ext}"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    rc, out, err = _cli(["sweep", str(p), "-o", str(tmp_path / "r.parquet")], capsys)
    assert rc == 2 and err.startswith("graphsim: error: spec:"), err


@pytest.mark.parametrize("ext", [".yaml", ".json"])
def test_sweep_spec_with_a_lone_surrogate_escape(tmp_path, capsys, ext):
    # found by the fuzz run: JSON/YAML admit "\udbbe", which no Parquet column or terminal can write
    p = tmp_path / f"s{ext}"
    p.write_text('{"name": "fz", "structure": {"model": "deepseek-v3", "hw": "x\\udbbe", "requests": "decode"}, '
                 '"axes": {"decode.context": [1024]}}')
    rc, _, err = _cli(["sweep", str(p), "-o", str(tmp_path / "r.parquet")], capsys)
    assert rc == 2 and err.startswith("graphsim: error: spec.structure.hw:") and "surrogate" in err, err


@pytest.mark.parametrize("target", ["{dir}", "/dev/full", "/dev/null", "{dir}/file/x.dot"])
def test_outputs_that_cannot_be_written(tmp_path, target, capsys):
    if target.startswith("/dev/") and not Path(target).exists():
        pytest.skip(f"no {target} on this system")
    (tmp_path / "file").write_text("x")  # a file where a folder is needed
    out = target.replace("{dir}", str(tmp_path))
    rc, _, err = _cli(["graph", "--model", "llama-3.1-70b", "--request", "decode:8", "-o", out], capsys)
    assert rc == 2 and err.startswith("graphsim: error: output:"), err


def test_an_output_in_a_missing_folder_creates_it(tmp_path, capsys):
    out = tmp_path / "missing" / "x.dot"
    rc, _, err = _cli(["graph", "--model", "llama-3.1-70b", "--request", "decode:8", "-o", str(out)], capsys)
    assert rc == 0, err
    assert out.read_text().startswith("digraph")


def test_sweep_point_with_an_out_of_range_mapping_is_reported_not_a_crash(tmp_path):
    # found by the 20,000-input run: a structural error row could not store an int beyond int64
    import graphsim as gs
    import graphsim.sweep  # noqa: F401

    spec = {"name": "fz", "structure": {"model": "deepseek-v4-flash", "hw": "h100", "requests": "decode",
                                        "mapping": {"ep": -(2**70), "pp": 44}},
            "axes": {"decode.count": [1], "decode.context": [100]}}
    df = gs.sweep.run(spec, tmp_path / "r.parquet").to_pandas()
    assert len(df) == 1 and df["error_field"].iloc[0] == "mapping.ep"
    assert "must lie in" in df["error"].iloc[0]


def test_sweep_to_a_device_is_refused_and_leaves_it_a_device(tmp_path, capsys):
    # a sweep's resumable Parquet (parts, lock, atomic rename) cannot go to a device: before the fix the
    # rename replaced /dev/full itself with a regular file
    import stat

    dev = Path("/dev/full")
    if not dev.exists() or not stat.S_ISCHR(dev.stat().st_mode):
        pytest.skip("no /dev/full character device on this system")
    spec = Path(__file__).parents[1] / "examples" / "sweep_spec.toml"
    rc, _, err = _cli(["sweep", str(spec), "-o", str(dev)], capsys)
    assert rc == 2 and err.startswith("graphsim: error: output: /dev/full is a device"), err
    assert stat.S_ISCHR(dev.stat().st_mode)
    assert not Path("/dev/full.lock").exists() and not Path("/dev/full.parts").exists()


@pytest.mark.parametrize("kind,field", [("memory", "kind"), ("latency", "kind"), ("pareto", "x")])
def test_plots_of_tables_without_their_columns(tmp_path, capsys, kind, field):
    # found by the fuzz run: a memory plot of a results table without memory columns was a KeyError
    res = tmp_path / "r.csv"
    res.write_text("mapping,decode.count\ntp4,8\ntp4,64\n" if kind != "memory" else S.RESULTS_CSV)
    rc, _, err = _cli(["plot", str(res), "--kind", kind, "-o", str(tmp_path / "p.png")], capsys)
    assert rc == 2 and err.startswith(f"graphsim: error: {field}:") and "lacks" in err, err


def test_plot_where_is_a_filter_not_code(tmp_path, capsys):
    res = tmp_path / "r.csv"
    res.write_text(S.RESULTS_CSV)
    pwned = tmp_path / "pwned"
    for where in (f"@df.to_pickle('{pwned}')", f"__import__('os').system('touch {pwned}')"):
        rc, _, err = _cli(["plot", str(res), "--kind", "latency", "-o", str(tmp_path / "p.png"), "--where", where],
                          capsys)
        assert rc == 2 and err.startswith("graphsim: error: where:"), err
    assert not pwned.exists()
    rc, _, err = _cli(["plot", str(res), "--kind", "latency", "-o", str(tmp_path / "p.png"), "--x", "decode.context",
                       "--where", "decode.count == 8 and mapping == 'tp4'"], capsys)
    assert rc == 0, err


def test_filter_grammar():
    import pandas as pd

    from graphsim.exports.filters import apply_filter

    df = pd.DataFrame({"a": [1, 2, 3], "b.c": ["x", "y", "x"], "ok": [True, False, True]})
    assert list(apply_filter(df, "a >= 2 and `b.c` == 'x'")["a"]) == [3]
    assert list(apply_filter(df, "not (a == 1 or a == 2)")["a"]) == [3]
    assert list(apply_filter(df, "b.c in ['y', 'z'] or ok == false")["a"]) == [2]
    for bad in ("a >", "a == 1 junk", "d == 1", "a.b()", "a == [1]"):
        with pytest.raises(gs.GraphsimError, match="where"):
            apply_filter(df, bad)


def test_internal_errors_say_so_and_debug_shows_the_traceback(monkeypatch, capsys):
    import graphsim.cli.app as cli

    def boom(a):
        raise ZeroDivisionError("x")

    monkeypatch.setattr(cli, "cmd_models", boom)
    rc, _, err = _cli(["models"], capsys)
    assert rc == 3 and err.startswith("graphsim: internal error: ZeroDivisionError") and "--debug" in err
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "models"])


def test_module_entry_points_know_every_command():
    for mod in ("graphsim", "graphsim.cli.app"):
        r = subprocess.run([sys.executable, "-m", mod, "sweep", "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "spec" in r.stdout, (mod, r.stderr)
    r = subprocess.run([sys.executable, "-m", "graphsim", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("graphsim ")


def test_two_sweeps_on_one_output(tmp_path):
    """A second sweep on the same -o fails at once with one line; the first completes; nothing is lost."""
    from graphsim.core.outputs import exclusive

    out = tmp_path / "r.parquet"
    spec = {"name": "t", "structure": {"model": "llama-3.1-70b", "requests": "decode"},
            "axes": {"decode.count": [1, 8], "decode.context": [1024, 4096]}}
    started, release = threading.Event(), threading.Event()

    def holder():
        with exclusive(out):
            started.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    started.wait(30)
    try:
        with pytest.raises(gs.GraphsimError, match="output: .* is being written by another graphsim run"):
            gs.sweep.run(spec, out)
    finally:
        release.set()
        t.join()
    r = gs.sweep.run(spec, out)  # the lock is free again: this run completes
    assert r.rows == 4 and len(gs.sweep.read_results(out)) == 4
