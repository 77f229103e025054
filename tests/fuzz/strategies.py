"""Hypothesis strategies for malformed (and well-formed) graphsim inputs, by family: request strings and plans
through the API, CLI argument vectors, HF config dicts, hardware and profile TOML files, sweep specs.

Every strategy mixes valid values (so inputs reach deep code) with the values careless users and scripts
produce: zero, negatives, huge and 2^53+1 integers, inf/NaN, booleans, strings, containers, 300-character
names, non-UTF-8 bytes, truncated files. Inputs never write outside a temporary directory (``{tmp}``),
except ``/dev/full`` (a full device) and directories used as outputs."""
from __future__ import annotations

import json
import re
from importlib.resources import files
from pathlib import Path

from hypothesis import strategies as st

MODELS = ("deepseek-v3", "deepseek-v4.1-flash", "deepseek-v4-flash", "llama-3.1-70b")
HWS = ("gb200", "gb300", "b200", "h200", "h100", "h800")
WEIRD = (0, -1, 1, 2, 3, 7, 64, 127, 128, 129, 1000, 2**31, 2**53 + 1, 10**30, 10**200, 1.5, -2.5, 1e9, 1e18,
         float("inf"), float("-inf"), float("nan"), True, False, None, "", "x", "1e3", [], {}, [1], {"a": 1})

weird = st.sampled_from(WEIRD)


def rare(draw, n: int) -> bool:
    """True one time in n+1. (Hypothesis starts from, and shrinks toward, the smallest draw: the common case
    must be the small one, or early inputs would all take the rare branch.)"""
    return draw(st.integers(0, n)) == n
small = st.integers(-3, 300)
ints = st.one_of(small, small, st.integers(-(2**70), 2**70), st.sampled_from([2**53 + 1, 10**200, 4294967296]))
anything = st.one_of(ints, weird, st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
HF_IDS = ("deepseek-ai/DeepSeek-V3", "meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen3-VL-2B-Instruct", "nobody/none",
          "meta-llama/Llama-4-Scout-17B-16E-Instruct", "google/gemma-3-27b-it",
          "DeepSeek-AI/deepseek-v3", "a/b/c", "/x", "org/")
name = st.one_of(st.sampled_from(MODELS), st.sampled_from(MODELS), st.just("x" * 300), st.text(max_size=10),
                 st.just("../../etc/passwd"), st.just("deepseek-v3.json"), st.sampled_from(HF_IDS))
hw_name = st.one_of(st.sampled_from(HWS), st.sampled_from(HWS), st.text(max_size=8), st.just("/"), st.just("x.toml"))
num_text = st.one_of(ints.map(str), st.sampled_from(["", "abc", "1e3", "1_000", "1,000", "-0", "9" * 200, "0x1F",
                                                      " 5", "½", "inf", "nan", "2.5"]))


@st.composite
def valid_request(draw) -> str:
    """A request a user would write: a real kind, length, count, sometimes a prefix hit or a verify length."""
    kind = draw(st.sampled_from(["decode", "prefill"]))
    n = draw(st.sampled_from([1, 2, 127, 128, 129, 1000, 4096, 8192, 32768, 131072]))
    s = f"{kind}:{n}"
    if draw(st.booleans()):
        s += f"x{draw(st.sampled_from([1, 2, 8, 64, 256]))}"
    if kind == "prefill" and n > 1 and rare(draw, 3):
        s += f"@{draw(st.integers(1, n - 1))}"
        if draw(st.booleans()):
            s += ":" + draw(st.sampled_from(["hbm", "host", "disk"]))
        if draw(st.booleans()):
            s += "/noswa"
    return s


VALID_MAPPINGS = ({}, {"tp": 2}, {"tp": 4}, {"tp": 8}, {"tp": 4, "ep": 4}, {"dp": 8, "ep": 8}, {"tp": 2, "dp": 2, "ep": 4},
                  {"pp": 2}, {"tp": 4, "pp": 2}, {"cp": 2}, {"tp": 8, "ep": 8})


@st.composite
def request_string(draw) -> str:
    """``KIND:LEN[xCOUNT][vK][@CACHED[:TIER][/noswa]][+img:WxH]``, each part possibly malformed."""
    kind = draw(st.sampled_from(["prefill", "decode", "prefill", "decode", "Prefill", "encode", ""]))
    ln = draw(st.one_of(st.integers(1, 200_000).map(str), num_text))
    s = f"{kind}{ln}" if rare(draw, 20) else f"{kind}:{ln}"
    if draw(st.booleans()):
        s += "x" + draw(st.one_of(st.integers(1, 256).map(str), num_text))
    if kind == "decode" and rare(draw, 4):
        s += "v" + draw(st.one_of(st.integers(0, 6).map(str), num_text))
    if rare(draw, 3):
        s += "@" + draw(st.one_of(st.integers(0, 200_000).map(str), num_text))
        if draw(st.booleans()):
            s += ":" + draw(st.sampled_from(["hbm", "host", "disk", "tape", ""]))
        if draw(st.booleans()):
            s += draw(st.sampled_from(["/noswa", "/swa", "/"]))
    if rare(draw, 8):
        s += "+img:" + draw(st.sampled_from(["1024x768", "224x224", "0x0", "-1x5", "axb", "99999x99999", "14",
                                                   "3000x17", "17x3000"]))
    return s


POLICY_VALUES = {
    "decoder_replay": ["off", "sglang", "paper"], "encoder_replay": ["on", "off"],
    "fusion": ["unfused", "two-pass", "single-pass"], "overlap": ["none", "two-batch"], "engram": ["hbm", "host"],
    "prefetch_distance": [0, 1, 2, 8], "dspark": ["off", "on"], "replay_window": [1, 64, 128],
    "ep_imbalance": [1.0, 1.5, 4.0], "pp_micro_batches": [0, 1, 2, 4, 64],
    "attention_precision": ["auto", "bf16", "fp8", "fp4"], "sp": ["off", "on"], "engram_shard": ["tp", "world"],
    "engram_proj": ["replicated", "tp"], "acceptance": [[0.8] * 5, [0.9, 0.8]],
    "algorithms": [{"all_reduce": "tree"}, {"all_to_all": "direct"}, {"x": "y"}],
}


@st.composite
def policies(draw) -> dict:
    out = {}
    for field in draw(st.lists(st.sampled_from(sorted(POLICY_VALUES)), max_size=3, unique=True)):
        out[field] = draw(st.one_of(st.sampled_from(POLICY_VALUES[field]), st.sampled_from(POLICY_VALUES[field]),
                                    weird))
    return out


@st.composite
def mapping(draw) -> dict:
    out = {}
    for ax in draw(st.lists(st.sampled_from(["tp", "dp", "ep", "pp", "cp"]), max_size=3, unique=True)):
        out[ax] = draw(st.one_of(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]), ints, weird))
    return out


@st.composite
def api_case(draw) -> dict:
    """Mostly real plans (so inputs reach deep code), one field broken one time in three, all of them broken
    one time in eight."""
    case = {"model": draw(st.sampled_from(MODELS)), "hw": draw(st.sampled_from(HWS)),
            "requests": draw(st.lists(valid_request(), min_size=1, max_size=3)),
            "mapping": dict(draw(st.sampled_from(VALID_MAPPINGS))),
            "policies": {k: draw(st.sampled_from(v)) for k, v in sorted(POLICY_VALUES.items())
                         if draw(st.integers(0, 5)) == 5}}
    mode = draw(st.integers(0, 7))
    if mode == 7:
        return {"model": draw(st.one_of(st.sampled_from(MODELS), name)), "hw": draw(hw_name),
                "requests": draw(st.lists(request_string(), max_size=3)), "mapping": draw(mapping()),
                "policies": draw(policies())}
    if mode >= 5:
        what = draw(st.sampled_from(["model", "hw", "requests", "mapping", "policies"]))
        case[what] = {"model": lambda: draw(name), "hw": lambda: draw(hw_name),
                      "requests": lambda: draw(st.lists(request_string(), max_size=3)),
                      "mapping": lambda: draw(mapping()), "policies": lambda: draw(policies())}[what]()
    return case


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------

OUTPUTS = ["{tmp}/out.svg", "{tmp}/out.dot", "{tmp}/trace.json", "{tmp}", "{tmp}/missing/dir/x.png", "/dev/full",
           "/", "{tmp}/r.parquet", "{tmp}/r.csv", "{tmp}/x.txt", "{tmp}/p.png"]
RESULTS_CSV = ("mapping,decode.count,decode.context,forward_s,tokens_per_s_per_gpu,tokens_per_s_per_user,error\n"
               "tp4,8,1024,0.01,1000,100,\ntp4,64,1024,0.02,4000,50,\ntp8,8,4096,0.015,900,90,\n")
WHERE = ["`decode.count` == 64", "forward_s > 0.01 and mapping == 'tp4'", "@df.to_pickle('{tmp}/pwned')",
         "__import__('os').system('touch {tmp}/pwned')", "decode.count >", "nonexistent == 3", "", "((("]


MEASURED = str(Path(__file__).resolve().parent.parent / "data" / "measured")
MEASURED_DIRS = [MEASURED, MEASURED, "{tmp}", "{tmp}/nope", "{tmp}/r.csv"]


def _plan_flags(draw) -> list:
    argv = ["--model", draw(st.one_of(st.sampled_from(MODELS), st.sampled_from(MODELS), name)),
            "--hw", draw(st.one_of(st.sampled_from(HWS), hw_name))]
    for ax in draw(st.lists(st.sampled_from(["--tp", "--dp", "--ep", "--pp", "--cp"]), max_size=2, unique=True)):
        argv += [ax, draw(st.one_of(st.sampled_from(["1", "2", "4", "8"]), st.sampled_from(["1", "2", "4"]), num_text))]
    for _ in range(draw(st.integers(0, 2))):
        flag, vals = draw(st.sampled_from([
            ("--decoder-replay", ["sglang", "paper", "on"]), ("--fusion", ["single-pass", "x"]),
            ("--overlap", ["two-batch"]), ("--engram", ["host"]), ("--dspark", ["on"]),
            ("--ep-imbalance", ["1.5", "inf", "nan", "-1", "0"]), ("--pp-micro-batches", ["2", "0", "-1", "99999"]),
            ("--prefetch-distance", ["0", "3", "-2", "x"]), ("--attention-precision", ["fp8", "fp4", "int4"]),
            ("--sp", ["on"]), ("--engram-shard", ["world"]), ("--algorithm", ["all_reduce=tree", "x", "a=b"]),
            ("--acceptance", ["0.8,0.7,0.6,0.5,0.4", "a,b", "2,3"]), ("--verify", ["2", "-1", "9"]),
            ("--profile", ["practitioner", "nope", "{tmp}/p.toml"]),
            ("--view", ["op", "hybrid", "hybrid", "sol", "auto", "x"]), ("--measured", MEASURED_DIRS),
            ("--backend", ["trtllm@1.3.0rc20", "trtllm", "sglang@0.5.14", "trtllm@x y", "@", ""]),
            ("--fill", ["none", "older", "x"])]))
        argv += [flag, draw(st.sampled_from(vals))]
    if rare(draw, 4):  # a measured view, named completely (or left to --view auto: tables make it hybrid)
        view = draw(st.sampled_from(["op", "hybrid", "auto"]))
        argv += (["--view", view] if view != "auto" else []) + ["--measured", draw(st.sampled_from(MEASURED_DIRS)),
                 "--backend", draw(st.sampled_from(["trtllm@1.3.0rc20", "trtllm@1.3.0rc20", "nccl", "vllm@0.24.0"]))]
    return argv


@st.composite
def cli_case(draw) -> dict:
    cmd = draw(st.sampled_from(["estimate", "estimate", "estimate", "memory", "layers", "fit", "hw", "ledger",
                                "graph", "trace", "disagg", "plot", "sweep", "models", "bogus", "--version",
                                "measured"]))
    files: dict = {}
    if cmd == "estimate":
        argv = ["estimate", *_plan_flags(draw)]
        reqs = draw(st.lists(st.one_of(valid_request(), valid_request(), request_string()), min_size=0, max_size=3))
        argv += [x for r in reqs for x in ("--request", r)]
        if draw(st.booleans()):
            argv.append("--json")
        if rare(draw, 5):
            argv += ["--chunk", draw(st.sampled_from(["1", "256", "4096", "0", "-5", "x"]))]
    elif cmd in ("memory", "layers"):
        argv = [cmd, draw(st.one_of(st.sampled_from(MODELS), name))]
        if cmd == "memory":
            argv += ["--context", draw(st.one_of(st.sampled_from(["0", "127", "128", "129", "131072"]), num_text))]
        if draw(st.booleans()):
            argv.append("--json")
    elif cmd == "fit":
        argv = ["fit", *_plan_flags(draw)[:4]]
        for flag in draw(st.lists(st.sampled_from(["--context", "--batch", "--reserve-gib", "--pp", "--tp"]),
                                  max_size=3, unique=True)):
            argv += [flag, draw(st.one_of(st.sampled_from(["1", "2", "8", "4096", "inf", "nan", "-3"]), num_text))]
        if draw(st.booleans()):
            argv.append("--json")
    elif cmd == "hw":
        argv = ["hw", draw(st.sampled_from(["list", "show", "show", "frob"]))]
        if argv[1] == "show":
            argv.append(draw(hw_name))
        if draw(st.booleans()):
            argv.append("--json")
    elif cmd == "ledger":
        argv = ["ledger", "--model", draw(st.one_of(st.sampled_from(MODELS), name))]
        argv += [x for r in draw(st.lists(request_string(), min_size=1, max_size=2)) for x in ("--request", r)]
        if draw(st.booleans()):
            argv += ["--chunk", draw(st.sampled_from(["1", "128", "0", "x"]))]
    elif cmd in ("graph", "trace"):
        argv = [cmd, *_plan_flags(draw), "--request", draw(request_string()), "-o", draw(st.sampled_from(OUTPUTS))]
    elif cmd == "disagg":
        argv = ["disagg", "--model", draw(st.sampled_from(MODELS)), "--isl", draw(num_text), "--osl", draw(num_text),
                "--prefill", draw(st.sampled_from(["dp=8,ep=8", "tp=4", "x", "tp=0", ""])),
                "--decode", draw(st.sampled_from(["dp=8,ep=8", "tp=4", "tp=3", "q=1"]))]
    elif cmd == "plot":
        files["r.csv"] = RESULTS_CSV
        kind = draw(st.sampled_from(["latency", "pareto", "kinds", "memory", "roofline", "nope"]))
        argv = ["plot", "{tmp}/r.csv", "--kind", kind, "-o", draw(st.sampled_from(OUTPUTS))]
        if kind == "roofline" or rare(draw, 6):  # a results row's roofline (its plan rebuilt)
            argv += ["--row", draw(st.sampled_from(["0", "1", "-1", "100000", "x"]))]
        if draw(st.booleans()):
            argv += ["--where", draw(st.sampled_from(WHERE))]
    elif cmd == "sweep":
        text, ext = draw(sweep_text())
        files["spec" + ext] = text
        argv = ["sweep", "{tmp}/spec" + ext, "-o", draw(st.sampled_from(OUTPUTS)), "--no-progress"]
    elif cmd == "measured":
        if draw(st.booleans()):
            files["gb200/bad.parquet"] = draw(st.sampled_from([b"PAR1junk", b"", "text"]))
        if draw(st.booleans()):
            argv = ["measured", "list", draw(st.sampled_from(MEASURED_DIRS + [""]))]
            argv += draw(st.sampled_from([[], ["--json"], ["--device", "gb200"], ["--family", "gemm"], ["--family", "x"]]))
        else:
            argv = ["measured", "import", draw(st.sampled_from(["aiconfigurator", "aiconfigurator", "x"])),
                    "--from", draw(st.sampled_from(["{tmp}", "{tmp}/nope", MEASURED])),
                    "-o", draw(st.sampled_from(["{tmp}/o", "{tmp}", "{tmp}/missing/o", "/dev/full"]))]
    elif cmd == "models":
        argv = ["models"] + draw(st.sampled_from([[], ["--hub"], ["--hub", "-o", "{tmp}/m.txt"], ["--hubb"]]))
    elif cmd == "--version":
        argv = ["--version"]
    else:
        argv = [cmd] + draw(st.lists(st.text(max_size=6), max_size=2))
    if cmd in ("estimate", "fit") and rare(draw, 6):
        files["p.toml"] = draw(toml_text("profile"))
    return {"argv": argv, "files": files}


# --------------------------------------------------------------------------------------------------
# Configs, TOMLs, sweep specs
# --------------------------------------------------------------------------------------------------

def _shipped_config(model: str) -> dict:
    from graphsim.core.config import load_config

    return load_config(model)


#: Real checkpoints' configs of the other families (graphsim/configs/hf) mutated like the shipped ones.
FAMILY_CONFIGS = ("Qwen--Qwen3-30B-A3B", "openai--gpt-oss-20b", "meta-llama--Llama-4-Scout-17B-16E-Instruct",
                  "Qwen--Qwen3.5-27B", "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "mistralai--Mixtral-8x7B-v0.1",
                  "deepseek-ai--DeepSeek-V3.2", "moonshotai--Kimi-K2.5", "zai-org--GLM-5-FP8",
                  "google--gemma-3-27b-it", "Qwen--Qwen3-VL-8B-Instruct")


def _family_config(name: str) -> dict:
    from pathlib import Path

    return json.loads((Path(__file__).parents[2] / "graphsim" / "configs" / "hf" / f"{name}_config.json").read_text())


@st.composite
def config_case(draw) -> tuple:
    base = draw(st.sampled_from(MODELS + FAMILY_CONFIGS))
    cfg = json.loads(json.dumps(_family_config(base) if "--" in base else _shipped_config(base)))
    if rare(draw, 30):
        return base, draw(st.sampled_from([[], "x", 3, None, [cfg]]))
    section = cfg.get("text_config", cfg)
    if isinstance(cfg.get("vision_config"), dict) and draw(st.booleans()):  # the vision towers' parsers too
        section = cfg["vision_config"]
    keys = sorted(k for k in section if not k.startswith("_"))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys))
        op = draw(st.integers(0, 5))
        if op == 5:
            section.pop(key, None)
        elif isinstance(section.get(key), list) and section[key] and op < 2:
            lst = list(section[key])
            i = draw(st.integers(0, len(lst) - 1))
            lst[i] = draw(anything)
            section[key] = lst if op == 0 else lst[: draw(st.integers(0, len(lst)))]
        elif isinstance(section.get(key), int) and op < 3:
            section[key] = draw(st.sampled_from([0, -1, -section[key], section[key] * 1000, 10**9, 2**53 + 1, 1]))
        else:
            section[key] = draw(anything)
    if rare(draw, 6) and "quantization_config" in cfg:
        cfg["quantization_config"] = draw(st.sampled_from([None, [], {"quant_method": "fp8"},
                                                           {"kv_cache_quant_algo": draw(st.sampled_from(["FP8", "x", 3]))}]))
    return base, cfg


def _shipped_toml(kind: str, name: str) -> str:
    folder = files("graphsim.hw") / "data"
    return ((folder / "profiles" / f"{name}.toml") if kind == "profile" else (folder / f"{name}.toml")).read_text()


@st.composite
def toml_text(draw, kind: str):
    text = _shipped_toml(kind, "practitioner" if kind == "profile" else draw(st.sampled_from(HWS)))
    lines = text.splitlines()
    values = [i for i, ln in enumerate(lines) if re.match(r"^\w+ = ", ln)]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.sampled_from(values))
        key = lines[i].split(" = ")[0]
        op = draw(st.integers(0, 4))
        if op == 4:
            lines[i] = ""
        elif op == 3:
            lines[i] = f"{key} = {key}"
        else:
            v = draw(st.sampled_from(["0", "-1", "1e400", "inf", "nan", "-inf", '"fast"', "true", "[]", "{}", "1e-30",
                                      "1e30", "0.5", "2", "99999999999999999999999"]))
            lines[i] = f"{key} = {v}"
    if rare(draw, 8):
        lines.append(draw(st.sampled_from(["bogus = 1", "[peak_flops]\nfp2 = 1e15", "name = 3", "[[x]]"])))
    out = "\n".join(lines)
    if rare(draw, 10):
        out = out[: draw(st.integers(0, len(out)))]
    if rare(draw, 15):
        return out.encode() + b"\xff\xfe\x00"
    return out


@st.composite
def sweep_spec(draw) -> dict:
    kind = draw(st.sampled_from(["decode", "prefill", "prefill+decode", "x"]))
    structure = {"model": draw(st.one_of(st.sampled_from(MODELS[::3]), st.sampled_from(MODELS), name)),
                 "hw": draw(st.one_of(st.sampled_from(HWS), hw_name)), "requests": kind}
    if draw(st.booleans()):
        structure["mapping"] = draw(st.one_of(mapping(), st.sampled_from(["tp4-ep4", "tp3", "x", 4])))
    if draw(st.booleans()):
        structure["policies"] = draw(policies())
    if rare(draw, 4):  # measured views as structural axes
        structure["view"] = draw(st.sampled_from(["op", "hybrid", ["sol", "hybrid"], "x", 3]))
        if draw(st.booleans()):
            structure["measured"] = draw(st.sampled_from([MEASURED, MEASURED, "/nonexistent", 7, ""]))
        if draw(st.booleans()):
            structure["backend"] = draw(st.sampled_from(["trtllm@1.3.0rc20", ["trtllm@1.3.0rc20", "nccl"], "x y", 1]))
        if draw(st.booleans()):
            structure["profile"] = draw(st.sampled_from(["practitioner", ["sol", "practitioner"]]))
    axis_names = ["decode.count", "decode.context", "decode.new", "prefill.prompt", "prefill.cached",
                  "prefill.count", "prefill.tier", "hw.hbm_bw", "hw.exp_rate", "hw.nvlink_domain", "profile.hbm", "x.y"]
    axes = {}
    for ax in draw(st.lists(st.sampled_from(axis_names), max_size=3, unique=True)):
        axes[ax] = draw(st.one_of(
            st.lists(st.one_of(st.sampled_from([1, 8, 64, 1024, 4096]), ints, weird), min_size=1, max_size=4),
            st.sampled_from([{"start": 1, "stop": 4096, "num": 3}, {"start": 1, "stop": 9}, {"start": 5, "stop": 1,
                             "num": 10**12}, [], "x", 3])))
    for need, default in (("decode.context", [1024]), ("prefill.prompt", [2048])):
        if need.split(".")[0] in kind and need not in axes and not rare(draw, 5):
            axes[need] = default
    spec = {"name": "fz", "structure": structure, "axes": axes}
    if rare(draw, 8):
        spec[draw(st.sampled_from(["zip", "outputs", "chunk", "bogus"]))] = draw(st.one_of(anything, st.just(["kinds"])))
    return spec


@st.composite
def sweep_text(draw) -> tuple:
    spec = draw(sweep_spec())
    ext = draw(st.sampled_from([".json", ".json", ".toml", ".yaml", ".txt"]))
    text = json.dumps(spec, default=str)
    if ext == ".yaml":
        text = draw(st.sampled_from([text, "- a\n- b\n", "a: [1, 2\n", "just a string", "structure: 3\n"]))
    elif ext == ".toml":
        text = draw(st.sampled_from(['name = "t"\n[structure]\nmodel = "deepseek-v3"\nrequests = "decode"\n'
                                     '[axes]\n"decode.context" = [1024]\n', "x = [", "[structure]\nmodel = 3\n"]))
    if rare(draw, 8):
        text = text[: draw(st.integers(0, len(text)))]
    if rare(draw, 15):
        return text.encode() + b"\xff\xfe", ext
    return text, ext


# --------------------------------------------------------------------------------------------------
# FPM models and samples, measured tables, collect, plot (issue 26)
# --------------------------------------------------------------------------------------------------

#: a small real model for FPM identities (forwards are never timed here)
FPM_MODEL = str(Path(__file__).resolve().parents[2] / "examples" / "configs" / "tiny-llama.json")
_BASE: dict = {}


def base_samples():
    """Samples of a real plan identity with known ratios to SOL (a DataFrame; built once per process)."""
    if "samples" not in _BASE:
        import pandas as pd

        import graphsim as gs
        from graphsim.views.fpm.schema import sample_identity

        m, spec = gs.load_model(FPM_MODEL), gs.load_hw("gb200")
        env = {"framework": "jax", "version": "0.1", "image_digest": "env:0.1", "kernel_source": "xla:cpu",
               "instrumentation": "fuzz", "device_name": "fuzz cpu", "devices": 1}
        rows = []
        for b in (1, 2, 4, 8):
            for ctx in (64, 256, 1024):
                plan = gs.Plan([f"decode:{ctx}x{b}"])
                ident = sample_identity(m, plan.mapping, plan.policies, spec, env, 1)
                sol = 1e-3 * b + 1e-6 * ctx
                r = 1.5 + 0.1 * b
                rows.append({**ident, "requests": f"decode:{ctx}x{b}", "prefill_requests": 0, "prefill_tokens": 0,
                             "prefill_past": 0, "decode_requests": b, "decode_tokens": b, "decode_past": b * ctx,
                             "latency_s": sol * r, "latency_min_s": sol * r, "latency_p90_s": sol * r, "reps": 3,
                             "compile_s": 0.1, "sol_s": sol, "status": "ok", "error": ""})
        _BASE["samples"] = pd.DataFrame(rows)
    return _BASE["samples"].copy()


def base_fpm_model() -> dict:
    """A fitted FPM model file's JSON (built once per process)."""
    if "model" not in _BASE:
        from graphsim.views.fpm.fit import fit

        _BASE["model"] = json.loads(json.dumps(fit(base_samples()).to_json(), default=float))
    return json.loads(json.dumps(_BASE["model"]))


def _paths(d, prefix=()) -> list:
    """Every (path) to a value inside a JSON tree."""
    out = [prefix]
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def fpm_model_text(draw):
    """An FPM model file: the fitted one with 1-3 values replaced, removed or grown; sometimes truncated,
    NaN/Infinity literals, or not JSON."""
    d = base_fpm_model()
    paths = [p for p in _paths(d) if p]
    for _ in range(draw(st.integers(1, 3))):
        p = draw(st.sampled_from(paths))
        parent = d
        try:
            for k in p[:-1]:
                parent = parent[k]
            op = draw(st.integers(0, 4))
            if op == 4 and isinstance(parent, dict):
                parent.pop(p[-1], None)
            elif op == 3 and isinstance(parent[p[-1]], (int, float)) and not isinstance(parent[p[-1]], bool):
                parent[p[-1]] = parent[p[-1]] * draw(st.sampled_from([-1, 0, 1e3, 1e300, -1e300, 1 + 1e-12]))
            else:
                parent[p[-1]] = draw(st.one_of(anything, st.sampled_from([-1000.0, 1000.0, [], {}, [1.0] * 9])))
        except (KeyError, IndexError, TypeError):
            pass
    text = json.dumps(d, default=str)
    if rare(draw, 8):
        text = text.replace("0.", draw(st.sampled_from(["NaN", "Infinity", "-Infinity"])) + "0.", 1)
    if rare(draw, 10):
        text = text[: draw(st.integers(0, len(text)))]
    if rare(draw, 20):
        return text.encode() + b"\xff"
    return text


SAMPLE_VALUES = (0, -1, 1.5, 2**53 + 1, float("nan"), float("inf"), "x", "", None, True, "1")


@st.composite
def fpm_samples_case(draw) -> dict:
    """Mutations of a samples table: {column: value (every row) or (row, value)}, sometimes a dropped
    column or failed rows."""
    from graphsim.views.fpm.schema import COORDS, IDENTITY, RESULTS

    cols = list(IDENTITY + COORDS + RESULTS + ("status", "error", "requests"))
    muts = {}
    for c in draw(st.lists(st.sampled_from(cols), max_size=2, unique=True)):
        v = draw(st.one_of(st.sampled_from(SAMPLE_VALUES), anything))
        muts[c] = (draw(st.integers(0, 11)), v) if draw(st.booleans()) else v
    drop = draw(st.sampled_from(cols)) if rare(draw, 6) else None
    status = draw(st.sampled_from(["ok", "oom", "unsupported", "x"])) if rare(draw, 4) else None
    return {"mutations": muts, "drop": drop, "status": status, "eval": draw(st.booleans())}


MEASURED_COLUMNS = ("m", "n", "k", "latency_s", "framework", "version", "device", "family", "op", "dtype",
                    "boundary", "kernel_source", "kv_dtype")


@st.composite
def measured_case(draw) -> dict:
    """A GEMM table of the fixture with mutated columns (one value or every row), in a copy of the fixture."""
    muts = {}
    for c in draw(st.lists(st.sampled_from(MEASURED_COLUMNS), max_size=2, unique=True)):
        v = draw(st.one_of(st.sampled_from(SAMPLE_VALUES + (1e-30, 1e30, 2**62, "gb300", "../x", "kernel"))))
        muts[c] = (draw(st.integers(0, 5)), v) if draw(st.booleans()) else v
    return {"mutations": muts, "view": draw(st.sampled_from(["op", "hybrid", "hybrid", "auto"])),
            "request": draw(valid_request()), "truncate": rare(draw, 10)}


HW_NAMES = ("testcpu", "testcpu", "GB200", "../../x", "/abs/x", "a/b", "..", ".", "", "x" * 200, "tab\tname",
            "nul\x00name", "ünïcode", "a\\b", ".hidden")
COLLECT_OUTPUTS = ["{tmp}/out", "{tmp}/out", "{tmp}/new/deep/out", "{tmp}/file", "{tmp}", "/dev/null", "/dev/full"]


@st.composite
def collect_case(draw) -> dict:
    return {"name": draw(st.one_of(st.sampled_from(HW_NAMES), st.text(max_size=6))),
            "out": draw(st.sampled_from(COLLECT_OUTPUTS)),
            "families": draw(st.sampled_from([["copy"], ["copy"], [], ["nope"], ["copy", "nope"]])),
            "bytes": draw(st.sampled_from([1024, 4096, 1024, 0, -5, 1.5, 2**40, "x"])),
            "warmup": draw(st.sampled_from([0, 0, 1, -1, 1.5, "x"])),
            "reps": draw(st.sampled_from([1, 1, 2, 0, -1, "x"]))}


PLOT_COLUMNS = ("decode.count", "decode.context", "forward_s", "mapping", "hw", "fits", "nope", "`decode.count`",
                "error", "tokens_per_s_per_gpu")
LITERALS = ("8", "64", "1e9", "-1", "'tp4'", "'GB200'", "true", "false", "[8, 64]", "['a']", "nan", "'", "[")
OPS_W = ("==", "!=", "<", "<=", ">", ">=", "in", "=", "~")


@st.composite
def where_text(draw, depth: int = 0):
    """A filter: comparisons of a column with a literal, joined by and/or/not, nested, sometimes malformed."""
    kind = draw(st.integers(0, 6 if depth < 4 else 2))
    if kind <= 2:
        return f"{draw(st.sampled_from(PLOT_COLUMNS))} {draw(st.sampled_from(OPS_W))} {draw(st.sampled_from(LITERALS))}"
    if kind == 3:
        return f"not {draw(where_text(depth + 1))}"
    if kind == 4:
        return f"({draw(where_text(depth + 1))})"
    return f"{draw(where_text(depth + 1))} {draw(st.sampled_from(['and', 'or', 'AND', 'xor']))} {draw(where_text(depth + 1))}"


@st.composite
def plot_case(draw) -> dict:
    where = None
    if draw(st.booleans()):
        where = draw(st.one_of(where_text(), st.sampled_from(WHERE),
                               st.integers(50, 400).map(lambda n: "(" * n + "decode.count == 8" + ")" * n),
                               st.integers(50, 400).map(lambda n: "not " * n + "decode.count == 8")))
    argv = ["plot", "{tmp}/r.parquet", "--kind", draw(st.sampled_from(["latency", "pareto", "kinds", "memory",
                                                                       "roofline"])),
            "-o", draw(st.sampled_from(["{tmp}/p.png", "{tmp}/p.svg", "{tmp}/new/p.png", "{tmp}", "/dev/null",
                                        "/dev/full", "{tmp}/p.txt"]))]
    if where is not None:
        argv += ["--where", where]
    if rare(draw, 3):
        argv += ["--x", draw(st.sampled_from(["decode.context", "decode.count", "nope", "forward_s"]))]
    return {"argv": argv}


# --------------------------------------------------------------------------------------------------
# search: argv, request-length files and cache entries (issue 26)
# --------------------------------------------------------------------------------------------------

#: the search a seeded cache comes from (the cache is hit only by runs of the same identity: model, hw, traffic,
#: kv margin, batches; SLA, refine and the mapping degrees may differ)
SEARCH_BASE = ["--model", "deepseek-v3", "--hw", "gb200", "--gpus", "8", "--isl", "2000", "--osl", "500",
               "--batch", "1,2"]
SEARCH_NUMS = ["0", "-1", "-5", "1e3", "2.5", "x", "", "9" * 30, "inf", "nan", str(2**63)]


def base_search_cache() -> dict:
    """The cache folder of a real SEARCH_BASE run (entry name -> text, with their ``.sum`` sidecars), run once
    per process in a subprocess (the campaign's parent never evaluates)."""
    if "search" not in _BASE:
        import os
        import subprocess
        import sys
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "t.parquet"
            subprocess.run([sys.executable, "-m", "graphsim", "search", *SEARCH_BASE, "--tp", "8", "--modes", "agg",
                            "--refine", "1", "-o", str(out), "--no-plot", "--no-progress"], check=True,
                           capture_output=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
            _BASE["search"] = {p.name: p.read_text() for p in sorted(Path(str(out) + ".parts").iterdir())}
    return dict(_BASE["search"])


CACHE_VALUES = (float("nan"), float("inf"), -1.0, 0.0, 1e-30, 1e300, "x", None, [], {}, [[1.0]], True)


@st.composite
def _cache_entries(draw) -> dict:
    """Files for ``t.parquet.parts/``: real entries with their bytes and/or sidecars broken — an array scaled
    (negative, zero, fractional, huge), a value NaN, a string or missing, a torn file, arrays of another
    length or shape, another kind; the sidecar missing,
    wrong, not JSON, or valid for the mutated bytes (so the entry is read) — and foreign entries."""
    import hashlib

    base = base_search_cache()
    names = sorted(n for n in base if n.endswith(".json"))
    out = {}
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True)):
        text, side = base[name], json.loads(base[name + ".sum"])
        d = json.loads(text)
        arrays = sorted(k for k, v in d.items() if isinstance(v, list) and v)
        for _ in range(draw(st.integers(0, 2))):
            key = draw(st.sampled_from(sorted(d) + ["bogus"]))
            op = draw(st.integers(0, 6))
            arrays = sorted(k for k, v in d.items() if isinstance(v, list) and v)  # what earlier steps left
            if op <= 1 and arrays:  # plausible numbers, insane: a whole array scaled (only sense can refuse it)
                key = draw(st.sampled_from(arrays))
                f = draw(st.sampled_from([-1.0, 0.0, 0.5, 1e300]))
                d[key] = [[x * f for x in r] if isinstance(r, list) else r * f for r in d[key]]
            elif op == 2 and arrays and "forward_s" in arrays:
                d["forward_s"] = [x[0] if isinstance(x, list) and x else [x, x] for x in d["forward_s"]]  # other rank
            elif op == 3 and key == "kind":
                d[key] = draw(st.sampled_from(["decode", "prefill", "mixed", "x", ""]))
            elif op == 3 and isinstance(d.get(key), list) and d[key]:
                lst = list(d[key])
                i = draw(st.integers(0, len(lst) - 1))
                lst[i] = draw(st.sampled_from(CACHE_VALUES)) if not isinstance(lst[i], list) or draw(st.booleans()) \
                    else [draw(st.sampled_from(CACHE_VALUES))] * len(lst[i])
                d[key] = lst
            elif op == 4 and isinstance(d.get(key), list) and d[key]:
                d[key] = d[key][: draw(st.integers(0, len(d[key]) - 1))] if draw(st.booleans()) else d[key] * 2
            elif op == 5:
                d.pop(key, None)
            else:
                d[key] = draw(st.sampled_from(CACHE_VALUES))
        text = json.dumps(d)
        if rare(draw, 8):
            text = text[: draw(st.integers(0, len(text)))]
        sc = draw(st.sampled_from(["valid", "valid", "valid", "missing", "wrong", "stale", "garbage", "list"]))
        if sc == "valid":
            side["sha256"] = hashlib.sha256(text.encode()).hexdigest()
        elif sc == "wrong":
            side["sha256"] = "0" * 64
        elif sc == "stale":  # bytes as written, but computed from another identity
            side = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "inputs": {"search": "0" * 64}}
        out[f"t.parquet.parts/{name}"] = text
        if sc == "garbage":
            out[f"t.parquet.parts/{name}.sum"] = draw(st.sampled_from(["", "{", "null", '{"sha256": 3, "inputs": 1}']))
        elif sc == "list":
            out[f"t.parquet.parts/{name}.sum"] = "[]"
        elif sc != "missing":
            out[f"t.parquet.parts/{name}.sum"] = json.dumps(side)
    if rare(draw, 4):  # an entry of no search, with and without a sidecar
        out["t.parquet.parts/0123456789abcdef01234567.json"] = draw(st.sampled_from(["{}", "[", "null"]))
        if draw(st.booleans()):
            out["t.parquet.parts/0123456789abcdef01234567.json.sum"] = "{}"
    if rare(draw, 10):  # a sidecar that is a folder
        out.pop(f"t.parquet.parts/{names[0]}.sum", None)
        out[f"t.parquet.parts/{names[0]}.sum/x"] = ""
    return out


@st.composite
def lengths_csv(draw):
    """A request-length distribution ``isl,osl,weight``: a few good rows, sometimes a value, the header or the
    encoding broken."""
    rows = [[draw(st.sampled_from([1, 128, 1000, 2000, 8000])), draw(st.sampled_from([1, 100, 500, 1000])),
             draw(st.sampled_from([1, 1, 3, 0.5]))] for _ in range(draw(st.integers(1, 4)))]
    header = ["isl", "osl", "weight"]
    if rare(draw, 3):
        r, c = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, 2))
        rows[r][c] = draw(st.sampled_from([0, -1, 2.5, 10**9, 10**30, "x", "", "nan", "inf", "True", "1e3", 2**63]))
    if rare(draw, 6):
        header = draw(st.sampled_from([["isl", "osl"], ["isl", "out"], ["isl", "osl", "count"], ["a", "b", "c"],
                                       ["isl", "isl", "osl"]]))
        rows = [r[: len(header)] for r in rows]
    text = ",".join(header) + "\n" + "".join(",".join(str(v) for v in r) + "\n" for r in rows)
    if rare(draw, 10):
        text = draw(st.sampled_from(["", "isl,osl,weight\n", "\n", "isl;osl\n1;2\n", '"unterminated\n']))
    if rare(draw, 15):
        return text.encode() + b"\xff\xfe"
    return text


SEARCH_BREAKS = ("gpus", "isl", "osl", "batch", "modes", "refine", "ttft", "tpot", "min-user-tps", "tpot-stat",
                 "kv-margin", "acceptance", "lengths+isl", "engine", "engine-set", "rate", "concurrency", "executor",
                 "launch-dir")


@st.composite
def search_case(draw) -> dict:
    """``graphsim search`` argv (each run well under 3 s: a small explicit space) with files: traffic from
    --isl/--osl or a --lengths CSV, SLA bounds, MTP acceptances, a table output and sometimes a pre-seeded
    cache of mutated entries beside it (``{tmp}/t.parquet.parts/``). Valid values mostly; about one case in
    two breaks one flag (the rest reach the search)."""
    files: dict = {}
    brk = draw(st.sampled_from(SEARCH_BREAKS)) if draw(st.booleans()) else None

    def pick(flag, good):
        return draw(st.sampled_from(SEARCH_NUMS if brk == flag else good))

    seeded = rare(draw, 3)
    if seeded:  # the base search's identity, so the seeded entries are looked up
        argv = ["search", *SEARCH_BASE]
        model, gpus = "deepseek-v3", "8"
        files.update(draw(_cache_entries()))
    else:
        model = draw(st.sampled_from(["deepseek-v3", "deepseek-v3", "llama-3.1-70b"]))
        gpus = pick("gpus", ["4", "8", "8"])
        argv = ["search", "--model", model, "--hw", draw(st.sampled_from(["gb200", "h200"])), "--gpus", gpus]
        if rare(draw, 6):
            files["lengths.csv"] = draw(lengths_csv())
            argv += ["--lengths", "{tmp}/lengths.csv"]
            if brk == "lengths+isl":
                argv += ["--isl", "100"]
        else:
            good = ["1", "128", "1000", "2000", "8000", "32000"]
            argv += ["--isl", pick("isl", good), "--osl", pick("osl", good)]
        batch = draw(st.lists(st.sampled_from(["1", "2", "4", "16", "64"]), min_size=1, max_size=3, unique=True))
        if brk == "batch":
            batch = [draw(st.sampled_from(["0", "-1", "x", "", ",", "100000", str(2**63)]))]
        argv += ["--batch", ",".join(batch)]
    tp = "4" if gpus == "4" or draw(st.booleans()) else "8"
    argv += ["--tp", tp, "--ep", tp] if model == "deepseek-v3" and tp == "4" else ["--tp", tp]
    argv += ["--modes", draw(st.sampled_from(["disagg", "agg,disagg", "x", ""] if brk == "modes" else ["agg"]))]
    argv += ["--refine", draw(st.sampled_from(["-1", "x", "1.5"] if brk == "refine" else ["0", "1"]))]
    for flag, vals in (("ttft", ["200", "2000", "50000", "0.001"]), ("tpot", ["5", "30", "100"]),
                       ("min-user-tps", ["10", "100", "1000"])):
        if brk == flag or draw(st.booleans()):
            argv += [f"--{flag}", pick(flag, vals)]
    if brk == "tpot-stat" or rare(draw, 3):
        argv += ["--tpot-stat", draw(st.sampled_from(["p50", "", "P99"] if brk == "tpot-stat" else ["mean", "p99"]))]
    if brk == "kv-margin" or rare(draw, 4):
        argv += ["--kv-margin", draw(st.sampled_from(["-1", "inf", "nan", "1e6", "x"] if brk == "kv-margin" else
                                                     ["0", "3", "1.5", "1000"]))]
    if model == "deepseek-v3" and (brk == "acceptance" or rare(draw, 4)):
        k = draw(st.integers(0, 3))
        acc = [draw(st.sampled_from(["0.8", "0.6", "0.9"])) for _ in range(k)]
        if brk == "acceptance":
            if acc and draw(st.booleans()):
                acc[0] = draw(st.sampled_from(["1.5", "-0.1", "a", "nan", "0"]))
            else:
                acc = acc[1:] if acc and draw(st.booleans()) else acc + ["0.5"]
        argv += ["--mtp", str(k)] if draw(st.integers(0, 3)) else []
        argv += ["--acceptance", ",".join(acc)]
    if brk == "engine" or rare(draw, 4):  # whose memory rule decides the batches
        argv += ["--engine", draw(st.sampled_from(["tgi", "", "VLLM"] if brk == "engine" else
                                                  ["auto", "none", "vllm", "trtllm", "sglang"]))]
    # an engine's terms overridden (a prediction prices its steps with them)
    if brk == "engine-set" or (brk != "engine" and rare(draw, 6)):
        argv += ["--engine", draw(st.sampled_from(["vllm", "trtllm", "sglang"]))]
        argv += ["--engine-set", draw(st.sampled_from(
            ["tokens=1", "step_tokens=8k", "graph_max_batch=-1", "launch_us=nan", "chunked_prefill=maybe", "=1",
             "moe_load_ratio=0.5"]
            if brk == "engine-set" else ["step_tokens=4096", "max_running=none", "launch_us=4", "chunked_prefill=false",
                                         "graph_max_batch=0", "step_overhead_us=50", "eplb=true",
                                         "moe_load_ratio=1.2"]))]
    # capacity planning, launch files, the executor (local only here: a Ray cluster is the slow test's)
    if brk == "rate" or rare(draw, 5):
        argv += ["--rate", draw(st.sampled_from(["0", "-1", "nan", "inf", "x"] if brk == "rate" else ["1", "50", "1e6"]))]
    if brk == "concurrency" or rare(draw, 6):
        argv += ["--concurrency", draw(st.sampled_from(["0", "-3", "1.5", "x"] if brk == "concurrency" else
                                                       ["1", "256", "100000"]))]
    if brk == "executor":
        argv += ["--executor", draw(st.sampled_from(["dask", "", "RAY"]))]
    if brk == "launch-dir" or rare(draw, 6):
        argv += ["--launch-dir", draw(st.sampled_from(["{tmp}/t.parquet", "/dev/full", "{tmp}/x/../"] if
                                                      brk == "launch-dir" else ["{tmp}/L", "{tmp}/new/L"]))]
        if draw(st.booleans()):
            argv.append("--launch")
    if rare(draw, 6):  # a prediction from the shipped tables, ranked beside its SOL twin
        argv += ["--measured", MEASURED, "--backend", draw(st.sampled_from(["trtllm@1.3.0rc20", "trtllm@9"]))]
    if seeded or draw(st.booleans()):
        argv += ["-o", "{tmp}/t.parquet" if seeded or draw(st.integers(0, 4)) else "{tmp}/t.csv"]
        if draw(st.integers(0, 5)):
            argv.append("--no-plot")
    if draw(st.booleans()):
        argv.append("--json")
    if rare(draw, 6):
        argv.append("--fresh")
    return {"argv": argv + ["--no-progress"], "files": files}


# --------------------------------------------------------------------------------------------------
# serve-sim: argv, request traces and synthetic streams (issue 27)
# --------------------------------------------------------------------------------------------------

SERVE_MODELS = ("deepseek-v3", "deepseek-v4.1-flash", "llama-3.1-70b")
#: per model, mappings that fit (the hw first) and mappings a user gets wrong
SERVE_DEPLOYMENTS = {
    "deepseek-v3": (("gb200", ["--tp", "8", "--ep", "8"]), ("gb200", ["--tp", "4", "--ep", "4"]),
                    ("h200", ["--tp", "8", "--ep", "8"]), ("gb200", ["--dp", "8", "--ep", "8"])),
    "deepseek-v4.1-flash": (("gb200", ["--tp", "4"]), ("gb200", ["--tp", "8"]), ("h200", ["--tp", "4", "--ep", "4"]),
                            ("gb200", ["--tp", "4", "--ep", "4"])),
    "llama-3.1-70b": (("h200", ["--tp", "4"]), ("h200", ["--tp", "2"]), ("gb200", ["--tp", "2", "--dp", "2"]),
                      ("h200", ["--tp", "8"])),
}
BAD_SERVE_MAPPINGS = (["--pp", "2"], ["--tp", "3"], ["--tp", "0"], ["--tp", "1"], ["--ep", "16"], ["--cp", "2"],
                      ["--tp", "x"], ["--dp", "-1"])
SERVE_TIERS_GOOD = ("host:fraction=0.1,ttl_s=300,holds=swa", "disk", "disk:capacity_gib=1", "host",
                    "host:capacity_gib=0.001,ttl_s=1", "disk:ttl_s=60,holds=global,price=0.0001",
                    "host:fraction=0,holds=global+swa", "disk:capacity_gib=inf,ttl_s=inf", "host:holds=global")
SERVE_TIERS_BAD = ("host:fraction=2", "host:fraction=nan", "host:fraction=-0.1", "host:capacity_gib=-1",
                   "disk:capacity_gib=nan", "disk:ttl_s=0", "disk:ttl_s=-5", "host:ttl_s=nan", "disk:price=-1",
                   "disk:price=nan", "disk:price=inf", "host:capacity_gib=1e400", "disk:holds=foo", "disk:holds=",
                   "nvme:capacity_gib=1", "host:bogus=1", "host:ttl_s", "host:", "", ":", "disk:fraction=0.1",
                   "host:capacity_gib=x", "disk:ttl_s=1e-300", "host:capacity_gib=1e-300", "HOST")
SERVE_PRICES = ("disk=0.0001", "host=1", "disk=x", "nvme=1", "disk=-1", "disk=inf", "disk=nan", "x", "=1", "disk=")
SERVE_FLAGS = {  # flag: (good values, bad values)
    "--replicas": (["1", "2", "3"], ["0", "-1", "x", "70000", "1.5", ""]),
    "--router": (["prefix", "least-loaded", "round-robin"], ["random", ""]),
    "--cache-design": (["auto", "three-tier", "swa-on-disk", "host-disk", "hbm"], ["x", "disk"]),
    "--ttft": (["100", "2000", "1e9"], ["0", "-1", "nan", "inf", "x"]),
    "--tpot": (["5", "50"], ["0", "-1", "nan", "inf", "x"]),
    "--classes": (["1000", "512,4096", "4096,512", "1,1"], ["0", "-5", "x", "", ",", str(2**70)]),
    "--token-budget": (["64", "512", "8192", "100000"], ["0", "-1", "x", str(2**30)]),
    "--max-running": (["1", "4", "64"], ["0", "-1", "x", str(2**40)]),
    "--hbm-kv-gib": (["0.001", "0.5", "1", "100", "inf"], ["0", "nan", "-1", "x", "-inf", "1e400"]),
    "--reserve-gib": (["0", "5"], ["-1", "inf", "nan", "1e6"]),
    "--head": (["1", "5", "1000"], ["0", "-1", "x"]),
    "--rate-scale": (["1", "10", "0.1", "1e-3"], ["0", "-1", "nan", "inf", "1e300", "1e-300", "x"]),
    "--validate": (["0", "4", "16"], ["-1", "x"]),
    "--engine": (["auto", "none", "sglang", "vllm", "trtllm"], ["tgi"]),
    "--seed": (["0", "7"], ["-1", "x", str(2**70)]),
}
SERVE_OUTPUTS = {"-o": (["{tmp}/out.json", "{tmp}/out.txt"], ["{tmp}", "/dev/full", "{tmp}/missing/dir/x.json"]),
                 "--requests-out": (["{tmp}/r.parquet", "{tmp}/r.csv", "{tmp}/new/r.csv"],
                                    ["{tmp}/r.txt", "{tmp}", "/dev/full", "{tmp}/r.json"]),
                 "--plot": (["{tmp}/p.png", "{tmp}/p.svg"], ["{tmp}/p.jpg", "{tmp}", "/dev/null"])}
TRACE_VALUES = (0, -1, -512, 1.5, 10**6, 2**63, 10**30, 1e300, float("nan"), float("inf"), True, None, "", "x",
                "12", "1e3", [1], {"a": 1})
TRACE_JUNK = ("", "\n\n", "not json\n", "[]\n", "{}\n", "null\n", '{"timestamp": 0, "input_length": 5\n',
              b"\x00\xff\xfe junk \x89PNG", b"PAR1\x00\x00junk", "timestamp,input_length\n", "\ufeff")


@st.composite
def trace_rows(draw) -> list:
    """Mooncake-like records: a few prefix chains shared between requests (so caches hit), short prompts and
    outputs, at most 60 requests."""
    n = draw(st.integers(1, 60))
    rows, t = [], 0
    for i in range(n):
        t += draw(st.sampled_from([0, 0, 1, 10, 100, 1000, 5000]))
        inp = draw(st.sampled_from([1, 2, 100, 511, 512, 513, 1500, 2048, 4000, 8000]))
        nb = -(-inp // 512)
        chain, share = draw(st.integers(0, 3)), draw(st.integers(0, nb))
        ids = [chain * 1000 + j for j in range(share)] + [100_000 + i * 20 + j for j in range(nb - share)]
        rows.append({"timestamp": t, "input_length": inp, "output_length": draw(st.sampled_from([1, 1, 2, 8, 32, 64])),
                     "hash_ids": ids})
    if rare(draw, 5):  # multi-turn columns
        for r in rows:
            r["session_id"], r["turn"] = draw(st.sampled_from([0, 1, 2])), draw(st.sampled_from([0, 1, 2]))
    return rows


@st.composite
def mangled_rows(draw) -> list:
    """trace_rows with, one time in three, a few records broken: a field missing or of a wrong value (negative,
    huge beyond any model's context, a string, NaN, a bool, a container), hash_ids too long / short / not
    whole numbers, the records shuffled (unsorted timestamps), unknown fields."""
    rows = draw(trace_rows())
    if draw(st.integers(0, 2)):
        return rows
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(rows) - 1))
        r = rows[i]
        op = draw(st.integers(0, 9))
        key = draw(st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "session_id", "turn"]))
        if not isinstance(r, dict):  # an earlier step made it a non-record
            continue
        ids = r.get("hash_ids") if isinstance(r.get("hash_ids"), list) else []  # (an earlier step may have broken it)
        if op == 0:
            r.pop(key, None)
        elif op <= 2:
            r[key] = draw(st.sampled_from(TRACE_VALUES))
        elif op == 3:  # beyond the context, with a hash list that fits it
            r["input_length"] = draw(st.sampled_from([131_072, 163_840, 200_000, 10**6]))
            r["hash_ids"] = ids[:4]
        elif op == 4:  # too many blocks
            r["hash_ids"] = ids + [7] * draw(st.integers(1, 5))
        elif op == 5:  # too few (fresh ids for the rest)
            r["hash_ids"] = ids[: draw(st.integers(0, len(ids)))]
        elif op == 6:
            r["hash_ids"] = draw(st.sampled_from([[-1], [1.5], ["a"], [2**63], "1 2 3", 5, [None], [[1]], {}]))
        elif op == 7:
            rows = draw(st.permutations(rows))
        elif op == 8:
            r["extra"] = draw(st.sampled_from(TRACE_VALUES))
        else:
            rows[i] = draw(st.sampled_from([[], "x", 3, None]))
    return rows


def _jsonl(rows, draw) -> str | bytes:
    lines = [json.dumps(r) for r in rows]
    if rare(draw, 8):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(["", "   ", "x", "[1]", "{", "NaN"])))
    text = "\n".join(lines) + "\n"
    if rare(draw, 12):
        text = text[: draw(st.integers(0, len(text)))]
    return text


def _csv(rows, draw) -> str:
    cols = []
    for r in rows:
        for k in (r if isinstance(r, dict) else {}):
            if k not in cols:
                cols.append(k)
    if rare(draw, 10):
        cols = draw(st.permutations(cols))
    out = [",".join(cols)]
    for r in rows:
        if not isinstance(r, dict):
            out.append(str(r))
            continue
        cells = []
        for k in cols:
            v = r.get(k, "")
            if isinstance(v, list):
                v = " ".join(map(str, v)) if draw(st.integers(0, 4)) else json.dumps(v)
            cells.append('"' + str(v).replace('"', '""') + '"' if "," in str(v) or '"' in str(v) else str(v))
        out.append(",".join(cells))
    return "\n".join(out) + "\n"


@st.composite
def synthetic_spec(draw) -> str:
    """--synthetic JSON: synthetic()'s arguments, small (<= 60 requests), sometimes with agent sessions; one time
    in two one field broken (unknown fields, bad distributions, zero or non-finite rates, both or neither of
    requests / duration_s), sometimes not a JSON object at all."""
    length = lambda mean: st.one_of(  # noqa: E731
        st.sampled_from([mean, mean // 2 + 1]),
        st.sampled_from([{"dist": "const", "value": mean}, {"dist": "uniform", "low": 1, "high": mean},
                         {"dist": "lognormal", "mean": mean, "cv": 1.0}, {"dist": "lognormal", "mean": mean, "cv": 0.5,
                                                                          "max": 2 * mean}]))
    spec: dict = {"rate": draw(st.sampled_from([0.5, 2, 10, 100])), "requests": draw(st.integers(1, 60))}
    if rare(draw, 4):
        spec = {"rate": 5, "duration_s": draw(st.sampled_from([0, 1, 5, 10]))}
    if draw(st.booleans()):
        spec["input"] = draw(length(draw(st.sampled_from([100, 1000, 3000]))))
    if draw(st.booleans()):
        spec["output"] = draw(length(draw(st.sampled_from([1, 8, 32]))))
    if rare(draw, 3):
        spec["arrival"] = "gamma"
        spec["cv"] = draw(st.sampled_from([0.5, 1, 3]))
    if rare(draw, 2):
        spec["sessions"] = {"turns": draw(st.sampled_from([1, 3, {"dist": "uniform", "low": 1, "high": 4}])),
                            "think_s": draw(st.sampled_from([0, 2, {"dist": "lognormal", "mean": 5, "cv": 1}])),
                            "tool_tokens": draw(st.sampled_from([0, 100, {"dist": "const", "value": 300}])),
                            "system_tokens": draw(st.sampled_from([0, 512, 1000]))}
        spec["requests"] = min(spec.get("requests", 60), 60)
    if rare(draw, 4):
        spec["seed"] = draw(st.sampled_from([0, 1, 12345]))
    if draw(st.booleans()):
        where = draw(st.sampled_from(["rate", "requests", "duration_s", "input", "output", "arrival", "cv", "seed",
                                      "block_tokens", "sessions", "bogus", "dist", "max", "sessions.turns",
                                      "sessions.system_tokens", "sessions.bogus", "uniform"]))
        v = draw(st.sampled_from((0, -1, 1.5, float("nan"), float("inf"), True, None, "x", [], {}, 2**70, -(2**63))))
        if where == "dist":
            spec["input"] = {"dist": draw(st.sampled_from(["normal", "", "const"])), "mean": 10}
        elif where == "max":
            spec["output"] = {"dist": "const", "value": 8, "max": v}
        elif where == "uniform":
            spec["input"] = {"dist": "uniform", "low": 100, "high": draw(st.sampled_from([10, -1, 1e300]))}
        elif where.startswith("sessions."):
            s = spec.setdefault("sessions", {"turns": 2})
            k = where.split(".", 1)[1]
            if k == "turns" and draw(st.booleans()):
                s.pop("turns", None)
            else:
                s[k] = v
        elif where == "duration_s":
            spec["duration_s"] = v  # with requests: both given
        else:
            spec[where] = v
    text = json.dumps(spec)  # NaN / Infinity as Python's json writes them (and reads them back)
    if rare(draw, 12):
        text = draw(st.sampled_from(["[]", "3", '"x"', "{", "", "null", "{'rate': 1}"]))
    return text


SEARCH_DOC_ROWS = ({"rank": 1, "mode": "agg", "decode_mapping": "tp8-dp1-ep8-pp1", "decode_replicas": 1,
                    "policies": "overlap=serial"},
                   {"rank": 2, "mode": "agg", "decode_mapping": "tp4-dp1-ep4-pp1", "decode_replicas": 2,
                    "policies": "default"})
SEARCH_ROW_BREAKS = {"decode_mapping": ["tp8", "tp8-dp1-ep8-pp2", "x", "", "tp0-dp1-ep1-pp1", "tp8-dp1-ep8-pp1-tp2",
                                        None, 8],
                     "decode_replicas": [0, -1, "x", 1.5, None, 2**70, float("nan")],
                     "policies": ["overlap=x", "x", "fusion=", "acceptance=1", "prefetch_distance=x",
                                  "ep_imbalance=nan", None, 3],
                     "mode": ["disagg", "", None], "rank": ["1", None, 1.5]}


@st.composite
def search_output(draw) -> tuple:
    """(file name, content, rank) of a graphsim search output for --from: a JSON document or a CSV table of
    ranked deployments, sometimes with a row broken or the file not a document at all."""
    rows = [dict(r) for r in SEARCH_DOC_ROWS]
    if draw(st.booleans()):
        r = rows[draw(st.integers(0, 1))]
        k = draw(st.sampled_from(sorted(SEARCH_ROW_BREAKS)))
        if draw(st.integers(0, 4)):
            r[k] = draw(st.sampled_from(SEARCH_ROW_BREAKS[k]))
        else:
            r.pop(k)
    if draw(st.booleans()):
        text = json.dumps({"best": rows} if draw(st.integers(0, 6)) else draw(st.sampled_from([{"best": []}, [], {}])))
        if rare(draw, 8):
            text = draw(st.sampled_from(["", "{", "null", '{"best": [1, 2]}', '{"best": "x"}']))
        name = "search.json"
        rank = draw(st.sampled_from(["1", "1", "2", "3", "0", "-1", "x"]))
    else:
        cols = sorted({k for r in rows for k in r})
        text = ",".join(cols) + "\n" + "".join(",".join("" if r.get(k) is None else str(r[k]) for k in cols) + "\n"
                                               for r in rows)
        if rare(draw, 8):
            text = draw(st.sampled_from(["", "a,b\n", '"\n', "decode_mapping\n"]))
        name = draw(st.sampled_from(["search.csv", "search.csv", "search.txt"]))
        rank = draw(st.sampled_from(["0", "0", "1", "2", "-1"]))
    return name, text, rank


@st.composite
def serve_sim_case(draw) -> dict:
    """``graphsim serve-sim`` argv with its files: a small trace (Mooncake JSONL / CSV / Parquet, good or mangled,
    or junk) or a --synthetic stream, a deployment (valid mostly, sometimes a mapping that is not), the engine
    and cache flags, SLA and report flags and outputs in the temp dir; about one case in two breaks one flag.
    One case in five calls graphsim.serving from Python instead (serve_api_case). Parquet traces are given as
    ``("parquet", rows)``: the target writes them (tests/fuzz/targets.py)."""
    if rare(draw, 4):  # the Python API instead of the command
        return draw(serve_api_case())
    files: dict = {}
    model = draw(st.sampled_from(SERVE_MODELS)) if draw(st.integers(0, 20)) else draw(name)
    hw, mapping = draw(st.sampled_from(SERVE_DEPLOYMENTS.get(model, SERVE_DEPLOYMENTS["llama-3.1-70b"])))
    if rare(draw, 8):
        mapping = list(draw(st.sampled_from(BAD_SERVE_MAPPINGS)))
    argv = ["serve-sim", "--model", model, "--hw", hw, *mapping]
    # traffic
    src = draw(st.sampled_from(["jsonl", "jsonl", "csv", "parquet", "synthetic", "synthetic"]))
    if rare(draw, 12):
        src = draw(st.sampled_from(["junk", "none", "both"]))
    if src in ("jsonl", "csv", "parquet", "both"):
        rows = draw(mangled_rows())
        ext = {"jsonl": draw(st.sampled_from([".jsonl", ".jsonl", ".json"])), "csv": ".csv",
               "parquet": draw(st.sampled_from([".parquet", ".pq"])), "both": ".jsonl"}[src]
        files["trace" + ext] = (_jsonl(rows, draw) if ext in (".jsonl", ".json") else _csv(rows, draw) if ext == ".csv"
                                else ("parquet", rows))
        argv += ["--trace", "{tmp}/trace" + ext]
    elif src == "junk":
        ext = draw(st.sampled_from([".jsonl", ".csv", ".parquet", ".txt", ""]))
        files["trace" + ext] = draw(st.sampled_from(TRACE_JUNK))
        argv += ["--trace", draw(st.sampled_from(["{tmp}/trace" + ext, "{tmp}/trace" + ext, "{tmp}/none.jsonl",
                                                  "{tmp}"]))]
    if src in ("synthetic", "both"):
        spec = draw(synthetic_spec())
        if rare(draw, 3):
            files["syn.json"] = spec
            spec = draw(st.sampled_from(["{tmp}/syn.json", "{tmp}/syn.json", "{tmp}/nope.json", "{tmp}"]))
        argv += ["--synthetic", spec]
    # deployment from a search output
    if rare(draw, 8):
        fname, text, rank = draw(search_output())
        files[fname] = text
        argv += ["--from", "{tmp}/" + fname, "--rank", rank]
    brk = draw(st.sampled_from(sorted(SERVE_FLAGS) + ["tier", "price", "output", "prefill", "spec", "grid", "row"])) \
        if draw(st.booleans()) else None
    if brk == "prefill" or rare(draw, 6):  # a disaggregated deployment: a prefill pool of the deployment's mapping
        pre = ",".join(f"{mapping[i][2:]}={mapping[i + 1]}" for i in range(0, len(mapping) - 1, 2)) or "tp=1"
        argv += ["--prefill", draw(st.sampled_from(["tp=3,ep=9", "x", ""] if brk == "prefill" else [pre])),
                 "--prefill-replicas", draw(st.sampled_from(["0", "-1", "x"] if brk == "prefill" and
                                                            draw(st.booleans()) else ["1", "2"]))]
    if brk == "spec" or rare(draw, 6):  # speculative decoding: MTP on V3, DSpark on V4.1, or a missing acceptance
        spec = {"deepseek-v3": ["--mtp", "1", "--acceptance", "0.8"],
                "deepseek-v4.1-flash": ["--dspark", "on", "--acceptance", "0.9,0.8,0.7,0.6,0.5"]}.get(model, ["--mtp", "1"])
        argv += spec[:2] if brk == "spec" else spec
    if brk == "grid" or rare(draw, 8):  # a grid: every point a simulation, rows to -o
        argv += ["--grid", draw(st.sampled_from(["replicas=1,x", "nope=1", "replicas=", "mapping=tp3"] if brk == "grid"
                                                else ["replicas=1,2", "cache_design=hbm,host-disk", "router=prefix"]))]
    if brk == "row":  # a search table names a row, not a rank
        fname, text, _ = draw(search_output())
        files[fname] = text
        argv += ["--from", "{tmp}/" + fname, "--row", draw(st.sampled_from(["0", "-1", "99999", "x"]))]
    for flag, (good, bad) in SERVE_FLAGS.items():
        if brk == flag or rare(draw, 3):
            argv += [flag, draw(st.sampled_from(bad if brk == flag else good))]
    if brk == "tier" or rare(draw, 4):
        twice = rare(draw, 5)  # the same tier named twice
        tiers = draw(st.lists(st.sampled_from(SERVE_TIERS_BAD if brk == "tier" else SERVE_TIERS_GOOD), min_size=1,
                              max_size=2, unique_by=(lambda t: t) if twice else (lambda t: t.split(":")[0])))
        argv += [x for t in tiers for x in ("--tier", t)]
    if brk == "price" or rare(draw, 5):
        argv += ["--price", draw(st.sampled_from(SERVE_PRICES if brk == "price" else SERVE_PRICES[:2]))]
    for flag, (good, bad) in SERVE_OUTPUTS.items():
        if rare(draw, 3):
            argv += [flag, draw(st.sampled_from(bad if brk == "output" and draw(st.booleans()) else good))]
    if rare(draw, 6):
        argv.append("--beyond-context")
    if rare(draw, 8) and model == "deepseek-v3" and hw == "gb200":  # a prediction from the shipped tables
        argv += ["--view", "hybrid", "--measured", MEASURED, "--backend", "trtllm@1.3.0rc20"]
    if "--validate" not in argv:
        argv += ["--validate", draw(st.sampled_from(["0", "8", "8", "256"]))]
    if draw(st.integers(0, 3)):
        argv.append("--json")
    if "--grid" in argv:  # a grid writes its rows to one -o table (the last -o wins: keep only that one)
        k = 0
        while "-o" in argv[k:]:
            k = argv.index("-o", k)
            del argv[k:k + 2]
        argv += ["-o", "{tmp}/grid.csv"]
    return {"argv": argv + ["--no-progress"], "files": files}


API_WEIRD = (0, -1, 1.5, 2**70, float("nan"), float("inf"), True, None, "x", "4", [], {})


@st.composite
def serve_api_case(draw) -> dict:
    """graphsim.serving through Python, as a script calls it: ``load_trace`` (format, block_tokens, time_unit) or
    ``synthetic(**kw)``, ``Trace.head`` / ``scale_rate``, tiers from ``TierSpec.parse`` (with the pooled host
    bytes) or ``TierSpec(...)``, a ``Deployment`` and ``simulate``'s keywords; valid mostly, one time in two one
    argument replaced by a value of the wrong kind or range."""
    files: dict = {}
    model = draw(st.sampled_from(SERVE_MODELS))
    hw, flags = draw(st.sampled_from(SERVE_DEPLOYMENTS[model]))
    mapping = {flags[i][2:]: int(flags[i + 1]) for i in range(0, len(flags), 2)}
    if draw(st.booleans()):
        files["t.jsonl"] = _jsonl(draw(trace_rows()), draw)
        traffic = {"load_trace": {}}
    else:
        try:
            kw = json.loads(draw(synthetic_spec()))  # (NaN / Infinity read back as Python floats)
        except ValueError:
            kw = None
        keep = ("requests", "duration_s", "rate", "arrival", "cv", "input", "output", "sessions", "seed",
                "block_tokens")
        traffic = {"synthetic": {k: v for k, v in kw.items() if k in keep} if isinstance(kw, dict) else
                   {"rate": 1, "requests": 5}}  # (an unknown keyword is Python's TypeError, not graphsim's to name)
    case = {"files": files, "traffic": traffic, "head": None, "scale": None, "tiers": None,
            "deployment": {"model": model, "hw": hw, "mapping": mapping},
            "simulate": {"validate": draw(st.sampled_from([0, 4])), "samples": draw(st.sampled_from([200, 20, 0]))}}
    if rare(draw, 3):
        case["deployment"].update({k: draw(st.sampled_from(v)) for k, v in (
            ("replicas", [1, 2]), ("max_running", [None, 4]), ("token_budget", [None, 512]),
            ("hbm_kv_gib", [None, 1.0, float("inf")]), ("engine", ["auto", "none", "vllm"]),
            ("reserve_gib", [None, 2.0]))})
    if rare(draw, 3):
        case["simulate"].update({"cache_design": draw(st.sampled_from(["auto", "hbm", "host-disk"])),
                                 "router": draw(st.sampled_from(["prefix", "round-robin"])),
                                 "sla": (draw(st.sampled_from([None, 500.0])), draw(st.sampled_from([None, 30]))),
                                 "classes": draw(st.sampled_from([(), (1000,), (512, 4096)])),
                                 "seed": draw(st.sampled_from([0, 3]))})
    if rare(draw, 3):
        texts = draw(st.lists(st.sampled_from(SERVE_TIERS_GOOD), min_size=1, max_size=2,
                              unique_by=lambda t: t.split(":")[0]))
        case["tiers"] = {"parse": texts, "host_bytes": 1e12}
    if rare(draw, 4):
        case["head"] = draw(st.sampled_from([1, 5, 100]))
    if draw(st.booleans()):  # one argument broken
        where = draw(st.sampled_from(["load_trace", "synthetic", "head", "scale", "tier", "tier_bytes", "tier_kw",
                                      "deployment", "mapping", "simulate"]))
        v = draw(st.sampled_from(API_WEIRD))
        if where == "load_trace" and "load_trace" in traffic:
            traffic["load_trace"][draw(st.sampled_from(["format", "block_tokens", "time_unit"]))] = v
        elif where == "synthetic" and "synthetic" in traffic:
            traffic["synthetic"][draw(st.sampled_from(["rate", "requests", "input", "cv", "seed", "sessions"]))] = v
        elif where in ("head", "scale"):
            case[where] = v
        elif where == "tier":
            case["tiers"] = {"parse": [v], "host_bytes": 1e12}
        elif where == "tier_bytes":
            case["tiers"] = {"parse": ["host:fraction=0.1"], "host_bytes": v}
        elif where == "tier_kw":
            case["tiers"] = {"kw": {"name": "disk", draw(st.sampled_from(["name", "capacity_bytes", "ttl_s", "holds",
                                                                        "price_gib_hour"])): v}}
        elif where == "deployment":  # numbers of any kind; names as strings (objects are the caller's types)
            k = draw(st.sampled_from(["model", "hw", "engine", "replicas", "max_running", "token_budget", "hbm_kv_gib",
                                      "reserve_gib"]))
            case["deployment"][k] = draw(st.sampled_from(["x", "", "../x", "gb200", "llama-3.1-70b"])) \
                if k in ("model", "hw", "engine") else v
        elif where == "mapping":
            case["deployment"]["mapping"] = {draw(st.sampled_from(["tp", "dp", "ep", "cp"])): v}
        else:
            case["simulate"][draw(st.sampled_from(["cache_design", "router", "classes", "seed", "validate", "samples",
                                                   "prices", "sla"]))] = v
    return {"api": case, "argv": [], "files": files}
