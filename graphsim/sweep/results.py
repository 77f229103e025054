"""Sweep results: arrow table helpers, column unification, SweepResult, reading and merging parts."""
from __future__ import annotations

import itertools
import os
import uuid
from pathlib import Path
from typing import Any, Iterable

import attrs
import numpy as np

from ..core.errors import GraphsimError
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
    #: (struct_id, why) of each finished part that was not reused (an input changed, its bytes changed)
    recomputed: tuple = ()

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


def _merge(out: Path, parts: Path, keys: list, axes: list, extra: dict | None = None) -> tuple[int, int, int]:
    """Stream this spec's parts, in spec order, into ``out`` (one row group at a time: bounded memory);
    ``extra`` (key -> tables) gives the rows of keys that have no part. Returns the row counts
    (:func:`_counts`)."""
    import pyarrow.parquet as pq

    extra = extra or {}
    sources = []  # (part file, None) or (None, tables), in spec order
    for k in dict.fromkeys(keys):
        f = parts / f"{k}.parquet"
        if f.is_file():
            sources.append((f, None))
        elif k in extra:
            sources.append((None, extra[k]))
    empty = []
    for f, tables in sources:
        empty += [pq.read_schema(f).empty_table()] if f is not None else [t.schema.empty_table() for t in tables]
    schema, _ = unify(empty, axes)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    if out.suffix != ".csv" and len(sources) == 1 and sources[0][0] is not None \
            and pq.read_schema(sources[0][0]).equals(schema):
        # One part that already is the output (one structural point: the 10M-point case): copy its bytes
        # instead of decoding and encoding every row group again (a copy, not a link: the output is the
        # user's file, the part is the resume cache)
        import shutil

        shutil.copyfile(sources[0][0], tmp)
        counts = [0, 0, 0]
        f = pq.ParquetFile(tmp)
        for i in range(f.num_row_groups):
            counts = [a + b for a, b in zip(counts, _counts([f.read_row_group(i, columns=["point", "error"])]))]
        os.replace(tmp, out)
        return tuple(counts)
    if out.suffix == ".csv":
        import pyarrow.csv as pcsv

        writer = pcsv.CSVWriter(str(tmp), schema)
    else:
        writer = pq.ParquetWriter(tmp, schema)
    counts = [0, 0, 0]

    def aligned():
        nonlocal counts
        for p, tables in sources:
            for t in _row_groups(p) if p is not None else tables:
                t = _align(t, schema)
                counts = [a + b for a, b in zip(counts, _counts([t]))]
                yield t

    try:
        _write_tables(writer, aligned())
    finally:
        writer.close()
    os.replace(tmp, out)
    return tuple(counts)


def _write_tables(writer, tables: Iterable) -> None:
    """``writer.write_table`` each of ``tables`` in a thread (Parquet/CSV encoding releases the GIL) while the
    next table is computed or read; at most two tables wait, so memory stays bounded."""
    import queue
    import threading

    pending: queue.Queue = queue.Queue(maxsize=2)
    failed: list = []

    def consume() -> None:
        try:
            while (t := pending.get()) is not None:
                writer.write_table(t)
        except BaseException as e:  # noqa: BLE001 - handed to the producing thread, which raises it
            failed.append(e)
            while pending.get() is not None:  # keep taking, so the producer never blocks
                pass

    thread = threading.Thread(target=consume, name="graphsim-writer", daemon=True)
    thread.start()
    try:
        for t in tables:
            if failed:
                break
            pending.put(t)
    finally:
        pending.put(None)
        thread.join()
    if failed:
        raise failed[0]


def _row_groups(path: Path):
    """A Parquet file's row groups, one table at a time."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    for i in range(f.num_row_groups):
        yield f.read_row_group(i)


def _write_part(parts: Path, key: str, tables: Iterable) -> None:
    """Stream ``tables`` into ``parts/<key>.parquet``, which exists only once complete."""
    import pyarrow.parquet as pq

    tables = iter(tables)
    first = next(tables, None)
    if first is None:
        return
    tmp = parts / f"{key}.parquet.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with pq.ParquetWriter(tmp, first.schema) as writer:
            _write_tables(writer, itertools.chain([first], (t.cast(first.schema) for t in tables)))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, parts / f"{key}.parquet")
