"""The architecture as the imports draw it (issue 30): graphsim's modules form no import cycle, and every import
points down the layers docs/architecture.md lists. Both module-level and function-level (lazy) imports count: a
lazy import defers the cost, not the dependency. The graph is read from the source with ``ast``, so a new cycle or
an upward import fails here with the offending edges named."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: installed package -> its folder (pyproject.toml's package-dir)
PACKAGES = {"graphsim": ROOT / "graphsim", "graphsim.passes": ROOT / "passes", "graphsim.lowering": ROOT / "lowering",
            "graphsim.hw": ROOT / "hw"}
#: the layers, bottom to top: a module imports only from its own layer or the ones below
LAYERS = ("graphsim.core", "graphsim.hw", "graphsim.lowering", "graphsim.passes", "graphsim.models",
          "graphsim.driver", "graphsim.views", "graphsim.sweep", "graphsim.serving", "graphsim.exports",
          "graphsim.cli", "graphsim")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            rel = f.relative_to(folder)
            if pkg == "graphsim" and rel.parts[0] in ("passes", "lowering", "hw"):
                continue
            parts = [p for p in rel.with_suffix("").parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


MODULES = _modules()


def _lazy_names() -> dict[str, str]:
    """``graphsim``'s public names -> the module that defines them (its PEP 562 table), so ``from graphsim import
    compile_plan`` inside the package counts as the import of the driver it is."""
    tree = ast.parse((ROOT / "graphsim" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_LAZY":
            return {k: "graphsim" + v for k, v in ast.literal_eval(node.value).items()}
    return {}


LAZY = _lazy_names()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == "TYPE_CHECKING"


def _targets(module: str, path: Path, node) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if node.level:
        base = base[:len(base) - node.level + 1]
        frm = ".".join(base + ([node.module] if node.module else []))
    else:
        frm = node.module or ""
    out = []
    for a in node.names:
        sub = f"{frm}.{a.name}"
        if sub in MODULES:
            out.append(sub)
        elif frm == "graphsim" and a.name in LAZY:
            out.append(LAZY[a.name])
        else:
            out.append(frm)
    return out


def import_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for module, path in MODULES.items():
        g.add_node(module)
        stack = [ast.parse(path.read_text())]
        while stack:
            node = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    continue  # annotations only
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for t in _targets(module, path, child):
                        dep = _resolve(t) if t.startswith("graphsim") else None
                        if dep and dep != module:
                            g.add_edge(module, dep, line=child.lineno)
                stack.append(child)
    return g


_GRAPH: list = []


def _graph() -> nx.DiGraph:
    """Read once per process, when a test here first asks (collection stays cheap on the other workers)."""
    if not _GRAPH:
        _GRAPH.append(import_graph())
    return _GRAPH[0]


def _layer(module: str) -> int:
    return next(i for i, p in enumerate(LAYERS) if module == p or module.startswith(p + "."))


def _edge(a: str, b: str, g: nx.DiGraph | None = None) -> str:
    line = (g if g is not None else _graph()).edges[a, b].get("line", "?")
    return f"{a} -> {b} ({MODULES[a].relative_to(ROOT)}:{line})"


def _cycles(g: nx.DiGraph) -> list[str]:
    """One cycle of each strongly connected component, its edges named."""
    return [" ; ".join(_edge(a, b, g) for a, b in nx.find_cycle(g.subgraph(c)))
            for c in nx.strongly_connected_components(g) if len(c) > 1]


def _upward(g: nx.DiGraph) -> list[str]:
    return sorted(_edge(a, b, g) for a, b in g.edges if _layer(b) > _layer(a))


def test_the_parser_sees_the_imports():
    # the graph is not empty by accident: the driver imports the IR, the CLI reaches the search, lazily
    GRAPH = _graph()
    assert GRAPH.has_edge("graphsim.driver.pipeline", "graphsim.core.ir")
    assert nx.has_path(GRAPH, "graphsim.cli.search", "graphsim.serving.search")
    assert len(MODULES) > 100 and GRAPH.number_of_edges() > 400


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_every_module_has_a_layer():
    assert all(isinstance(_layer(m), int) for m in MODULES)


def test_imports_point_down_the_layers():
    up = _upward(_graph())
    assert not up, "imports that point up the layers:\n" + "\n".join(up)


@pytest.mark.parametrize("mutation", ["cycle", "upward"])
def test_the_checks_can_fail(mutation):
    """The checks above are not vacuous: one added edge of each kind is caught by the same functions."""
    g = _graph().copy()
    if mutation == "cycle":  # the builder imports the IR: the IR importing the builder closes a cycle
        g.add_edge("graphsim.core.ir", "graphsim.core.builder")
        found = _cycles(g)
        assert len(found) == 1 and "graphsim.core.ir -> graphsim.core.builder" in found[0]
    else:  # the core reaching the search
        g.add_edge("graphsim.core.ir", "graphsim.serving.search")
        assert [e.split(" (")[0] for e in _upward(g)] == ["graphsim.core.ir -> graphsim.serving.search"]
