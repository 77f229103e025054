"""The ``graphsim`` command line (also ``python -m graphsim``).

Exit codes: 0 done; 1 a check found what it looks for (``measured check``: a table row below its SOL); 2 bad
input — one line ``graphsim: error: <field>: <what is allowed>`` (argparse's errors included; the usage block
only with ``--help``); 3 an internal error (a bug: one line asking to rerun with
``--debug`` or ``GRAPHSIM_DEBUG=1``, which show its traceback); 130 interrupted.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..core.errors import GraphsimError

# Building the parser imports nothing heavy (no IR, numpy or JAX): `graphsim hw list` and `--help` answer in a
# blink, and each command imports what it needs when it runs. tests/test_light_imports.py checks this copy
# against graphsim.core.ir.ATTENTION_PRECISIONS.
ATTENTION_PRECISIONS = ("auto", "bf16", "fp8", "fp4")


def _model_args(p: argparse.ArgumentParser) -> None:
    """How a checkpoint is loaded: its weight format and redundant experts."""
    if isinstance(p, _Unbuilt):  # a command not being run: skip importing the format table
        return
    from ..core.quant import SCHEMES

    p.add_argument("--weights", default=None, choices=tuple(SCHEMES),
                   help="override the checkpoint's weight quantization for every linear layer")
    p.add_argument("--redundant-experts", type=int, default=0, metavar="N",
                   help="extra routed-expert copies for EP load balancing (memory; EP divides experts + N)")


def load_model_args(a):
    """The model the flags name (``--model`` / positional), with ``--weights`` and ``--redundant-experts``."""
    from ..models import load_model

    return load_model(a.model, weights=getattr(a, "weights", None),
                      redundant_experts=getattr(a, "redundant_experts", 0))


def add_command(sub, name: str, *, help: str, description: str, examples: Sequence[str]):
    """A subcommand's parser with the shared conventions (tests/test_cli_help.py holds every command to them):
    a description kept as written, and an epilog of real ``graphsim <name> ...`` invocations."""
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
    return sub.add_parser(name, help=help, description=description, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def output_args(p, *, with_json: bool = True, output: str = "") -> None:
    """The ``output`` group: ``--json`` (docs/json.md) and ``-o FILE`` (the printed result, written atomically)."""
    g = p.add_argument_group("output")
    if with_json:
        g.add_argument("--json", action="store_true",
                       help="print the result as one JSON document (keys: docs/json.md, schema_version 1)")
    g.add_argument("-o", "--output", default=None, metavar="FILE",
                   help=output or "write the result (text, or JSON with --json) to FILE instead of printing it; "
                                  "one line says so")


def mapping_args(p, what: str = "") -> None:
    """The ``mapping`` group: the five parallelism degrees."""
    g = p.add_argument_group("mapping", "parallelism degrees; GPUs = tp x dp x pp x cp (EP spans tp x dp)")
    names = {"tp": "tensor", "dp": "attention data", "ep": "expert", "pp": "pipeline", "cp": "context"}
    for ax in ("tp", "dp", "ep", "pp", "cp"):
        g.add_argument(f"--{ax}", type=int, default=1, metavar="N", help=f"{what}{names[ax]} parallel degree (default 1)")


def _view_args(p: argparse.ArgumentParser) -> None:
    """Which view prices the ops: SOL, or measured tables (docs/measured.md)."""
    p = p.add_argument_group("view", "how ops are priced: speed of light or measured tables (docs/measured.md)")
    p.add_argument("--view", default="auto", choices=("auto", "sol", "op", "hybrid", "fpm"),
                   help="auto (default): the prediction the inputs allow — hybrid with --measured, fpm with --fpm, "
                        "else (estimate, search, serve-sim) the SOL program derated by the practitioner profile, "
                        "the SOL figures beside it, or (other commands) sol; sol: speed of light (the bound "
                        "alone); op: measured tables for every op a table "
                        "family times (strict); hybrid: measured where covered, else the backend's own efficiency "
                        "for the family or a fit on its covered ops; fpm: whole forwards from a fitted FPM model")
    p.add_argument("--fpm", default=None, metavar="FILE",
                   help="the FPM model for --view fpm (graphsim fpm fit samples.parquet -o model.fpm)")
    p.add_argument("--measured", default=None, metavar="DIR",
                   help="folder of measured tables (graphsim measured import ...) for --view op|hybrid")
    p.add_argument("--backend", default="", metavar="FRAMEWORK[@VERSION]",
                   help="the measured tables' identity, e.g. trtllm@1.3.0rc20 or sglang@0.5.14")
    p.add_argument("--fill", default="older", choices=("older", "none"),
                   help="a family the named version did not collect: from the newest older version of the same "
                        "framework (older, reported per op) or uncovered (none)")


def reserve_arg(g) -> None:
    """``--reserve-gib``: the runtime reserve per GPU the memory checks keep back (its default printed as a value)."""
    from ..core.limits import DEFAULT_RESERVE_GIB

    g.add_argument("--reserve-gib", type=float, default=None, metavar="GIB",
                   help=f"runtime reserve per GPU in the memory check (default {DEFAULT_RESERVE_GIB:g} GiB: CUDA "
                        "context, NCCL/DeepEP buffers, workspaces)")


def model_hw_args(p, *, weights: bool = True, profile: bool = True):
    """The ``model & hardware`` group: ``--model`` (+ ``--weights``/``--redundant-experts``), ``--hw`` and
    ``--profile``; returns the group for a command's own additions."""
    g = p.add_argument_group("model & hardware")
    g.add_argument("--model", required=True,
                   help="shipped model name (graphsim models), a Hugging Face id ORG/NAME (the local HF cache, else "
                        "the bundled snapshot: graphsim models --hub), a config.json path or a checkpoint directory")
    if weights:
        _model_args(g)
    g.add_argument("--hw", default="gb200", help="hardware descriptor name (graphsim hw list) or TOML path (default gb200)")
    if profile:
        g.add_argument("--profile", default=None,
                       help="efficiency profile name or TOML derating the peaks (default: SOL, no derating)")
    return g


def int_list(text: str | None, field: str) -> tuple | None:
    """``"1,2,4"`` -> (1, 2, 4); None stays None; anything else is a one-line error naming ``field``."""
    if text is None:
        return None
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise GraphsimError(field, f"{text!r} is not a comma-separated list of integers") from None
    if not vals:
        raise GraphsimError(field, "give at least one integer")
    return vals


def float_list(text: str, field: str) -> tuple:
    """``"0.9,0.8"`` -> (0.9, 0.8) ("" -> ()); anything else is a one-line error naming ``field``."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise GraphsimError(field, f"expected comma-separated numbers, got {text!r}") from None


def _plan_args(p: argparse.ArgumentParser, requests: bool = True) -> None:
    """One plan's flags, in groups: model & hardware, mapping, requests, policies, view."""
    model_hw_args(p)
    mapping_args(p)
    if requests:
        r = p.add_argument_group("requests", "KIND:LEN[xCOUNT][@CACHED]: prefill:2048 is a 2,048-token prompt; "
                                 "decode:4096x64 is 64 requests\neach decoding one token at context 4,096; "
                                 "prefill:2048@1024 takes 1,024 of its tokens from the prefix cache")
        r.add_argument("--request", action="append", required=True, metavar="KIND:LEN[xCOUNT][@CACHED]",
                       help="one group of identical requests (repeatable), e.g. decode:4096x64 or prefill:2048@1024")
    g = p.add_argument_group("policies", "runtime strategies (recorded in every result's identity)")
    g.add_argument("--decoder-replay", default="off", choices=("off", "sglang", "paper"),
                   help="DeepSeek-V4.1 decoder bounded replay of a prefill: off = every layer runs every token; "
                        "sglang = layers 0-20 on the whole extend, 21-39 on each request's last 128 tokens; "
                        "paper = the whole decoder on the last 128 tokens")
    g.add_argument("--encoder-replay", default="on", choices=("on", "off"),
                   help="a prefix hit without its SWA cache: on = replay the last 128 cached tokens with the "
                        "suffix; off = recompute the hit from scratch")
    g.add_argument("--fusion", default="unfused", choices=("unfused", "two-pass", "single-pass"),
                   help="mHC kernel fusion: unfused = separate coefficient, pre-mix, pre-norm and residual ops; "
                        "two-pass / single-pass = fused sub-block boundaries (fewer bytes per token)")
    g.add_argument("--attention-precision", default="auto", choices=ATTENTION_PRECISIONS,
                   help="attention math precision (QK^T, PV); auto = from the KV cache format. An explicit "
                        "narrower one keeps the KV cache at it (FP8 attention reads an FP8 cache)")
    g.add_argument("--overlap", default="none", choices=("none", "serial", "two-batch"),
                   help="none = one batch per forward, its collectives overlapping the compute that does not "
                        "depend on them (the model's dataflow); serial = no overlap inside the batch; "
                        "two-batch = two micro-batches (requests, or one prompt's tokens) whose communication "
                        "hides under each other's compute")
    g.add_argument("--sp", default="off", choices=("off", "on"),
                   help="sequence parallelism: norms/mHC/elementwise shard their tokens over TP (RS in, AG out)")
    g.add_argument("--engram", default="hbm", choices=("hbm", "host"),
                   help="where the Engram tables live: hbm = on every GPU; host = in host memory, rows "
                        "prefetched over C2C/PCIe on the copy stream")
    g.add_argument("--engram-shard", default="tp", choices=("tp", "world"),
                   help="Engram table rows over the TP group, or over every rank of the stage (TP x EP)")
    g.add_argument("--engram-proj", default="replicated", choices=("replicated", "tp"),
                   help="Engram 6144->25600 projection replicated, or column-split over TP (+ all-gather)")
    g.add_argument("--prefetch-distance", type=int, default=1, metavar="N",
                   help="--engram host: how many blocks ahead a layer's Engram row copy may start (default 1)")
    g.add_argument("--beyond-context", dest="beyond_context", action="store_const", const="allow", default="refuse",
                   help="allow contexts beyond the model's max_position_embeddings as a what-if (recorded)")
    g.add_argument("--dspark", default="off", choices=("off", "on"),
                   help="DSpark speculative decoding (DeepSeek-V4.1): on = each decode step verifies drafts, "
                        "then the drafter drafts the next block")
    g.add_argument("--verify", type=int, default=0, metavar="K",
                   help="DSpark: draft positions each decode request verifies (the step runs 1 + K positions)")
    g.add_argument("--mtp", type=int, default=0, metavar="K",
                   help="MTP drafting: the checkpoint's MTP module drafts K tokens per decode step and the step "
                        "verifies 1 + K positions (give --acceptance a_1,...,a_K)")
    g.add_argument("--acceptance", default="", metavar="A1,...,AD",
                   help="DSpark/MTP: conditional acceptance per draft position, e.g. 0.9,0.8,0.7 (ITL = step "
                        "time / expected emitted tokens)")
    g.add_argument("--ep-imbalance", type=float, default=1.0, metavar="X",
                   help="busiest EP rank's routed work / the mean (>= 1; default 1, perfectly balanced)")
    g.add_argument("--pp-micro-batches", type=int, default=0, metavar="N",
                   help="pipeline micro-batches per forward (0 = as many as pipeline stages)")
    g.add_argument("--algorithm", action="append", default=[], metavar="COLLECTIVE=ALGO",
                   help="force a collective's algorithm (repeatable; default auto: the fastest at each point): "
                        "all_reduce = ring|tree|one_shot|two_shot|nvls, all_gather, reduce_scatter = "
                        "ring|tree|one_shot|nvls, all_to_all = direct|hierarchical; each at its fastest protocol, "
                        "or ALGO/PROTO with PROTO ll|ll128|simple; e.g. all_reduce=tree, all_reduce=ring/ll128")
    _view_args(p)


def _compile(a, requests=None):
    """The plan the command-line flags describe (``requests`` overrides ``--request``), compiled."""
    import attrs

    from .. import ParallelMapping, Plan, Request, compile_plan, load_profile

    policies = policies_from_args(a)
    if a.verify < 0:
        raise GraphsimError("verify", f"must be >= 0, got {a.verify}")
    model = load_model_args(a)
    proc = model.image_processor()  # +img:WxH through this model's image processor
    reqs = [r if isinstance(r, Request) else Request.parse(r, proc) for r in (a.request if requests is None else requests)]
    if a.verify:
        if a.dspark != "on":
            raise GraphsimError("verify", "verify lengths need --dspark on (or --mtp K)")
        reqs = [attrs.evolve(r, new=1 + a.verify) if r.kind == "decode" else r for r in reqs]
    elif a.mtp:  # MTP-K: every decode step verifies the K drafted positions
        reqs = [attrs.evolve(r, new=1 + a.mtp) if r.kind == "decode" and r.new == 1 else r for r in reqs]
    plan = Plan(reqs, ParallelMapping(a.tp, a.dp, a.ep, a.pp, a.cp), policies)
    profile = load_profile(a.profile) if a.profile else None
    return compile_plan(model, plan, a.hw, profile, view=view_spec(a))


def policies_from_args(a):
    """The Policies the ``policies`` flag group names."""
    from .. import Policies

    acc = float_list(a.acceptance, "acceptance")
    algos = {}
    for item in a.algorithm:
        k, sep, v = item.partition("=")
        if not sep:
            raise GraphsimError("algorithm", f"expected COLLECTIVE=ALGO, got {item!r}")
        algos[k.strip()] = v.strip()
    return Policies(a.decoder_replay, a.encoder_replay, a.fusion, a.overlap, a.engram, a.prefetch_distance,
                    a.dspark, ep_imbalance=a.ep_imbalance, pp_micro_batches=a.pp_micro_batches,
                    algorithms=algos, acceptance=acc, attention_precision=a.attention_precision, sp=a.sp,
                    engram_shard=a.engram_shard, engram_proj=a.engram_proj, beyond_context=a.beyond_context,
                    mtp=a.mtp)


#: the efficiency profile a prediction falls back to when no measured tables or FPM model are given
DEFAULT_PREDICTION_PROFILE = "practitioner"


def prediction_default(a) -> None:
    """``--view auto`` (the default) asks for the prediction the inputs allow: the hybrid view with ``--measured``
    tables, the FPM view with ``--fpm``, else the SOL program derated by the practitioner efficiency profile
    (hw/data/profiles, each fraction sourced), labelled as such; ``--view sol`` is the bound alone. The SOL figures
    stay beside the prediction in every output."""
    if getattr(a, "view", "sol") != "auto":
        return
    if getattr(a, "measured", None) or getattr(a, "fpm", None) or getattr(a, "profile", None):
        return
    if getattr(a, "backend", ""):
        return  # view_spec names the missing tables
    a.profile = DEFAULT_PREDICTION_PROFILE


def view_spec(a):
    """The measured view the flags name (None for SOL). ``--view auto`` (the default) is the prediction the
    inputs allow: hybrid with measured tables, fpm with an FPM model, else SOL."""
    if getattr(a, "view", "sol") == "auto":
        a.view = "fpm" if getattr(a, "fpm", None) else "hybrid" if getattr(a, "measured", None) else "sol"
    if getattr(a, "view", "sol") == "sol":
        if getattr(a, "measured", None) or getattr(a, "backend", "") or getattr(a, "fpm", None):
            raise GraphsimError("view", "--measured/--backend need --view op or --view hybrid; --fpm needs --view fpm")
        return None
    from ..views.measured.view import ViewSpec

    if a.view == "fpm":
        if getattr(a, "measured", None):
            raise GraphsimError("measured", "--view fpm reads an FPM model (--fpm FILE), not measured tables")
        return ViewSpec("fpm", getattr(a, "fpm", None) or "", a.backend, a.fill)
    if getattr(a, "fpm", None):
        raise GraphsimError("fpm", "--fpm needs --view fpm")

    return ViewSpec(a.view, a.measured, a.backend, a.fill)


def cmd_estimate(a) -> None:
    from ..core.outputs import check_output, emit

    check_output(a.output)
    prediction_default(a)
    if a.chunk:
        return _estimate_chunked(a)
    r = _compile(a).report()
    emit(a.output, (r.to_json() if a.json else r.to_text()) + "\n", "JSON" if a.json else "text")


def _estimate_chunked(a) -> None:
    """Chunked prefill: one forward per chunk step (decode requests ride along in every step); TTFT of a
    prompt is the sum of its steps. Every step has the same request structure — each prompt's current chunk
    (none, count 0, once it has finished) and the decodes — so one compiled program evaluates all the steps
    as points of one vectorized call."""
    from .. import Request, Workload
    from ..driver.ledger import chunk_prefill

    proc = load_model_args(a).image_processor()
    reqs = [Request.parse(r, proc) for r in a.request]
    prefills = [chunk_prefill(r, a.chunk) for r in reqs if r.kind == "prefill"]
    decodes = [r for r in reqs if r.kind == "decode"]
    n_steps = max((len(p) for p in prefills), default=1)
    c = _compile(a, [p[0] for p in prefills] + decodes)
    points = []
    for i in range(n_steps):
        step = [p[min(i, len(p) - 1)] for p in prefills] + decodes
        wl = c.plan.__class__(step, c.plan.mapping, c.plan.policies).workload()
        for g, p in enumerate(prefills):
            if i >= len(p):
                wl.count[0, g] = 0.0  # this prompt is done: its group runs nothing in this step
        points.append(wl)
    wl = Workload.stack(points)
    out = c.evaluate(wl, outputs=("forward", "stages"))
    steps = []
    for i in range(n_steps):
        names = [str(p[i]) for p in prefills if i < len(p)] + [str(r) for r in decodes]
        steps.append({"step": i, "requests": names, "forward_s": float(out["forward"][i]),
                      "stages": [{"stage": s, "busy_s": float(v)} for s, v in zip(c.program.stages, out["stages"][i])]})
    ttft = sum(s["forward_s"] for s in steps)
    from ..core.outputs import emit, json_document

    if a.json:
        doc = {"mode": "chunked", "model": c.model.name, "hw": c.hw.name, "mapping": str(c.plan.mapping),
               "chunk_tokens": a.chunk, "steps": steps, "ttft_s": ttft}
        emit(a.output, json_document("estimate", doc) + "\n", "JSON")
        return
    lines = [f"step {s['step']:>3}  {s['forward_s'] * 1e3:10.3f} ms  {', '.join(s['requests'])}" for s in steps]
    lines.append(f"TTFT (sum of {len(steps)} chunk steps): {ttft * 1e3:.3f} ms")
    emit(a.output, "\n".join(lines) + "\n", "text")


#: SVG pictures of larger graphs collapse to one node per layer (the DOT text always has every op)
SVG_MAX_OPS = 1000


def cmd_graph(a) -> None:
    from ..exports.dot import dot_binary, render_svg, to_dot

    from ..core.outputs import emit, output_path

    svg = bool(a.output and a.output.endswith(".svg"))
    if a.output:
        output_path(a.output)  # before the work: a directory or a missing folder fails at once
    if svg:
        dot_binary()  # an SVG without graphviz fails before the work (and before any note), in one line
    c = _compile(a)
    collapse = a.collapse
    if svg and not collapse and len(c.graph.ops) > SVG_MAX_OPS:
        # graphviz's layout of a few thousand clustered nodes runs for many minutes (1,606 ops: > 5 min)
        collapse = True
        print(f"graphsim: note: {len(c.graph.ops):,} ops is more than graphviz lays out in reasonable time "
              f"(> {SVG_MAX_OPS:,}): the SVG has one node per layer; write .dot for every op", file=sys.stderr)
    text = to_dot(c.graph, schedule=c.schedule(), collapse_layers=collapse)
    if svg:
        text = render_svg(text)
    emit(a.output, text, f"{len(c.graph.ops)} ops")


def cmd_hw(a) -> None:
    from ..hw import list_hw, load_hw
    from ..core.outputs import check_output, emit, json_document

    check_output(a.output)
    if a.action == "probe":
        from ..views.collect.probe import probe, to_toml

        desc = probe(a.name or "local", quick=a.quick, log=lambda m: print(m, file=sys.stderr))
        emit(a.output, to_toml(desc), f"{desc['name']}: use --hw {a.output}")
        return
    if a.action == "list":
        rows = [(n, load_hw(n).description) for n in list_hw()]
        if a.json:
            doc = {"action": "list", "hardware": [{"name": n, "description": d} for n, d in rows]}
            emit(a.output, json_document("hw", doc) + "\n", "JSON")
        else:
            emit(a.output, "".join(f"{n:<8} {d}\n" for n, d in rows), "text")
        return
    if not a.name:
        raise GraphsimError("name", "give a hardware name, e.g. `graphsim hw show gb300`")
    h = load_hw(a.name)
    if a.json:
        emit(a.output, json_document("hw", hw_json(h)) + "\n", "JSON")
        return
    rows = h.describe()
    w = max(len(r[0]) for r in rows)
    v = max(len(r[1]) for r in rows)
    lines = [f"{h.name}: {h.description}"] + [f"  {f:<{w}}  {val:<{v}}  {src}" for f, val, src in rows]
    emit(a.output, "\n".join(lines) + "\n", "text")


#: ``hw show --json``: a descriptor field's unit, as the suffix its key carries (docs/json.md)
_HW_UNIT_SUFFIX = {"bytes": "", "s": "", "W": "", "B/s": "_bytes_per_s", "GPUs": "_gpus", "exp/s": "_per_s"}


def hw_json(h) -> dict:
    """The keys of ``hw show --json``: every precision (its dense peak, 0 where the chip has none, and the
    precision it runs at), every rate and capacity with its unit in its name, and the sources."""
    from ..hw.descriptor import _UNITS, PRECISIONS

    peaks = dict(h.peak_flops)
    fields = {}
    for f, unit in _UNITS.items():
        suffix = _HW_UNIT_SUFFIX.get(unit, "_" + "".join(c if c.isalnum() else "_" for c in unit.lower()))
        fields[f if f.endswith(suffix) else f + suffix] = getattr(h, f)
    return {"action": "show", "name": h.name, "description": h.description,
            "precisions": [{"precision": p, "peak_flops_per_s": float(peaks.get(p, 0.0)), "native": p in peaks,
                            "runs_at": h.resolve_precision(p)} for p in PRECISIONS],
            **fields, "sources": [{"field": f, "source": src} for f, src in h.sources]}


def cmd_models(a) -> None:
    from ..models import list_models
    from ..core.outputs import emit

    if getattr(a, "hub", False):
        from ..models.hub import bundled_ids

        emit(a.output, "".join(f"{n}\n" for n in bundled_ids()), "text")
        return
    emit(a.output, "".join(f"{n}\n" for n in list_models()), "text")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors that name the argument (``tp: invalid int value: 'x'``)."""

    def error(self, message: str):
        raise GraphsimError(*_argparse_field(message))


def _argparse_field(message: str) -> tuple[str, str]:
    """(field, message) from an argparse error: ``argument --tp: ...`` -> ``tp``; required / unrecognized
    arguments -> the first one named."""
    import re

    m = re.match(r"argument (?:-\w/)?(-{0,2})([\w\-]+)(?:/[\w\-]+)?: (.*)", message, re.S)
    if m:
        field, text = m.group(2).replace("-", "_"), m.group(3)
        text = re.sub(r"\s*\(choose from (.*)\)", lambda c: "; allowed: " + c.group(1).replace("'", ""), text)
        return field, " ".join(text.split())
    m = re.match(r"the following arguments are required: (.*)", message)
    if m:
        names = []
        for n in m.group(1).split(","):  # "-o/--output" -> output
            forms = n.strip().split("/")
            names.append(next((f for f in forms if f.startswith("--")), forms[0]).lstrip("-").replace("-", "_"))
        return names[0], "required" + (f" (so are: {', '.join(names[1:])})" if names[1:] else "")
    m = re.match(r"unrecognized arguments: (.*)", message)
    if m:
        return "arguments", f"not recognized: {m.group(1)} (see --help)"
    return "arguments", " ".join(message.split())


class _Unbuilt:
    """Stands in for the parser of a command that is not being run: every attribute, call or result of a call is
    itself again, and it iterates as empty (``for act in p._actions``), so registrations run through it unchanged."""

    def __getattr__(self, name: str):
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __iter__(self):
        return iter(())


class _OneCommand:
    """The subparsers action as command registrations see it, building only the parser of ``command``: argparse
    spends ~0.1 ms per argument (a help formatter and gettext lookups each), ~25 ms for every command's flags,
    which a run of one command does not need. ``names`` collects every command registered."""

    def __init__(self, sub, command: str) -> None:
        self.sub, self.command, self.names = sub, command, []

    def add_parser(self, name: str, **kwargs):
        self.names.append(name)
        return self.sub.add_parser(name, **kwargs) if name == self.command else _Unbuilt()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; given ``command`` (the first word of argv), only that command's subparser
    when it is one (the full parser otherwise: top-level --help and an unknown command list them all)."""
    from ..core.version import __version__

    p = _Parser(prog="graphsim", description="Dataflow-graph compiler for LLM forward passes")
    p.add_argument("--version", action="version", version=f"graphsim {__version__}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an internal error (or GRAPHSIM_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True, metavar="command")
    from . import commands

    if command is not None:
        if command not in _CORE_COMMANDS:
            commands.register(command)  # only the module that registers it, when its source says which
        one = _OneCommand(sub, command)
        _add_commands(one, extras=command not in _CORE_COMMANDS)
        return p if command in one.names else build_parser()
    commands.register()
    _add_commands(sub)
    return p


#: The commands this module defines (the others come from the package's command modules, see graphsim.cli.commands).
_CORE_COMMANDS = ("estimate", "graph", "hw", "models")


def _add_commands(sub, extras: bool = True) -> None:
    e = add_command(sub, "estimate", help="estimate one plan: times, throughput, memory, critical path",
                    description="Compile one plan (model, hardware, mapping, requests, policies) and report its "
                                "forward time, TTFT/ITL,\nthroughput, stage and op-kind breakdowns, memory per "
                                "device and the critical path.\nWith --chunk, a chunked prefill: one forward per "
                                "chunk step, TTFT the sum of the steps.",
                    examples=["graphsim estimate --model deepseek-v3 --hw gb200 --tp 4 --ep 4 --request decode:4096x64",
                              "graphsim estimate --model deepseek-v4.1-flash --tp 4 --request prefill:32768 "
                              "--decoder-replay sglang --json -o report.json",
                              "graphsim estimate --model llama-3.1-70b --hw h200 --tp 8 --request prefill:8192 "
                              "--request decode:2048x32 --chunk 2048"])
    _plan_args(e)
    g = e.add_argument_group("chunked prefill")
    g.add_argument("--chunk", type=int, default=None, metavar="TOKENS",
                   help="chunked prefill: tokens per forward step (decode requests ride along in every step)")
    output_args(e)
    e.set_defaults(fn=cmd_estimate)
    g = add_command(sub, "graph", help="export the compiled graph as DOT (or SVG with -o x.svg)",
                    description="The compiled graph of one plan as Graphviz DOT: one cluster per stage and layer, "
                                "scheduled times on\nevery op. -o x.svg renders it (one node per layer beyond "
                                f"{SVG_MAX_OPS:,} ops).",
                    examples=["graphsim graph --model deepseek-v3 --request decode:100x4 -o graph.dot",
                              "graphsim graph --model llama-3.1-70b --request decode:2048x8 --collapse -o graph.svg"])
    _plan_args(g)
    o = g.add_argument_group("output")
    o.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="write the DOT text (.dot) or a rendered picture (.svg) here instead of printing DOT")
    o.add_argument("--collapse", action="store_true", help="one summary node per layer")
    g.set_defaults(fn=cmd_graph)
    h = add_command(sub, "hw", help="hardware descriptors",
                    description="The shipped hardware descriptors (peaks, bandwidths, capacities, each with its "
                                "source): list them,\nshow one, or probe this machine's default JAX device into "
                                "a new descriptor.",
                    examples=["graphsim hw list", "graphsim hw show gb300 --json -o gb300.json",
                              "graphsim hw probe local --quick -o local.toml"])
    w = h.add_argument_group("what")
    w.add_argument("action", choices=("list", "show", "probe"),
                   help="list shipped descriptors, show one, or probe this machine's default JAX device")
    w.add_argument("name", nargs="?", help="show: the descriptor; probe: the name to give it (default local)")
    w.add_argument("--quick", action="store_true", help="probe: fewer sizes and repetitions (seconds)")
    output_args(h, output="list/show: write the result here instead of printing it; probe: write the descriptor "
                          "TOML here")
    h.set_defaults(fn=cmd_hw)
    m = add_command(sub, "models", help="list shipped models (and the bundled Hugging Face ids)",
                    description="The shipped model names, one per line (any --model also takes a Hugging Face id "
                                "ORG/NAME — from the local\nHugging Face cache or graphsim's bundled snapshot of "
                                "public configs —, a config.json path or a checkpoint\ndirectory in the Hugging Face "
                                "layout).",
                    examples=["graphsim models", "graphsim models --hub", "graphsim models -o models.txt"])
    m.add_argument("--hub", action="store_true",
                   help="list the Hugging Face ids graphsim's bundled snapshot answers (graphsim/configs/hf)")
    output_args(m, with_json=False, output="write the list to FILE instead of printing it")
    m.set_defaults(fn=cmd_models)
    from .commands import EXTRA_COMMANDS

    for extra in EXTRA_COMMANDS if extras else ():
        extra(sub)




#: policy flags that only some model families honour: flag dest -> (what it belongs to, does ``model`` use it)
_FAMILY_FLAGS = {
    "decoder_replay": ("DeepSeek-V4.1 bounded replay", lambda m, s: len(s["decoder_replay"]) > 1),
    "encoder_replay": ("DeepSeek-V4.1 bounded replay", lambda m, s: m.kv_breakdown(1024) is not None
                       and "swa_bytes" in (m.kv_breakdown(1024) or {})),
    "fusion": ("DeepSeek-V4.1 mHC fusion", lambda m, s: len(s["fusion"]) > 1),
    "engram": ("DeepSeek-V4.1 Engram", lambda m, s: len(s["engram"]) > 1),
    "engram_shard": ("DeepSeek-V4.1 Engram", lambda m, s: len(s["engram"]) > 1),
    "engram_proj": ("DeepSeek-V4.1 Engram", lambda m, s: len(s["engram"]) > 1),
    "prefetch_distance": ("DeepSeek-V4.1 Engram", lambda m, s: len(s["engram"]) > 1),
    "dspark": ("DeepSeek-V4.1 DSpark drafting", lambda m, s: len(s["dspark"]) > 1),
    "verify": ("DeepSeek-V4.1 DSpark drafting", lambda m, s: len(s["dspark"]) > 1),
    "mtp": ("MTP drafting", lambda m, s: m.max_mtp() > 0),
}


def _focus_help(parser, command, args) -> None:
    """``--help`` after ``--model M``: the flags M's family honours stay; the policies of other families (V4.1's
    replay, fusion, Engram, DSpark; MTP without an MTP module) fold into one line naming them, so a Llama user reads
    Llama's flags. Any failure to load the model leaves the help whole."""
    if command is None or "--model" not in args:
        return
    i = args.index("--model")
    if i + 1 >= len(args):
        return
    try:
        from ..models import load_model
        from ..driver.pipeline import BASE_SUPPORT

        model = load_model(args[i + 1])
        support = {**BASE_SUPPORT, **model.POLICY_SUPPORT}
        support = {k: tuple(v) for k, v in support.items()}
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.choices.get(command)
        if p is None:
            return
        folded: dict = {}
        for act in p._actions:
            rule = _FAMILY_FLAGS.get(act.dest)
            if rule and not rule[1](model, support):
                folded.setdefault(rule[0], []).extend(act.option_strings[:1])
                act.help = argparse.SUPPRESS
        if folded:
            what = "; ".join(f"{k}: {', '.join(v)}" for k, v in folded.items())
            p.epilog = ((p.epilog or "") + f"\n\nnot shown: flags {model.name} does not use ({what}); "
                        "--help without --model lists every flag")
    except Exception:  # noqa: BLE001 - help must always print; a bad --model is reported when the command runs
        return


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    import os

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("GRAPHSIM_DEBUG", "") not in ("", "0")
    args = [x for x in args if x != "--debug"]  # accepted before or after the command
    try:
        command = next((x for x in args if not x.startswith("-")), None)  # top-level flags take no values
        parser = build_parser(command)
        if "-h" in args or "--help" in args:
            _focus_help(parser, command, args)
        a = parser.parse_args(args)
        rc = a.fn(a)
    except GraphsimError as e:
        print("graphsim: error: " + " ".join(str(e).split()), file=sys.stderr)  # always one line
        return 2
    except BrokenPipeError:  # e.g. `graphsim estimate ... | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("graphsim: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - anything else is graphsim's bug, never the user's
        if debug:
            raise
        what = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        print(f"graphsim: internal error: {what} (a bug in graphsim; rerun with --debug or GRAPHSIM_DEBUG=1 "
              "for the traceback)", file=sys.stderr)
        return 3
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":  # `python -m graphsim.cli.app`: the package's module, so subcommands register on it
    from graphsim.cli.app import main as _main

    sys.exit(_main())
