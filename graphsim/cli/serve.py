"""``graphsim serve-sim``: a request trace served by one deployment — continuous batching, chunked prefill, KV
admission and preemption, a prefix cache in HBM and pooled host / disk tiers — with every step priced by
graphsim's compiled program (graphsim.serving.sim; docs/serving.md)."""
from __future__ import annotations

import json
import math
import sys

from ..core.errors import GraphsimError, require

TABLE_SUFFIXES = (".parquet", ".csv")


def register(sub) -> None:
    from .app import _plan_args, add_command, output_args, reserve_arg

    p = add_command(
        sub, "serve-sim", help="simulate a request trace on a deployment: latency percentiles, goodput, KV tiers",
        description="Serve a request trace (Mooncake JSONL, CSV or Parquet; or a synthetic stream) on one deployment "
                    "with an\nengine scheduler (continuous batching, chunked prefill under a token budget, admission "
                    "by KV capacity,\npreemption by recompute) and a KV cache hierarchy: each replica's HBM, a host-"
                    "memory pool and disk, each\nwith capacity, TTL and what it keeps (DeepSeek-V4.1: the global KV "
                    "and the SWA state may live in different\ntiers). Every step's time comes from graphsim's compiled "
                    "program in the view chosen. Prints TTFT / TPOT /\nend-to-end percentiles, goodput under the SLA, "
                    "throughput per GPU, hit rates and bytes per tier, and the\nchecks (Little's law, the step "
                    "surface's error). The model and its defaults: docs/serving.md.",
        examples=["graphsim serve-sim --model deepseek-v4.1-flash --hw gb200 --tp 4 "
                  "--trace mooncake_synthetic_trace.jsonl --json",
                  "graphsim serve-sim --model deepseek-v3 --hw gb200 --tp 8 --ep 8 --trace trace.jsonl --ttft 2000 "
                  "--tpot 50 --requests-out requests.parquet",
                  "graphsim serve-sim --model llama-3.1-70b --hw h200 --tp 4 --replicas 2 --synthetic "
                  "'{\"rate\": 4, \"requests\": 2000}'",
                  "graphsim serve-sim --model deepseek-v3 --hw gb200 --from search.json --rank 1 --trace trace.jsonl"])
    _plan_args(p, requests=False)
    d = p.add_argument_group("deployment", "replicas of the mapping above, or a row of graphsim search's output")
    d.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="aggregated replicas (default 1); with --prefill-replicas, the decode pool's")
    d.add_argument("--prefill", default=None, metavar="MAPPING",
                   help="disaggregated: the prefill pool's mapping (tp=4,ep=4 or tp4-ep4; default the mapping above)")
    d.add_argument("--prefill-replicas", type=int, default=0, metavar="N",
                   help="disaggregated: prefill replicas (default 0: aggregated); the mapping flags are the decode "
                        "pool's, and the KV is handed over as graphsim disagg prices it")
    d.add_argument("--from", dest="from_file", default=None, metavar="FILE",
                   help="take the mapping, replicas and policies from graphsim search output (--json document, or "
                        "its -o table .parquet/.csv)")
    d.add_argument("--rank", type=int, default=1, metavar="N",
                   help="with --from a search --json document: the ranked deployment (default 1)")
    d.add_argument("--row", type=int, default=None, metavar="I",
                   help="with --from a search -o table: the row (0-based index; the table holds every deployment at "
                        "every batch, ranked or not)")
    d.add_argument("--engine", default="auto", choices=("auto", "none", "sglang", "vllm", "trtllm"),
                   help="whose documented memory rule sizes the KV pool (auto: the --backend's framework under a "
                        "measured view, none under SOL)")
    d.add_argument("--max-running", type=int, default=None, metavar="N",
                   help="requests a replica runs at once (default: the engine's documented cap, else memory decides)")
    d.add_argument("--token-budget", type=int, default=None, metavar="TOKENS",
                   help="tokens per step (decodes + prefill chunks; default the engine's, else 8192)")
    d.add_argument("--hbm-kv-gib", type=float, default=None, metavar="GIB",
                   help="KV pool of one replica in GiB instead of what the memory model leaves (inf: unbounded)")
    reserve_arg(d)
    d.add_argument("--router", default="prefix", choices=("prefix", "least-loaded", "round-robin"),
                   help="which replica takes a request: the longest HBM prefix match (default), the least loaded, "
                        "or in turn")
    t = p.add_argument_group("traffic", "one of --trace / --synthetic")
    t.add_argument("--trace", default=None, metavar="FILE",
                   help="request trace: Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids), or "
                        "CSV / Parquet with those columns")
    t.add_argument("--synthetic", default=None, metavar="JSON|FILE",
                   help="a synthetic stream: a JSON object (or .json file) of graphsim.serving.synthetic's arguments, "
                        "e.g. '{\"rate\": 2, \"requests\": 5000, \"sessions\": {\"turns\": {\"dist\": \"lognormal\", "
                        "\"mean\": 6, \"cv\": 0.5}, \"think_s\": 20, \"tool_tokens\": 800}}'")
    t.add_argument("--head", type=int, default=None, metavar="N", help="only the first N requests of the trace")
    t.add_argument("--rate-scale", type=float, default=None, metavar="X",
                   help="replay the trace X times faster (arrival times divided by X)")
    c = p.add_argument_group("KV cache", "tiers below each replica's HBM (docs/serving.md)")
    c.add_argument("--cache-design", default="auto",
                   choices=("auto", "three-tier", "swa-on-disk", "host-disk", "hbm"),
                   help="auto: three-tier for a model with an SWA cache (SWA state in a host pool of 10%% of DRAM "
                        "for 300 s, global KV on disk for 72 h), else host-disk; swa-on-disk: DeepSeek-V4's design; "
                        "hbm: only each replica's HBM prefix cache")
    c.add_argument("--tier", action="append", default=[], metavar="NAME:KEY=V,...",
                   help="replace the design's tiers (repeatable): host or disk with capacity_gib, fraction (host: of "
                        "the pooled DRAM), ttl_s, holds (global+swa), price (per GiB-hour), e.g. "
                        "host:fraction=0.1,ttl_s=300,holds=swa")
    c.add_argument("--price", action="append", default=[], metavar="TIER=PER_GIB_HOUR",
                   help="price a tier of the design per GiB-hour (repeatable), e.g. disk=0.0001")
    s = p.add_argument_group("SLA and report")
    s.add_argument("--ttft", type=float, default=None, metavar="MS", help="goodput: time-to-first-token bound")
    s.add_argument("--tpot", type=float, default=None, metavar="MS", help="goodput: time-per-output-token bound")
    s.add_argument("--classes", default=None, metavar="T1[,T2...]",
                   help="input-length edges splitting the requests into classes (percentiles per class)")
    s.add_argument("--seed", type=int, default=0, help="seed of the step sample the surface error is stated on")
    s.add_argument("--validate", type=int, default=256, metavar="N",
                   help="steps re-priced exactly to state the step surface's error (0: skip)")
    s.add_argument("--requests-out", default=None, metavar="FILE",
                   help="per-request records (.parquet or .csv)")
    s.add_argument("--plot", default=None, metavar="FILE.png",
                   help="latency CDFs and tier occupancy over time")
    s.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    s.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    output_args(p)
    _grid_args(p)
    p.set_defaults(fn=run)


#: graphsim.serving.grid.AXES (the --grid help; tests/test_serve_grid.py holds them equal)
GRID_AXES = ("replicas", "mapping", "policies", "max_running", "token_budget", "hbm_kv_gib", "engine", "cache_design",
             "router", "host_fraction", "host_ttl_s", "disk_capacity_gib", "disk_ttl_s")


def _grid_args(p) -> None:
    """``--grid``: many simulations of the trace, one per point of a product of axes (graphsim.serving.grid; its
    AXES and EXECUTORS, named here so that building the parser imports nothing heavy)."""
    g = p.add_argument_group("grid", "simulate every point of a product of axes on the sweeps' executors; -o "
                                     "(.parquet/.csv) gets one row per point, resumable like a sweep")
    g.add_argument("--grid", action="append", default=[], metavar="AXIS=V1,V2,...",
                   help=f"an axis and its values (repeatable; separate values with ';' when one holds a comma, "
                        f"e.g. policies=fusion=single-pass;default). Axes: {', '.join(GRID_AXES)}")
    g.add_argument("--executor", default="local", choices=("local", "processes", "ray"),
                   help="where the points run: this process, local worker processes, or Ray (default local)")
    g.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes with --executor processes (default: one per CPU)")
    g.add_argument("--fresh", action="store_true",
                   help="recompute every point (default: reuse the parts of -o whose inputs are unchanged)")


def _trace(a):
    from ..serving.trace import load_trace, synthetic

    require((a.trace is None) != (a.synthetic is None), "trace", "give one of --trace FILE or --synthetic JSON")
    if a.trace is not None:
        tr = load_trace(a.trace)
    else:
        text = a.synthetic.strip()
        if not text.startswith("{"):
            try:
                with open(text, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise GraphsimError("synthetic", f"{a.synthetic!r}: neither a JSON object nor a readable file "
                                                 f"({e.strerror or e})") from None
        try:
            kw = json.loads(text)
        except json.JSONDecodeError as e:
            raise GraphsimError("synthetic", f"not valid JSON ({e.msg} at character {e.pos})") from None
        require(isinstance(kw, dict), "synthetic", "must be a JSON object of synthetic()'s arguments")
        try:
            tr = synthetic(**kw)
        except TypeError as e:
            raise GraphsimError("synthetic", f"{e}".replace("synthetic() ", "")) from None
    if a.head is not None:
        require(a.head >= 1, "head", f"must be >= 1, got {a.head}")
        tr = tr.head(a.head)
    if a.rate_scale is not None:
        tr = tr.scale_rate(a.rate_scale)
    require(len(tr) > 0, "trace", "holds no requests")
    return tr


def deployment_from_search(path: str, rank: int = 1, row: int | None = None) -> dict:
    """Mapping, replicas and policies (both pools' for a disaggregated row) of one deployment in ``graphsim search``
    output: the ``rank``-th of a --json document, or row ``row`` of an -o table."""
    from pathlib import Path

    p = Path(path)
    require(p.is_file(), "from", f"{path}: no such file")
    if p.suffix.lower() == ".json":
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise GraphsimError("from", f"{path}: not a graphsim search JSON document ({e})") from None
        rows = doc.get("best") if isinstance(doc, dict) else None
        require(isinstance(rows, list) and rows, "from", f"{path}: has no ranked deployments ('best')")
        require(all(isinstance(r, dict) for r in rows), "from", f"{path}: 'best' must be a list of deployment objects")
        hit = [r for r in rows if r.get("rank") == rank]
        require(bool(hit), "rank", f"{path} ranks {len(rows)} deployments; got --rank {rank}")
        row = hit[0]
    elif p.suffix.lower() in TABLE_SUFFIXES:
        import pandas as pd

        try:
            df = pd.read_parquet(p) if p.suffix.lower() == ".parquet" else pd.read_csv(p)
        except (OSError, ValueError) as e:  # pandas' and pyarrow's parse errors are ValueErrors
            raise GraphsimError("from", f"{path}: not a graphsim search table ({str(e).strip().splitlines()[0]})") \
                from None
        require(row is not None, "row", f"{path} is a table of every searched row: name one with --row I (0-based)")
        require(0 <= row < len(df), "row", f"{path} has {len(df)} rows; got --row {row}")
        row = df.iloc[row].to_dict()
    else:
        raise GraphsimError("from", f"{path}: graphsim search output is .json, .parquet or .csv")
    text = str(row.get("policies", "default"))
    pre_pol, dec_pol = text, text
    if text.startswith("prefill:") and " decode:" in text:  # a disaggregated row whose pools' policies differ
        pre_pol, _, dec_pol = text[len("prefill:"):].partition(" decode:")
    disagg = row.get("mode", "agg") == "disagg"
    out = {"mapping": _mapping(_field(row, "decode_mapping", path)), "replicas": _whole(row, "decode_replicas", path),
           "policies": _policies(dec_pol), "prefill_mapping": None, "prefill_replicas": 0, "prefill_policies": None}
    if disagg:
        out.update(prefill_mapping=_mapping(_field(row, "prefill_mapping", path)),
                   prefill_replicas=_whole(row, "prefill_replicas", path), prefill_policies=_policies(pre_pol))
    return out


def _field(row: dict, key: str, path) -> str:
    require(row.get(key) is not None, f"from.{key}", f"{path}: the row has no {key}")
    return str(row[key])


def _whole(row: dict, key: str, path) -> int:
    v = row.get(key, 1)
    try:
        whole = float(v).is_integer() and not isinstance(v, bool) and float(v) >= 1
    except (TypeError, ValueError, OverflowError):
        whole = False
    require(whole, f"from.{key}", f"{path}: must be a whole number >= 1, got {v!r}")
    return int(float(v))


def _mapping(text: str):
    """``tp4-dp1-ep4-pp1`` or ``tp=4,ep=4`` -> ParallelMapping (one parser: ParallelMapping.parse)."""
    from ..core.plan import ParallelMapping

    return ParallelMapping.parse(text, "from.mapping")


def _policies(text: str):
    """A search row's policies text -> Policies (graphsim.driver.pipeline.parse_policy_text)."""
    from ..driver.pipeline import parse_policy_text

    return parse_policy_text(text, "from.policies")


def run(a) -> None:
    from .. import ParallelMapping, load_hw, load_profile
    from .app import int_list, load_model_args, policies_from_args, prediction_default, view_spec
    from ..core.outputs import check_output, emit, exclusive, json_document, output_path
    from ..serving.kvcache import TierSpec
    from ..serving.sim import SLA, Deployment, simulate

    check_output(a.output)
    prediction_default(a)
    for f, suffixes in (("requests_out", TABLE_SUFFIXES), ("plot", (".png", ".pdf", ".svg"))):
        if getattr(a, f):
            output_path(getattr(a, f), field=f.replace("_", "-"), suffixes=suffixes)
    tr = _trace(a)
    model, hw = load_model_args(a), load_hw(a.hw)
    if a.from_file:
        got = deployment_from_search(a.from_file, a.rank, a.row)
    else:
        got = {"mapping": ParallelMapping(a.tp, a.dp, a.ep, a.pp, a.cp), "replicas": a.replicas,
               "policies": policies_from_args(a), "prefill_replicas": a.prefill_replicas, "prefill_policies": None,
               "prefill_mapping": _mapping(a.prefill) if a.prefill else None}
        require(a.prefill is None or a.prefill_replicas > 0, "prefill",
                "--prefill names the prefill pool of a disaggregated deployment: give --prefill-replicas N too")
    dep = Deployment(model, hw, got["mapping"], got["policies"], got["replicas"], view_spec(a),
                     load_profile(a.profile) if a.profile else None, a.engine, a.max_running, a.token_budget,
                     a.reserve_gib, a.hbm_kv_gib, got["prefill_mapping"], got["prefill_replicas"],
                     got["prefill_policies"])
    gpus = dep.mapping.gpus * dep.replicas + ((dep.prefill_mapping or dep.mapping).gpus * dep.prefill_replicas)
    tiers = None
    if a.tier:
        host = hw.host_mem_bytes * gpus
        tiers = tuple(TierSpec.parse(t, host) for t in a.tier)
        names = [t.name for t in tiers]
        require(len(set(names)) == len(names), "tier", f"each tier once, got {', '.join(names)}")
    prices = {}
    for item in a.price:
        k, sep, v = item.partition("=")
        require(bool(sep), "price", f"{item!r}: expected TIER=PER_GIB_HOUR, e.g. disk=0.0001")
        try:
            prices[k.strip()] = float(v)
        except ValueError:
            raise GraphsimError("price", f"{v!r} is not a number") from None
    classes = int_list(a.classes, "classes") or ()
    if a.grid:
        return _run_grid(a, tr, dep, tiers=tiers, prices=prices, classes=classes)
    show = a.progress if a.progress is not None else sys.stderr.isatty()
    bar = _Progress(len(tr)) if show else None
    locks = [x for x in (a.output, a.requests_out, a.plot) if x]
    import contextlib

    with contextlib.ExitStack() as held:
        for out in locks:
            held.enter_context(exclusive(out))
        try:
            res = simulate(tr, dep, cache_design=a.cache_design, tiers=tiers, router=a.router, sla=SLA(a.ttft, a.tpot),
                           classes=classes, seed=a.seed, validate=a.validate, prices=prices, progress=bar)
        finally:
            if bar:
                bar.close()
        notes = []
        if a.requests_out:
            from ..core.outputs import atomic_target

            df = res.to_frame()
            with atomic_target(a.requests_out, field="requests-out", suffixes=TABLE_SUFFIXES) as tmp:
                (df.to_parquet if a.requests_out.lower().endswith(".parquet") else df.to_csv)(tmp, index=False)
            notes.append(f"wrote {a.requests_out} ({len(df):,} requests)")
        if a.plot:
            from ..exports.plots import plot_serving

            plot_serving(res, a.plot)
            notes.append(f"wrote {a.plot}")
        doc = {**res.to_json(), "trace": {"source": getattr(tr, "source", ""), "requests": len(tr)}}
        text = json_document("serve-sim", doc) + "\n" if a.json else to_text(res, tr) + "\n"
        emit(a.output, text, "JSON" if a.json else "text")
        for n in notes:
            print(n, file=sys.stderr if a.json and not a.output else sys.stdout)


def _grid_axes(items) -> dict:
    axes: dict = {}
    for item in items:
        k, sep, v = item.partition("=")
        k = k.strip().replace("-", "_")
        require(bool(sep) and k and v.strip(), "grid", f"{item!r}: expected AXIS=V1,V2,..., e.g. replicas=1,2,4")
        require(k not in axes, "grid", f"axis {k!r} is given twice")
        axes[k] = [x.strip() for x in v.split(";" if ";" in v else ",") if x.strip()]
    return axes


def _run_grid(a, tr, dep, *, tiers, prices, classes) -> None:
    """``--grid``: one simulation per point, written to -o (resumable parts) and printed as a compact table."""
    from ..serving.grid import grid
    from ..serving.sim import SLA

    require(bool(a.output) and a.output.lower().endswith(TABLE_SUFFIXES), "output",
            "--grid writes a table: give -o FILE.parquet or FILE.csv")
    bad = [f for f, v in (("--json", a.json), ("--requests-out", a.requests_out), ("--plot", a.plot)) if v]
    require(not bad, "grid", f"{', '.join(bad)} describe one simulation; a grid writes one row per point to -o")
    axes = _grid_axes(a.grid)
    kw = {k: v for k, v in (("cache_design", a.cache_design), ("router", a.router)) if k not in axes}
    show = a.progress if a.progress is not None else sys.stderr.isatty()
    df = grid(tr, dep, axes, output=a.output, executor=a.executor, jobs=a.jobs, resume=not a.fresh,
              progress=show, tiers=tiers, prices=prices, classes=classes, sla=SLA(a.ttft, a.tpot), seed=a.seed,
              validate=a.validate, **kw)
    print(grid_text(df, list(axes)))
    info = df.attrs["grid"]
    print(f"wrote {a.output} ({info['points']} points: {info['computed']} computed, {info['reused']} reused"
          + (f", {len(info['stale'])} recomputed because an input changed" if info["stale"] else "") + ")")


def grid_text(df, axes: list) -> str:
    """A grid's table in a terminal: the axes, then TTFT / TPOT p50 and p99, goodput, throughput, hit ratio."""
    cols = [("ttft_p50_ms", "TTFT p50 ms", "{:,.1f}"), ("ttft_p99_ms", "TTFT p99 ms", "{:,.1f}"),
            ("tpot_p50_ms", "TPOT p50 ms", "{:,.1f}"), ("tpot_p99_ms", "TPOT p99 ms", "{:,.1f}"),
            ("goodput_fraction", "goodput", "{:.1%}"), ("out_tok_per_s_per_gpu", "out tok/s/GPU", "{:,.1f}"),
            ("hit_ratio", "hit ratio", "{:.1%}")]
    head = [*axes, *(c[1] for c in cols)]
    rows, errors = [], {}
    for n, (_, r) in enumerate(df.iterrows()):
        rows.append([str(r[x]) for x in axes])
        if isinstance(r["error"], str):  # the refused point: its error after its axes
            errors[n] = r["error"]
        else:
            rows[-1] += ["-" if isinstance(r[k], float) and math.isnan(r[k]) else f.format(r[k]) for k, _, f in cols]
    width = [max([len(h)] + [len(c[i]) for c in rows if i < len(c)]) for i, h in enumerate(head)]

    def line(cells, err=None):
        text = "  ".join(c.ljust(w) if i < len(axes) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, width)))
        return text + (f"  error: {err}" if err else "")

    return "\n".join([line(head), *(line(c, errors.get(n)) for n, c in enumerate(rows))])


class _Progress:
    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("serve-sim: arrivals"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=False)
        self.bar.start()
        self.task = self.bar.add_task("serve", total=total)

    def __call__(self, done: int) -> None:
        self.bar.update(self.task, completed=done)

    def close(self) -> None:
        self.bar.stop()


def _ms(d: dict, k: str) -> str:
    v = d.get(k)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.1f}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"


def to_text(res, tr) -> str:
    s = res.summary
    dep, rq, lat = s["deployment"], s["requests"], s["latency"]
    where = f"{dep['replicas']}x {dep['mapping']}" if dep["mode"] == "agg" else \
        f"P {dep['prefill_replicas']}x {dep['prefill_mapping']} + D {dep['replicas']}x {dep['mapping']}"
    lines = [f"serve-sim: {dep['model']} on {where} ({dep['hw']}, {dep['gpus']} GPUs), "
             f"view {dep['view']}" + (f" ({dep['profile']} profile: a prediction)" if dep["profile"] != "none" else
                                      " (the bound)" if dep["view"] == "sol" else "")
             + f", engine {dep['engine']}, token budget {dep['token_budget']:,}, router "
             f"{dep['router']}",
             f"trace: {getattr(tr, 'source', '') or 'in memory'}: {rq['total']:,} requests over "
             f"{s['duration_s']:,.1f} s; served {rq['served']:,}, rejected {rq['rejected']:,} "
             f"({rq['rejected_beyond_context']:,} beyond the model's context, {rq['rejected_over_step_budget']:,} "
             f"prompts over a step without chunked prefill), preemptions {rq['preemptions']:,}", "",
             f"{'latency (ms)':<22}{'p50':>12}{'p90':>12}{'p99':>12}{'mean':>12}"]
    rows = [("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL (per token)", "itl_ms"), ("end-to-end", "e2e_ms")]
    if dep["mode"] == "disagg":
        rows.append(("KV hand-over", "handover_ms"))
    for name, key in rows:
        d = lat[key]
        lines.append(f"{name:<22}" + "".join(f"{_ms(d, k):>12}" for k in ("p50", "p90", "p99", "mean")))
    if len(s["classes"]) > 1:
        lines += ["", "per class (TTFT p50 / p99, TPOT p50 / p99 ms):"]
        for c in s["classes"]:
            lines.append(f"  {c['name']:<24}{c['requests']:>8,} req  TTFT {_ms(c['ttft_ms'], 'p50')} / "
                         f"{_ms(c['ttft_ms'], 'p99')}  TPOT {_ms(c['tpot_ms'], 'p50')} / {_ms(c['tpot_ms'], 'p99')}")
    g, th = s["goodput"], s["throughput"]
    lines += ["", f"throughput: {th['output_tokens_per_s_per_gpu']:,.1f} output tok/s/GPU, "
                  f"{th['input_tokens_per_s_per_gpu']:,.0f} input tok/s/GPU, {th['requests_per_s']:.2f} req/s",
              f"goodput (TTFT <= {g['ttft_ms'] or '-'} ms, TPOT <= {g['tpot_ms'] or '-'} ms): "
              f"{g['fraction']:.1%} of requests, {g['requests_per_s']:.2f} req/s, "
              f"{g['output_tokens_per_s_per_gpu']:,.1f} tok/s/GPU",
              f"queue: mean {s['queue']['mean_waiting']:.1f} waiting, max {s['queue']['max_waiting']}; steps: "
              f"{s['steps']['decode_only']:,} decode-only, {s['steps']['mixed']:,} with prefill, busy "
              f"{s['steps']['busy_fraction']:.0%}"]
    c = s["cache"]
    reuse = c["trace_prefix_reuse"]
    pool = dep["hbm_pool_gib_per_replica"]
    lines += ["", f"KV cache ({dep['cache_design']}): hit ratio {c['hit_ratio']:.1%} of input tokens"
                  + (f" (the trace's own prefix reuse: {reuse:.1%})" if reuse is not None else ""),
              f"  HBM pool per replica {'unbounded' if pool is None else f'{pool:,.1f} GiB'}: "
              f"{c['hit_tokens']['hbm']:,.0f} hit tokens ({c['hit_requests']['hbm']:,} requests), "
              f"{c['hbm_evicted']:,} entries evicted"]
    for t in c["tiers"]:
        if not t["present"]:
            continue
        cap = "unbounded" if t["capacity_gib"] is None else f"{t['capacity_gib']:,.1f} GiB"
        ttl = "no TTL" if t["ttl_s"] is None else f"TTL {t['ttl_s']:,.0f} s"
        lines.append(f"  {t['name']:<5} ({'+'.join(t['holds'])}; {cap}, {ttl}): {t['hit_tokens']:,.0f} hit tokens "
                     f"({t['hit_requests']:,} requests), peak {t['peak_gib']:,.2f} GiB, {t['gib_hours']:,.3f} GiB-h"
                     + (f", cost {t['cost']:,.4f}" if t["cost"] else "") + f", evicted {t['evicted']:,}, expired "
                     f"{t['expired']:,}")
    if c["swa_hits"] or c["replays"] or c["recomputed_hit_tokens"]:
        lines.append(f"  SWA state hits {c['swa_hits']:,}; bounded replays {c['replays']:,} "
                     f"({c['replayed_tokens']:,} tokens); hits recomputed for a missing SWA state "
                     f"{c['recomputed_hit_tokens']:,} tokens")
    lit = res.checks["littles_law"]
    lines += ["", f"checks: Little's law L = {lit['mean_in_system']:.3f} vs lambda*W = "
                  f"{lit['arrival_rate_x_mean_time']:.3f} ({lit['relative_error']:.2%})"]
    e = res.surface_error
    if e["steps"]:
        lines.append(f"  step surface vs the exact program on {e['steps']} sampled steps: median "
                     f"{e['median_rel']:+.2%}, p90 |err| {e['p90_abs_rel']:.2%}, max |err| {e['max_abs_rel']:.2%} "
                     f"({e['surface_points']:,} program points)")
    return "\n".join(lines)
