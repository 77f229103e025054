"""The reproducers of issue 26 (integrity), each as a regression test: exit 0 with a sane result, or exit 2 with
one line naming the field. (Search's are in tests/test_search.py.)"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import graphsim as gs
from graphsim.cli import main
from graphsim.core.errors import GraphsimError
from graphsim.views.fpm.fit import FPMModel, fit
from graphsim.core.outputs import exclusive, locked_output, safe_name

from test_fpm import _synthetic  # samples of a real plan identity with known ratios

ROOT = Path(__file__).resolve().parents[1]


def _cli(argv, capsys):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str, field: str) -> None:
    assert err.count("\n") == 1 and err.startswith(f"graphsim: error: {field}"), err


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    p = tmp_path_factory.mktemp("cfg") / "micro-llama.json"
    p.write_text(json.dumps({
        "model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "hidden_act": "silu", "max_position_embeddings": 1024, "tie_word_embeddings": False}))
    return str(p)


@pytest.fixture(scope="module")
def fpm_model(micro, tmp_path_factory):
    d = tmp_path_factory.mktemp("fpm")
    df = _synthetic(micro, ratio_of=lambda v, b, c: 3.0)
    df.to_parquet(d / "train.parquet", index=False)
    model = fit(df)
    model.save(d / "m.fpm")
    return d


def _estimate_fpm(micro, path, capsys, request="decode:200x3"):
    return _cli(["estimate", "--model", micro, "--hw", "gb200", "--request", request, "--view", "fpm",
                 "--fpm", path, "--json"], capsys)


# ---- FPM model files --------------------------------------------------------------------------------

MUTATIONS = [
    (lambda d: d["partitions"][0]["curves"]["decode"].pop("coef"), "fpm.partitions[0].curves.decode.coef"),
    (lambda d: d["partitions"][0]["curves"]["decode"].update(coef="x"), "fpm.partitions[0].curves.decode.coef"),
    (lambda d: d["partitions"][0]["curves"]["decode"].update(coef=[1.0]), "fpm.partitions[0].curves.decode.coef"),
    (lambda d: d["partitions"][0]["curves"]["decode"]["lo"].append(1.0), "fpm.partitions[0].curves.decode.lo"),
    (lambda d: d["partitions"][0]["curves"]["decode"].update(coords=["nope"]),
     "fpm.partitions[0].curves.decode.coords"),
    (lambda d: d["partitions"][0]["curves"]["decode"].update(n=-1), "fpm.partitions[0].curves.decode.n"),
    (lambda d: d["partitions"][0]["identity"].pop("device"), "fpm.partitions[0].identity.device"),
    (lambda d: d["partitions"][0]["identity"].update(mtp="1"), "fpm.partitions[0].identity.mtp"),
    (lambda d: d["partitions"][0].update(curves={"weird": {}}), "fpm.partitions[0].curves"),
    (lambda d: d["partitions"][0].update(failures={"oom": -3}), "fpm.partitions[0].failures"),
    (lambda d: d.update(partitions=[]), "fpm.partitions"),
    (lambda d: d.update(partitions={"a": 1}), "fpm.partitions"),
    (lambda d: d["partitions"][0]["curves"]["decode"]["coef"].__setitem__(0, 1e6),
     "fpm.partitions[0].curves.decode.coef"),  # a billion-fold ratio to SOL (exp overflow before)
]


@pytest.mark.parametrize("mutate,field", MUTATIONS)
def test_a_mutated_fpm_model_is_one_line_naming_the_field(fpm_model, micro, tmp_path, capsys, mutate, field):
    d = json.loads((fpm_model / "m.fpm").read_text())
    mutate(d)
    bad = tmp_path / "bad.fpm"
    bad.write_text(json.dumps(d))
    with pytest.raises(GraphsimError) as e:
        FPMModel.load(bad)
    assert e.value.field == field and "bad.fpm" in str(e.value)
    rc, _, err = _estimate_fpm(micro, bad, capsys)
    assert rc == 2
    _one_line(err, field)


def test_an_fpm_model_with_nan_text_is_refused(fpm_model, tmp_path):
    text = (fpm_model / "m.fpm").read_text()
    d = json.loads(text)
    d["partitions"][0]["curves"]["decode"]["coef"][0] = "NAN"
    bad = tmp_path / "nan.fpm"
    bad.write_text(json.dumps(d).replace('"NAN"', "NaN"))
    with pytest.raises(GraphsimError, match="nan.fpm"):
        FPMModel.load(bad)


def test_a_negative_intercept_never_gives_a_forward_below_sol(fpm_model, micro, tmp_path, capsys):
    # before: an intercept of -1000 gave forward_s 0.0 and exit 0; no forward beats its SOL
    d = json.loads((fpm_model / "m.fpm").read_text())
    d["partitions"][0]["curves"]["decode"]["coef"][0] = -1000.0
    neg = tmp_path / "neg.fpm"
    neg.write_text(json.dumps(d))
    rc, out, err = _estimate_fpm(micro, neg, capsys)
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["forward_s"] > 0 and rep["forward_s"] == pytest.approx(rep["fpm"]["sol_forward_s"], rel=1e-12)


def test_the_fpm_view_is_never_below_sol(fpm_model, micro, capsys):
    for request in ("decode:200x3", "decode:1000x64", "decode:10x1"):
        rc, out, err = _estimate_fpm(micro, fpm_model / "m.fpm", capsys, request)
        assert rc == 0, err
        rep = json.loads(out)
        assert rep["forward_s"] >= rep["fpm"]["sol_forward_s"] > 0


# ---- FPM samples and fit outputs ---------------------------------------------------------------------

@pytest.mark.parametrize("value", [1.5, "two", -1])
def test_samples_with_a_non_integer_mtp_column(micro, tmp_path, capsys, value):
    df = _synthetic(micro)
    df["mtp"] = value
    p = tmp_path / "s.parquet"
    df.to_parquet(p, index=False)
    rc, _, err = _cli(["fpm", "fit", p, "-o", tmp_path / "m.fpm"], capsys)
    assert rc == 2
    _one_line(err, "s.parquet.mtp")
    assert not (tmp_path / "m.fpm").exists()


def test_fpm_fit_into_a_directory_a_device_or_an_unwritable_place(fpm_model, tmp_path, capsys):
    samples = fpm_model / "train.parquet"
    targets = [tmp_path, "/dev/null"]
    if Path("/dev/full").exists():
        targets.append("/dev/full")
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:  # root writes anywhere
        ro.chmod(0o500)
        targets.append(ro / "m.fpm")
    for target in targets:
        rc, _, err = _cli(["fpm", "fit", samples, "-o", target], capsys)
        assert rc == 2, target
        _one_line(err, "output")
    rc, out, err = _cli(["fpm", "fit", samples, "-o", tmp_path / "new" / "dir" / "m.fpm"], capsys)
    assert rc == 0, err  # a missing folder is created
    assert FPMModel.load(tmp_path / "new" / "dir" / "m.fpm").partitions


def test_fpm_fit_refuses_a_second_writer(fpm_model, tmp_path, capsys):
    target = tmp_path / "m.fpm"
    with exclusive(target):  # another run holds the output
        rc, _, err = _cli(["fpm", "fit", fpm_model / "train.parquet", "-o", target], capsys)
    assert rc == 2 and "being written by another graphsim run" in err
    _one_line(err, "output")


# ---- sweep specs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["requests", "model", "hw", "mapping", "profile"])
def test_a_sweep_spec_with_an_empty_list(tmp_path, capsys, key):
    spec = {"name": "e", "structure": {"model": "deepseek-v3", "requests": "decode", key: []},
            "axes": {"decode.context": [1024]}}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(spec))
    rc, _, err = _cli(["sweep", p, "-o", tmp_path / "r.parquet", "--no-progress"], capsys)
    assert rc == 2
    _one_line(err, f"structure.{key}")


# ---- plot ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("res")
    spec = {"name": "p", "structure": {"model": "deepseek-v3", "mapping": {"tp": 4, "ep": 4}},
            "axes": {"decode.count": [8, 64], "decode.context": [1024, 4096]}}
    gs.sweep.run(spec, d / "r.parquet")
    return d / "r.parquet"


def test_plot_where_with_deep_nesting_is_one_line(results, tmp_path, capsys):
    where = "(" * 300 + "decode.count == 8" + ")" * 300
    rc, _, err = _cli(["plot", results, "--kind", "latency", "--where", where, "-o", tmp_path / "p.png"], capsys)
    assert rc == 2
    _one_line(err, "where")
    where = "not " * 300 + "decode.count == 8"
    rc, _, err = _cli(["plot", results, "--kind", "latency", "--where", where, "-o", tmp_path / "p.png"], capsys)
    assert rc == 2
    _one_line(err, "where")
    # a few levels are fine
    where = "((not (decode.count == 8)))"
    rc, _, err = _cli(["plot", results, "--kind", "latency", "--where", where, "-o", tmp_path / "p.png"], capsys)
    assert rc == 0, err


def test_plot_where_matching_nothing_is_an_error_naming_the_filter(results, tmp_path, capsys):
    rc, _, err = _cli(["plot", results, "--kind", "latency", "--where", "decode.count == 7", "-o",
                       tmp_path / "p.png"], capsys)
    assert rc == 2 and "decode.count == 7" in err and "selects none" in err
    _one_line(err, "where")
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
def test_plot_to_a_device_is_refused_before_work(results, tmp_path, capsys, device):
    if not Path(device).exists():
        pytest.skip(f"no {device}")
    for argv in (["plot", results, "--kind", "latency", "-o", device],
                 ["plot", "--kind", "roofline", "--model", "deepseek-v3", "--request", "decode:1024x8", "-o", device]):
        rc, out, err = _cli(argv, capsys)
        assert rc == 2 and "wrote" not in out
        _one_line(err, "output")
    assert not Path(device + ".png").exists()


def test_plot_into_a_missing_folder_creates_it(results, tmp_path, capsys):
    target = tmp_path / "a" / "b" / "p.png"
    rc, out, err = _cli(["plot", results, "--kind", "latency", "-o", target], capsys)
    assert rc == 0, err
    assert target.stat().st_size > 0


# ---- names from inputs never form paths ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["..", ".", "../../x", "/abs/x", "/tmp", "a/b", "a\\b", "a\x00b", "", ".hidden",
                                  "x" * 200, "tab\there"])
def test_safe_name_refuses_what_would_leave_the_folder(name):
    with pytest.raises(GraphsimError) as e:
        safe_name(name, "hw.name")
    assert e.value.field == "hw.name"


def test_safe_name_keeps_ordinary_names():
    for name in ("gb200", "GB300 NVL72", "jax@0.4.35", "trtllm@1.3.0rc20", "h100-sxm_80gb"):
        assert safe_name(name, "x") == name


@pytest.mark.parametrize("name", ["../../x", "/abs/x", "a/b"])
def test_collect_ops_with_a_path_as_hardware_name_writes_nothing(tmp_path, capsys, name):
    toml = (ROOT / "hw" / "data" / "gb200.toml").read_text()
    hw = tmp_path / "evil.toml"
    hw.write_text(toml.replace('name = "GB200"', f"name = {json.dumps(name)}"))
    out = tmp_path / "deep" / "er" / "tables"
    before = set(tmp_path.rglob("*"))
    rc, _, err = _cli(["collect", "ops", "--hw", hw, "--quick", "--family", "copy", "-o", out], capsys)
    assert rc == 2
    _one_line(err, "hw.name")
    assert set(tmp_path.rglob("*")) == before  # nothing written, inside or outside -o


def test_collect_ops_into_a_file_or_a_device_is_one_line(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for target in (f, "/dev/null"):
        rc, _, err = _cli(["collect", "ops", "--hw", "gb200", "--quick", "--family", "copy", "-o", target], capsys)
        assert rc == 2
        _one_line(err, "output")


def test_locked_output_is_one_lock_for_every_writer(tmp_path):
    target = tmp_path / "o.parquet"
    with locked_output(target, suffixes=(".parquet",)) as p:
        assert p == target
        with pytest.raises(GraphsimError, match="being written by another graphsim run"):
            with locked_output(target):
                pass
    with locked_output(target):  # released
        pass
    with pytest.raises(GraphsimError) as e:
        with locked_output("/dev/null"):
            pass
    assert e.value.field == "output"


# ---- measured stores -----------------------------------------------------------------------------------

def _gemm_table(tmp_path):
    from graphsim.views.measured.store import read_partitions

    src = next((ROOT / "tests" / "data" / "measured" / "gb200" / "gemm").rglob("*.parquet"))
    df = pd.read_parquet(src)
    assert read_partitions(src)
    return df


@pytest.mark.parametrize("column,value,field", [
    ("m", 1.5, "gemm.parquet.m"),
    ("m", -1, "gemm.parquet.m"),
    ("latency_s", np.nan, "gemm.parquet.latency_s"),
    ("latency_s", -1e-6, "gemm.parquet.latency_s"),
    ("latency_s", "fast", "gemm.parquet.latency_s"),
    ("framework", 3, "gemm.parquet.framework"),
    ("family", "nope", "gemm.parquet.family"),
])
def test_a_measured_table_is_checked_field_by_field(tmp_path, column, value, field):
    from graphsim.views.measured.store import read_partitions

    df = _gemm_table(tmp_path)
    df[column] = value
    p = tmp_path / "gemm.parquet"
    df.to_parquet(p, index=False)
    with pytest.raises(GraphsimError) as e:
        read_partitions(p, tmp_path)
    assert e.value.field == field
