"""``graphsim search``: the best deployment for a model, GPU count, traffic and SLA — aggregated or
disaggregated, every parallel mapping, batch sizes and the model's policies — ranked, with the Pareto front,
why the others lost and the commands that launch it on SGLang, vLLM, TensorRT-LLM and Dynamo (graphsim.serving.search,
graphsim.serving.launch; docs/search.md)."""
from __future__ import annotations

import contextlib
import json
import sys

from ..core.errors import GraphsimError, require

TABLE_SUFFIXES = (".parquet", ".csv")


def _policies(items: list[str]):
    if not items:
        return None
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        vals = tuple(x.strip() for x in v.split(",") if x.strip())
        if not sep or not k.strip() or not vals:
            raise GraphsimError("policy", f"expected FIELD=V1[,V2...], e.g. fusion=unfused,single-pass; got {item!r}")
        field = k.strip().replace("-", "_")
        from .app import float_list, int_list
        from ..driver.pipeline import Policies

        default = getattr(Policies(), field, None)  # numeric fields take numbers (unknown fields: Space says so)
        if isinstance(default, int) and not isinstance(default, bool):
            vals = int_list(v, f"policy.{field}")
        elif isinstance(default, float):
            vals = float_list(v, f"policy.{field}")
        out[field] = vals
    return tuple(out.items())


def register(sub) -> None:
    from .app import _view_args, add_command, model_hw_args, output_args, reserve_arg

    p = add_command(
        sub, "search", help="find the best deployment under an SLA: agg/disagg, mappings, batches, policies",
        description="Search aggregated and disaggregated deployments of a model on N GPUs: every parallel mapping "
                    "the model accepts,\nbatch sizes and the model's policies, priced by graphsim (the view and "
                    "profile chosen). Ranks the deployments\nthat meet the SLA by output tokens/s per GPU, gives the "
                    "Pareto front (tokens/s/GPU vs tokens/s/user), why the\nothers lost, and the SGLang / vLLM / "
                    "TensorRT-LLM / Dynamo commands (--launch-dir writes them). The serving model and the flag "
                    "tables: docs/search.md.",
        examples=["graphsim search --model deepseek-v3 --hw gb200 --gpus 8 --isl 4000 --osl 1000 --ttft 2000 --tpot 30",
                  "graphsim search --model deepseek-v4.1-flash --hw gb300 --gpus 8 --isl 4000 --osl 1000 --ttft 2000 "
                  "--tpot 30 --json",
                  "graphsim search --model deepseek-v3 --hw gb200 --gpus 16 --isl 8000 --osl 500 --modes disagg "
                  "--tp 1,2 -o results.parquet"])
    g = model_hw_args(p)
    g.add_argument("--gpus", type=int, required=True, metavar="N",
                   help="GPUs to deploy on: floor(N / replica size) aggregated replicas, or prefill + decode pools of "
                        "at most N; tokens/s per GPU counts the GPUs a deployment uses")
    reserve_arg(g)
    g.add_argument("--kv-margin", type=float, default=None, metavar="SIGMAS",
                   help="memory holds each decode request at the steady-state mean context isl + osl/2 plus this many "
                        "standard deviations of a DP rank's summed context (default 3: positions uniform over "
                        "[isl, isl + osl], osl/sqrt(12) each; docs/search.md)")
    t = p.add_argument_group("traffic", "one request class (--isl/--osl) or a distribution (--lengths)")
    t.add_argument("--isl", type=int, default=None, metavar="TOKENS", help="prompt tokens per request")
    t.add_argument("--osl", type=int, default=None, metavar="TOKENS", help="output tokens per request")
    t.add_argument("--lengths", default=None, metavar="FILE",
                   help="request-length distribution: CSV, JSON or Parquet with columns isl, osl [, weight]")
    s = p.add_argument_group("SLA", "bounds a deployment must meet (omit one to leave it free)")
    s.add_argument("--ttft", type=float, default=None, metavar="MS", help="time to first token bound, ms")
    s.add_argument("--tpot", type=float, default=None, metavar="MS",
                   help="time per output token (mean inter-token latency) bound, ms")
    s.add_argument("--rate", type=float, default=None, metavar="REQ/S",
                   help="capacity: the request rate to carry; prints the fewest GPUs (replicas of a deployment that "
                        "meets the SLA) that carry it")
    s.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help="capacity: requests in flight to hold at once (with or without --rate)")
    s.add_argument("--min-user-tps", type=float, default=None, metavar="TOK/S",
                   help="minimum output tokens/s per user")
    s.add_argument("--tpot-stat", default="mean", choices=("mean", "p99"),
                   help="which TPOT --tpot bounds: the steady-state mean (default) or the p99 over the step mix "
                        "(a step that prefills is a spike)")
    sp = p.add_argument_group("space", "what is searched (comma lists prune it)")
    sp.add_argument("--modes", default="agg,disagg", help="agg, disagg or both (default agg,disagg)")
    for ax, what in (("tp", "tensor"), ("dp", "attention data"), ("ep", "expert")):
        sp.add_argument(f"--{ax}", default=None, metavar="N[,N...]",
                        help=f"{what}-parallel degrees to try (default: every degree the model accepts)")
    sp.add_argument("--pp", default="1", metavar="N[,N...]",
                    help="pipeline degrees (default 1; give 1,2 to add 2: pipeline decode is priced as a fill-drain "
                         "forward)")
    sp.add_argument("--cp", default="1", metavar="N[,N...]",
                    help="context-parallel degrees for prefill pools (default 1; give 1,2 to add 2)")
    sp.add_argument("--batch", default=None, metavar="B[,B...]",
                    help="decode requests per attention-DP rank (default 1,2,4,...,512)")
    sp.add_argument("--prefill-batch", default=None, metavar="P[,P...]",
                    help="prompts per DP rank in a disaggregated prefill forward (default 1,2,4,8)")
    sp.add_argument("--policy", action="append", default=[], metavar="FIELD=V1[,V2...]",
                    help="a policy axis and its values, base first (repeatable): replaces that default axis or adds "
                         "one, e.g. attention_precision=auto,fp8; one value holds it fixed (overlap=none). Default "
                         "axes: fusion, overlap, decoder_replay, engram with the values the model supports")
    sp.add_argument("--acceptance", default="", metavar="A1,...,AK",
                    help="search speculative decoding (MTP-K, or DSpark with K = its draft block) at these "
                         "per-position acceptances; without it speculation stays off")
    sp.add_argument("--mtp", type=int, default=None, metavar="K",
                    help="the deepest MTP draft searched (depths 0..K), as in estimate --mtp: give K --acceptance "
                         "values (without --mtp, K is the number of --acceptance values)")
    sp.add_argument("--engine", default="auto", choices=("auto", "none", "sglang", "vllm", "trtllm"),
                    help="whose documented memory rule and KV paging decide which batches fit (vLLM "
                         "gpu_memory_utilization 0.92 and 16-token blocks, TensorRT-LLM 0.9 of free memory and "
                         "32-token blocks, SGLang token pages); auto: the --backend's framework under a measured "
                         "view, none under SOL (a bound keeps every byte)")
    sp.add_argument("--engine-set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override one of the engine's documented terms (repeatable): max_running, step_tokens "
                         "(a number or none), chunked_prefill, graph_max_batch, launch_us, graph_launch_us, "
                         "step_overhead_us, memory_fraction, kv_block_tokens; a prediction prices steps with them "
                         "(docs/search.md has the defaults and sources)")
    sp.add_argument("--refine", type=int, default=4, metavar="N",
                    help="how many of the best deployments along the tok/s/GPU vs tok/s/user front get the policy "
                         "stage (default 4; 0 = base policies only; chosen without the SLA)")
    sp.add_argument("--exhaustive", action="store_true",
                    help="policy stage: every combination of the policy axes instead of one axis at a time + the "
                         "combinations of the values on the front (with --refine >= the deployments: the whole "
                         "space, a bound on it)")
    sp.add_argument("--executor", default="local", choices=("local", "ray"),
                    help="where programs are evaluated: local (--jobs processes) or ray (a Ray cluster: --address, "
                         "default a local instance); the same rows either way")
    sp.add_argument("--address", default=None, metavar="HOST:PORT", help="--executor ray: the cluster to join")
    sp.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="evaluate programs on N worker processes (default 1; the same results)")
    sp.add_argument("--max-replica-gpus", type=int, default=None, metavar="N",
                    help="largest replica (GPUs of one mapping) to try (default --gpus)")
    _view_args(p)
    o = p.add_argument_group("results")
    o.add_argument("--top", type=int, default=5, metavar="N", help="deployments to rank (default 5)")
    o.add_argument("--launch", action="store_true", help="print launch flags for every ranked deployment (default: #1)")
    o.add_argument("--launch-dir", default=None, metavar="DIR",
                   help="write the launch files of deployment #1 (with --launch: every rank, #K in DIR/rank-K): a "
                        "script per engine and pool, router / proxy, benchmark, the TensorRT-LLM YAMLs and a README")
    o.add_argument("--plot", default=None, metavar="FILE",
                   help="Pareto picture (.png/.svg/.pdf); with -o results.parquet it defaults to results.pareto.png")
    o.add_argument("--no-plot", action="store_true", help="with -o TABLE: do not draw the Pareto picture")
    o.add_argument("--fresh", action="store_true", help="ignore programs cached by an earlier run on the same -o")
    o.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="show progress on stderr (default: when stderr is a terminal)")
    o.add_argument("--no-progress", dest="progress", action="store_false", help="no progress line")
    output_args(p, output="FILE.parquet/.csv: every evaluated deployment x batch (the Pareto data; re-running "
                          "resumes from FILE.parts/); any other name: the printed result")
    p.set_defaults(fn=run)


def _space(a):
    from .app import float_list, int_list
    from ..serving.search import DEFAULT_BATCHES, DEFAULT_PREFILL_BATCHES, Space

    acc = float_list(a.acceptance, "acceptance")
    if a.mtp is not None:
        require(a.mtp >= 0, "mtp", f"a draft depth >= 0, got {a.mtp}")
        require(len(acc) == a.mtp, "acceptance", f"--mtp {a.mtp} searches draft depths up to {a.mtp}: give "
                f"{a.mtp} per-position acceptances (A1,...,A{a.mtp}), got {len(acc)}")
    modes = tuple(m.strip() for m in a.modes.split(",") if m.strip())
    return Space(modes=modes, tp=int_list(a.tp, "tp"), dp=int_list(a.dp, "dp"), ep=int_list(a.ep, "ep"),
                 pp=int_list(a.pp, "pp"), cp=int_list(a.cp, "cp"), batches=int_list(a.batch, "batch") or DEFAULT_BATCHES,
                 prefill_batches=int_list(a.prefill_batch, "prefill_batch") or DEFAULT_PREFILL_BATCHES,
                 policies=_policies(a.policy), acceptance=acc, refine=a.refine, exhaustive=a.exhaustive,
                 max_replica_gpus=a.max_replica_gpus)


def run(a) -> None:
    import shutil
    from pathlib import Path

    from .app import load_model_args, view_spec
    from ..core.outputs import check_output, emit, exclusive, output_path
    from ..serving.search import SLA, Traffic, search

    from ..serving.search import DEFAULT_KV_MARGIN

    margin = DEFAULT_KV_MARGIN if a.kv_margin is None else a.kv_margin
    if a.lengths:
        if a.isl is not None or a.osl is not None:
            raise GraphsimError("lengths", "give --isl/--osl or --lengths, not both")
        traffic = Traffic.load(a.lengths, margin)
    else:
        if a.isl is None or a.osl is None:
            raise GraphsimError("isl" if a.isl is None else "osl", "required (or give --lengths FILE)")
        traffic = Traffic.of(a.isl, a.osl, margin)
    sla = SLA(a.ttft, a.tpot, a.min_user_tps, a.tpot_stat)
    space = _space(a)
    table_out = a.output if a.output and a.output.lower().endswith(TABLE_SUFFIXES) else None
    text_out = a.output if a.output and not table_out else None
    if table_out:
        output_path(table_out, suffixes=TABLE_SUFFIXES, regular=True)
    check_output(text_out)  # every output is checked before the work
    if a.launch_dir:
        output_path(a.launch_dir, field="launch_dir", folder=True)
    plot = a.plot or (None if a.no_plot or not table_out else str(Path(table_out).with_suffix("")) + ".pareto.png")
    if plot:
        from ..exports.plots import IMAGE_SUFFIXES

        output_path(plot, suffixes=IMAGE_SUFFIXES)
    # one run at a time per output: a second search writing the same -o fails at once with one line
    # (issue 26: two concurrent runs both printed "wrote" and the first one's rows were lost)
    with contextlib.ExitStack() as held:
        for out in (table_out, text_out, plot):
            if out:
                held.enter_context(exclusive(out))
        cache = None
        if table_out:
            cache = Path(table_out + ".parts")
            if a.fresh:
                shutil.rmtree(cache, ignore_errors=True)
        from .app import prediction_default

        prediction_default(a)
        show = a.progress if a.progress is not None else sys.stderr.isatty()
        bar = _Progress() if show else None
        try:
            r = search(load_model_args(a), a.hw, gpus=a.gpus, traffic=traffic, sla=sla, space=space, top=a.top,
                       profile=a.profile, view=view_spec(a), reserve_gib=a.reserve_gib, cache_dir=cache, progress=bar,
                       jobs=a.jobs, engine=a.engine, engine_set=tuple(a.engine_set), executor=a.executor,
                       address=a.address)
        finally:
            if bar:
                bar.close()
        notes = []
        if table_out:
            _write_table(table_out, r.table)
            notes.append(f"wrote {table_out} ({len(r.table):,} rows; cache {cache.name}/ lets a rerun resume)")
        if plot:
            from ..exports.plots import plot_pareto

            title = f"{r.model} on {r.gpus}x {r.hw}: ISL/OSL {_traffic_text(r.traffic)} ({r.view})"
            t = r.table
            # the points the front is drawn from: those that fit and meet TTFT (the TPOT bound is a vertical line
            # in tokens/s per user, which the front crosses)
            t = t[t["fits"] & (t["ttft_ms"] <= r.sla.ttft_ms if r.sla.ttft_ms else True)]
            color = "policies" if t["policies"].nunique() <= 12 else "mode"
            plot_pareto(t, plot, x="tokens_per_s_per_user", y="tokens_per_s_per_gpu", color=color, marker="mode",
                        title=title)
            notes.append(f"wrote {plot}")
        if a.launch_dir and r.best:
            from ..serving.launch import write_launch_dir

            wrote = write_launch_dir(a.launch_dir, [b["launch"] for b in (r.best if a.launch else r.best[:1])])
            notes.append(f"wrote {len(wrote)} launch files to {a.launch_dir} (README.md lists them)")
        elif a.launch_dir:
            notes.append(f"no deployment meets the SLA: nothing written to {a.launch_dir}")
        cap = None
        if a.rate is not None or a.concurrency is not None:
            from ..serving.capacity import fewest_gpus

            cap = fewest_gpus(r, a.rate, a.concurrency)
        if a.json:
            doc = r.to_json()
            doc["capacity"] = cap
            text = json.dumps(doc, indent=2) + "\n"
        else:
            text = to_text(r, launch_all=a.launch) + (_capacity_text(cap) if cap is not None else "")
        emit(text_out, text, "JSON" if a.json else "text")
        for n in notes:
            print(n, file=sys.stderr if a.json and not text_out else sys.stdout)


def _capacity_text(cap: dict) -> str:
    load = " and ".join(x for x in (f"{cap['rate_per_s']:g} requests/s" if cap["rate_per_s"] else "",
                                    f"{cap['concurrency']:,} requests in flight" if cap["concurrency"] else "") if x)
    if cap["fewest_gpus"] is None:
        return f"\ncapacity: no deployment meets the SLA, so none carries {load}\n"
    return (f"\ncapacity: {load} need {cap['fewest_gpus']:,} GPUs at the fewest: {cap['replicas']}x "
            f"{cap['deployment']} ({cap['tokens_per_s_per_gpu']:,.1f} tok/s/GPU; replicas scale the load linearly)\n")


def _write_table(path: str, df) -> None:
    """The rows as Parquet or CSV, replaced atomically (the one checked writer: permission and folder errors are
    one line)."""
    from ..core.outputs import atomic_target

    with atomic_target(path, suffixes=TABLE_SUFFIXES) as tmp:
        if path.lower().endswith(".parquet"):
            df.to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False)


class _Progress:
    """A bar of programs evaluated on stderr (rich; its total grows as each search stage plans its programs)."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("search: programs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=False)
        self.bar.start()
        self.task = self.bar.add_task("search", total=0)
        self.total = 0

    def expect(self, n: int) -> None:
        self.total += n
        self.bar.update(self.task, total=self.total)

    def __call__(self, k: int) -> None:
        self.bar.advance(self.task, k)

    def close(self) -> None:
        self.bar.update(self.task, total=self.bar.tasks[0].completed)  # planned programs skipped: done anyway
        self.bar.stop()


def _traffic_text(t) -> str:
    if len(t.isl) == 1:
        return f"{t.isl[0]}/{t.osl[0]}"
    return f"{len(t.isl)} classes (mean OSL {t.mean_osl:.0f})"


def _sla_text(s) -> str:
    stat = " (p99)" if s.tpot_stat == "p99" else ""
    parts = [f"TTFT <= {s.ttft_ms:g} ms" if s.ttft_ms else "", f"TPOT{stat} <= {s.tpot_ms:g} ms" if s.tpot_ms else "",
             f">= {s.min_tokens_per_s_per_user:g} tok/s/user" if s.min_tokens_per_s_per_user else ""]
    return ", ".join(p for p in parts if p) or "none"


def _num(v, digits: int) -> str:
    """A number for a table cell; "-" where there is none (a row without a SOL twin)."""
    import math

    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def to_text(r, launch_all: bool = False, pareto_rows: int = 12, lost_rows: int = 10) -> str:
    sp, st = r.space, r.stats
    axes = "; ".join(f"{a['field']} {'/'.join(map(str, a['values']))}" for a in sp["policy_axes"]) or "none"
    lines = [f"graphsim search {r.model} on {r.gpus}x {r.hw}: ISL/OSL {_traffic_text(r.traffic)}; SLA "
             f"{_sla_text(r.sla)}; {r.view} view, profile {r.profile}"
             + (f"; {sp['engine']} memory rule and KV pages" if sp.get("engine", "none") != "none" else "")
             + ("; its steps priced (limits, chunked prompts, host time)" if sp.get("engine_steps") == "priced"
                else ""),
             f"searched {'+'.join(sp['modes'])}: {sp['decode_mappings']} decode / {sp['prefill_mappings']} prefill "
             f"mappings, batches {sp['batches_per_dp_rank'][0]}..{sp['batches_per_dp_rank'][-1]} per DP rank, "
             f"policy axes: {axes}; {st['programs_compiled']} programs compiled, {st['programs_cached']} from cache, "
             f"{st['rows']:,} points in {st['wall_s']:.1f} s", ""]
    if r.view == "sol" and r.profile == "sol":
        lines += ["times are lower bounds (SOL): no run is faster; each row's TTFT and TPOT are achieved together "
                  "by its TTFT step's schedule", ""]
    else:
        lines += [f"times are predictions ({r.view} view, profile {r.profile}), ranked by the prediction; the SOL "
                  "columns are the same row at the speed of light (the bound no run beats)", ""]
    predicted = not (r.view == "sol" and r.profile == "sol")
    if not r.best:
        lines.append("no deployment meets the SLA (see why below; the Pareto front shows what is reachable)")
    else:
        from ..exports.tables import text_table

        heads = ["#", "mode", "deployment", "policies", "batch", "GPUs", "TTFT ms", "(step)", "TPOT ms", "p99",
                 "tok/s/user", "tok/s/GPU", "req/s", "tok/J", "free GiB"] + \
            (["SOL TTFT", "SOL TPOT", "SOL tok/s/GPU"] if predicted else [])
        right = [True, False, False, False, True, True, True, False] + [True] * (len(heads) - 8)
        rows, extra = [], []
        for b in r.best:
            batch = b["decode_batch"] if b["verify"] == 0 else f"{b['decode_batch']}v{b['verify']}"
            rows.append([str(b["rank"]), b["mode"], b["mapping"], b["policies"], str(batch), str(b["gpus"]),
                         f"{b['ttft_ms']:.0f}", b["ttft_step"], f"{b['tpot_ms']:.2f}", f"{b['tpot_p99_ms']:.2f}",
                         f"{b['tokens_per_s_per_user']:.1f}", f"{b['tokens_per_s_per_gpu']:.1f}",
                         _num(b.get("requests_per_s"), 2), _num(b.get("output_tokens_per_joule"), 2),
                         f"{b['memory_headroom_gib']:.1f}"]
                        + ([_num(b.get("sol_ttft_ms"), 0), _num(b.get("sol_tpot_ms"), 2),
                            _num(b.get("sol_tokens_per_s_per_gpu"), 1)] if predicted else []))
            others = [p for p in b.get("jointly_achievable", []) if p["ttft_step"] != b["ttft_step"]]
            if others:
                extra.append(f"  #{b['rank']} also achieves together: " + "; ".join(
                    f"TTFT {p['ttft_ms']:.0f} ms ({p['ttft_step']}) with TPOT {p['tpot_ms']:.2f} ms" for p in others))
        lines += text_table(heads, rows, right=right) + extra
    lines += ["", f"Pareto front (tok/s/GPU vs tok/s/user; fits and meets TTFT): {len(r.pareto)} points"]
    front = r.pareto
    if len(front) > pareto_rows:  # evenly spaced along the front, both ends kept
        step = (len(front) - 1) / (pareto_rows - 1)
        front = [front[round(i * step)] for i in range(pareto_rows)]
    for p in front:
        tpot = p["tpot_p99_ms" if r.sla.tpot_stat == "p99" else "tpot_ms"]
        ok = "" if not r.sla.tpot_ms or tpot <= r.sla.tpot_ms else "  (misses TPOT)"
        lines.append(f"  {p['tokens_per_s_per_user']:>8.1f} tok/s/user {p['tokens_per_s_per_gpu']:>9.1f} tok/s/GPU  "
                     f"{p['mode']} {p['mapping']} [{p['policies']}] batch {p['decode_batch']}, TTFT "
                     f"{p['ttft_ms']:.0f} ms ({p['ttft_step']}){ok}")
    counts = ", ".join(f"{k} {v}" for k, v in r.reasons.items() if v)
    lines += ["", f"why the others lost ({len(r.rejected)} deployments: {counts or 'none'}):"]
    for x in r.rejected[:lost_rows]:
        lines.append(f"  {x['reason']:<10} {x['mode']} {x['mapping']} [{x['policies']}]: {x['detail']}")
    if len(r.rejected) > lost_rows:
        lines.append(f"  ... {len(r.rejected) - lost_rows} more (--json lists them all)")
    if r.skipped:  # every program that failed, with its error (--json lists them too)
        lines += ["", f"not evaluated ({len(r.skipped)} programs):"]
        for x in r.skipped:
            lines.append(f"  {x['what']}: {x['error']}")
    for b in r.best if launch_all else r.best[:1]:
        lines += ["", f"launch #{b['rank']} ({b['mode']} {b['mapping']}):"]
        ln_ = b["launch"]
        for engine in ("sglang", "vllm", "trtllm", "dynamo"):
            ok = ln_.get("launchable", {}).get(engine, True)
            lines.append(f"  {engine}:" + ("" if ok else " NOT launchable as priced"))
            lines += [f"    ! {w}" for w in ln_.get("reasons", {}).get(engine, [])]
            lines += [f"    {ln}" for cmd in ln_[engine] for ln in cmd.split("\n")]
            router = ln_.get("router", {}).get(engine)
            if router and engine != "dynamo":
                lines.append(f"    # router / proxy\n    {router}")
            bench = ln_.get("benchmark", {}).get(engine)
            if bench:
                lines.append(f"    # benchmark\n    {bench}")
        for name, text in ln_.get("configs", {}).items():
            lines.append(f"  {name}:")
            lines += [f"    {x}" for x in text.rstrip("\n").split("\n")]
        lines += [f"  note: {n}" for n in ln_["notes"]]
    return "\n".join(lines) + "\n"
