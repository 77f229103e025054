"""Fuzz targets: run one generated input through graphsim as a user (CLI) or a script (Python API) would, and
classify what happened. Shared by the in-process property suite (tests/test_fuzz.py) and the isolated
campaign (tests/fuzz/campaign.py), which adds hangs and memory.

Outcomes:
* ``ok`` — it ran, and the result is sane (finite, non-negative, strict JSON where JSON is printed);
* ``error`` — a clean refusal: one line that starts with a field path (``mapping.tp: ...``);
* ``unnamed`` — a refusal whose message names no field;
* ``nonsense`` — it ran but the result is not sane (inf, NaN, negative sizes, invalid JSON...);
* ``crash`` — anything else: a traceback, an internal error, an unexpected exit code.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import tempfile
from typing import Any

#: ``field: message`` where field is a dotted path, optionally with [index] parts (``op[layers.0.x].split``).
FIELD = re.compile(r"^[A-Za-z_][\w\-]*(\[[^\]]*\])?(\.[\w\-]+(\[[^\]]*\])?)*: \S")
CLI_ERROR = re.compile(r"^graphsim: error: (.*)$")


def outcome_of_message(msg: str) -> str:
    first, *rest = str(msg).strip().splitlines() or [""]
    if rest:
        return "unnamed"
    return "error" if FIELD.match(first) else "unnamed"


def _finite_tree(x: Any, path: str = "") -> str | None:
    """The path of the first non-finite or NaN number in a JSON-like tree (None if all finite)."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return None
    if isinstance(x, (int, float)):
        return None if math.isfinite(x) else path or "<root>"
    if isinstance(x, dict):
        for k, v in x.items():
            bad = _finite_tree(v, f"{path}.{k}" if path else str(k))
            if bad:
                return bad
    if isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            bad = _finite_tree(v, f"{path}[{i}]")
            if bad:
                return bad
    return None


def check_report(rep) -> str | None:
    """Sanity of a Report: forward time finite and > 0, every number finite, memory non-negative, strict JSON."""
    d = rep.to_dict()
    bad = _finite_tree(d)
    if bad:
        return f"non-finite {bad}"
    if not rep.forward_s > 0:
        return f"forward_s {rep.forward_s}"
    for k in ("kv_gib", "workspace_gib", "total_gib", "weights_total_gib"):
        if d["memory"][k] < 0:
            return f"negative memory.{k}"
    try:
        json.dumps(d, allow_nan=False, default=float)
    except ValueError as e:
        return f"invalid JSON: {e}"
    return None


def run_api(case: dict) -> tuple[str, str]:
    """A plan through the Python API: compile, report, sanity."""
    import graphsim as gs

    try:
        plan = gs.Plan(case["requests"], gs.ParallelMapping(**case.get("mapping", {})),
                       gs.Policies(**case.get("policies", {})))
        c = gs.compile_plan(case["model"], plan, case.get("hw", "gb200"))
        rep = c.report()
    except gs.GraphsimError as e:
        return outcome_of_message(str(e)), str(e)
    except Exception as e:  # noqa: BLE001 - classify, never raise
        return "crash", f"{type(e).__name__}: {e}"
    bad = check_report(rep)
    return ("nonsense", bad) if bad else ("ok", "")


def run_cli(argv: list[str], files: dict | None = None) -> tuple[str, str]:
    """``graphsim ARGV`` in-process (files: name -> text/bytes written to a temp dir, ``{tmp}`` in argv
    replaced by it). Exit 0 must print something (valid strict JSON with --json); exit 2 must print one line
    ``graphsim: error: <field>: ...``; anything else is a crash."""
    from graphsim.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        for name, content in (files or {}).items():
            mode = "wb" if isinstance(content, bytes) else "w"
            os.makedirs(os.path.dirname(os.path.join(tmp, name)), exist_ok=True)
            with open(os.path.join(tmp, name), mode) as f:
                f.write(content)
        args = [a.replace("{tmp}", tmp) for a in argv]
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(args)
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # noqa: BLE001
            return "crash", f"{type(e).__name__}: {e}"
        o, e = out.getvalue(), err.getvalue().strip()
    if rc == 0:
        if "--json" in args and o.strip():
            try:
                d = json.loads(o, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
            except ValueError as x:
                return "nonsense", f"invalid JSON ({x})"
            bad = _finite_tree(d)
            if bad:
                return "nonsense", f"non-finite {bad}"
        if "Traceback" in e:
            return "crash", e[-300:]
        return "ok", ""
    if rc == 2:
        lines = e.splitlines()
        m = CLI_ERROR.match(lines[-1]) if lines else None
        if not m or len(lines) != 1:
            return "unnamed", e[-300:]
        return outcome_of_message(m.group(1)), m.group(1)
    return "crash", f"exit {rc}: {e[-300:]}"


def run_config(base: str, cfg: Any, requests=("decode:1024x4", "prefill:2048")) -> tuple[str, str]:
    """A (mutated) HF config dict through load_model and a small plan; KV capacity must be monotone."""
    import graphsim as gs

    try:
        m = gs.load_model(cfg)
        kv = [m.kv_bytes(n) for n in (0, 1, 127, 128, 129, 4096)]
        c = gs.compile_plan(m, gs.Plan(list(requests)), "gb200")
        rep = c.report()
    except gs.GraphsimError as e:
        return outcome_of_message(str(e)), str(e)
    except Exception as e:  # noqa: BLE001
        return "crash", f"{type(e).__name__}: {e}"
    if any(not math.isfinite(k) or k < 0 for k in kv) or any(b < a for a, b in zip(kv, kv[1:])):
        return "nonsense", f"kv bytes {kv}"
    bad = check_report(rep)
    return ("nonsense", bad) if bad else ("ok", "")


def run_toml(kind: str, text: str | bytes) -> tuple[str, str]:
    """A hardware or profile TOML through its loader and a small plan."""
    import graphsim as gs

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "x.toml")
        with open(path, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        try:
            if kind == "hw":
                hw = gs.load_hw(path)
                rep = gs.compile_plan("deepseek-v3", gs.Plan(["decode:2048x8"], gs.ParallelMapping(tp=4)), hw).report()
            else:
                prof = gs.load_profile(path)
                rep = gs.compile_plan("llama-3.1-70b", gs.Plan(["decode:2048x8"], gs.ParallelMapping(tp=4)), "h200",
                                      prof).report()
        except gs.GraphsimError as e:
            return outcome_of_message(str(e)), str(e)
        except Exception as e:  # noqa: BLE001
            return "crash", f"{type(e).__name__}: {e}"
    bad = check_report(rep)
    return ("nonsense", bad) if bad else ("ok", "")


def run_sweep(spec: Any, text: str | bytes | None = None, ext: str = ".json") -> tuple[str, str]:
    """A sweep spec (a dict, or raw file text with an extension) run to a temporary Parquet file; every row is
    a result or an error row naming its field, and results are finite."""
    import graphsim as gs
    from graphsim.sweep import run

    with tempfile.TemporaryDirectory() as tmp:
        src = spec
        if text is not None:
            src = os.path.join(tmp, "spec" + ext)
            with open(src, "wb" if isinstance(text, bytes) else "w") as f:
                f.write(text)
        try:
            df = run(src, os.path.join(tmp, "r.parquet"), progress=False).to_pandas()
        except gs.GraphsimError as e:
            return outcome_of_message(str(e)), str(e)
        except Exception as e:  # noqa: BLE001
            return "crash", f"{type(e).__name__}: {e}"
    if "error" in df:
        errs = df["error"].dropna()
        errs = errs[errs != ""]
        for msg in errs:
            if outcome_of_message(msg) != "error":
                return "unnamed", msg
        good = df[df["error"].isna() | (df["error"] == "")]
    else:
        good = df
    if "forward_s" in good and len(good):
        f = good["forward_s"].to_numpy(dtype=float)
        if not (f > 0).all() or not (f < math.inf).all():
            return "nonsense", f"forward_s {f[:5]}"
    return "ok", ""
