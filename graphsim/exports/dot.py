"""Graphviz DOT text of a graph: stage clusters, layer sub-clusters or collapsed per-layer summaries, colour by
op kind, edge style by dependency kind, the critical path highlighted, tooltips with FLOPs, bytes and time.

DOT text needs no binary; :func:`render_svg` needs Graphviz's ``dot`` and says so clearly when it is missing.
"""
from __future__ import annotations

import shutil
from contextlib import contextmanager, nullcontext
from typing import Iterable

from graphsim.core.ir import COMPONENTS, Graph

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
CRITICAL = (("color", "red"), ("penwidth", "2.5"), ("class", "critical"))


def _text(s) -> "graphviz.nohtml":
    """A label or tooltip as DOT text: backslashes literal, line breaks as DOT's ``\\n`` (the package quotes it
    and escapes its quotes; ``nohtml``: a name like ``<x>`` is text, never an HTML label)."""
    import graphviz

    return graphviz.nohtml(str(s).replace("\\", "\\\\").replace("\n", "\\n"))


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
            from graphsim.driver.views import SOURCE_NAMES

            lines.append(f"source: {SOURCE_NAMES[int(schedule.source[point, i])]} "
                         f"(SOL {schedule.sol_duration[point, i] * 1e6:.3f} us)")
    else:
        lines += [f"{c}: {v:.4g}·{f}" for c, f, v in op.cost.terms[:8]]
    return "\n".join(lines)


def to_digraph(graph: Graph, *, schedule=None, point: int = 0, collapse_layers: bool | Iterable[int] = False,
               max_tooltip: int = 600, legend: bool = True) -> "graphviz.Digraph":
    """The picture as a ``graphviz.Digraph``: a cluster per stage, a dashed sub-cluster per layer (or one summary
    node per collapsed layer). With ``schedule`` (a reference Schedule of this graph) ops carry FLOPs/bytes/time
    tooltips and the critical path is drawn red (edges get ``class="critical"``, stream-order hops on it
    included). ``collapse_layers``: True draws one summary node per layer, an iterable collapses only those
    layers. Over ``FAST_LAYOUT_NODES`` drawn nodes the graph carries ``FAST_LAYOUT`` (bounded layout effort),
    so its .dot file renders as quickly outside graphsim."""
    import graphviz

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
    # attribute lists, not dicts: the package sorts a plain dict's keys, a list keeps today's order
    g = graphviz.Digraph(graphviz.nohtml(graph.name), graph_attr=[("rankdir", "TB"), ("compound", "true"), ("newrank", "true")],
                         node_attr=[("shape", "box"), ("style", "filled,rounded"), ("fontsize", "10"),
                                    ("fontname", "Helvetica")],
                         edge_attr=[("arrowsize", "0.6")])

    def node_id(i: int) -> str:
        op = graph.ops[i]
        if collapse(op.layer):
            return f"L{graph.stages.index(op.stage) if op.stage in graph.stages else 0}_{op.layer}"
        return f"n{i}"

    by_stage: dict[str, dict] = {}
    for i, op in enumerate(graph.ops):
        by_stage.setdefault(op.stage, {}).setdefault(op.layer, []).append(i)
    nodes = 0
    for si, (stage, layers) in enumerate(by_stage.items()):
        busy = f"  ({sum(float(dur[i]) for ls in layers.values() for i in ls) * 1e3:.3f} ms busy)" if dur is not None else ""
        with g.subgraph(name=f"cluster_stage_{si}") as sg:
            sg.attr(_attributes=[("label", _text("stage: " + stage + busy)), ("style", "rounded"),
                                 ("color", "gray40"), ("fontname", "Helvetica")])
            for layer, ops in layers.items():
                if collapse(layer):
                    t = sum(float(dur[i]) for i in ops) if dur is not None else None
                    kinds: dict[str, int] = {}
                    for i in ops:
                        kinds[graph.ops[i].kind] = kinds.get(graph.ops[i].kind, 0) + 1
                    label = f"layer {layer}\n{len(ops)} ops" + (f"\n{t * 1e3:.3f} ms" if t is not None else "")
                    tip = f"layer {layer}: " + ", ".join(f"{n} {k}" for k, n in kinds.items())
                    on_path = [("color", "red"), ("penwidth", "2.5")] if any(i in crit for i in ops) else []
                    sg.node(node_id(ops[0]), _attributes=[("label", _text(label)), ("fillcolor", "#eeeeee"),
                                                          ("tooltip", _text(tip[:max_tooltip])), *on_path])
                    nodes += 1
                    continue
                inner = layer is not None
                with (sg.subgraph(name=f"cluster_s{si}_l{layer}") if inner else nullcontext(sg)) as lg:
                    if inner:
                        lg.attr(_attributes=[("label", f"layer {layer}"), ("style", "dashed")])
                    for i in ops:
                        lg.node(f"n{i}", _attributes=_op_attrs(graph, i, schedule, point, bounds, dur, inner,
                                                               i in crit, max_tooltip))
                        nodes += 1
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
        colour = CRITICAL if critical else (("color", EDGE_COLOURS.get(kind, "gray30")),)
        g.edge(ka, kb, _attributes=[("style", EDGE_STYLES.get(kind, "solid")), ("tooltip", kind), *colour])
    if legend:
        _legend(g, graph, schedule is not None)
    if nodes > FAST_LAYOUT_NODES:
        g.graph_attr.update(FAST_LAYOUT)
    return g


def _op_attrs(graph: Graph, i: int, schedule, point, bounds, dur, inner: bool, on_path: bool,
              max_tooltip: int) -> list[tuple[str, str]]:
    """One op's node: short name (and time), fill by kind, the tooltip; ellipse off the compute stream; border by
    duration source in measured views; red on the critical path."""
    op = graph.ops[i]
    label = op.name.split(".", 2)[-1] if inner else op.name
    if dur is not None:
        label += f"\n{float(dur[i]) * 1e6:.2f} us"
    attrs_ = [["label", label], ["fillcolor", KIND_COLOURS.get(op.kind, "#ffffff")],
              ["tooltip", _text(op_tooltip(graph, i, schedule, point, bounds)[:max_tooltip])]]
    if op.stream != "compute":
        attrs_.append(["shape", "ellipse"])
    if schedule is not None and schedule.source is not None:  # measured views: border by source
        src = int(schedule.source[point, i])
        attrs_ += [["color", SOURCE_COLOURS[src]], ["penwidth", "2"]]
        attrs_[0][1] = label + " [" + SOURCE_TAGS[src] + "]"
    if on_path:
        attrs_ += [["color", "red"], ["penwidth", "2.5"]]
    attrs_[0][1] = _text(attrs_[0][1])
    return [tuple(a) for a in attrs_]


def to_dot(graph: Graph, **kw) -> str:
    """DOT text of :func:`to_digraph` (same keywords): what ``graphsim graph -o g.dot`` writes."""
    return to_digraph(graph, **kw).source


def _legend(g, graph: Graph, with_path: bool) -> None:
    from html import escape

    kinds = list(dict.fromkeys(op.kind for op in graph.ops))
    rows = "".join(f'<TR><TD BGCOLOR="{KIND_COLOURS.get(k, "#ffffff")}">{escape(k)}</TD></TR>' for k in kinds)
    rows += "".join(f"<TR><TD>{k} edge: {EDGE_STYLES[k]}</TD></TR>" for k in ("data", "cache_read", "topk_reuse", "candidates", "order"))
    if with_path:
        rows += '<TR><TD><FONT COLOR="red">critical path</FONT></TD></TR>'
    with g.subgraph(name="cluster_legend") as lg:
        lg.attr(_attributes=[("label", "legend"), ("style", "rounded"), ("color", "gray70"), ("fontname", "Helvetica")])
        # a label between < and > is an HTML-like label for the package and for DOT
        lg.node("legend", _attributes=[("shape", "plaintext"), ("style", ""),
                                       ("label", f'<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0">{rows}</TABLE>>')])


def dot_available() -> bool:
    return shutil.which("dot") is not None


#: Above this many nodes dot's network-simplex ranking and positioning dominate (55 s for DeepSeek-V4.1's
#: 1,184-op decode graph): cap their iterations (1.3 s, a plainer layout of the same graph). Graph attributes,
#: the same as ``dot -Gnslimit=1 ...``: a .dot file carries them to whoever renders it.
FAST_LAYOUT_NODES = 400
FAST_LAYOUT = {"nslimit": "1", "nslimit1": "1", "mclimit": "0.1"}
DOT_TIMEOUT_S = 120


def dot_binary() -> str:
    """The graphviz ``dot`` executable, or a one-line error naming the output and the fix (checked before any
    work by a command that writes SVG)."""
    from ..core.errors import GraphsimError

    exe = shutil.which("dot")
    if exe is None:
        raise GraphsimError("output", "an SVG needs the graphviz 'dot' binary, which is not installed "
                            "(apt-get install graphviz); a .dot output needs none")
    return exe


def render_svg(dot) -> str:
    """SVG of DOT text or a ``graphviz.Digraph``, rendered by the graphviz package (``pipe_string``), which runs the
    ``dot`` binary. A missing binary is the user's environment, not a bug: a GraphsimError naming the output
    and the fix. A layout that runs past ``DOT_TIMEOUT_S`` is stopped (the child is killed) and is a one-line
    error pointing at ``--collapse`` or a .dot output; a failing ``dot`` a RuntimeError with its message."""
    import graphviz

    from ..core.errors import GraphsimError

    dot_binary()
    text = dot if isinstance(dot, str) else dot.source
    try:
        with _deadline(DOT_TIMEOUT_S):
            # graphviz.pipe_string runs subprocess.run (Digraph.pipe feeds lines through a Popen that an
            # interrupt would leave running)
            return graphviz.pipe_string("dot", "svg", text, encoding="utf-8", quiet=True)
    except _Deadline:
        raise GraphsimError("output", f"graphviz did not lay out the graph in {DOT_TIMEOUT_S} s; use --collapse "
                            "(one node per layer) or write a .dot file") from None
    except graphviz.ExecutableNotFound:  # removed between the check and the run
        dot_binary()
        raise
    except graphviz.CalledProcessError as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else str(e.stderr or "")
        raise RuntimeError(f"dot failed: {err.strip()[:500]}") from None


class _Deadline(BaseException):
    """Raised by SIGALRM inside the package's ``subprocess.run``, which kills the ``dot`` child and re-raises it
    (a BaseException, so no ``except Exception`` on the way swallows it)."""


@contextmanager
def _deadline(seconds: float):
    """At most ``seconds`` in the block, by SIGALRM: the graphviz package's ``pipe`` takes no timeout, and
    ``subprocess.run`` kills its child on any exception. Only where that works: POSIX, the main thread, and no
    timer already set by someone else (pytest-timeout, a caller's alarm) — elsewhere no bound."""
    import signal
    import threading

    if (not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread()
            or signal.getitimer(signal.ITIMER_REAL)[0]):
        yield
        return

    def fire(signum, frame):
        raise _Deadline

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
