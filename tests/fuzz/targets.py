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

#: ``field: message`` where field is a dotted path whose parts may be indexed, once or more
#: (``op[layers.0.x].split``, ``fpm.partitions[0].curves.decode.knots[0][1]``).
FIELD = re.compile(r"^[A-Za-z_][\w\-]*(\[[^\]]*\])*(\.[\w\-]+(\[[^\]]*\])*)*: \S")
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


def run_cli(argv: list[str], files: dict | None = None, check=None) -> tuple[str, str]:
    """``graphsim ARGV`` in-process (files: name -> text/bytes written to a temp dir, ``{tmp}`` in argv
    replaced by it). Exit 0 must print something (valid strict JSON with --json) and pass ``check(tmp, args)``
    (what it wrote; a reason it is nonsense, or None); exit 2 must print one line
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
        if rc == 0 and check is not None and "Traceback" not in e:
            try:
                bad = check(tmp, args)
            except Exception as x:  # noqa: BLE001 - an output the check cannot read is the command's
                bad = f"unreadable output ({type(x).__name__}: {x})"
            if bad:
                return "nonsense", bad
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
        if not m.vision():  # a model with a vision tower prices an image request too (its processor and tower)
            requests = (*requests, "prefill:256+img:640x480")
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


# ---- FPM, measured, collect, plot (issue 26) -------------------------------------------------------------

_RESULTS: dict = {}


def base_results() -> bytes:
    """A small sweep's results (Parquet bytes; computed once per process)."""
    if "r" not in _RESULTS:
        from graphsim.sweep import run

        with tempfile.TemporaryDirectory() as tmp:
            spec = {"name": "fz", "structure": {"model": "deepseek-v3", "mapping": [{"tp": 4, "ep": 4}, {"tp": 8}]},
                    "axes": {"decode.count": [8, 64], "decode.context": [1024, 4096]}, "outputs": ["stages", "kinds"]}
            out = os.path.join(tmp, "r.parquet")
            run(spec, out)
            with open(out, "rb") as f:
                _RESULTS["r"] = f.read()
    return _RESULTS["r"]


def _fpm_sane(rep: dict) -> str | None:
    """An FPM estimate: finite, > 0, never below its SOL forward."""
    bad = _finite_tree(rep)
    if bad:
        return f"non-finite {bad}"
    f, sol = rep.get("forward_s"), (rep.get("fpm") or {}).get("sol_forward_s")
    if not isinstance(f, (int, float)) or not f > 0:
        return f"forward_s {f}"
    if isinstance(sol, (int, float)) and f < sol * (1 - 1e-12):
        return f"forward_s {f} below its SOL {sol}"
    return None


def run_fpm_model(text) -> tuple[str, str]:
    """An FPM model file through ``estimate --view fpm`` (and FPMModel.load): a sane estimate or one line."""
    from fuzz.strategies import FPM_MODEL

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.fpm")
        with open(path, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        outcome, detail, out = _cli_capture(["estimate", "--model", FPM_MODEL, "--hw", "gb200", "--request",
                                             "decode:200x3", "--view", "fpm", "--fpm", path, "--json"])
    if outcome != "ok":
        return outcome, detail
    try:
        bad = _fpm_sane(json.loads(out))
    except ValueError as e:
        return "nonsense", f"invalid JSON ({e})"
    return ("nonsense", bad) if bad else ("ok", "")


def _cli_capture(argv: list[str]) -> tuple[str, str, str]:
    """run_cli's classification, plus stdout."""
    from graphsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except Exception as e:  # noqa: BLE001
        return "crash", f"{type(e).__name__}: {e}", ""
    e = err.getvalue().strip()
    if rc == 0:
        return ("crash", e[-300:], "") if "Traceback" in e else ("ok", "", out.getvalue())
    if rc == 2:
        lines = e.splitlines()
        m = CLI_ERROR.match(lines[-1]) if lines else None
        if not m or len(lines) != 1:
            return "unnamed", e[-300:], ""
        return outcome_of_message(m.group(1)), m.group(1), ""
    return "crash", f"exit {rc}: {e[-300:]}", ""


def _mutate(df, muts: dict):
    import pandas as pd

    for c, v in muts.items():
        if isinstance(v, tuple):
            row, val = v
            if c in df and len(df):
                col = df[c].astype(object)
                col.iloc[row % len(df)] = val
                df[c] = col
        else:
            df[c] = pd.Series([v] * len(df), index=df.index, dtype=object) if isinstance(v, (list, dict)) else v
    return df


def _to_parquet(df, path) -> bool:
    """Write a mutated table; False when pyarrow cannot store it (no file a user could have)."""
    try:
        df.to_parquet(path, index=False)
        return True
    except Exception:  # noqa: BLE001 - mixed-type columns pyarrow refuses
        return False


def run_fpm_samples(case: dict) -> tuple[str, str]:
    """Mutated FPM samples through ``fpm fit`` (and ``fpm eval`` of the fit on them)."""
    from fuzz.strategies import base_samples

    df = base_samples()
    if case.get("status"):
        df.loc[df.index[::3], "status"] = case["status"]
    df = _mutate(df, case["mutations"])
    if case.get("drop") in df:
        df = df.drop(columns=[case["drop"]])
    with tempfile.TemporaryDirectory() as tmp:
        s = os.path.join(tmp, "s.parquet")
        if not _to_parquet(df, s):
            return "ok", "not storable"
        m = os.path.join(tmp, "m.fpm")
        outcome, detail = run_cli(["fpm", "fit", s, "-o", m])
        if outcome != "ok" or not case.get("eval"):
            return outcome, detail
        outcome, detail, out = _cli_capture(["fpm", "eval", m, "--holdout", s, "--json"])
    if outcome != "ok":
        return outcome, detail
    try:
        rep = json.loads(out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError as e:
        return "nonsense", f"invalid JSON ({e})"
    bad = _finite_tree(rep)
    return ("nonsense", f"non-finite {bad}") if bad else ("ok", "")


def run_measured(case: dict) -> tuple[str, str]:
    """A copy of the measured fixture with one GEMM table mutated, through ``estimate --view op|hybrid``: a
    sane report (never below SOL in hybrid) or one line."""
    import shutil
    from pathlib import Path

    import pandas as pd

    from fuzz.strategies import MEASURED

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "m"
        shutil.copytree(MEASURED, root)
        gemm = sorted(root.glob("gb200/gemm/*/*.parquet"))[0]
        df = _mutate(pd.read_parquet(gemm), case["mutations"])
        if not _to_parquet(df, gemm):
            return "ok", "not storable"
        if case.get("truncate"):
            data = gemm.read_bytes()
            gemm.write_bytes(data[: len(data) // 2])
        view = ["--view", case["view"]] if case["view"] != "auto" else []  # auto: --measured makes it hybrid
        outcome, detail, out = _cli_capture(["estimate", "--model", "deepseek-v3", "--hw", "gb200", "--tp", "4",
                                             "--ep", "4", "--request", case["request"], *view,
                                             "--measured", str(root), "--backend", "trtllm@1.3.0rc20", "--json"])
        checked = _measured_check(root)
    if checked[0] != "ok":
        return checked
    if outcome != "ok":
        return outcome, detail
    try:
        rep = json.loads(out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError as e:
        return "nonsense", f"invalid JSON ({e})"
    bad = _finite_tree(rep)
    if bad:
        return "nonsense", f"non-finite {bad}"
    if not rep.get("forward_s", 0) > 0:
        return "nonsense", f"forward_s {rep.get('forward_s')}"
    return "ok", ""


def _measured_check(root) -> tuple[str, str]:
    """``measured check`` on the same store: exit 0 (none below SOL) or 1 (violations) with a JSON document
    whose counts add up, or one line naming the field."""
    from graphsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["measured", "check", str(root), "--json"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except Exception as e:  # noqa: BLE001
        return "crash", f"measured check: {type(e).__name__}: {e}"
    e = err.getvalue().strip()
    if rc == 2:
        lines = e.splitlines()
        m = CLI_ERROR.match(lines[-1]) if lines else None
        return ("unnamed", e[-300:]) if not m or len(lines) != 1 else (outcome_of_message(m.group(1)), m.group(1))
    if rc not in (0, 1) or "Traceback" in e:
        return "crash", f"measured check exit {rc}: {e[-300:]}"
    try:
        d = json.loads(out.getvalue(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError as x:
        return "nonsense", f"measured check: invalid JSON ({x})"
    n = sum(r["violations"] for r in d["summary"])
    if d["violations"] != n or (rc == 1) != (n > 0) or any(r["rows"] < r["checked"] for r in d["summary"]):
        return "nonsense", f"measured check: exit {rc}, {d['violations']} violations, summary {n}"
    bad = _finite_tree({k: v for k, v in d.items() if k != "worst"})
    return ("nonsense", f"measured check: non-finite {bad}") if bad else ("ok", "")


def run_collect(case: dict) -> tuple[str, str]:
    """``collect ops`` (API, a one-point grid) with a descriptor whose name comes from the case and an output
    that may be a file, a device or a new folder: it writes only under the output (and its lock beside it),
    or refuses with one line before any work."""
    from pathlib import Path

    import graphsim as gs
    from graphsim.views.collect.ops import collect_ops

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "work"
        root.mkdir()
        toml = (Path(__file__).resolve().parents[2] / "hw" / "data" / "gb200.toml").read_text()
        hw = root / "hw.toml"
        hw.write_text(toml.replace('name = "GB200"', f"name = {json.dumps(case['name'])}"), encoding="utf-8",
                      errors="surrogatepass")
        (root / "file").write_text("x")
        out = case["out"].replace("{tmp}", str(root))
        before = {p for p in Path(tmp).rglob("*")}
        grid = {"copy": [{"bytes": case["bytes"]}]}  # one point (no family: the grid's, i.e. copy)
        try:
            collect_ops(str(hw), out, families=case["families"] or None, grid=grid, warmup=case["warmup"],
                        reps=case["reps"])
            outcome, detail = "ok", ""
        except gs.GraphsimError as e:
            outcome, detail = outcome_of_message(str(e)), str(e)
        except Exception as e:  # noqa: BLE001
            return "crash", f"{type(e).__name__}: {e}"
        new = {p for p in Path(tmp).rglob("*")} - before
        base = Path(out).resolve() if not out.startswith("/dev/") else None
        for p in new:
            q = p.resolve()
            inside = base is not None and (q == base or base in q.parents or q == Path(str(base) + ".lock"))
            if not inside and not (base is not None and q in base.parents):
                return "nonsense", f"wrote {p} outside the output {out}"
    return outcome, detail


def run_plot(case: dict) -> tuple[str, str]:
    """``graphsim plot`` of a real results file: a written, non-empty image or one line."""
    from pathlib import Path

    data = base_results()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "r.parquet").write_bytes(data)
        args = [a.replace("{tmp}", tmp) for a in case["argv"]]
        outcome, detail, out = _cli_capture(args)
        if outcome == "ok":
            target = Path(args[args.index("-o") + 1])
            if not target.is_file() or target.stat().st_size == 0:
                return "nonsense", f"exit 0 but no image at {target}"
    for dev in ("/dev/null", "/dev/full"):
        if Path(dev + ".png").exists():
            return "nonsense", f"wrote {dev}.png"
    return outcome, detail


def _search_outputs(files: dict, tmp: str, args: list[str]) -> str | None:
    """What a successful search wrote: its table (when -o names one) with every row that fits finite and
    positive in TTFT, TPOT and tokens/s/GPU, and every cache entry it wrote or rewrote sealed with the
    SHA-256 of its bytes (an entry seeded by the case and left as it was is the cache's to judge)."""
    from pathlib import Path

    import numpy as np
    import pandas as pd

    from graphsim.driver.identity import part_checksum

    out = args[args.index("-o") + 1] if "-o" in args else None
    if not out or not out.endswith((".parquet", ".csv")):
        return None
    if not Path(out).is_file():
        return f"exit 0 but no table at {out}"
    df = pd.read_parquet(out) if out.endswith(".parquet") else pd.read_csv(out)
    fits = df[df["fits"].astype(bool)] if len(df) else df
    for col in ("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu"):
        v = fits[col].to_numpy(dtype=float)
        if not (np.isfinite(v) & (v > 0)).all():
            return f"a row that fits has {col} {v[~(np.isfinite(v) & (v > 0))][:3]}"
    parts = Path(out + ".parts")
    for p in sorted(parts.glob("*.json")) if parts.is_dir() else ():
        seeded = files.get(f"{Path(out).name}.parts/{p.name}")
        if seeded is not None and p.read_bytes() == (seeded.encode() if isinstance(seeded, str) else seeded):
            continue
        side = p.with_name(p.name + ".sum")
        try:
            want = json.loads(side.read_text())["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            return f"cache entry {p.name} written without a readable checksum"
        if want != part_checksum(p):
            return f"cache entry {p.name} does not match its checksum"
    return None


def run_search(case: dict) -> tuple[str, str]:
    """``graphsim search`` (a small space, run_cli's rules) and, on exit 0, what it wrote (_search_outputs)."""
    return run_cli(case["argv"], case["files"], check=lambda tmp, args: _search_outputs(case["files"], tmp, args))


# ---- serve-sim (issue 27) ------------------------------------------------------------------------------------------

def _write_case_file(path: str, content) -> bool:
    """A case's file: text, bytes, or ``("parquet", rows)`` written as a Mooncake Parquet trace (False when
    pyarrow cannot store the rows: no file a user could have)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if isinstance(content, tuple) and content[0] == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pq.write_table(pa.Table.from_pylist([r if isinstance(r, dict) else {"x": r} for r in content[1]]), path)
        except Exception:  # noqa: BLE001 - mixed-type columns pyarrow refuses
            return False
        return True
    with open(path, "wb" if isinstance(content, bytes) else "w") as f:
        f.write(content)
    return True


def _serve_doc(doc: dict) -> str | None:
    """The invariants of a serve-sim --json document beyond strict, finite JSON: its schema, served + rejected =
    total, every percentile null or finite >= 0, Little's law when anything was served, and a hit ratio in
    [0, the trace's own prefix reuse] (a cache never beats the trace's reuse)."""
    if doc.get("schema_version") != 1 or doc.get("command") != "serve-sim":
        return f"schema_version {doc.get('schema_version')!r}, command {doc.get('command')!r}"
    rq = doc["requests"]
    if rq["served"] + rq["rejected"] != rq["total"]:
        return f"requests: served {rq['served']} + rejected {rq['rejected']} != total {rq['total']}"
    blocks = [(f"latency.{k}", v) for k, v in doc["latency"].items()]
    blocks += [(f"classes[{i}].{k}", c[k]) for i, c in enumerate(doc["classes"])
               for k in ("ttft_ms", "tpot_ms", "e2e_ms")]
    for where, d in blocks:
        for q in ("p50", "p90", "p99", "mean"):
            v = d.get(q)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                return f"{where}.{q} = {v!r}"
    lit = doc["checks"]["littles_law"]["relative_error"]
    if rq["served"] > 0 and not lit < 0.02:
        return f"checks.littles_law.relative_error {lit}"
    c = doc["cache"]
    reuse = c["trace_prefix_reuse"]
    if not 0 <= c["hit_ratio"] <= (1.0 if reuse is None else reuse) + 1e-9:
        return f"cache.hit_ratio {c['hit_ratio']} outside [0, the trace's prefix reuse {reuse}]"
    return None


def run_serve_sim(case: dict) -> tuple[str, str]:
    """``graphsim serve-sim`` with its files (run_cli's rules: exit 0 sane, exit 2 one line naming a field,
    anything else a crash); on exit 0, the --json document's invariants (_serve_doc) and every file named by
    -o / --requests-out / --plot written. A case with ``api`` goes through Python instead (run_serve_api)."""
    from pathlib import Path

    if "api" in case:
        return run_serve_api(case["api"], case["files"])
    with tempfile.TemporaryDirectory() as tmp:
        for fname, content in case["files"].items():
            if not _write_case_file(os.path.join(tmp, fname), content):
                return "ok", "not storable"
        args = [a.replace("{tmp}", tmp) for a in case["argv"]]
        outcome, detail, out = _cli_capture(args)
        if "internal error" in detail:  # one line naming a field, but the command's own fault
            return "crash", detail
        if outcome != "ok":
            return outcome, detail
        named = {f: args[args.index(f) + 1] for f in ("-o", "--requests-out", "--plot") if f in args}
        for flag, path in named.items():
            if not Path(path).is_file() or Path(path).stat().st_size == 0:
                return "nonsense", f"exit 0 but {flag} {path} was not written"
        text = Path(named["-o"]).read_text() if "-o" in named else out
        if not text.strip():
            return "nonsense", "exit 0 with no output"
        if "--json" not in args:
            return "ok", ""
        try:
            doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        except ValueError as e:
            return "nonsense", f"invalid JSON ({e})"
    bad = _finite_tree(doc)
    if bad:
        return "nonsense", f"non-finite {bad}"
    try:
        bad = _serve_doc(doc)
    except (KeyError, TypeError) as e:
        bad = f"document lacks {type(e).__name__}: {e}"
    return ("nonsense", bad) if bad else ("ok", "")


def run_serve_api(api: dict, files: dict) -> tuple[str, str]:
    """graphsim.serving from Python (a serve_api_case): a GraphsimError naming a field, or a SimResult whose
    --json body holds _serve_doc's invariants."""
    import graphsim as gs
    from graphsim.serving import SLA, Deployment, TierSpec, load_trace, simulate, synthetic

    with tempfile.TemporaryDirectory() as tmp:
        for fname, content in files.items():
            _write_case_file(os.path.join(tmp, fname), content)
        try:
            t = api["traffic"]
            tr = load_trace(os.path.join(tmp, "t.jsonl"), **t["load_trace"]) if "load_trace" in t \
                else synthetic(**t["synthetic"])
            if api["head"] is not None:
                tr = tr.head(api["head"])
            if api["scale"] is not None:
                tr = tr.scale_rate(api["scale"])
            tiers = api["tiers"]
            if tiers is not None:
                tiers = [TierSpec(**tiers["kw"])] if "kw" in tiers else \
                    [TierSpec.parse(x, tiers["host_bytes"]) for x in tiers["parse"]]
            d = dict(api["deployment"])
            m = d.pop("mapping")
            dep = Deployment(mapping=gs.ParallelMapping(**m) if isinstance(m, dict) else m, **d)
            kw = dict(api["simulate"])
            if isinstance(kw.get("sla"), tuple):
                kw["sla"] = SLA(*kw["sla"])
            res = simulate(tr, dep, tiers=tiers, **kw)
            text = json.dumps({"schema_version": 1, "command": "serve-sim", **res.to_json()}, default=float)
        except gs.GraphsimError as e:
            return outcome_of_message(str(e)), str(e)
        except Exception as e:  # noqa: BLE001 - classify, never raise
            return "crash", f"{type(e).__name__}: {e}"
    try:
        doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError as e:
        return "nonsense", f"invalid JSON ({e})"
    bad = _finite_tree(doc) or _serve_doc(doc)
    return ("nonsense", bad) if bad else ("ok", "")
