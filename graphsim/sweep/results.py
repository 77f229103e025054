"""Sweep results: arrow table helpers, column unification, SweepResult, reading and merging parts."""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Iterable

import attrs
import numpy as np

from ..errors import GraphsimError
from .spec import MEMORY_COLUMNS, TOKEN_COLUMNS, identity_columns

def _table(columns: dict):
    import pyarrow as pa

    arrays, names = [], []
    for k, v in columns.items():
        names.append(k)
        if isinstance(v, pa.Array):
            arrays.append(v)
        else:
            arrays.append(pa.array(v))
    return pa.table(arrays, names=names)


def _const(value, n: int):
    import pyarrow as pa

    if value is None:  # typed when parts are unified (the other parts say what the column holds)
        return pa.nulls(n)
    if isinstance(value, bool):
        return pa.array(np.full(n, value))
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:  # an out-of-range value of a bad point: its error column names it
            return pa.nulls(n)
        return pa.array(np.full(n, value, dtype=np.int64))
    if isinstance(value, float):
        return pa.array(np.full(n, value, dtype=np.float64))
    return pa.array([str(value)] * n, pa.string())


def _column_rank(name: str, axes: list) -> tuple:
    fixed = [*identity_columns(), "point"]
    if name in fixed:
        return (0, fixed.index(name))
    if name in axes:
        return (1, axes.index(name))
    if name == "forward_s":
        return (2, 0)
    for i, pre in enumerate(("stage_s.", "kind_s.")):
        if name.startswith(pre):
            return (3 + i, 0)
    for i, group in enumerate((TOKEN_COLUMNS, MEMORY_COLUMNS)):
        if name in group:
            return (5 + i, group.index(name))
    if name.startswith("traffic."):
        return (7, 0)
    return (8, ("error", "error_field").index(name) if name in ("error", "error_field") else 9)


def unify(tables: list, axes: list):
    """One table from parts whose columns differ (absent columns become nulls); canonical column order."""
    import pyarrow as pa

    fields: dict = {}
    for t in tables:
        for f in t.schema:
            if f.name not in fields or pa.types.is_null(fields[f.name].type):
                fields[f.name] = f
    order = sorted(fields, key=lambda n: (_column_rank(n, axes), list(fields).index(n)))
    schema = pa.schema([fields[n] for n in order])
    return schema, [_align(t, schema) for t in tables]


def _align(t, schema):
    import pyarrow as pa

    cols = [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(len(t), f.type)
            for f in schema]
    return pa.table(cols, schema=schema)


@attrs.frozen
class SweepResult:
    """What a run did: ``table`` (pyarrow) in memory, or ``path`` when written to a file."""

    path: str | None
    table: Any
    rows: int
    structural_points: int
    skipped: int
    structural_errors: int
    point_errors: int
    seconds: float

    def to_pandas(self):
        if self.table is not None:
            return self.table.to_pandas()
        return read_results(self.path)


def read_results(path: str | Path, columns: list | None = None):
    """A results file (Parquet or CSV) as a pandas DataFrame; an unreadable one is a one-line error."""
    p = str(path)
    try:
        ok = Path(p).is_file()
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise GraphsimError("results", f"no such file {p[:100]!r}")
    try:
        if p.endswith(".csv"):
            import pandas as pd

            return pd.read_csv(p, usecols=columns)
        import pyarrow.parquet as pq

        return pq.read_table(p, columns=columns).to_pandas()
    except (OSError, ValueError, UnicodeDecodeError) as e:  # pyarrow's and pandas' parse errors are ValueErrors
        raise GraphsimError("results", f"cannot read {p[:100]}: {' '.join(str(e).split())[:200]}") from None


def _counts(tables: Iterable) -> tuple[int, int, int]:
    """(rows, structural error rows, point error rows): a structural error row has no point index."""
    rows = struct = errs = 0
    for t in tables:
        rows += t.num_rows
        errs += t.num_rows - t.column("error").null_count
        struct += t.column("point").null_count
    return rows, struct, errs - struct


def _merge(out: Path, parts: Path, keys: list, axes: list) -> tuple[int, int, int]:
    """Stream this spec's parts, in spec order, into ``out`` (one row group at a time: bounded memory);
    returns the row counts (:func:`_counts`)."""
    import pyarrow.parquet as pq

    files = [parts / f"{k}.parquet" for k in dict.fromkeys(keys)]
    files = [f for f in files if f.is_file()]
    schema, _ = unify([pq.read_schema(f).empty_table() for f in files], axes)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    if out.suffix == ".csv":
        import pyarrow.csv as pcsv

        writer = pcsv.CSVWriter(str(tmp), schema)
    else:
        writer = pq.ParquetWriter(tmp, schema)
    counts = [0, 0, 0]
    try:
        for p in files:
            f = pq.ParquetFile(p)
            for i in range(f.num_row_groups):
                t = _align(f.read_row_group(i), schema)
                writer.write_table(t)
                counts = [a + b for a, b in zip(counts, _counts([t]))]
    finally:
        writer.close()
    os.replace(tmp, out)
    return tuple(counts)
