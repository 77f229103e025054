"""Graphviz DOT text of a graph: stage clusters, optional layer sub-clusters or a collapsed per-layer summary,
colour by op kind, edge style by dependency kind, the critical path highlighted, tooltips with costs."""
from __future__ import annotations

import shutil
import subprocess

from graphsim.ir import Graph

KIND_COLOURS = {
    "gemm": "#8ecae6", "moe_experts": "#219ebc", "attention": "#ffb703", "sparse_attention": "#ffb703",
    "indexer": "#fb8500", "norm": "#d9ed92", "elementwise": "#e9edc9", "activation": "#e9edc9",
    "cache_write": "#cdb4db", "cache_read": "#cdb4db", "collective": "#ef476f", "host_copy": "#06d6a0",
    "embedding": "#adb5bd", "router": "#bde0fe", "mhc": "#f1c0e8", "engram": "#90dbf4", "topk": "#ffd6a5",
    "quant": "#e9edc9", "compressor": "#caffbf",
}
EDGE_STYLES = {"data": "solid", "cache_read": "dashed", "topk_reuse": "dotted", "order": "bold"}


def _q(s: str) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: Graph, *, schedule=None, point: int = 0, collapse_layers: bool = False,
           max_tooltip: int = 300) -> str:
    """DOT text. With ``schedule`` (a reference Schedule of this graph) ops carry times and the critical
    path is drawn red and bold; ``collapse_layers`` draws one summary node per layer."""
    crit: set[int] = set()
    dur = None
    if schedule is not None:
        path = schedule.critical_path(point)
        crit = set(path)
        crit_edges = set(zip(path, path[1:]))
        dur = schedule.duration[point]
    else:
        crit_edges = set()
    idx = graph.op_index
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB; compound=true; node [shape=box, style=filled, fontsize=10];"]

    def node_id(i: int) -> str:
        op = graph.ops[i]
        if collapse_layers and op.layer is not None:
            return f"L{op.stage}_{op.layer}"
        return f"n{i}"

    by_stage: dict[str, dict] = {}
    for i, op in enumerate(graph.ops):
        by_stage.setdefault(op.stage, {}).setdefault(op.layer, []).append(i)
    for si, (stage, layers) in enumerate(by_stage.items()):
        lines.append(f"  subgraph cluster_stage_{si} {{ label={_q('stage: ' + stage)}; style=rounded; color=gray40;")
        for layer, ops in layers.items():
            if collapse_layers and layer is not None:
                t = sum(float(dur[i]) for i in ops) if dur is not None else None
                label = f"layer {layer}\\n{len(ops)} ops" + (f"\\n{t * 1e3:.3f} ms" if t is not None else "")
                on_path = any(i in crit for i in ops)
                lines.append(f"    {node_id(ops[0])} [label={_q(label)}, fillcolor=\"#eeeeee\""
                             + (", color=red, penwidth=2" if on_path else "") + "];")
                continue
            inner = layer is not None
            if inner:
                lines.append(f"    subgraph cluster_s{si}_l{layer} {{ label={_q(f'layer {layer}')}; style=dashed;")
            for i in ops:
                op = graph.ops[i]
                tip = f"{op.name}\\nkind={op.kind} stream={op.stream} tokens={op.token_set}\\n{op.formula}"
                for c, f, v in op.cost.terms[:6]:
                    tip += f"\\n{c}: {v:.4g}·{f}"
                if dur is not None:
                    tip += f"\\ntime={float(dur[i]) * 1e6:.2f} us"
                label = op.name.split(".", 2)[-1] if inner else op.name
                attrs_ = [f"label={_q(label)}", f"fillcolor={_q(KIND_COLOURS.get(op.kind, '#ffffff'))}",
                          f"tooltip={_q(tip[:max_tooltip])}"]
                if op.stream != "compute":
                    attrs_.append("shape=ellipse")
                if i in crit:
                    attrs_ += ["color=red", "penwidth=2.5"]
                lines.append(f"      n{i} [{', '.join(attrs_)}];")
            if inner:
                lines.append("    }")
        lines.append("  }")
    seen = set()
    for e in graph.edges:
        a, b = idx[e.src], idx[e.dst]
        ka, kb = node_id(a), node_id(b)
        if ka == kb or (ka, kb, e.kind) in seen:
            continue
        seen.add((ka, kb, e.kind))
        style = [f"style={EDGE_STYLES.get(e.kind, 'solid')}", f"tooltip={_q(e.kind)}"]
        if (a, b) in crit_edges:
            style += ["color=red", "penwidth=2.5", 'class="critical"']
        lines.append(f"  {ka} -> {kb} [{', '.join(style)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(dot_text: str) -> str:
    """SVG via the ``dot`` binary; raises RuntimeError with a clear message when it is missing."""
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError("the graphviz 'dot' binary is not installed (apt-get install graphviz); DOT text needs none")
    return subprocess.run([exe, "-Tsvg"], input=dot_text.encode(), capture_output=True, check=True).stdout.decode()
