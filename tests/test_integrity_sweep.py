"""Content identity of sweep parts (issue 26): a resumed sweep reuses a part only while every input it was
computed from — model config, hardware and profile TOML, measured tables — has the same content, and only
while the part's bytes match its checksum; anything else is recomputed, and the run says why."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from graphsim.driver import identity
from graphsim.views.measured.schema import measured_digest
from graphsim.sweep import read_results, run

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "data" / "measured"
TRT = "trtllm@1.3.0rc20"


@pytest.fixture()
def files(tmp_path):
    cfg = tmp_path / "v3" / "config.json"
    cfg.parent.mkdir()
    shutil.copy(ROOT / "graphsim" / "configs" / "deepseek-v3.json", cfg)
    hw = tmp_path / "mygpu.toml"
    shutil.copy(ROOT / "hw" / "data" / "gb200.toml", hw)
    meas = tmp_path / "measured"
    shutil.copytree(FIX, meas)
    return cfg, hw, meas


def spec(cfg, hw, meas=None):
    s = {"name": "edit", "structure": {"model": [str(cfg), "deepseek-v3"], "hw": [str(hw), "gb300"],
                                       "mapping": {"tp": 4, "ep": 4}, "requests": "decode"},
         "axes": {"decode.count": [8, 64], "decode.context": [1024, 4096]}}
    if meas is not None:
        s["structure"].update(model="deepseek-v3", hw="gb200", view=["sol", "hybrid"], measured=str(meas),
                              backend=TRT)
    return s


def forward(df, **where):
    sel = pd.Series(True, index=df.index)
    for k, v in where.items():
        sel &= df[k] == v
    return df[sel].sort_values("point")["forward_s"].to_numpy()


def test_editing_a_hardware_file_recomputes_exactly_its_parts(files, tmp_path):
    cfg, hw, _ = files
    out = tmp_path / "r.parquet"
    r1 = run(spec(cfg, hw), out)
    assert r1.structural_points == 4 and r1.skipped == 0
    before = read_results(out)
    text = hw.read_text()
    assert "hbm_bw = 8e12" in text
    hw.write_text(text.replace("hbm_bw = 8e12", "hbm_bw = 4e12"))  # in place: same name, half the bandwidth
    r2 = run(spec(cfg, hw), out)
    assert r2.skipped == 2  # the gb300 points
    assert sorted(why for _, why in r2.recomputed) == ["the hardware file changed"] * 2
    after = read_results(out)
    for m in (str(cfg), "deepseek-v3"):
        old, new = forward(before, model=m, hw=str(hw)), forward(after, model=m, hw=str(hw))
        assert (new > old).all()  # decode at half the HBM bandwidth is slower: the new file was used
        assert (forward(after, model=m, hw="gb300") == forward(before, model=m, hw="gb300")).all()
    assert before["hw_digest"].nunique() == 2 and after["hw_digest"].nunique() == 2
    changed = after["hw"] == str(hw)
    assert set(after.loc[changed, "hw_digest"]).isdisjoint(set(before.loc[before["hw"] == str(hw), "hw_digest"]))
    assert (after["struct_id"].to_numpy() == before["struct_id"].to_numpy()).all()  # found by name, trusted by content


def test_editing_a_config_recomputes_its_parts_only(files, tmp_path, capsys):
    import json

    cfg, hw, _ = files
    out = tmp_path / "r.parquet"
    run(spec(cfg, hw), out)
    before = read_results(out)
    d = json.loads(cfg.read_text())
    d["num_hidden_layers"] = d["num_hidden_layers"] - 30  # a smaller model under the same path
    cfg.write_text(json.dumps(d))
    from graphsim.cli import main

    spec_file = tmp_path / "s.json"
    spec_file.write_text(json.dumps(spec(cfg, hw)))
    assert main(["sweep", str(spec_file), "-o", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert text.count("the model config changed") == 2 and "(2 already done" in text
    after = read_results(out)
    for h in (str(hw), "gb300"):
        assert (forward(after, model=str(cfg), hw=h) < forward(before, model=str(cfg), hw=h)).all()
        assert (forward(after, model="deepseek-v3", hw=h) == forward(before, model="deepseek-v3", hw=h)).all()


def test_editing_a_measured_table_recomputes_the_measured_view_only(files, tmp_path):
    _, _, meas = files
    out = tmp_path / "r.parquet"
    r1 = run(spec(None, None, meas), out)
    assert r1.structural_points == 2 and r1.point_errors == 0
    before = read_results(out)
    gemm = next(meas.glob(f"gb200/gemm/{TRT}/*.parquet"))
    t = pq.read_table(gemm).to_pandas()
    t["latency_s"] *= 3.0  # every GEMM three times slower
    t.to_parquet(gemm, index=False)
    r2 = run(spec(None, None, meas), out)
    assert r2.skipped == 1 and [why for _, why in r2.recomputed] == ["the measured tables changed"]
    after = read_results(out)
    assert (forward(after, view="hybrid") > forward(before, view="hybrid")).all()
    assert (forward(after, view="sol") == forward(before, view="sol")).all()


def test_a_damaged_or_edited_part_is_recomputed_never_trusted(files, tmp_path):
    cfg, hw, _ = files
    out = tmp_path / "r.parquet"
    run(spec(cfg, hw), out)
    good = read_results(out)
    parts = sorted((tmp_path / "r.parquet.parts").glob("*.parquet"))
    assert len(parts) == 4 and all(p.with_name(p.name + ".sum").is_file() for p in parts)
    # an edited number: a valid Parquet file with another forward time
    t = pq.read_table(parts[0]).to_pandas()
    t["forward_s"] = 1e-9
    t.to_parquet(parts[0], index=False)
    # damaged bytes; and a part whose checksum sidecar is gone
    raw = bytearray(parts[1].read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    parts[1].write_bytes(bytes(raw))
    parts[2].with_name(parts[2].name + ".sum").unlink()
    r = run(spec(cfg, hw), out)
    assert r.skipped == 1
    whys = sorted(why for _, why in r.recomputed)
    assert whys == ["its bytes changed since it was written (damaged or edited)"] * 2 + [
        "no valid checksum (written by an older graphsim, or interrupted)"]
    pd.testing.assert_frame_equal(read_results(out), good)


def test_input_digest_api(files):
    cfg, hw, meas = files
    d = identity.input_digest(model=str(cfg), hw=str(hw), profile="practitioner")
    assert set(d) == {"model", "hw", "profile", "graphsim"}  # measured tables: their layout's own digest, below
    assert d["model"] == identity.model_digest("deepseek-v3")  # same content, another name: same digest
    assert d["hw"] == identity.toml_digest("gb200")
    assert identity.input_digest(hw="nope-gpu")["hw"].startswith("missing:")
    hw.write_text(hw.read_text() + "\n# a comment\n")
    assert identity.toml_digest(str(hw)) != d["hw"]  # the bytes the loader reads
    assert measured_digest(meas, "h200") != measured_digest(meas, "gb200")


def test_seal_and_verify_any_cached_file(tmp_path):
    # the API search / serve-sim caches use: a JSON cache entry sealed beside itself
    entry = tmp_path / "k.json"
    entry.write_text('{"ttft_s": 0.07}')
    d = {"model": "a", "hw": "b"}
    assert identity.verify(entry, d) == "no valid checksum (written by an older graphsim, or interrupted)"
    identity.seal(entry, d)
    assert identity.verify(entry, d) is None
    assert identity.verify(entry, {**d, "hw": "c"}) == "the hardware file changed"
    entry.write_text('{"ttft_s": NaN}')
    assert identity.verify(entry, d) == "its bytes changed since it was written (damaged or edited)"
    identity.discard(entry)
    assert not list(tmp_path.iterdir())
