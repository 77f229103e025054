"""Graphviz DOT text of a graph: stage clusters, layer sub-clusters or collapsed per-layer summaries, colour by
op kind, edge style by dependency kind, the critical path highlighted, tooltips with FLOPs, bytes and time.

DOT text needs no binary; :func:`render_svg` needs Graphviz's ``dot`` and says so clearly when it is missing.
"""
from __future__ import annotations

import shutil
import subprocess
from typing import Iterable

from graphsim.ir import COMPONENTS, Graph

KIND_COLOURS = {
    "gemm": "#8ecae6", "moe_experts": "#219ebc", "attention": "#ffb703", "sparse_attention": "#ffb703",
    "indexer": "#fb8500", "norm": "#d9ed92", "elementwise": "#e9edc9", "activation": "#e9edc9",
    "cache_write": "#cdb4db", "cache_read": "#cdb4db", "collective": "#ef476f", "host_copy": "#06d6a0",
    "embedding": "#adb5bd", "router": "#bde0fe", "mhc": "#f1c0e8", "engram": "#90dbf4", "topk": "#ffd6a5",
    "quant": "#e9edc9", "compressor": "#caffbf",
}
#: data = producer -> consumer; cache_read = a layer reading a KV owner's cache; topk_reuse = a layer reusing
#: another's Top-K selection; candidates = a Reindex layer scoring the shared candidate pool; order = an
#: ordering constraint without data. Stream order (ops of one stream
#: issue in program order) is not an edge of the graph: it is drawn only where it is on the critical path.
EDGE_STYLES = {"data": "solid", "cache_read": "dashed", "topk_reuse": "dotted", "candidates": "dotted", "order": "bold",
               "stream": "dashed"}
EDGE_COLOURS = {"data": "gray30", "cache_read": "#7b2cbf", "topk_reuse": "#f77f00", "candidates": "#2a9d8f",
                "order": "gray60", "stream": "gray60"}
CRITICAL = 'color=red, penwidth=2.5, class="critical"'


def _q(s: str) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _si(v: float, unit: str) -> str:
    for scale, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {p}{unit}"
    return f"{v:.3g} {unit}"


#: measured views: node border per duration source (measured, interpolated, extrapolated, fallback, sol)
SOURCE_COLOURS = ("#1b7837", "#2166ac", "#e08214", "#762a83", "#999999")
SOURCE_TAGS = ("measured", "interp", "extrap", "fallback", "sol")


def op_tooltip(graph: Graph, i: int, schedule=None, point: int = 0, bounds: list | None = None) -> str:
    """What an op does and costs: kind, stream, token set, formula; with a schedule its FLOPs per precision,
    bytes per kind, time and bound, else its cost terms."""
    op = graph.ops[i]
    lines = [op.name, f"kind={op.kind} stage={op.stage} layer={op.layer} stream={op.stream} tokens={op.token_set}"]
    if op.formula:
        lines.append(op.formula)
    if schedule is not None:
        comp = schedule.components[point, i]
        parts = [f"{c[6:]} {_si(v, 'FLOP')}" for c, v in zip(COMPONENTS, comp) if c.startswith("flops_") and v]
        parts += [f"{c[6:]} {_si(v, 'B')}" for c, v in zip(COMPONENTS, comp) if c.startswith("bytes_") and v]
        lines += parts or ["no FLOPs or bytes"]
        bound = (bounds or schedule.bound(point))[i]
        lines.append(f"time {schedule.duration[point, i] * 1e6:.3f} us, starts {schedule.start[point, i] * 1e6:.3f} us, "
                     f"bound: {bound}")
        if schedule.source is not None:
            from graphsim.measured.view import SOURCE_NAMES

            lines.append(f"source: {SOURCE_NAMES[int(schedule.source[point, i])]} "
                         f"(SOL {schedule.sol_duration[point, i] * 1e6:.3f} us)")
    else:
        lines += [f"{c}: {v:.4g}·{f}" for c, f, v in op.cost.terms[:8]]
    return "\n".join(lines)


def to_dot(graph: Graph, *, schedule=None, point: int = 0, collapse_layers: bool | Iterable[int] = False,
           max_tooltip: int = 600, legend: bool = True) -> str:
    """DOT text. With ``schedule`` (a reference Schedule of this graph) ops carry FLOPs/bytes/time tooltips and
    the critical path is drawn red (edges get ``class="critical"``, stream-order hops on it included).
    ``collapse_layers``: True draws one summary node per layer, an iterable collapses only those layers."""
    crit: set[int] = set()
    crit_edges: set = set()
    dur = bounds = None
    if schedule is not None:
        bounds = schedule.bound(point)
        path = schedule.critical_path(point)
        crit = set(path)
        crit_edges = set(zip(path, path[1:]))
        dur = schedule.duration[point]
    collapse = (lambda layer: layer is not None) if collapse_layers is True else \
        (lambda layer: False) if not collapse_layers else \
        (lambda layer, s=frozenset(collapse_layers): layer in s)
    idx = graph.op_index
    lines = [f"digraph {_q(graph.name)} {{",
             "  rankdir=TB; compound=true; newrank=true;",
             "  node [shape=box, style=\"filled,rounded\", fontsize=10, fontname=Helvetica];",
             "  edge [arrowsize=0.6];"]

    def node_id(i: int) -> str:
        op = graph.ops[i]
        if collapse(op.layer):
            return f"L{graph.stages.index(op.stage) if op.stage in graph.stages else 0}_{op.layer}"
        return f"n{i}"

    by_stage: dict[str, dict] = {}
    for i, op in enumerate(graph.ops):
        by_stage.setdefault(op.stage, {}).setdefault(op.layer, []).append(i)
    for si, (stage, layers) in enumerate(by_stage.items()):
        busy = f"  ({sum(float(dur[i]) for ls in layers.values() for i in ls) * 1e3:.3f} ms busy)" if dur is not None else ""
        lines.append(f"  subgraph cluster_stage_{si} {{ label={_q('stage: ' + stage + busy)}; style=rounded; "
                     "color=gray40; fontname=Helvetica;")
        for layer, ops in layers.items():
            if collapse(layer):
                t = sum(float(dur[i]) for i in ops) if dur is not None else None
                kinds: dict[str, int] = {}
                for i in ops:
                    kinds[graph.ops[i].kind] = kinds.get(graph.ops[i].kind, 0) + 1
                label = f"layer {layer}\n{len(ops)} ops" + (f"\n{t * 1e3:.3f} ms" if t is not None else "")
                tip = f"layer {layer}: " + ", ".join(f"{n} {k}" for k, n in kinds.items())
                on_path = any(i in crit for i in ops)
                lines.append(f"    {node_id(ops[0])} [label={_q(label)}, fillcolor=\"#eeeeee\", "
                             f"tooltip={_q(tip[:max_tooltip])}" + (", color=red, penwidth=2.5" if on_path else "") + "];")
                continue
            inner = layer is not None
            if inner:
                lines.append(f"    subgraph cluster_s{si}_l{layer} {{ label={_q(f'layer {layer}')}; style=dashed;")
            for i in ops:
                op = graph.ops[i]
                label = op.name.split(".", 2)[-1] if inner else op.name
                if dur is not None:
                    label += f"\n{float(dur[i]) * 1e6:.2f} us"
                attrs_ = [f"label={_q(label)}", f"fillcolor={_q(KIND_COLOURS.get(op.kind, '#ffffff'))}",
                          f"tooltip={_q(op_tooltip(graph, i, schedule, point, bounds)[:max_tooltip])}"]
                if op.stream != "compute":
                    attrs_.append("shape=ellipse")
                if schedule is not None and schedule.source is not None:  # measured views: border by source
                    src = int(schedule.source[point, i])
                    attrs_ += [f"color={_q(SOURCE_COLOURS[src])}", "penwidth=2"]
                    attrs_[0] = f"label={_q(label + ' [' + SOURCE_TAGS[src] + ']')}"
                if i in crit:
                    attrs_ += ["color=red", "penwidth=2.5"]
                lines.append(f"      n{i} [{', '.join(attrs_)}];")
            if inner:
                lines.append("    }")
        lines.append("  }")
    # Edges: one per (tail, head, kind) after collapsing; critical if any op pair behind it is.
    edges: dict[tuple, bool] = {}
    for e in graph.edges:
        a, b = idx[e.src], idx[e.dst]
        key = (node_id(a), node_id(b), e.kind)
        if key[0] != key[1]:
            edges[key] = edges.get(key, False) or (a, b) in crit_edges
    data_pairs = {(idx[e.src], idx[e.dst]) for e in graph.edges}
    for a, b in sorted(crit_edges - data_pairs):  # stream-order hops that carry the critical path
        key = (node_id(a), node_id(b), "stream")
        if key[0] != key[1]:
            edges[key] = True
    for (ka, kb, kind), critical in edges.items():
        style = [f"style={EDGE_STYLES.get(kind, 'solid')}", f"tooltip={_q(kind)}"]
        style.append(CRITICAL if critical else f"color={_q(EDGE_COLOURS.get(kind, 'gray30'))}")
        lines.append(f"  {ka} -> {kb} [{', '.join(style)}];")
    if legend:
        lines += _legend(graph, schedule is not None)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _legend(graph: Graph, with_path: bool) -> list[str]:
    kinds = list(dict.fromkeys(op.kind for op in graph.ops))
    rows = "".join(f'<TR><TD BGCOLOR="{KIND_COLOURS.get(k, "#ffffff")}">{k}</TD></TR>' for k in kinds)
    rows += "".join(f"<TR><TD>{k} edge: {EDGE_STYLES[k]}</TD></TR>" for k in ("data", "cache_read", "topk_reuse", "candidates", "order"))
    if with_path:
        rows += '<TR><TD><FONT COLOR="red">critical path</FONT></TD></TR>'
    return ["  subgraph cluster_legend { label=\"legend\"; style=rounded; color=gray70; fontname=Helvetica;",
            f"    legend [shape=plaintext, style=\"\", label=<<TABLE BORDER=\"0\" CELLBORDER=\"1\" CELLSPACING=\"0\">{rows}</TABLE>>];",
            "  }"]


def dot_available() -> bool:
    return shutil.which("dot") is not None


#: Above this many nodes dot's network-simplex ranking and positioning dominate (55 s for DeepSeek-V4.1's
#: 1,184-op decode graph): cap their iterations (1.3 s, a plainer layout of the same graph).
FAST_LAYOUT_NODES = 400
FAST_LAYOUT = ("-Gnslimit=1", "-Gnslimit1=1", "-Gmclimit=0.1")
DOT_TIMEOUT_S = 120


def dot_binary() -> str:
    """The graphviz ``dot`` executable, or a one-line error naming the output and the fix (checked before any
    work by a command that writes SVG)."""
    from ..errors import GraphsimError

    exe = shutil.which("dot")
    if exe is None:
        raise GraphsimError("output", "an SVG needs the graphviz 'dot' binary, which is not installed "
                            "(apt-get install graphviz); a .dot output needs none")
    return exe


def render_svg(dot_text: str) -> str:
    """SVG via the ``dot`` binary; a missing binary is the user's environment, not a bug: a GraphsimError
    naming the output and the fix. Large graphs get a bounded layout effort; a layout that still runs past
    ``DOT_TIMEOUT_S`` is a one-line error pointing at ``--collapse`` or a .dot output."""
    from ..errors import GraphsimError

    exe = dot_binary()
    nodes = sum(1 for line in dot_text.splitlines() if line.lstrip().startswith("n") and "[label=" in line)
    flags = FAST_LAYOUT if nodes > FAST_LAYOUT_NODES else ()
    try:
        r = subprocess.run([exe, "-Tsvg", *flags], input=dot_text.encode(), capture_output=True, timeout=DOT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise GraphsimError("output", f"graphviz did not lay out {nodes:,} nodes in {DOT_TIMEOUT_S} s; use --collapse "
                            "(one node per layer) or write a .dot file") from None
    if r.returncode:
        raise RuntimeError(f"dot failed: {r.stderr.decode(errors='replace').strip()[:500]}")
    return r.stdout.decode()
