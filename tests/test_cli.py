"""The CLI: readable output, --json keys, and one-line errors with a non-zero exit (no traceback)."""
import json
import subprocess
import sys

import pytest

from graphsim.cli import main


def run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_estimate_json_keys(capsys):
    rc, out, _ = run(["estimate", "--model", "deepseek-v3", "--hw", "gb200", "--tp", "4", "--ep", "4",
                      "--request", "decode:4096x64", "--request", "prefill:2048", "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["schema_version"] == 1 and d["command"] == "estimate"
    for k in ("forward_s", "stages", "critical_path", "op_kinds", "memory", "tokens"):
        assert k in d
    assert d["forward_s"] > 0 and d["tokens"]["decode_tokens"] == 64 and d["tokens"]["prefill_tokens"] == 2048


def test_estimate_text(capsys):
    rc, out, _ = run(["estimate", "--model", "llama-3.1-70b", "--hw", "h200", "--tp", "8", "--request", "decode:2048x32"], capsys)
    assert rc == 0 and "ITL" in out and "critical path" in out


@pytest.mark.parametrize("args,field", [
    (["--model", "nope", "--request", "decode:1"], "model"),
    (["--model", "deepseek-v3", "--hw", "tpu9", "--request", "decode:1"], "hw"),
    (["--model", "deepseek-v3", "--tp", "3", "--request", "decode:1"], "mapping.tp"),
    (["--model", "deepseek-v3", "--dp", "6", "--ep", "6", "--request", "decode:1"], "mapping.ep"),
    (["--model", "deepseek-v3", "--request", "decode:-4"], "request.length"),
    (["--model", "deepseek-v3", "--request", "decode4096"], "request"),
    (["--model", "deepseek-v3", "--request", "prefill:100@100"], "request.cached"),
])
def test_bad_input_one_line(args, field, capsys):
    rc, out, err = run(["estimate", *args], capsys)
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"error: {field}" in err


def test_config_missing_field(tmp_path, capsys):
    cfg = json.loads(open(str(__import__("graphsim.core.config", fromlist=["x"])._CONFIGS / "deepseek-v3.json")).read())
    del cfg["kv_lora_rank"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    rc, _, err = run(["estimate", "--model", str(p), "--request", "decode:10"], capsys)
    assert rc == 2 and "kv_lora_rank" in err


def test_console_script_no_traceback():
    r = subprocess.run([sys.executable, "-m", "graphsim.cli.app", "estimate", "--model", "deepseek-v3", "--tp", "5",
                        "--request", "decode:1"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "mapping.tp" in r.stderr


def test_hw_list_and_show(capsys):
    rc, out, _ = run(["hw", "list"], capsys)
    assert rc == 0 and all(n in out for n in ("gb200", "gb300", "b200", "h200", "h100", "h800"))
    rc, out, _ = run(["hw", "show", "gb300"], capsys)
    assert rc == 0 and "hbm_bw" in out


def test_graph_dot(tmp_path, capsys):
    out = tmp_path / "g.dot"
    rc, _, _ = run(["graph", "--model", "deepseek-v3", "--request", "decode:100x4", "-o", str(out)], capsys)
    assert rc == 0
    text = out.read_text()
    assert text.startswith("digraph") and "cluster_stage_" in text and "layer 60" in text


def test_estimate_chunked_prefill(capsys):
    # chunked prefill: one forward per chunk, decode requests ride along; TTFT = sum of the steps
    rc = main(["estimate", "--model", "deepseek-v4.1-flash", "--request", "prefill:1000", "--request", "decode:4096x8",
               "--chunk", "256", "--decoder-replay", "sglang", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(d["steps"]) == 4
    assert d["steps"][3]["requests"] == ["prefill:1000@768:hbm", "decode:4096x8"]  # earlier chunks stay in HBM
    assert abs(d["ttft_s"] - sum(s["forward_s"] for s in d["steps"])) < 1e-12


def test_dspark_report_counts_expected_emitted_tokens(capsys):
    # a=[.9,.8,.7,.6,.5], k=3: E[emitted] = 1 + .9 + .72 + .504 = 3.124 (graphsim.models.dspark bonus convention);
    # ITL is the step time over E[emitted], never the verify step itself
    rc = main(["estimate", "--model", "deepseek-v4.1-flash", "--tp", "4", "--ep", "4", "--request", "decode:8192x64v3",
               "--dspark", "on", "--acceptance", "0.9,0.8,0.7,0.6,0.5", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert d["tokens"]["decode_tokens"] == pytest.approx(64 * 3.124)
    assert d["tokens"]["itl_s"] == pytest.approx(d["forward_s"] / 3.124)
    rc = main(["estimate", "--model", "deepseek-v4.1-flash", "--request", "decode:8192x64v3", "--dspark", "on"])
    assert rc == 2 and "policies.acceptance" in capsys.readouterr().err


@pytest.mark.parametrize("args,field", [
    (["--model", "deepseek-v3", "--request", "prefill:100", "--decoder-replay", "sglang"], "policies.decoder_replay"),
    (["--model", "llama-3.1-70b", "--request", "decode:100", "--dspark", "on"], "policies.dspark"),
    (["--model", "deepseek-v4.1-flash", "--request", "decode:100", "--dspark", "on", "--ep", "192", "--dp", "192"],
     "mapping.ep"),  # 192 divides the 384 trunk experts but not the drafter's 128
    (["--model", "deepseek-v4.1-flash", "--request", "decode:100v6", "--dspark", "on", "--acceptance", "1,1,1,1,1"],
     "request.new"),
])
def test_unsupported_policies_are_rejected(args, field, capsys):
    rc = main(["estimate", *args])
    assert rc == 2 and f"error: {field}" in capsys.readouterr().err


def test_chunked_prefill_with_an_image_larger_than_a_chunk(capsys):
    # 2,000 text + 475 image tokens in chunks of 256: the ViT runs in step 0; image tokens spread over 2 steps
    from graphsim.driver.ledger import chunk_prefill
    from graphsim.core.plan import Request

    steps = chunk_prefill(Request.parse("prefill:2000+img:1024x768"), 256)
    assert [s.image_tokens for s in steps[:3]] == [256, 219, 0] and sum(s.new_tokens for s in steps) == 2475
    assert [s.image_patches > 0 for s in steps[:2]] == [True, False]
    rc = main(["estimate", "--model", "deepseek-v4.1-flash", "--request", "prefill:2000+img:1024x768", "--chunk", "256",
               "--view", "sol", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(d["steps"]) == 10
    # the ViT runs in the first step only (its patches); later steps project only their own image tokens
    vision = [sum(s["busy_s"] for s in st["stages"] if s["stage"] == "vision") for st in d["steps"]]
    assert vision[0] > 0 and vision[1] < 0.01 * vision[0] and vision[2] == 0.0


def test_chunked_steps_are_one_program_that_matches_step_by_step_plans(capsys):
    """All chunk steps evaluate as points of one program; a prompt that has finished is a group with count 0,
    which runs nothing and reads no weights ('active' features) — the same times as compiling every step's
    own plan."""
    import graphsim as gs
    from graphsim.driver.ledger import chunk_prefill

    reqs = ["prefill:1000", "prefill:300@100", "decode:4096x8"]
    rc = main(["estimate", "--model", "deepseek-v3", "--tp", "2", "--chunk", "256", "--view", "sol", "--json"]
              + [x for r in reqs for x in ("--request", r)])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(d["steps"]) == 4
    a, b = (chunk_prefill(gs.Request.parse(r), 256) for r in reqs[:2])
    for i, step in enumerate(d["steps"]):
        plan = gs.Plan([p[i] for p in (a, b) if i < len(p)] + [reqs[2]], gs.ParallelMapping(tp=2))
        want = gs.compile_plan("deepseek-v3", plan, "gb200").report().forward_s
        assert step["forward_s"] == pytest.approx(want, rel=1e-9), i
    assert d["ttft_s"] == pytest.approx(sum(s["forward_s"] for s in d["steps"]))


def test_chunk_steps_are_bounded():
    rc = main(["estimate", "--model", "deepseek-v3", "--chunk", "1", "--request", "prefill:100000"])
    assert rc == 2


def test_layers_and_memory_take_model_as_a_flag_like_every_command(capsys):
    # issue 16: --model everywhere; the positional MODEL stays as an alias; both at once must agree
    assert main(["layers", "--model", "deepseek-v4.1-flash", "--json"]) == 0
    by_flag = capsys.readouterr().out
    assert main(["layers", "deepseek-v4.1-flash", "--json"]) == 0
    assert capsys.readouterr().out == by_flag
    assert main(["memory", "--model", "deepseek-v3", "--context", "4096", "--json"]) == 0
    capsys.readouterr()
    assert main(["memory", "deepseek-v3", "--model", "llama-3.1-70b", "--context", "4096"]) == 2
    assert "model: given twice" in capsys.readouterr().err
    assert main(["layers"]) == 2
    assert "model: required" in capsys.readouterr().err


def test_estimate_writes_its_report_to_a_file(tmp_path, capsys):
    # issue 16: -o FILE on a command that prints a result; the file holds what stdout would have
    args = ["estimate", "--model", "deepseek-v3", "--request", "decode:4096x8", "--json"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    out = tmp_path / "r.json"
    assert main([*args, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} (JSON)"
    assert json.loads(out.read_text()) == printed


@pytest.mark.parametrize("args", [
    ["hw", "list"],
    ["hw", "show", "gb300", "--json"],
    ["models"],
    ["layers", "--model", "deepseek-v4.1-flash"],
    ["memory", "--model", "deepseek-v3", "--context", "4096", "--json"],
    ["fit", "--model", "llama-3.1-70b", "--hw", "h200", "--tp", "4", "--context", "8192"],
    ["ledger", "--model", "deepseek-v4.1-flash", "--request", "prefill:300", "--request", "decode:8192x4"],
    ["disagg", "--model", "deepseek-v3", "--isl", "1024", "--osl", "128", "--prefill", "tp=4", "--decode", "tp=4",
     "--json"],
    ["estimate", "--model", "deepseek-v3", "--request", "prefill:600", "--chunk", "256"],
])
def test_every_result_can_go_to_a_file(args, tmp_path, capsys):
    # issue 16: -o FILE on every command that prints a result: the file holds exactly what stdout would have
    assert main(args) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "result.out"
    assert main([*args, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} ({'JSON' if '--json' in args else 'text'})"
    assert out.read_text() == printed
    # issue 26: a missing folder is created; a place no folder can be made (under a regular file) is one line
    deep = tmp_path / "no" / "such" / "dir" / "x"
    assert main([*args, "-o", str(deep)]) == 0 and deep.read_text() == printed
    capsys.readouterr()
    (tmp_path / "afile").write_text("")
    assert main([*args, "-o", str(tmp_path / "afile" / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphsim: error: output:")


def test_an_svg_without_graphviz_is_one_line_before_any_note(tmp_path, capsys, monkeypatch):
    """Found by the fuzz campaign (cli family): a graph too large for a full SVG printed its collapse note, then
    the missing-graphviz error — two lines. The binary is checked before the work."""
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    rc = main(["graph", "--model", "deepseek-v4.1-flash", "--hw", "gb200", "--request", "prefill:1000", "-o",
               str(tmp_path / "out.svg")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("graphsim: error: output: an SVG needs the graphviz")
    assert not (tmp_path / "out.svg").exists()
