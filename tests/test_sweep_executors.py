"""Sweep executors: the processes executor against the local one (tables, parts, resume, progress, a dying
worker), program reuse between structural points, lazy grids and streaming merges."""
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graphsim.core.errors import GraphsimError
from graphsim.sweep import SweepSpec, _Programs, read_results, run, structural_tables
from graphsim.sweep.executors import _by_program
from graphsim.sweep.results import _merge

#: 12 structural points, 6 programs (profile shares one), a structural error (tp3), point errors (count -1)
SPEC = {"name": "exec", "chunk": 4,
        "structure": {"model": "deepseek-v3", "hw": ["gb200", "gb300"], "mapping": [{"tp": 4, "ep": 4}, {"tp": 3},
                                                                                    {"dp": 8, "ep": 8}],
                      "profile": ["sol", "practitioner"]},
        "axes": {"decode.count": [8, 64, -1], "decode.context": [1024, 4096, 65536]}}


@pytest.fixture(scope="module")
def local():
    return run(SPEC).to_pandas()


def test_processes_executor_matches_local_in_memory(local):
    seen = []
    r = run(SPEC, executor="processes", jobs=2, progress=lambda done, total: seen.append((done, total)))
    pd.testing.assert_frame_equal(r.to_pandas(), local)
    assert r.structural_points == 12 and r.structural_errors == 4
    total = 12 * 9
    assert seen[-1] == (total, total) and all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))


def test_processes_executor_parts_merge_and_resume(tmp_path, local):
    out = tmp_path / "r.parquet"
    r = run(SPEC, out, executor="processes", jobs=2)
    pd.testing.assert_frame_equal(read_results(out), local)
    parts = out.with_name(out.name + ".parts")
    ids = local["struct_id"].unique()  # each part with its checksum sidecar (graphsim.driver.identity)
    assert sorted(p.name for p in parts.iterdir()) == sorted([f"{k}.parquet" for k in ids]
                                                             + [f"{k}.parquet.sum" for k in ids])
    assert r.rows == len(local) and r.skipped == 0
    first = local["struct_id"].iloc[0]
    (parts / f"{first}.parquet").unlink()
    r2 = run(SPEC, out, executor="processes", jobs=2)
    assert r2.skipped == 11  # only the missing part ran again
    pd.testing.assert_frame_equal(read_results(out), local)
    local_out = tmp_path / "l.parquet"
    run(SPEC, local_out)
    assert pq.read_schema(local_out).equals(pq.read_schema(out))
    pd.testing.assert_frame_equal(read_results(local_out), read_results(out))


def _die_on_first_gb300(spec, sp, key, parts):  # a task whose process dies (run in a spawned worker)
    from graphsim.sweep.processes import _task

    if sp.hw == "gb300" and sp.profile == "SOL" and dict(sp.mapping)["tp"] == 4:
        os._exit(3)
    return _task(spec, sp, key, parts)


def test_a_dying_worker_is_an_error_row_and_the_sweep_goes_on(tmp_path, local):
    from graphsim.sweep.processes import run_processes

    from graphsim.sweep.executors import _seal

    spec = SweepSpec.from_dict(SPEC)
    points = [sp.with_inputs() for sp in spec.structural_points()]  # as run() gives them: with input digests
    keys = [sp.key(spec) for sp in points]
    by_key = dict(zip(keys, points))
    parts = tmp_path / "r.parquet.parts"
    parts.mkdir()
    extra, advanced = {}, []
    run_processes(spec, _by_program(list(zip(points, keys))), 2, parts, extra, advanced.append,
                  task=_die_on_first_gb300, sealed=lambda k: _seal(parts, k, by_key[k]))
    assert sum(advanced) == 12 * 9  # the progress covers every point, the dead one's too
    (dead,) = extra
    assert not (parts / f"{dead}.parquet").exists() and len(list(parts.glob("*.parquet"))) == 11  # the others completed
    row = extra[dead][0].to_pylist()[0]
    assert row["error_field"] == "executor" and "died" in row["error"] and row["point"] is None
    assert row["hw"] == "gb300" and row["profile"] == "SOL" and row["tp"] == 4
    out = tmp_path / "r.parquet"
    rows, struct_errors, _ = _merge(out, parts, keys, [a.name for a in spec.axes], extra)
    df = read_results(out)
    assert rows == len(df) == len(local) - 9 + 1 and struct_errors == 5
    keep = local["struct_id"] != dead
    pd.testing.assert_frame_equal(df[df["struct_id"] != dead].reset_index(drop=True),
                                  local[keep].reset_index(drop=True), check_dtype=False)
    r = run(SPEC, out, executor="processes", jobs=2)  # the next run retries only the dead point's program
    assert r.skipped == 11
    pd.testing.assert_frame_equal(read_results(out), local)


def test_jobs_is_validated_and_cli_runs_processes(tmp_path, capsys):
    from graphsim.cli import main

    with pytest.raises(GraphsimError, match="jobs"):
        run(SPEC, executor="processes", jobs=0)
    with pytest.raises(GraphsimError, match="executor"):
        run(SPEC, executor="threads")
    spec = tmp_path / "s.toml"
    spec.write_text('name = "cli"\n[structure]\nmodel = "deepseek-v3"\nmapping = [{tp = 4, ep = 4}, {tp = 3}]\n'
                    '[axes]\n"decode.count" = [8, 64]\n"decode.context" = [1024, 8192]\n')
    out = tmp_path / "r.parquet"
    assert main(["sweep", str(spec), "-o", str(out), "--executor", "processes", "--jobs", "2", "--no-progress"]) == 0
    assert "1 structural errors" in capsys.readouterr().out
    assert len(read_results(out)) == 5
    assert main(["sweep", str(spec), "-o", str(out), "--jobs", "0"]) == 2
    assert "jobs: must be an integer >= 1" in capsys.readouterr().err


# ---- program reuse between structural points --------------------------------------------------------

def test_points_sharing_a_program_run_together_and_failures_compile_once(monkeypatch):
    import graphsim

    spec = SweepSpec.from_dict(SPEC)
    pts = spec.structural_points()
    todo = [(sp, str(i)) for i, sp in enumerate(pts)]
    shuffled = todo[1::2] + todo[::2]
    grouped = _by_program(shuffled)
    keys = [(sp.model, sp.hw, sp.mapping) for sp, _ in grouped]
    assert sorted(grouped, key=lambda t: t[1]) == sorted(todo, key=lambda t: t[1])
    assert all(keys.index(k) == i or keys[i - 1] == k for i, k in enumerate(keys))  # each program one run

    calls = []
    real = graphsim.compile_plan
    monkeypatch.setattr(graphsim, "compile_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    programs = _Programs()
    for sp, _ in todo:
        for _t in structural_tables(spec, sp, programs):
            pass
    assert len(calls) == 6  # one per program, the failing tp3 ones included
    assert len(programs.weights) == 4  # resident weights computed once per (good) program


# ---- bounded memory: lazy grids, streaming merges ---------------------------------------------------

def test_grid_is_chunked_and_lazy():
    spec = SweepSpec.from_dict({"name": "big", "chunk": 64,
                                "structure": {"model": "deepseek-v3", "mapping": {"tp": 4, "ep": 4}},
                                "axes": {"decode.count": {"start": 1, "stop": 1000, "num": 1000},
                                         "decode.context": {"start": 1024, "stop": 1024000, "num": 1000},
                                         "hw.hbm_bw": {"start": 4e12, "stop": 16e12, "num": 1000}}})
    sp = spec.structural_points()[0]
    grid = spec.grid(sp.kinds)
    assert grid.size == 10**9
    tail = grid.take(grid.size - 3, grid.size)
    np.testing.assert_array_equal(tail["hw.hbm_bw"][0], [997, 998, 999])
    assert (tail["decode.count"][1] == 1000).all()
    tables = structural_tables(spec, sp)
    first = next(tables)  # the first chunk of a billion points, without building the rest
    assert first.num_rows == 64 and first.column("point").to_pylist() == list(range(64))
    tables.close()


def test_merge_streams_row_groups_in_spec_order_with_extra_rows(tmp_path):
    parts = tmp_path / "p"
    parts.mkdir()
    axes = ["x"]

    def table(key, lo, hi):
        return pa.table({"struct_id": [key] * (hi - lo), "point": pa.array(range(lo, hi), pa.int64()),
                         "x": np.arange(lo, hi, dtype=float), "error": pa.nulls(hi - lo, pa.string())})

    for key in ("a", "c"):
        with pq.ParquetWriter(parts / f"{key}.parquet", table(key, 0, 1).schema) as w:
            for lo in range(0, 10, 3):
                w.write_table(table(key, lo, min(lo + 3, 10)))
    extra = {"b": [pa.table({"struct_id": ["b"], "point": pa.nulls(1, pa.int64()), "error": ["died"]})]}
    out = tmp_path / "m.parquet"
    assert _merge(out, parts, ["c", "b", "a", "c"], axes, extra) == (21, 1, 0)
    got = pq.read_table(out)
    assert got.column("struct_id").to_pylist() == ["c"] * 10 + ["b"] + ["a"] * 10
    assert pq.ParquetFile(out).num_row_groups == 9  # one per part row group: nothing concatenated in memory


def test_a_sweep_in_fast_precision_stays_within_1e_5_and_bad_precision_is_refused():
    base = {"name": "p", "outputs": ["stages"],
            "structure": {"model": "deepseek-v4.1-flash", "hw": "gb300", "mapping": {"tp": 4, "ep": 4},
                          "requests": "decode", "policies": {"overlap": ["none", "two-batch"]}},
            "axes": {"decode.count": [1, 7, 64, 512], "decode.context": {"start": 1024, "stop": 1 << 20, "num": 1200,
                                                                          "scale": "log"}}}
    exact = run(base).to_pandas()
    fast = run({**base, "precision": "fast"}).to_pandas()
    assert len(exact) == len(fast) == 2 * 4 * 1200  # 4,800 points per program: the JAX route
    for col in ("forward_s", "itl_s"):
        np.testing.assert_allclose(fast[col], exact[col], rtol=1e-5)
    assert not np.array_equal(fast["forward_s"], exact["forward_s"])  # it did run in float32
    with pytest.raises(GraphsimError, match="precision"):
        SweepSpec.from_dict({**base, "precision": "half"})
