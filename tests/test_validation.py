"""The published DeepSeek-V3/R1 setups (shared/reference/measurements.md): SOL is never below a measurement,
the practitioner profile only derates, and docs/validation.md shows the table this code produces."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "validate_published.py"


@pytest.fixture(scope="module")
def validation():
    spec = importlib.util.spec_from_file_location("validate_published", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, mod.validate()


def test_sol_never_below_a_measurement(validation):
    _, rows = validation
    assert len(rows) == 7
    for r in rows:
        assert r.sol >= r.case.published, r.case.name  # measured / SOL <= 1
        assert r.derated < r.sol  # the profile only derates
        assert 0.2 < r.efficiency <= 1.0


def test_docs_table_is_current(validation):
    mod, rows = validation
    text = (ROOT / "docs" / "validation.md").read_text()
    for line in mod.table(rows).splitlines():
        assert line in text, f"docs/validation.md is stale; regenerate with examples/validate_published.py: {line}"

# The script itself (its __main__ block prints the table and asserts SOL >= measured) runs in
# tests/test_examples.py with every other example.
