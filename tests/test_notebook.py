"""examples/tour.ipynb (issue 16, part 3): it executes without an error, its display cells show rich outputs (a
picture or HTML for a graph, HTML for a report, a PNG for a plot), and it is committed with its outputs stripped."""
import json
import sys
from pathlib import Path

import pytest

TOUR = Path(__file__).resolve().parents[1] / "examples" / "tour.ipynb"
#: tagged display cells -> the MIME types one of which each must produce
RICH = {"display-graph": ("image/svg+xml", "text/html"), "display-report": ("text/html",),
        "display-plot": ("image/png",)}


def test_committed_notebook_has_no_outputs():
    nb = json.loads(TOUR.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code), \
        "strip the outputs of examples/tour.ipynb (jupyter nbconvert --clear-output --inplace)"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    tags = [t for c in code for t in c["metadata"].get("tags", ())]
    assert sorted(tags) == sorted(RICH)  # the cells test_tour_executes checks


def _python3_kernel_here(root: Path) -> Path:
    """A ``python3`` kernel spec that runs *this* interpreter (the venv's), ahead of any other on JUPYTER_PATH."""
    from ipykernel.kernelspec import write_kernel_spec

    write_kernel_spec(root / "kernels" / "python3")
    spec = json.loads((root / "kernels" / "python3" / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    return root


def test_tour_executes(tmp_path, monkeypatch):
    for mod in ("nbclient", "nbformat", "ipykernel"):
        pytest.importorskip(mod, reason=f"{mod} is not installed (pip install -e '.[dev]'): the tour is not run")
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_PATH", str(_python3_kernel_here(tmp_path / "jupyter")))
    work = tmp_path / "cwd"
    work.mkdir()
    nb = nbformat.read(TOUR, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(code) for o in c.outputs
              if o.output_type == "error"]
    assert not errors, errors  # nbclient raises on the first error; this keeps a swallowed one from passing
    for c in code:
        for tag in c.metadata.get("tags", ()):
            mimes = {m for o in c.outputs if o.output_type in ("execute_result", "display_data") for m in o.data}
            assert mimes & set(RICH[tag]), (tag, sorted(mimes))
    assert all(c.execution_count for c in code)
    assert not list(work.iterdir())  # the sweep wrote into its own temporary directory and removed it
