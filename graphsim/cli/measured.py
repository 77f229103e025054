"""``graphsim measured import aiconfigurator [--from DIR] -o DIR``, ``graphsim measured list DIR`` and
``graphsim measured check DIR`` (every row against SOL)."""
from __future__ import annotations

import json
import sys


def cmd_measured(a) -> None:
    from ..core.errors import GraphsimError

    if a.action == "import":
        if a.source != "aiconfigurator":
            raise GraphsimError("source", f"importers: aiconfigurator; got {a.source!r}")
        if not a.output:
            raise GraphsimError("output", "required: the folder to write the tables to (-o DIR)")
        from ..views.measured.aiconfigurator import import_tables

        import_tables(a.from_dir, a.output, systems=a.system or None, families=a.family or None)
        return
    if a.action == "list":
        return _list(a)
    if a.action == "check":
        return _check(a)
    raise GraphsimError("action", f"must be import, list or check, got {a.action!r}")


def _check(a) -> int:
    """Every row against SOL; exit code 1 when a row is below its SOL (a violation), 0 otherwise."""
    from ..core.errors import GraphsimError
    from ..views.measured.check import STATUSES, scan
    from ..core.outputs import check_output, emit

    if not a.source:
        raise GraphsimError("dir", "give the folder of measured tables: graphsim measured check DIR")
    out = a.output or ""
    if out and not (out.endswith(".parquet") or out.endswith(".json") or out.endswith(".txt")):
        raise GraphsimError("output", f"-o takes FILE.parquet (the violations), FILE.json or FILE.txt; got {out!r}")
    check_output(out)
    r = scan(a.source, devices=[a.device] if a.device else None, families=a.family or None)
    v = r.violations
    if out.endswith(".parquet"):
        from ..core.outputs import atomic_target

        with atomic_target(out, suffixes=(".parquet",)) as tmp:
            v.to_parquet(tmp, index=False)
        # stderr when stdout carries the JSON document (it stays parseable)
        print(f"wrote {out} ({len(v):,} violations)", file=sys.stderr if a.json else sys.stdout)
    if a.json or out.endswith(".json"):
        from ..core.outputs import json_document

        doc = {"rows": r.rows, "seconds": round(r.seconds, 3), "violations": r.n_violations, "summary": r.summary,
               "reasons": [{"device": d, "family": f, "op": o, "status": st, "reason": why, "rows": n}
                           for (d, f, o, st), m in sorted(r.reasons.items()) for why, n in sorted(m.items())],
               "worst": _records(v.nsmallest(50, "ratio")) if len(v) else []}
        emit(out if out.endswith(".json") else None, json_document("measured check", doc) + "\n", "JSON")
    else:
        lines = [f"{'device':<7}{'family':<22}{'op':<15}{'rows':>10}" + "".join(f"{s:>14}" for s in STATUSES)
                 + f"{'violations':>12}{'worst':>8}"]
        for s in r.summary:
            worst = f"{s['worst']:.3f}" if s["worst"] is not None else "-"
            lines.append(f"{s['device']:<7}{s['family']:<22}{s['op']:<15}{s['rows']:>10,}"
                         + "".join(f"{s[st]:>14,}" for st in STATUSES) + f"{s['violations']:>12,}{worst:>8}")
        lines.append(f"{r.rows:,} rows in {r.seconds:.1f} s ({r.rows / max(r.seconds, 1e-9):,.0f} rows/s); "
                     f"{r.n_violations:,} below SOL (measured / SOL < 1)")
        if len(v):
            lines.append("worst violations (partition: coordinates  measured vs SOL):")
            for _, row in v.nsmallest(20, "ratio").iterrows():
                coords = " ".join(f"{c}={int(row[c])}" for c in _coords(row["family"]) if c in row and row[c] == row[c])
                part = "/".join(str(row[c]) for c in ("device", "framework", "version", "kernel_source", "dtype",
                                                      "kv_dtype") if row.get(c, ""))
                lines.append(f"  {row['family']}/{row['op']} {part}: {coords}  {row['latency_s'] * 1e6:,.2f} us vs "
                             f"{row['sol_s'] * 1e6:,.2f} us ({row['ratio']:.3f})")
        unpriced = [(k, m) for k, m in sorted(r.reasons.items()) if k[3] != "checked"]
        if unpriced:
            lines.append("rows not priced, and why:")
            for (d, f, o, st), m in unpriced:
                for why, n in sorted(m.items(), key=lambda x: -x[1]):
                    lines.append(f"  {d} {f}/{o} {st}: {n:,} rows: {why}")
        emit(out if out.endswith(".txt") else None, "\n".join(lines) + "\n", "text")
    return 1 if r.n_violations else 0


def _coords(family: str) -> tuple:
    from ..views.measured.schema import FAMILIES

    return FAMILIES[family].coords


def _records(df) -> list:
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items() if v == v and v != ""}
            for row in df.to_dict("records")]


def _list(a) -> None:
    from ..core.errors import GraphsimError
    from ..views.measured.store import Store

    if not a.source:
        raise GraphsimError("dir", "give the folder of measured tables: graphsim measured list DIR")
    store = Store(a.source)
    parts = store.partitions(a.device) if a.device else store.partitions()
    if a.family:
        parts = [p for p in parts if p.family in set(a.family)]
    rows = [{"device": p.identity["device"], "partition": p.key, "rows": int(len(p.t)),
             "boundary": p.identity["boundary"], "ranges": p.ranges(), "source": p.identity["source"]}
            for p in sorted(parts, key=lambda p: (p.identity["device"], p.key))]
    from ..core.outputs import emit

    if a.json:
        emit(a.output, json.dumps(rows, indent=2) + "\n", "JSON")
        return
    lines = []
    for r in rows:
        rng = " ".join(f"{c}={lo}" + (f"..{hi}" if hi != lo else "") for c, (lo, hi) in r["ranges"].items())
        lines.append(f"{r['device']:<6} {r['partition']:<70} {r['rows']:>7,} rows  {rng}")
    lines.append(f"{len(rows)} partitions, {sum(r['rows'] for r in rows):,} rows")
    emit(a.output, "\n".join(lines) + "\n", "text")


def register(sub) -> None:
    from .app import add_command

    p = add_command(sub, "measured", help="measured operator tables: import (aiconfigurator), list partitions, "
                    "check every row against SOL",
                    description="Measured operator tables (docs/measured.md): import NVIDIA aiconfigurator's "
                                "collections into graphsim's\ntables, list a folder's partitions with their "
                                "rows and sampled ranges, or check every row against\ngraphsim's SOL of the op "
                                "it times (exit code 1 when a row is below it). Use them with --view op|hybrid.",
                    examples=["graphsim measured import aiconfigurator -o tables --system gb200",
                              "graphsim measured list tables --device gb200",
                              "graphsim measured list tables --family gemm --json -o partitions.json",
                              "graphsim measured check tables --device h200 -o violations.parquet"])
    g = p.add_argument_group("what")
    g.add_argument("action", choices=("import", "list", "check"),
                   help="import: convert an importer's tables into DIR (-o); list: the partitions of a folder; "
                        "check: every row against graphsim's SOL of the op it times")
    g.add_argument("source", nargs="?", default="",
                   help="import: the importer (aiconfigurator); list, check: the folder of measured tables")
    g.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                   help="import from an unpacked aiconfigurator_core folder instead of the installed package")
    g = p.add_argument_group("filters")
    g.add_argument("--system", action="append", default=[], help="import only this system, e.g. gb200 (repeatable)")
    g.add_argument("--family", action="append", default=[], help="only this table family, e.g. gemm (repeatable)")
    g.add_argument("--device", default=None, help="list, check: only this device, e.g. gb200")
    g = p.add_argument_group("output")
    g.add_argument("-o", "--output", default=None, metavar="DIR|FILE",
                   help="import: the folder to write graphsim tables to; list: write the listing to FILE "
                        "instead of printing it; check: FILE.parquet (the violations, one row each), FILE.json "
                        "or FILE.txt (the report)")
    g.add_argument("--json", action="store_true", help="list, check: print JSON")
    p.set_defaults(fn=cmd_measured)
