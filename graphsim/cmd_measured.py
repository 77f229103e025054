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
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        rng = " ".join(f"{c}={lo}" + (f"..{hi}" if hi != lo else "") for c, (lo, hi) in r["ranges"].items())
        print(f"{r['device']:<6} {r['partition']:<70} {r['rows']:>7,} rows  {rng}")
    print(f"{len(rows)} partitions, {sum(r['rows'] for r in rows):,} rows")


def register(sub) -> None:
    p = sub.add_parser("measured", help="measured operator tables: import (aiconfigurator) and list partitions")
    p.add_argument("action", choices=("import", "list"))
    p.add_argument("source", nargs="?", default="",
                   help="import: the importer (aiconfigurator); list: the folder of measured tables")
    p.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                   help="import from an unpacked aiconfigurator_core folder instead of the installed package")
    p.add_argument("-o", "--output", default=None, help="import: the folder to write graphsim tables to")
    p.add_argument("--system", action="append", default=[], help="import only this system (repeatable)")
    p.add_argument("--family", action="append", default=[], help="only this table family (repeatable)")
    p.add_argument("--device", default=None, help="list: only this device")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_measured)
