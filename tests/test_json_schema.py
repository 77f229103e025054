"""The --json documents (issue 16): every command's keys are exactly the keys docs/json.md lists (its tables are
parsed here, so the page and the code cannot drift), the same for every model family, with schema_version and
command first, value types as documented and no object keyed by digit strings anywhere."""
import json
import re
from pathlib import Path

import pytest

from graphsim.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "json.md"
FAMILIES = ("deepseek-v3", "deepseek-v4.1-flash", "llama-3.1-70b")
FIX = str(Path(__file__).parent / "data" / "measured")


def _doc() -> dict:
    """{section: {key path: type}} from the tables of docs/json.md (rows ``| `key` | type | unit | meaning |``)."""
    out: dict = {}
    section = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            out[section] = {}
        elif section and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out[section][cells[0].strip("`")] = cells[1]
    return out


DOCS = _doc()

#: section of docs/json.md -> (command name, argv per family; {model} is replaced)
CASES = {
    "estimate": ("estimate", ["estimate", "--model", "{model}", "--tp", "4", "--request", "decode:2048x8", "--request",
                              "prefill:1024", "--algorithm", "all_reduce=tree", "--json"]),
    "estimate --chunk": ("estimate", ["estimate", "--model", "{model}", "--request", "prefill:600", "--request",
                                      "decode:1024x4", "--chunk", "256", "--json"]),
    "memory": ("memory", ["memory", "--model", "{model}", "--context", "4096", "--json"]),
    "fit": ("fit", ["fit", "--model", "{model}", "--tp", "4", "--context", "8192", "--json"]),
    "layers": ("layers", ["layers", "--model", "{model}", "--json"]),
    "ledger": ("ledger", ["ledger", "--model", "{model}", "--request", "prefill:512", "--request", "decode:1024x2",
                          "--json"]),
    "disagg": ("disagg", ["disagg", "--model", "{model}", "--isl", "1024", "--osl", "128", "--prefill", "tp=4",
                          "--decode", "tp=4", "--decode-batch", "8,32", "--json"]),
    "hw list": ("hw", ["hw", "list", "--json"]),
    "serve-sim": ("serve-sim", ["serve-sim", "--model", "{model}", "--tp", "4", "--trace", str(Path(__file__).parent / "data"
                                / "traces" / "mooncake_synthetic_trace_head300.jsonl"), "--head", "40", "--classes",
                                "4096", "--validate", "4", "--no-progress", "--json"]),
    "hw show": ("hw", ["hw", "show", "{model}", "--json"]),  # "families" of hardware: see _subjects
}


#: documented sections no case holds to the code yet; search's table has a ``best[].<row key>`` placeholder and
#: an open ``policy_values`` object, which this parser does not read: give it fixed rows and a case in CASES
UNCHECKED = ("search",)


def _subjects(section: str) -> tuple:
    return ("gb200", "h100", "b200") if section == "hw show" else FAMILIES


def _run(argv, capsys) -> dict:
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _walk(x, path: str, keys: dict, containers: set) -> None:
    """Every key path (``a.b``, ``a[].b``) with the types of its values; containers: paths holding keys."""
    if isinstance(x, dict):
        containers.add(path)
        for k, v in x.items():
            assert not k.isdigit(), f"{path or 'the document'} is keyed by a digit string ({k!r}): use records"
            p = f"{path}.{k}" if path else k
            keys.setdefault(p, set()).add(type(v).__name__)
            _walk(v, p, keys, containers)
    elif isinstance(x, list):
        for v in x:
            _walk(v, path + "[]", keys, containers)


def _parent(p: str) -> str:
    return p.rsplit(".", 1)[0] if "." in p else ""


_TYPES = {"int": {"int"}, "number": {"int", "float"}, "str": {"str"}, "bool": {"bool"}, "object": {"dict"},
          "list": {"list"}}


def _allowed(doc_type: str) -> set:
    base, _, null = doc_type.partition("/")
    ok = set(_TYPES["list"] if base.startswith("list") else _TYPES[base])
    return ok | ({"NoneType"} if null == "null" else set())


def _check(section: str, command: str, d: dict) -> frozenset:
    """The document against its table; returns its key paths."""
    doc = DOCS[section]
    assert list(d)[:2] == ["schema_version", "command"] and d["schema_version"] == 1 and d["command"] == command
    keys: dict = {}
    containers: set = set()
    _walk(d, "", keys, containers)
    extra = set(keys) - set(doc)
    assert not extra, f"{section}: keys missing from docs/json.md: {sorted(extra)}"
    # a documented key must be there whenever the object or record list holding it is (not null, not empty)
    missing = {p for p in doc if _parent(p) in containers} - set(keys)
    assert not missing, f"{section}: documented keys not printed: {sorted(missing)}"
    for p, types in keys.items():
        assert types <= _allowed(doc[p]), f"{section}: {p} is {types}, documented as {doc[p]}"
    return frozenset(keys)


def test_the_doc_tables_parse():
    assert set(CASES) <= set(DOCS), sorted(set(CASES) - set(DOCS))
    for section in CASES:
        rows = DOCS[section]
        for key, t in rows.items():
            assert re.fullmatch(r"[a-z0-9_]+(\[\])?(\.[a-z0-9_]+(\[\])?)*", key), (section, key)
            assert t.partition("/")[0] in _TYPES or t.startswith("list["), (section, key, t)
            assert _parent(key) == "" or _parent(key).rstrip("[]") in rows, f"{section}: {key} has no parent row"


def test_every_documented_command_is_exercised():
    """A section with a table needs a case here (add it to CASES), so every table is held to the code."""
    documented = {s for s, rows in DOCS.items() if rows}
    missing = documented - set(CASES) - set(UNCHECKED)
    assert not missing, f"add cases for {sorted(missing)} to CASES in tests/test_json_schema.py"


@pytest.mark.parametrize("section", sorted(CASES))
def test_keys_are_the_documented_ones_and_the_same_for_every_family(section, capsys):
    command, argv = CASES[section]
    seen = {}
    for subject in _subjects(section) if "{model}" in argv else ("-",):
        d = _run([a.replace("{model}", subject) for a in argv], capsys)
        seen[subject] = _check(section, command, d)
    first = next(iter(seen.values()))
    for subject, keys in seen.items():
        assert keys == first, f"{section}: {subject} differs: {sorted(keys ^ first)}"


def test_measured_view_and_fallback_sections_follow_the_doc(capsys):
    # the coverage object (op / hybrid views) and a precision fallback (V4.1's FP4 on H100 runs at FP8)
    d = _run(["estimate", "--model", "deepseek-v3", "--tp", "4", "--ep", "4", "--request", "decode:1024x16",
              "--view", "hybrid", "--measured", FIX, "--backend", "trtllm@1.3.0rc20", "--json"], capsys)
    keys = _check("estimate", "estimate", d)
    assert "coverage.kinds[].sources.measured" in keys and d["fpm"] is None
    d = _run(["estimate", "--model", "deepseek-v4.1-flash", "--hw", "h100", "--tp", "8", "--ep", "8", "--request",
              "decode:2048x8", "--json"], capsys)
    assert "identity.precision_fallbacks[].runs_at" in _check("estimate", "estimate", d)
    assert {"precision": "fp4", "runs_at": "fp8"} in d["identity"]["precision_fallbacks"]


def test_categories_are_listed_in_full(capsys):
    # every precision, every storage format and every layer path, with 0 where absent
    from graphsim.core.ir import FORMATS, PRECISIONS

    d = _run(["estimate", "--model", "llama-3.1-70b", "--request", "decode:1024x4", "--json"], capsys)
    assert list(d["traffic"]["flops"]) == list(PRECISIONS) and d["traffic"]["flops"]["fp4"] == 0.0
    d = _run(["memory", "--model", "llama-3.1-70b", "--context", "1024", "--json"], capsys)
    assert [f["format"] for f in d["weights"]["by_format"]] == list(FORMATS)
    d = _run(["layers", "--model", "llama-3.1-70b", "--json"], capsys)
    assert d["path_counts"]["full"] == 80 and d["path_counts"]["reuse"] == 0
    d = _run(["hw", "show", "h100", "--json"], capsys)
    assert [p["precision"] for p in d["precisions"]] == list(PRECISIONS)
    assert {"precision": "fp4", "peak_flops_per_s": 0.0, "native": False, "runs_at": "fp8"} in d["precisions"]
