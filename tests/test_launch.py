"""Launch output (graphsim.serving.launch; docs/search.md "Launch flags"): every emitted flag is a row of its engine's
table, every emitted combination meets the table's constraints, the TensorRT-LLM YAML parses with its keys, and
``--launch-dir`` writes what the JSON carries. Rows are built by hand (no search) except the CLI round trip."""
import itertools
import shlex
import types

import pytest

import graphsim as gs
from graphsim.serving.search import Traffic, launch_flags
from graphsim.serving.engines import ENGINES as TERMS
from graphsim.serving.launch import TABLES, TRTLLM, VERSIONS, is_moe, launch_files, to_yaml, write_launch_dir

yaml = pytest.importorskip("yaml")


@pytest.fixture(scope="module")
def models():
    from graphsim.models import load_model

    return {"moe": load_model("deepseek-v3"), "dense": load_model("llama-3.1-70b")}


def _row(mode, dmap, pmap=None, overlap="none", mtp=0, fp8=False, batch=64, replicas=1):
    pol = gs.Policies(overlap=overlap, mtp=mtp, acceptance=(0.8,) * mtp,
                      attention_precision="fp8" if fp8 else "auto")
    return {"mode": mode, "_dmap": dmap, "_pmap": pmap or dmap, "decode_batch": batch, "prefill_batch": 2,
            "prefill_replicas": replicas, "decode_replicas": replicas, "_policies": pol, "_prefill_policies": pol}


def _commands(launch, engine):
    """(pool role, argv) for every command the engine's output carries: pools, router, benchmark."""
    out = []
    for cmd in launch[engine]:
        head, body = cmd.split("\n", 1)
        out.append((head[2:].split(":", 1)[0], shlex.split(body)))
    for what in ("router", "benchmark"):
        c = launch[what].get(engine)
        if c:
            out.append((what, shlex.split(c)))
    return out


def _table_flags(engine):
    """The flags and command heads an engine's table documents: each row's flag, and the flags its constraint names
    (a router or benchmark row lists the arguments it takes)."""
    import re

    out = set()
    for f in TABLES[engine]:
        out.add(f.flag)
        out.update(re.findall(r"(?<![\w-])--?[a-z][\w-]*", f.constraint))
    return out


def _flags(argv):
    return [a for a in argv if a.startswith("-")]


def _yaml_keys(d, prefix=""):
    for k, v in d.items():
        yield prefix + k
        if isinstance(v, dict):
            yield from _yaml_keys(v, prefix + k + ".")


MOE_MAPS = [gs.ParallelMapping(tp=1, dp=8, ep=8), gs.ParallelMapping(tp=1, dp=8, ep=4),
            gs.ParallelMapping(tp=8, dp=1, ep=8), gs.ParallelMapping(tp=8, dp=1, ep=1),
            gs.ParallelMapping(tp=2, dp=4, ep=8), gs.ParallelMapping(tp=4, dp=2, ep=2),
            gs.ParallelMapping(tp=1, dp=4, ep=4, pp=2), gs.ParallelMapping(tp=1, dp=1, ep=1, cp=2)]
DENSE_MAPS = [gs.ParallelMapping(tp=4), gs.ParallelMapping(tp=8), gs.ParallelMapping(tp=2, dp=4),
              gs.ParallelMapping(tp=4, pp=2)]


def _cases(models):
    for kind, maps in (("moe", MOE_MAPS), ("dense", DENSE_MAPS)):
        for m, overlap, mtp, fp8, mode in itertools.product(maps, ("none", "two-batch"), (0, 1), (False, True),
                                                            ("agg", "disagg")):
            if mtp and kind == "dense":
                continue
            pmap = m if mode == "agg" else MOE_MAPS[0] if kind == "moe" else DENSE_MAPS[0]
            yield kind, m, _row(mode, m, pmap, overlap, mtp, fp8), launch_flags(
                models[kind], _row(mode, m, pmap, overlap, mtp, fp8), traffic=Traffic.of(4000, 1000))


def test_every_emitted_flag_is_in_its_engines_table(models):
    for kind, m, row, f in _cases(models):
        for e in ("sglang", "vllm", "trtllm", "dynamo"):
            known = _table_flags(e) | (_table_flags("sglang") | _table_flags("vllm") if e == "dynamo" else set())
            for role, argv in _commands(f, e):
                line = " ".join(argv)
                heads = [k for k in known if not k.startswith("-") and line.startswith(k + " ")]
                assert heads, (e, role, argv[:4])
                for flag in _flags(argv[len(max(heads, key=len).split()):]):
                    assert flag in known, (e, role, flag)
        keys = {x.flag for x in TRTLLM}
        for name, text in f["configs"].items():
            if name == "trtllm_disagg.yaml":
                continue
            for k in _yaml_keys(yaml.safe_load(text)):
                assert k in keys or any(k.startswith(x + ".") or x.startswith(k + ".") for x in keys), (name, k)


def test_tables_name_a_source_and_version():
    for e, rows in TABLES.items():
        assert e in VERSIONS and rows
        for r in rows:
            assert r.concept and r.flag and r.source, (e, r)


def test_emitted_combinations_meet_the_documented_constraints(models):
    seen = set()
    for kind, m, row, f in _cases(models):
        moe = kind == "moe"
        assert is_moe(models[kind]) is moe
        for e in ("sglang", "vllm", "trtllm", "dynamo"):
            assert f["launchable"][e] is (not f["reasons"][e]), (e, f["reasons"][e])
        for role, argv in _commands(f, "sglang"):
            line = " ".join(argv)
            if "--enable-two-batch-overlap" in argv:  # SGLang rejects it with moe_a2a_backend none
                assert moe and "--moe-a2a-backend deepep" in line, line
                seen.add("tbo")
            if "--moe-a2a-backend deepep" in line:  # DeepEP sets ep_size = tp_size
                pm = row["_pmap"] if role == "prefill" else row["_dmap"]
                assert f"--ep-size {pm.tp * pm.dp}" in line and f"--tp-size {pm.tp * pm.dp}" in line
            if not moe:
                assert not {"--ep-size", "--moe-a2a-backend", "--deepep-mode", "--enable-two-batch-overlap"} \
                    & set(argv), line
        for role, argv in _commands(f, "vllm"):
            line = " ".join(argv)
            pm = row["_pmap"] if role == "prefill" else row["_dmap"]
            if "--enable-dbo" in argv:  # VllmConfig asserts a DeepEP all2all backend; DBO targets DP+EP
                assert moe and "--all2all-backend deepep_" in line and "--enable-expert-parallel" in argv
                assert pm.dp > 1
                seen.add("dbo")
            if "--enable-expert-parallel" in argv:  # vLLM's EP is TP x DP: only the priced layout
                assert pm.ep == pm.tp * pm.dp
                seen.add("ep")
            if not moe:
                assert not {"--enable-expert-parallel", "--all2all-backend", "--enable-dbo"} & set(argv), line
        pools = [row["_pmap"], row["_dmap"]] if row["mode"] == "disagg" else [row["_dmap"]]
        if moe and any(1 < p.ep < p.tp * p.dp for p in pools):
            assert not f["launchable"]["vllm"] and "EP = TP x DP" in " ".join(f["reasons"]["vllm"])
            seen.add("vllm-ep-refused")
        if row["_policies"].overlap == "two-batch":
            if not moe:  # no engine overlaps two batches of a dense model: never launchable as priced
                assert not any(f["launchable"][e] for e in ("sglang", "vllm", "trtllm", "dynamo"))
                seen.add("dense-tbo-refused")
            if f["launchable"]["sglang"]:  # launchable means the priced policy is in the command
                assert all("--enable-two-batch-overlap" in c for c in f["sglang"])
            if f["launchable"]["vllm"]:
                assert all("--enable-dbo" in c for c in f["vllm"])
        if any(p.tp > 1 and p.dp > 1 for p in pools):
            assert not f["launchable"]["trtllm"]
        if any(p.cp > 1 for p in pools):
            assert not f["launchable"]["sglang"] and not f["launchable"]["trtllm"]
    assert seen >= {"tbo", "dbo", "ep", "vllm-ep-refused", "dense-tbo-refused"}, seen


def test_trtllm_yaml_parses_with_its_keys(models):
    m = gs.ParallelMapping(tp=1, dp=8, ep=4)
    f = launch_flags(models["moe"], _row("disagg", m, gs.ParallelMapping(tp=8, ep=8), mtp=1, fp8=True, batch=256,
                                         replicas=2), traffic=Traffic.of(4000, 1000))
    dec = yaml.safe_load(f["configs"]["trtllm_decode.yaml"])
    assert dec["tensor_parallel_size"] == 8 and dec["enable_attention_dp"] is True
    assert dec["moe_expert_parallel_size"] == 4 and dec["moe_tensor_parallel_size"] == 2
    assert dec["max_batch_size"] == 256 // 8  # per attention-DP rank
    assert dec["max_num_tokens"] == 8192 and dec["enable_chunked_prefill"] is False
    assert dec["kv_cache_config"] == {"free_gpu_memory_fraction": 0.9, "dtype": "fp8"}
    assert dec["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": 128}
    assert dec["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 1}
    assert dec["cache_transceiver_config"] == {"backend": "DEFAULT"} and "disable_overlap_scheduler" not in dec
    pre = yaml.safe_load(f["configs"]["trtllm_prefill.yaml"])
    assert pre["disable_overlap_scheduler"] is True and "enable_attention_dp" not in pre
    disagg = yaml.safe_load(f["configs"]["trtllm_disagg.yaml"])
    assert disagg["context_servers"] == {"num_instances": 2, "urls": ["prefill-0:30000", "prefill-1:30000"]}
    assert disagg["generation_servers"]["num_instances"] == 2 and disagg["port"] == 8000
    assert f["router"]["trtllm"] == "trtllm-serve disaggregated -c trtllm_disagg.yaml"
    dense = launch_flags(models["dense"], _row("agg", gs.ParallelMapping(tp=4)))
    d = yaml.safe_load(dense["configs"]["trtllm_server.yaml"])
    assert "moe_expert_parallel_size" not in d and d["tensor_parallel_size"] == 4


def test_yaml_writer_round_trips():
    d = {"a": 1, "b": 0.25, "c": True, "d": None, "e": {"f": "DEFAULT", "g": ["x:1", "0.0.0.0"]}, "h": "yes"}
    assert yaml.safe_load(to_yaml(d)) == d


def test_engine_values_come_from_the_engine_terms(models):
    m = gs.ParallelMapping(tp=8)
    row = _row("agg", m, batch=96)
    f = launch_flags(models["dense"], row, hbm_bytes=141e9)  # H200: vLLM 1024 / 8192, SGLang 8192 below 160 GiB
    sg, vl = f["sglang"][0], f["vllm"][0]
    assert "--max-running-requests 96" in sg and "--chunked-prefill-size 8192" in sg and "--cuda-graph-max-bs 256" in sg
    assert "--mem-fraction-static" not in sg  # computed at launch: no figure to give
    assert "--max-num-seqs 96" in vl and "--max-num-batched-tokens 8192" in vl and "--gpu-memory-utilization 0.92" in vl
    assert "--compilation-config" not in vl
    terms = TERMS["sglang"].on(141e9).with_settings(["memory_fraction=0.8", "step_tokens=4096", "graph_max_batch=0"])
    f = launch_flags(models["dense"], row, terms=terms, hbm_bytes=141e9)
    sg = f["sglang"][0]
    assert "--mem-fraction-static 0.8" in sg and "--chunked-prefill-size 4096" in sg and "--disable-cuda-graph" in sg
    terms = TERMS["vllm"].on(141e9).with_settings(["memory_fraction=0.85", "graph_max_batch=64"])
    vl = launch_flags(models["dense"], row, terms=terms)["vllm"][0]
    assert "--gpu-memory-utilization 0.85" in vl and '"max_cudagraph_capture_size": 64' in vl


def test_dense_llama_gets_no_moe_flags_and_a_benchmark(models):
    f = launch_flags(models["dense"], _row("agg", gs.ParallelMapping(tp=4), batch=128, replicas=2),
                     traffic=Traffic.of(4000, 1000))
    text = " ".join(f["sglang"] + f["vllm"] + f["dynamo"] + list(f["configs"].values()))
    for flag in ("two-batch", "--enable-dbo", "a2a", "all2all", "--ep-size", "expert"):
        assert flag not in text
    assert all(f["launchable"].values())
    assert f["router"]["sglang"].startswith("python -m sglang_router.launch_router --worker-urls http://server-0:30000 "
                                            "http://server-1:30000")
    b = f["benchmark"]["vllm"]
    assert "--random-input-len 4000" in b and "--random-output-len 1000" in b and "--max-concurrency 256" in b


def test_hf_id_is_used_when_the_model_has_one(models):
    row = _row("agg", gs.ParallelMapping(tp=8, ep=8))
    bare = types.SimpleNamespace(name="my-config", cfg=models["moe"].cfg, hf_id=None)  # a config file: no id
    f = launch_flags(bare, row)
    assert f["model"] == "my-config" and any("Hugging Face id" in n for n in f["notes"])
    assert models["moe"].hf_id == "deepseek-ai/DeepSeek-V3"  # a shipped config knows its repository (graphsim.core.config)
    named = types.SimpleNamespace(name="deepseek-v3", cfg=models["moe"].cfg, hf_id="deepseek-ai/DeepSeek-V3")
    f = launch_flags(named, row)
    assert f["model"] == "deepseek-ai/DeepSeek-V3" and not any("Hugging Face id" in n for n in f["notes"])
    assert "--model-path deepseek-ai/DeepSeek-V3" in f["sglang"][0] and "vllm serve deepseek-ai/DeepSeek-V3" in \
        f["vllm"][0]


def test_launch_dir_writes_what_the_json_carries(models, tmp_path):
    row = _row("disagg", gs.ParallelMapping(tp=1, dp=8, ep=8), overlap="two-batch")
    f = launch_flags(models["moe"], row, traffic=Traffic.of(4000, 1000))
    g = launch_flags(models["dense"], _row("agg", gs.ParallelMapping(tp=8)))
    wrote = write_launch_dir(tmp_path / "L", [f, g])
    files = launch_files(f)
    assert {p.name for p in (tmp_path / "L").iterdir() if p.is_file()} == set(files)
    assert (tmp_path / "L" / "rank-2" / "sglang_server.sh").is_file() and len(wrote) == len(files) + len(
        launch_files(g))
    assert (tmp_path / "L" / "trtllm_decode.yaml").read_text() == f["configs"]["trtllm_decode.yaml"]
    sh = (tmp_path / "L" / "sglang_decode.sh").read_text()
    assert f["sglang"][1].split("\n", 1)[1] in sh and "--enable-two-batch-overlap" in sh
    readme = (tmp_path / "L" / "README.md").read_text()
    for name in files:
        assert name == "README.md" or f"`{name}`" in readme
    assert "NOT launchable as priced" in readme  # TensorRT-LLM has no two-batch overlap
    assert not list((tmp_path / "L").glob(".*tmp*"))  # atomic writes leave no temporaries
    (tmp_path / "file").write_text("x")
    with pytest.raises(gs.GraphsimError, match="launch_dir"):
        write_launch_dir(tmp_path / "file", [f])


def test_cli_launch_dir_round_trip(tmp_path, capsys):
    """The issue's acceptance shape on a small space: dense Llama writes commands with no two-batch overlap."""
    import json

    from graphsim.cli import main

    d = tmp_path / "L"
    rc = main(["search", "--model", "llama-3.1-70b", "--hw", "h200", "--gpus", "8", "--isl", "4000", "--osl", "1000",
               "--ttft", "2000", "--tpot", "30", "--tp", "4,8", "--batch", "8,32", "--refine", "0", "--modes", "agg",
               "--launch-dir", str(d), "--json", "--no-progress"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    launch = doc["best"][0]["launch"]
    assert set(launch_files(launch)) == {p.name for p in d.iterdir()}
    text = "".join(p.read_text() for p in d.iterdir())
    assert "two-batch" not in text and "--enable-dbo" not in text and "a2a" not in text
    assert "--max-num-batched-tokens 8192" in text  # vLLM's default on a >= 70 GiB GPU


def test_docs_print_the_tables():
    from pathlib import Path

    from graphsim.serving.launch import tables_markdown

    doc = Path(__file__).resolve().parents[1].joinpath("docs", "search.md").read_text()
    assert tables_markdown() in doc, "docs/search.md's launch tables differ from graphsim.serving.launch.TABLES"


def test_dynamo_wraps_the_first_backend_that_runs_the_deployment(models):
    f = launch_flags(models["moe"], _row("disagg", gs.ParallelMapping(tp=8, ep=8), gs.ParallelMapping(tp=4, cp=2)))
    assert not f["launchable"]["sglang"] and f["launchable"]["vllm"]  # cp: only vLLM's PCP expresses it
    assert f["launchable"]["dynamo"] and f["dynamo"][0].endswith("python -m dynamo.frontend --http-port 8000")
    pre, dec = f["dynamo"][1], f["dynamo"][2]
    assert "python -m dynamo.vllm --model deepseek-ai/DeepSeek-V3" in pre and "--prefill-context-parallel-size 2" in pre
    assert pre.endswith("--disaggregation-mode prefill") and dec.endswith("--disaggregation-mode decode")
    assert "NixlConnector" in dec
    f = launch_flags(models["moe"], _row("agg", gs.ParallelMapping(tp=1, dp=8, ep=4), overlap="two-batch"))
    assert not any(f["launchable"].values()) and "python -m dynamo.sglang" in f["dynamo"][1]
