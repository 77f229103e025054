"""Issue 26 for `graphsim search`: a resumed search never serves a stale or damaged program, and every output is
locked and written through the checked writer (regressions for the issue's reproducers)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from graphsim.cli import main
from graphsim.views.measured.view import ViewSpec
from graphsim.core.outputs import exclusive
from graphsim.serving.search import SLA, Space, Traffic, search

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "data" / "measured"
TRAFFIC = Traffic.of(4000, 1000)
SPACE = Space(tp=(4,), ep=(4,), batches=(8, 64), prefill_batches=(1,), modes=("agg",), refine=0)


def _run(cache, view=None):
    return search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=SPACE, view=view,
                  cache_dir=cache)


def test_edited_measured_tables_are_not_served_from_the_cache(tmp_path):
    """The reproducer: `search` reused programs built on old tables after the tables were edited in place
    (TTFT 69 ms vs 672 ms with --fresh). The view names a folder; its content is part of every program's key."""
    tables = tmp_path / "tables"
    shutil.copytree(FIX, tables)
    view = ViewSpec("hybrid", str(tables), "trtllm@1.3.0rc20")
    a = _run(tmp_path / "parts", view)
    assert a.stats["programs_compiled"] > 0 and _run(tmp_path / "parts", view).stats["programs_compiled"] == 0
    f = next(p for p in sorted(tables.rglob("*.parquet")) if "/gb200/gemm/trtllm@" in p.as_posix())
    df = pd.read_parquet(f)
    df["latency_s"] *= 10.0  # every GEMM of the backend ten times slower
    df.to_parquet(f, index=False)
    c = _run(tmp_path / "parts", view)
    assert c.stats["programs_cached"] == 0 and c.stats["programs_compiled"] == a.stats["programs_compiled"]
    fresh = _run(None, view)
    cols = ["mapping", "decode_batch", "tpot_ms", "ttft_ms"]
    assert c.table[cols].equals(fresh.table[cols]) and not c.table[cols].equals(a.table[cols])


@pytest.mark.parametrize("damage,kind", [("nan", "decode"), ("nan", "mixed"), ("edit", "decode"),
                                         ("checksum", "mixed")])
def test_a_damaged_or_edited_cache_entry_is_recomputed(tmp_path, damage, kind):
    """An edited number inside a cache part was used silently; a NaN crashed the search. Entries carry a
    checksum (<entry>.sum) and hold finite times (a SOL search runs every step: no NaN in any kind of program):
    anything else is recomputed, and the rows are the fresh ones."""
    a = _run(tmp_path)
    entries = sorted(tmp_path.glob("*.json"))
    assert entries and all(p.with_name(p.name + ".sum").is_file() for p in entries)
    victim = next(p for p in entries if json.loads(p.read_text())["kind"] == kind)
    d = json.loads(victim.read_text())
    if damage == "checksum":  # a plausible edit, resealed by nobody: the checksum catches it
        d["forward_s"] = (np.asarray(d["forward_s"]) * 0.5).tolist()
        victim.write_text(json.dumps(d))
    else:  # the checksum made to match (an edit that also rewrote the sidecar): the values are checked too
        from graphsim.driver.identity import part_checksum

        d["forward_s"] = [float("nan") if damage == "nan" else -1.0 for _ in np.ravel(d["forward_s"])]
        victim.write_text(json.dumps(d))
        side = victim.with_name(victim.name + ".sum")
        meta = json.loads(side.read_text())
        meta["sha256"] = part_checksum(victim)
        side.write_text(json.dumps(meta))
    b = _run(tmp_path)
    assert b.stats["programs_compiled"] == 1 and b.stats["programs_cached"] == a.stats["programs_compiled"] - 1
    cols = ["mapping", "decode_batch", "tpot_ms", "ttft_ms"]
    assert b.table[cols].equals(a.table[cols])


RESEALED = {  # found by the search fuzz family: each was trusted under a matching checksum
    "negative batch": ("decode", lambda d: d.update(batch=[-2.0] * len(d["batch"]))),  # ranked negative tok/s/GPU
    "no tokens emitted": ("decode", lambda d: d.update(emitted=[0.0] * len(d["emitted"]))),  # TPOT = inf
    "huge verify": ("decode", lambda d: d.update(verify=[1e300] * len(d["verify"]))),  # OverflowError
    "1-D mixed program": ("mixed", lambda d: d.update(forward_s=[r[0] for r in d["forward_s"]])),  # IndexError
    "huge prompts": ("mixed", lambda d: d.update(prompts=[1e300] * len(d["prompts"]))),  # OverflowError
    "another kind": ("mixed", lambda d: d.update(kind="decode")),
}


@pytest.mark.parametrize("damage", sorted(RESEALED))
def test_a_resealed_entry_this_search_could_not_have_written_is_recomputed(tmp_path, damage):
    """A checksum vouches for bytes, not sense: an entry edited and resealed is judged by what every evaluated
    program satisfies (its kind; one row per batch, a mixed program 2-D; whole batches >= 1; 1 <= emitted <=
    1 + verify; 0 <= prompts <= batch x emitted) and recomputed when it fails."""
    from graphsim.driver.identity import part_checksum

    a = _run(tmp_path)
    kind, edit = RESEALED[damage]
    victim = next(p for p in sorted(tmp_path.glob("*.json")) if json.loads(p.read_text())["kind"] == kind)
    d = json.loads(victim.read_text())
    edit(d)
    victim.write_text(json.dumps(d))
    side = victim.with_name(victim.name + ".sum")
    side.write_text(json.dumps({**json.loads(side.read_text()), "sha256": part_checksum(victim)}))
    b = _run(tmp_path)
    assert b.stats["programs_compiled"] == 1 and b.stats["programs_cached"] == a.stats["programs_compiled"] - 1
    cols = ["mapping", "decode_batch", "tpot_ms", "ttft_ms", "tokens_per_s_per_gpu"]
    assert b.table[cols].equals(a.table[cols])


ARGS = ["search", "--model", "deepseek-v3", "--hw", "gb200", "--gpus", "8", "--isl", "4000", "--osl", "1000",
        "--tp", "4", "--ep", "4", "--batch", "8", "--modes", "agg", "--refine", "0", "--no-plot"]


def test_a_second_search_writing_the_same_output_fails_at_once(tmp_path, capsys):
    """Two concurrent `search -o same.parquet` both printed "wrote" and the first run's rows were lost: the
    output is held under the sweeps' exclusive lock, so the second run is a one-line error before any work."""
    out = tmp_path / "same.parquet"
    with exclusive(out):  # another run holds it
        assert main([*ARGS, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output:" in err[0] and "being written by another graphsim run" in err[0]
    assert not out.exists()
    assert main([*ARGS, "-o", str(out)]) == 0 and len(pd.read_parquet(out)) > 0


def test_search_into_an_unwritable_place_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    for bad in (tmp_path / "afile" / "x.parquet", "/dev/full", "/dev/null"):
        assert main([*ARGS, "-o", str(bad)]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("graphsim: error: output"), err


@pytest.mark.parametrize("entry", ["kept", "missing"])
def test_a_folder_in_place_of_a_cache_checksum_is_one_line(tmp_path, capsys, entry):
    """Found by the search fuzz family: a folder named like an entry's ``.sum`` sidecar crashed the search
    (IsADirectoryError, exit 3) whether the entry was there (discarding it) or not (sealing the recomputed one).
    It is one line naming the output; --fresh clears the cache and the same search runs."""
    out = tmp_path / "t.parquet"
    assert main([*ARGS, "-o", str(out)]) == 0
    parts = Path(str(out) + ".parts")
    victim = sorted(parts.glob("*.json"))[0]
    side = victim.with_name(victim.name + ".sum")
    side.unlink()
    side.mkdir()
    if entry == "missing":
        victim.unlink()
    capsys.readouterr()
    assert main([*ARGS, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphsim: error: output: cannot ") and side.name in err[0], err
    assert main([*ARGS, "-o", str(out), "--fresh"]) == 0 and not side.is_dir()


@pytest.mark.slow
def test_ray_executor_gives_the_local_search(ray_local):
    """Issue 30 item 6: `search --executor ray` (a local Ray instance) ranks the same rows as the local search."""
    local = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=SPACE)
    remote = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=SPACE,
                    executor="ray")
    cols = ["mode", "mapping", "policies", "decode_batch", "ttft_ms", "tpot_ms", "tokens_per_s_per_gpu"]
    assert remote.table[cols].equals(local.table[cols]) and remote.stats["programs_compiled"] > 0
    assert [b["mapping"] for b in remote.best] == [b["mapping"] for b in local.best]
