"""``graphsim measured import aiconfigurator [--from DIR] -o DIR`` and ``graphsim measured list DIR``."""
from __future__ import annotations

import json


def cmd_measured(a) -> None:
    from .errors import GraphsimError

    if a.action == "import":
        if a.source != "aiconfigurator":
            raise GraphsimError("source", f"importers: aiconfigurator; got {a.source!r}")
        if not a.output:
            raise GraphsimError("output", "required: the folder to write the tables to (-o DIR)")
        from .measured.aiconfigurator import import_tables

        import_tables(a.from_dir, a.output, systems=a.system or None, families=a.family or None)
        return
    if a.action == "list":
        return _list(a)
    raise GraphsimError("action", f"must be import or list, got {a.action!r}")


def _list(a) -> None:
    from .errors import GraphsimError
    from .measured.store import Store

    if not a.source:
        raise GraphsimError("dir", "give the folder of measured tables: graphsim measured list DIR")
    store = Store(a.source)
    parts = store.partitions(a.device) if a.device else store.partitions()
    if a.family:
        parts = [p for p in parts if p.family in set(a.family)]
    rows = [{"device": p.identity["device"], "partition": p.key, "rows": int(len(p.t)),
             "boundary": p.identity["boundary"], "ranges": p.ranges(), "source": p.identity["source"]}
            for p in sorted(parts, key=lambda p: (p.identity["device"], p.key))]
    from .outputs import emit

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
    from .cli import add_command

    p = add_command(sub, "measured", help="measured operator tables: import (aiconfigurator) and list partitions",
                    description="Measured operator tables (docs/measured.md): import NVIDIA aiconfigurator's "
                                "collections into graphsim's\ntables, or list a folder's partitions with their "
                                "rows and sampled ranges. Use them with --view op|hybrid.",
                    examples=["graphsim measured import aiconfigurator -o tables --system gb200",
                              "graphsim measured list tables --device gb200",
                              "graphsim measured list tables --family gemm --json -o partitions.json"])
    g = p.add_argument_group("what")
    g.add_argument("action", choices=("import", "list"),
                   help="import: convert an importer's tables into DIR (-o); list: the partitions of a folder")
    g.add_argument("source", nargs="?", default="",
                   help="import: the importer (aiconfigurator); list: the folder of measured tables")
    g.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                   help="import from an unpacked aiconfigurator_core folder instead of the installed package")
    g = p.add_argument_group("filters")
    g.add_argument("--system", action="append", default=[], help="import only this system, e.g. gb200 (repeatable)")
    g.add_argument("--family", action="append", default=[], help="only this table family, e.g. gemm (repeatable)")
    g.add_argument("--device", default=None, help="list: only this device, e.g. gb200")
    g = p.add_argument_group("output")
    g.add_argument("-o", "--output", default=None, metavar="DIR|FILE",
                   help="import: the folder to write graphsim tables to; list: write the listing to FILE "
                        "instead of printing it")
    g.add_argument("--json", action="store_true", help="list: print the partitions as JSON")
    p.set_defaults(fn=cmd_measured)
