"""Deployment search against aiconfigurator: best configurations, throughput and wall time (tables, no assertions).

1. DeepSeek-V3 on 8x GB200, ISL 4000 / OSL 1000, TTFT <= 2000 ms, TPOT <= 30 ms: ``graphsim.serving.search.search``
   in-process and ``graphsim search --json`` in a fresh process (wall clock of each), and — with
   ``--aic-python`` — ``aiconfigurator cli default`` on the same case in a subprocess (its SOL database mode;
   when SOL cannot run for this system/model, its default database mode, labelled as such). The top 3 of each
   tool and the best of each mode (agg, disagg) side by side, then a SOL check: graphsim's SOL should never be
   beaten — by a measured-data estimate above all — and where it is, the step times of both tools at the same
   mapping and batch (prefill of one prompt per DP rank, one decode step) with their op breakdowns point at the
   term. The same search with an FP8 KV cache (``attention_precision=fp8``, what aiconfigurator's TRT-LLM model
   assumes) is listed for a like-for-like reading.
2. DeepSeek-V4.1-Flash (not in aiconfigurator) on 8x GB200 and 8x GB300, same traffic and SLA: best deployment,
   tokens/s per GPU and the GB300/GB200 ratio (rerun with a wider batch grid when the best batch is at its edge).

Markdown on stdout (and ``--out FILE``).

    python benchmarks/bench_search.py [--aic-python /path/to/venv/bin/python] [--aic-database-modes SOL,SILICON]
                                      [--out results.md]

aiconfigurator pulls in a large dependency tree, so it lives in a separate virtualenv, run only as a subprocess.
Its names differ from graphsim's: system ``gb200`` / ``gb300``, model ``deepseek-ai/DeepSeek-V3`` (a bundled
Hugging Face config), parallel ``tpXppYdpZetpUepV`` (= graphsim ``tpX-dpZ-epV``; graphsim derives the MoE TP
degree U = X·Z/V).
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from graphsim.serving.search import DEFAULT_BATCHES, SLA, Space, Traffic, search

CASE = {"isl": 4000, "osl": 1000, "ttft": 2000.0, "tpot": 30.0, "gpus": 8}
V3 = {"graphsim": ("deepseek-v3", "gb200"), "aic": ("deepseek-ai/DeepSeek-V3", "gb200")}
V41 = "deepseek-v4.1-flash"
TOP = 3


# ---- graphsim ---------------------------------------------------------------------------------------------------
def gs_search(model: str, hw: str, space: Space = Space()) -> tuple:
    t0 = time.perf_counter()
    r = search(model, hw, gpus=CASE["gpus"], traffic=Traffic.of(CASE["isl"], CASE["osl"]),
               sla=SLA(CASE["ttft"], CASE["tpot"]), space=space, top=TOP)
    return r, time.perf_counter() - t0


def gs_cli(model: str, hw: str) -> tuple[dict | None, float, str]:
    """``graphsim search --json`` in a fresh interpreter: (document, wall seconds, error)."""
    args = [sys.executable, "-m", "graphsim", "search", "--model", model, "--hw", hw, "--gpus", str(CASE["gpus"]),
            "--isl", str(CASE["isl"]), "--osl", str(CASE["osl"]), "--ttft", f"{CASE['ttft']:g}",
            "--tpot", f"{CASE['tpot']:g}", "--top", str(TOP), "--json", "--no-progress"]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        r = subprocess.run(args, capture_output=True, text=True, cwd=tmp, timeout=600)
        wall = time.perf_counter() - t0
    if r.returncode:
        return None, wall, (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return json.loads(r.stdout), wall, ""


def _dp(mapping: str) -> int:
    m = re.search(r"dp(\d+)", mapping)
    return int(m.group(1)) if m else 1


def gs_row(r: dict) -> dict:
    """A graphsim result row in the common form of the tables."""
    pol = "" if r["policies"] == "default" else f" [{r['policies']}]"
    conc = r["decode_batch"] * r["decode_replicas"]
    batch = f"{conc} ({r['decode_batch'] // _dp(r['decode_mapping'])}/rank)"
    if r["mode"] == "disagg":
        batch = f"D {batch}, P {r['prefill_batch']}/fwd"
    return {"mode": r["mode"], "mapping": r["mapping"] + pol, "batch": batch, "gpus": int(r["gpus"]),
            "tps_gpu": float(r["tokens_per_s_per_gpu"]), "tps_user": float(r["tokens_per_s_per_user"]),
            "ttft": float(r["ttft_ms"]), "tpot": float(r["tpot_ms"]), "per_rank": r["decode_batch"] //
            _dp(r["decode_mapping"]), "decode_mapping": r["decode_mapping"]}


def gs_top(res, mode: str | None = None, n: int = TOP) -> list[dict]:
    """Best ``n`` deployments meeting the SLA (one row per mode and mapping, as the search ranks them)."""
    t = res.table[res.table["meets_sla"]]
    if mode:
        t = t[t["mode"] == mode]
    t = t.sort_values("tokens_per_s_per_gpu", ascending=False).drop_duplicates(["mode", "mapping"]).head(n)
    return [gs_row(r) for r in t.to_dict("records")]


# ---- aiconfigurator -------------------------------------------------------------------------------------------------
def aic_version(python: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:  # an empty cwd: `python -c` puts the working directory on sys.path
        r = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('aiconfigurator'))"],
                           capture_output=True, text=True, cwd=tmp, timeout=120)
    return r.stdout.strip() or "?"


def aic_default(python: str, database_mode: str | None, timeout: int) -> dict:
    """``aiconfigurator cli default`` on the V3 case; best agg/disagg rows from its saved CSVs."""
    model, system = V3["aic"]
    args = [python, "-m", "aiconfigurator.main", "cli", "default", "--model-path", model, "--system", system,
            "--total-gpus", str(CASE["gpus"]), "--isl", str(CASE["isl"]), "--osl", str(CASE["osl"]),
            "--ttft", f"{CASE['ttft']:g}", "--tpot", f"{CASE['tpot']:g}", "--top-n", str(TOP), "--no-color"]
    if database_mode:
        args += ["--database-mode", database_mode]
    out = {"database_mode": database_mode or "default", "rows": {}, "error": "", "wall": None, "search_s": None}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        try:  # its own cwd: python -m puts the working directory on sys.path
            r = subprocess.run(args + ["--save-dir", tmp], capture_output=True, text=True, cwd=tmp, timeout=timeout)
        except subprocess.TimeoutExpired:
            out["error"] = f"timed out after {timeout} s"
            return out
        out["wall"] = time.perf_counter() - t0
        text = r.stdout + r.stderr
        m = re.search(r"All experiments completed in ([\d.]+) seconds", text)
        out["search_s"] = float(m.group(1)) if m else None
        m = re.search(r"Perf-DB version: (\S+)", text)
        out["db_version"] = m.group(1) if m else ""
        for mode in ("agg", "disagg"):
            files = glob.glob(os.path.join(tmp, "**", mode, "best_config_topn.csv"), recursive=True)
            if files:
                with open(files[0], newline="") as f:
                    out["rows"][mode] = [aic_row(mode, x) for x in csv.DictReader(f)][:TOP]
        if r.returncode or not any(out["rows"].values()):
            errs = [ln for ln in text.splitlines() if "error" in ln.lower() or "Error" in ln]
            out["error"] = (errs[-1] if errs else f"exit {r.returncode}, no results")[-300:]
    return out


def aic_row(mode: str, x: dict) -> dict:
    f = lambda k: float(x[k])  # noqa: E731
    if mode == "agg":
        reps = int(f("num_total_gpus")) // max(1, int(f("tp")) * int(f("pp")) * int(f("dp")))
        mapping = x["parallel"] + (f" x{reps}" if reps > 1 else "")
        batch = f"{int(f('concurrency'))} ({int(f('bs'))}/rank)"
        quant = f"gemm {x['gemm']}, kv {x['kvcache']}, fmha {x['fmha']}, moe {x['moe']}"
        par = {k: int(f(k)) for k in ("tp", "dp", "moe_tp", "moe_ep")}
        per_rank = int(f("bs"))
    else:
        per = lambda k: int(f(f"({k})tp")) * int(f(f"({k})pp")) * int(f(f"({k})dp")) * int(f(f"({k})workers"))  # noqa: E731
        reps = int(f("num_total_gpus")) // max(1, per("p") + per("d"))
        mapping = f"P {x['(p)parallel']} x{x['(p)workers']} + D {x['(d)parallel']} x{x['(d)workers']}" + \
            (f" (x{reps} replicas)" if reps > 1 else "")
        batch = f"D {int(f('(d)global_bs'))} ({int(f('(d)bs'))}/rank), P {int(f('(p)global_bs'))}/fwd"
        quant = f"gemm {x['(d)gemm']}, kv {x['(d)kvcache']}, fmha {x['(d)fmha']}, moe {x['(d)moe']}"
        par = {k: int(f(f"(d){k}")) for k in ("tp", "dp", "moe_tp", "moe_ep")}
        per_rank = int(f("(d)bs"))
    return {"mode": mode, "mapping": mapping, "batch": batch, "gpus": int(f("num_total_gpus")),
            "tps_gpu": f("tokens/s/gpu"), "tps_user": f("tokens/s/user"), "ttft": f("ttft"), "tpot": f("tpot"),
            "backend": f"{x.get('backend', '')} {x.get('version', '')}".strip(), "quant": quant, "par": par,
            "per_rank": per_rank}


AIC_STEPS = r"""
import json, logging, sys
logging.disable(logging.WARNING)
from aiconfigurator.cli.api import cli_estimate
a = json.load(sys.stdin)
kw = dict(database_mode=a["database_mode"], tp_size=a["tp"], attention_dp_size=a["dp"], moe_tp_size=a["moe_tp"],
          moe_ep_size=a["moe_ep"])
pre = cli_estimate(a["model"], a["system"], mode="static_ctx", isl=a["isl"], osl=2, batch_size=1, **kw)
dec = cli_estimate(a["model"], a["system"], mode="static_gen", isl=a["ctx"], osl=2, batch_size=a["bs"], **kw)
print(json.dumps({"prefill_ms": pre.ttft, "decode_ms": dec.tpot,
                  "prefill_ops": dict(pre.summary.get_context_latency_dict()),
                  "decode_ops": dict(dec.summary.get_generation_latency_dict())}))
"""


#: aiconfigurator's own SOL of one DeepSeek-V3 layer's MLA pieces: the module op its model prices (the path it
#: takes when the module table identity matches) and the granular ops the module stands for. Private engine
#: plumbing (``_engine_query``), so best effort. Shapes from the DeepSeek-V3 config: hidden 7168, 128 heads,
#: q_lora 1536, kv_lora 512 (+ 64 rope: the fused q_a/kv_a "downscale" GEMM is 2112 wide), v_head 128.
AIC_MLA = r"""
import json, logging, sys
logging.disable(logging.WARNING)
from aiconfigurator_core.sdk import common, operations as ops
from aiconfigurator_core.sdk.perf_database import get_database
a = json.load(sys.stdin)
db = get_database(a["system"], a["backend"], a["version"], database_mode="SOL")
db.set_default_database_mode(common.DatabaseMode.SOL)
q, kv = common.GEMMQuantMode.fp8_block, common.KVCacheQuantMode.fp8
us = lambda r: float(r) * 1e3
gemms = {"downscale": (2112, 7168), "q_b": (24576, 1536), "kv_b": (32768, 512), "o_proj": (7168, 16384)}
pre = {k: us(ops.GEMM(k, 1, n, kk, q)._engine_query(db, x=a["isl"])) for k, (n, kk) in gemms.items()}
pre["module"] = us(ops.MLAModule("m", 1, True, 128, kv, common.FMHAQuantMode.bfloat16, q,
                                 native_num_heads=128)._engine_query(db, batch_size=1, s=a["isl"], is_context=True))
pre["attention core"] = us(ops.ContextMLA("c", 1, 128, kv, common.FMHAQuantMode.bfloat16)._engine_query(
    db, batch_size=1, s=a["isl"]))
dec = {k: us(ops.GEMM(k, 1, n, kk, q)._engine_query(db, x=a["bs"])) for k, (n, kk) in gemms.items() if k != "kv_b"}
dec["module"] = us(ops.MLAModule("m", 1, False, 128, kv, common.FMHAQuantMode.fp8, q,
                                 native_num_heads=128)._engine_query(db, batch_size=a["bs"], s=a["ctx"], is_context=False))
dec["attention core"] = us(ops.GenerationMLA("g", 1, 128, kv)._engine_query(db, batch_size=a["bs"], s=a["ctx"]))
dec["bmm pre+post"] = sum(us(ops.MLABmm("b", 1, 128, common.GEMMQuantMode.fp8, if_pre=p)._engine_query(
    db, batch_size=a["bs"], s=a["ctx"])) for p in (True, False))
print(json.dumps({"prefill": pre, "decode": dec}))
"""


def aic_mla(python: str, backend: str, per_rank: int, timeout: int) -> dict | None:
    name, version = (backend.split() + ["", ""])[:2]
    args = {"system": V3["aic"][1], "backend": name, "version": version, "isl": CASE["isl"], "bs": per_rank,
            "ctx": Traffic.of(CASE["isl"], CASE["osl"]).decode_context}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([python, "-c", AIC_MLA], input=json.dumps(args), capture_output=True, text=True,
                               cwd=tmp, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode:
        print(f"note: aiconfigurator MLA op probe failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}",
              file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def aic_steps(python: str, par: dict, per_rank: int, database_mode: str, timeout: int) -> dict | None:
    """aiconfigurator's static prefill (one prompt per DP rank) and decode step at a mapping and batch."""
    args = {"model": V3["aic"][0], "system": V3["aic"][1], "database_mode": database_mode, "isl": CASE["isl"],
            "ctx": Traffic.of(CASE["isl"], CASE["osl"]).decode_context, "bs": per_rank, **par}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([python, "-c", AIC_STEPS], input=json.dumps(args), capture_output=True, text=True,
                               cwd=tmp, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"note: aiconfigurator step estimate timed out after {timeout} s", file=sys.stderr)
        return None
    if r.returncode:
        print(f"note: aiconfigurator step estimate failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}",
              file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def gs_steps(par: dict, per_rank: int, attention_precision: str = "auto") -> dict:
    """graphsim's prefill (one prompt per DP rank) and decode step at an aiconfigurator mapping and batch."""
    import graphsim as gs

    model, hw = V3["graphsim"]
    m = gs.ParallelMapping(tp=par["tp"], dp=par["dp"], ep=par["moe_ep"])
    pol = gs.Policies(attention_precision=attention_precision)
    ctx = Traffic.of(CASE["isl"], CASE["osl"]).decode_context
    out = {}
    for kind, req in (("prefill", f"prefill:{CASE['isl']}x{par['dp']}"),
                      ("decode", f"decode:{ctx}x{per_rank * par['dp']}")):
        rep = gs.compile_plan(model, gs.Plan([req], m, pol), hw).report()
        out[f"{kind}_ms"] = rep.forward_s * 1e3
        out[f"{kind}_ops"] = {k: v * 1e3 for k, v in rep.breakdown.items() if v > 0}
        out[f"{kind}_attn_block_us"], out["layers"] = _attention_block_us(rep.critical_path)
    return out


def _attention_block_us(ops: list) -> tuple[float | None, int]:
    """Time of one MoE layer's attention block (after its input norm, up to the post-attention norm), µs."""
    layers = sorted({o["layer"] for o in ops if o["layer"] is not None})
    if not layers:
        return None, 0
    mid = layers[len(layers) // 2]
    names = [o for o in ops if o["layer"] == mid]
    try:
        i = next(k for k, o in enumerate(names) if o["name"].endswith(".attn_norm"))
        j = next(k for k, o in enumerate(names) if o["name"].endswith(".mlp_norm"))
    except StopIteration:
        return None, len(layers)
    return sum(o["duration_s"] for o in names[i + 1:j]) * 1e6, len(layers)


# ---- Markdown --------------------------------------------------------------------------------------------------
def md_table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def row_cells(tool: str, rank, r: dict, wall: str) -> list:
    return [tool, rank, r["mode"], r["mapping"], r["batch"], r["gpus"], f"{r['tps_gpu']:,.1f}", f"{r['tps_user']:.1f}",
            f"{r['ttft']:.0f}", f"{r['tpot']:.2f}", wall]


HEAD = ["tool", "#", "mode", "parallel mapping", "batch (concurrency)", "GPUs", "tok/s/GPU", "tok/s/user", "TTFT ms",
        "TPOT ms", "tool wall s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aic-python", default=os.environ.get("GRAPHSIM_AIC_PYTHON"),
                    help="python of a virtualenv with aiconfigurator (run in a subprocess; skipped without it)")
    ap.add_argument("--aic-database-modes", default="SOL",
                    help="aiconfigurator database modes to run, comma-separated (default SOL; e.g. SOL,SILICON adds "
                         "its measured-data estimate)")
    ap.add_argument("--aic-timeout", type=int, default=900, help="seconds per aiconfigurator run (default 900)")
    ap.add_argument("--no-explain", action="store_true",
                    help="skip the step-time comparison at aiconfigurator's best mapping")
    ap.add_argument("--out", default=None, metavar="FILE", help="also write the Markdown here")
    a = ap.parse_args()
    md: list[str] = []
    say = md.append
    case = (f"ISL {CASE['isl']} / OSL {CASE['osl']}, TTFT <= {CASE['ttft']:g} ms, TPOT <= {CASE['tpot']:g} ms, "
            f"{CASE['gpus']} GPUs")

    # ---- 1. DeepSeek-V3 on 8x GB200: graphsim --------------------------------------------------------------------
    model, hw = V3["graphsim"]
    res, t_api = gs_search(model, hw)
    doc, t_cli, cli_err = gs_cli(model, hw)
    res_fp8, t_fp8 = gs_search(model, hw, Space(policies=(("overlap", ("none", "two-batch")),
                                                          ("attention_precision", ("auto", "fp8")))))
    if doc and res.best and doc["best"][0]["mapping"] != res.best[0]["mapping"]:
        cli_err = f"CLI best {doc['best'][0]['mapping']} differs from the API's {res.best[0]['mapping']}"
    gs_wall = f"{t_api:.1f} (API) / {t_cli:.1f} (CLI)"
    tools = [("graphsim SOL", gs_top(res), {m: gs_top(res, m, 1) for m in ("agg", "disagg")}, gs_wall),
             ("graphsim SOL, FP8 KV", gs_top(res_fp8), {m: gs_top(res_fp8, m, 1) for m in ("agg", "disagg")},
              f"{t_fp8:.1f} (API)")]
    notes = [f"graphsim: `graphsim.serving.search.search('{model}', '{hw}', gpus=8, ...)` in-process {t_api:.2f} s "
             f"({res.stats['programs_compiled']} programs, {res.stats['rows']:,} points); fresh "
             f"`graphsim search ... --json` process {t_cli:.2f} s" + (f" ({cli_err})" if cli_err else "") +
             "; `FP8 KV` = the same search with `--policy attention_precision=auto,fp8` (FP8 KV cache and "
             "attention, as aiconfigurator's TRT-LLM model assumes; graphsim's default keeps DeepSeek-V3's KV in BF16)."]

    # ---- aiconfigurator ----------------------------------------------------------------------------------------------
    aic_runs = []
    if a.aic_python and os.path.exists(a.aic_python):
        ver = aic_version(a.aic_python)
        for mode in [m.strip().upper() for m in a.aic_database_modes.split(",") if m.strip()]:
            run = aic_default(a.aic_python, mode, a.aic_timeout)
            label = f"aiconfigurator {ver} {mode}"
            if run["error"] and mode == "SOL":
                notes.append(f"aiconfigurator could not run SOL mode for {V3['aic'][1]} / {V3['aic'][0]}: "
                             f"{run['error']}; falling back to its default database mode.")
                run = aic_default(a.aic_python, None, a.aic_timeout)
                label = f"aiconfigurator {ver} default DB mode (SOL fallback)"
            if run["error"] and not any(run["rows"].values()):
                notes.append(f"{label}: failed ({run['error']})")
                continue
            run["label"] = label
            aic_runs.append(run)
            rows = sorted(run["rows"].get("agg", []) + run["rows"].get("disagg", []), key=lambda r: -r["tps_gpu"])
            first = (run["rows"].get("agg") or run["rows"].get("disagg"))[0]
            wall = f"{run['wall']:.1f}" + (f" (search {run['search_s']:.1f})" if run["search_s"] else "")
            db_flag = f" --database-mode {run['database_mode']}" if run["database_mode"] != "default" else ""
            tools.append((label, rows[:TOP], {m: run["rows"].get(m, [])[:1] for m in ("agg", "disagg")}, wall))
            notes.append(f"{label}: `aiconfigurator cli default --model-path {V3['aic'][0]} --system {V3['aic'][1]} "
                         f"--total-gpus 8 --isl {CASE['isl']} --osl {CASE['osl']} --ttft {CASE['ttft']:g} --tpot "
                         f"{CASE['tpot']:g}{db_flag} --top-n {TOP}` (backend {first['backend']}, "
                         f"{first['quant']}); wall {run['wall']:.1f} s for the process"
                         + (f", {run['search_s']:.1f} s reported for its experiments" if run["search_s"] else "") +
                         (f"; warning: {run['error']}" if run["error"] else "") + ".")
    else:
        notes.append("aiconfigurator: not run (give `--aic-python PATH` to a virtualenv that has it).")

    say(f"## DeepSeek-V3 on 8x GB200: {case}\n")
    say("### Top 3 per tool (meeting the SLA, by output tokens/s per GPU)\n")
    rows = []
    for tool, top, _, wall in tools:
        rows += [row_cells(tool, i + 1, r, wall if i == 0 else "") for i, r in enumerate(top)]
        if not top:
            rows.append([tool, "-", "no deployment meets the SLA", "", "", "", "", "", "", "", wall])
    md.extend(md_table(HEAD, rows))
    say("\n### Best per mode\n")
    rows = []
    for tool, _, per_mode, wall in tools:
        for m in ("agg", "disagg"):
            rows += [row_cells(tool, "best", r, "") for r in per_mode[m]] or \
                [[tool, "best", m, "none meets the SLA", "", "", "", "", "", "", ""]]
    md.extend(md_table(HEAD, rows))
    say("")
    md.extend(f"- {n}" for n in notes)
    say("- aiconfigurator's `tpXppYdpZetpUepV` is graphsim's `tpX-dpZ-epV` (graphsim's MoE TP = X·Z/V); "
        "batch = concurrent requests of the deployment (per attention-DP rank in brackets); disagg `P n/fwd` = "
        "prompts per prefill forward.")

    # ---- SOL check --------------------------------------------------------------------------------------------------
    if aic_runs:
        say("\n### SOL check: graphsim SOL against aiconfigurator (best per mode)\n")
        rows, flags = [], []
        for run in aic_runs:
            for m in ("agg", "disagg"):
                ref = run["rows"].get(m, [])
                for tool, _, per_mode, _ in tools[:2]:
                    g = per_mode[m]
                    if not ref or not g:
                        continue
                    ratio = g[0]["tps_gpu"] / ref[0]["tps_gpu"]
                    verdict = "ok" if ratio >= 1 else "**graphsim below**"
                    rows.append([tool, run["label"], m, f"{g[0]['tps_gpu']:,.1f}", f"{ref[0]['tps_gpu']:,.1f}",
                                 f"{ratio:.3f}", verdict])
                    if ratio < 1:
                        flags.append((tool, run, m, g[0], ref[0], ratio))
        md.extend(md_table(["graphsim", "against", "mode", "graphsim tok/s/GPU", "aic tok/s/GPU", "ratio", ""], rows))
        say("")
        for tool, run, m, g, ref, ratio in flags:
            sol = run["database_mode"] == "SOL"
            say(f"- FLAG: {tool} best {m} {g['tps_gpu']:,.1f} tok/s/GPU ({g['mapping']}, {g['batch']}, TPOT "
                f"{g['tpot']:.2f} ms) is below {run['label']}'s {ref['tps_gpu']:,.1f} ({ref['mapping']}, "
                f"{ref['batch']}, TPOT {ref['tpot']:.2f} ms): ratio {ratio:.3f}"
                + (" — two speed-of-light models disagree; see the step times below." if sol else
                   " — a SOL beaten by a measured-data estimate."))
        if not flags:
            say("- graphsim's SOL is at or above aiconfigurator's best in every mode compared.")
        sol_runs = [r for r in aic_runs if r["rows"].get("agg")]
        if not a.no_explain and sol_runs:
            explain(a, sol_runs[0], res, say, md)

    # ---- 2. DeepSeek-V4.1-Flash on GB200 and GB300 --------------------------------------------------------------
    say(f"\n## DeepSeek-V4.1-Flash on 8x GB200 and 8x GB300 (graphsim only): {case}\n")
    best = {}
    rows = []
    wide = DEFAULT_BATCHES + (1536, 2048)
    for hw in ("gb200", "gb300"):
        r, t = gs_search(V41, hw)
        b = gs_top(r, n=1)
        best[hw] = b[0] if b else None
        if b:
            rows.append([hw.upper(), b[0]["mode"], b[0]["mapping"], b[0]["batch"], f"{b[0]['tps_gpu']:,.1f}",
                         f"{b[0]['tps_user']:.1f}", f"{b[0]['ttft']:.0f}", f"{b[0]['tpot']:.2f}", f"{t:.1f}"])
            if b[0]["per_rank"] >= max(DEFAULT_BATCHES):  # at the edge of the batch grid: widen it once
                r2, t2 = gs_search(V41, hw, Space(batches=wide))
                b2 = gs_top(r2, n=1)[0]
                best[hw + "_wide"] = b2
                rows.append([f"{hw.upper()}, batches to {max(wide)}/rank", b2["mode"], b2["mapping"], b2["batch"],
                             f"{b2['tps_gpu']:,.1f}", f"{b2['tps_user']:.1f}", f"{b2['ttft']:.0f}",
                             f"{b2['tpot']:.2f}", f"{t2:.1f}"])
        else:
            rows.append([hw.upper(), "-", "no deployment meets the SLA", "", "", "", "", "", f"{t:.1f}"])
    md.extend(md_table(["hardware", "mode", "best deployment", "batch (concurrency)", "tok/s/GPU", "tok/s/user",
                        "TTFT ms", "TPOT ms", "search wall s"], rows))
    say("")
    if best.get("gb200") and best.get("gb300"):
        say(f"- GB300 / GB200 best tokens/s per GPU: {best['gb300']['tps_gpu']:,.1f} / {best['gb200']['tps_gpu']:,.1f} "
            f"= **{best['gb300']['tps_gpu'] / best['gb200']['tps_gpu']:.3f}x** (default search space)")
        if best.get("gb200_wide") or best.get("gb300_wide"):
            g2, g3 = best.get("gb200_wide", best["gb200"]), best.get("gb300_wide", best["gb300"])
            say(f"- with the batch grid widened where the best sat at its edge ({max(DEFAULT_BATCHES)}/rank): "
                f"{g3['tps_gpu']:,.1f} / {g2['tps_gpu']:,.1f} = {g3['tps_gpu'] / g2['tps_gpu']:.3f}x")
    text = "\n".join(md) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


def explain(a, run: dict, res, say, md) -> None:
    """Step times of both tools at aiconfigurator's best agg mapping and batch, with their op breakdowns."""
    ref = run["rows"]["agg"][0]
    par, b = ref["par"], ref["per_rank"]
    mode = run["database_mode"] if run["database_mode"] != "default" else "SILICON"
    aic = aic_steps(a.aic_python, par, b, mode, a.aic_timeout)
    g16 = gs_steps(par, b)
    g8 = gs_steps(par, b, "fp8")
    ctx = Traffic.of(CASE["isl"], CASE["osl"]).decode_context
    say(f"\n### Step times at {run['label']}'s best agg mapping ({ref['mapping']} = graphsim tp{par['tp']}-"
        f"dp{par['dp']}-ep{par['moe_ep']}), {b} requests per DP rank\n")
    head = ["step", "graphsim SOL ms", "graphsim SOL FP8-KV ms"] + ([f"aic {mode} ms", "graphsim / aic"] if aic else [])
    rows = []
    for kind, what in (("prefill", f"prefill, 1 x {CASE['isl']}-token prompt per DP rank ({par['dp']} prompts)"),
                       ("decode", f"decode step, {b * par['dp']} requests at context {ctx}")):
        r = [what, f"{g16[f'{kind}_ms']:.2f}", f"{g8[f'{kind}_ms']:.2f}"]
        if aic:
            r += [f"{aic[f'{kind}_ms']:.2f}", f"{g16[f'{kind}_ms'] / aic[f'{kind}_ms']:.3f}"]
        rows.append(r)
    md.extend(md_table(head, rows))
    say("")
    for kind in ("prefill", "decode"):
        ranked = sorted(g16[f"{kind}_ops"].items(), key=lambda x: -x[1])
        gops = ", ".join(f"{k} {v:.2f}" for k, v in ranked if v >= 0.01)
        say(f"- graphsim {kind} by op kind (ms, BF16 KV): {gops}")
        if aic:
            aops = ", ".join(f"{k.split('_', 1)[1]} {v:.2f}" for k, v in aic[f"{kind}_ops"].items() if v >= 0.01)
            say(f"- aiconfigurator {kind} by op (ms): {aops}")
            mla = [v for k, v in aic[f"{kind}_ops"].items() if "mla" in k]
            n = g8["layers"] or 1
            if mla and g8[f"{kind}_attn_block_us"]:
                say(f"- attention block per layer ({kind}): graphsim FP8-KV {g8[f'{kind}_attn_block_us']:.1f} µs "
                    f"(q/kv projections, attention, o_proj at the roofline), aiconfigurator `mla_block` "
                    f"{sum(mla) / n * 1e3:.1f} µs ({sum(mla):.2f} ms / {n} layers)")
    # agg TPOT at this batch if each prefill ran as its own forward, pausing the decodes: T_dec + B/OSL x T_pre/dp.
    # graphsim's search prefills together with the decodes (mixed steps, one weight read), which is never slower.
    mla = aic_mla(a.aic_python, ref["backend"], b, a.aic_timeout) if run["database_mode"] == "SOL" else None
    if mla and aic:
        n = g8["layers"] or 1
        for kind, covered in (("prefill", ("downscale", "q_b", "kv_b", "o_proj")),
                              ("decode", ("downscale", "q_b", "o_proj"))):
            x = mla[kind]
            miss = sum(x[k] for k in covered)
            parts = " + ".join(f"{k} {x[k]:.1f}" for k in covered)
            inner = (f"its attention core alone {x['attention core']:.1f} µs" if kind == "prefill" else
                     f"attention core {x['attention core']:.1f} + BMMs {x['bmm pre+post']:.1f} µs")
            say(f"- aiconfigurator's own SOL per layer ({kind}): `mla_block` module {x['module']:.1f} µs = {inner}; "
                f"the projection GEMMs, priced by its own SOL ({parts} = {miss:.1f} µs), appear nowhere in its "
                f"{kind} ops: x {n} layers = {miss * n / 1e3:.2f} ms missing; with them its {kind} step is "
                f"{aic[f'{kind}_ms']:.2f} + {miss * n / 1e3:.2f} = {aic[f'{kind}_ms'] + miss * n / 1e3:.2f} ms "
                f"(graphsim {g16[f'{kind}_ms']:.2f} BF16 KV / {g8[f'{kind}_ms']:.2f} FP8 KV)")
    steps = [("graphsim, BF16 KV", g16), ("graphsim, FP8 KV", g8)] + ([(f"aiconfigurator {mode}", aic)] if aic else [])
    for lab, g in steps:
        tpot = g["decode_ms"] + b * par["dp"] / CASE["osl"] * g["prefill_ms"] / par["dp"]
        say(f"- agg TPOT at {b * par['dp']} requests from the {lab} steps with separate prefill forwards "
            f"(graphsim's mixed steps are never slower), T_dec + B/OSL x T_pre/dp: "
            f"{g['decode_ms']:.2f} + {b * par['dp']}/{CASE['osl']} x {g['prefill_ms']:.2f}/{par['dp']} = {tpot:.2f} ms "
            f"(aiconfigurator's agg TPOT: {ref['tpot']:.2f} ms)")


if __name__ == "__main__":
    main()
