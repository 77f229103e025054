"""Running a whole spec: run(), the local, processes and Ray executors, output parts and progress bars."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ..core.errors import GraphsimError, require
from .points import _PROGRAMS, structural_tables
from .results import SweepResult, _counts, _merge, _write_part, unify
from .spec import StructuralPoint, SweepSpec, program_key

EXECUTORS = ("local", "processes", "ray")


def _trusted(parts: Path, inputs: Mapping, suffix: str = ".parquet") -> tuple[set, list]:
    """The keys whose part ``<key><suffix>`` may be reused (its checksum holds and it was computed from the input
    digests ``inputs[key]``), and (key, why) for each part that is not trusted (it is removed: it will be
    recomputed). Shared with the serving grid (graphsim.serving.grid)."""
    from ..driver.identity import discard, verify

    if not parts.is_dir():
        return set(), []
    done, stale = set(), []
    for f in parts.glob("*" + suffix):
        key = f.name[: -len(suffix)]
        if key not in inputs:
            continue  # another spec's part: not ours to judge
        why = verify(f, dict(inputs[key]))
        if why is None:
            done.add(key)
        else:
            stale.append((key, why))
            discard(f)
    return done, sorted(stale)


def _seal(parts: Path, key: str, sp: StructuralPoint) -> None:
    """Record a finished part's checksum and input digests (a part without them is never reused)."""
    from ..driver.identity import seal

    f = parts / f"{key}.parquet"
    if f.is_file():
        seal(f, dict(sp.inputs))


def run(spec: SweepSpec | Mapping | str | Path, output: str | Path | None = None, *, executor: str = "local",
        address: str | None = None, progress: bool | Callable[[int, int], None] = False,
        resume: bool = True, jobs: int | None = None) -> SweepResult:
    """Run a sweep. Without ``output`` the rows come back in memory; with it (``.parquet`` or ``.csv``) each
    structural point is written to ``<output>.parts/<struct_id>.parquet`` once complete, and the parts of
    this spec are merged into ``output`` at the end. The parts stay: re-running skips every structural point
    whose part exists (an interrupted run resumes; a grown spec computes only what is new);
    ``resume=False`` deletes them and starts over. Writing to ``output`` holds an exclusive lock on it: a
    second run on the same output fails with a one-line error; files are replaced atomically.

    Executors give the same table (rows in spec order, same values): ``local`` runs in this process;
    ``processes`` runs structural points on ``jobs`` local worker processes (default: one per CPU; points that
    share a compiled program go to the same worker, which keeps it; a script using it needs the
    ``if __name__ == "__main__":`` guard, as for any spawned process); ``ray`` runs one task per structural
    point on a Ray cluster at ``address`` (default: a local one)."""
    if not isinstance(spec, SweepSpec):
        spec = SweepSpec.from_dict(spec) if isinstance(spec, Mapping) else SweepSpec.load(spec)
    require(executor in EXECUTORS, "executor", f"must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    require(jobs is None or (isinstance(jobs, int) and not isinstance(jobs, bool) and jobs >= 1), "jobs",
            f"must be an integer >= 1, got {jobs!r}")
    if output is None:
        return _run(spec, None, executor, address, progress, resume, jobs)
    from ..core.outputs import exclusive, output_path

    out = output_path(output, suffixes=(".parquet", ".csv"), regular=True)
    with exclusive(out):  # a second sweep on the same output fails at once instead of losing results
        return _run(spec, out, executor, address, progress, resume, jobs)


def _by_program(todo: list) -> list:
    """``todo`` with points sharing a program next to each other (stable): each program is compiled once."""
    groups: dict = {}
    for sp, key in todo:
        groups.setdefault(program_key(sp), []).append((sp, key))
    return [item for g in groups.values() for item in g]


def _run(spec: SweepSpec, out: Path | None, executor: str, address, progress, resume: bool,
         jobs: int | None = None) -> SweepResult:
    t0 = time.perf_counter()
    _PROGRAMS.failed.clear()  # a failed compilation is retried by the next run (files may have been fixed)
    memo: dict = {}
    points = [sp.with_inputs(memo) for sp in spec.structural_points()]  # content digests of every input
    _forget_stores(points)
    keys = [sp.key(spec) for sp in points]
    stale: list = []
    if out is not None:
        parts = out.with_name(out.name + ".parts")
        if not resume:
            shutil.rmtree(parts, ignore_errors=True)
            if out.exists():
                out.unlink()
        done, stale = _trusted(parts, {k: sp.inputs for k, sp in zip(keys, points)})
        parts.mkdir(parents=True, exist_ok=True)
    else:
        parts, done = None, set()
    todo = [(sp, k) for k, sp in dict(zip(keys, points)).items() if k not in done]  # identical points run once
    todo = _by_program(todo)  # results are assembled in spec order whatever the order of execution
    skipped = len(points) - len(todo)
    total = sum(spec.grid(sp.kinds).size for sp, _ in todo)
    bar = _progress_bar(progress, total)
    # key -> tables; assembled in spec order (executors may finish out of order). With an output, only rows
    # that are not a part (a worker process that died) are kept here: a later run retries them.
    memory_tables: dict = {}

    by_key = dict(zip(keys, points))

    def collect(key: str, tables: Iterable) -> None:
        if parts is None:
            memory_tables[key] = list(tables)
        else:
            _write_part(parts, key, tables)
            _seal(parts, key, by_key[key])

    try:
        if executor == "ray":
            _run_ray(spec, todo, address, collect, bar)
        elif executor == "processes" and todo:
            from .processes import run_processes

            run_processes(spec, todo, jobs or os.cpu_count() or 1, parts, memory_tables, bar,
                          sealed=lambda key: _seal(parts, key, by_key[key]) if parts is not None else None)
        else:
            for sp, key in todo:
                collect(key, structural_tables(spec, sp, progress=bar))
    finally:
        if hasattr(bar, "close"):
            bar.close()
    axes = [a.name for a in spec.axes]
    if parts is None:
        import pyarrow as pa

        schema, aligned = unify([t for k in keys if k in memory_tables for t in memory_tables[k]], axes)
        table = pa.concat_tables(aligned) if aligned else pa.table({})
        counts = _counts([table]) if aligned else (0, 0, 0)
        return SweepResult(None, table, counts[0], len(points), skipped, counts[1], counts[2], time.perf_counter() - t0)
    counts = _merge(out, parts, keys, axes, memory_tables)
    return SweepResult(str(out), None, counts[0], len(points), skipped, counts[1], counts[2], time.perf_counter() - t0,
                       tuple(stale))


def _forget_stores(points: list) -> None:
    """Measured stores and FPM models are cached per path within a process: a run reads them afresh (their
    files may have changed since the last run; the parts' digests say whether they did)."""
    import sys

    paths = {sp.view[1] for sp in points if sp.view[0] != "sol"}
    for mod, name in (("graphsim.views.measured.view", "_STORES"),):  # (FPM models are cached by content)
        cache = getattr(sys.modules.get(mod), name, None)
        if cache:
            for p in paths:
                cache.pop(p, None)


def _run_ray(spec: SweepSpec, todo: list, address: str | None, collect, bar) -> None:
    """One Ray task per structural point; the driver writes results as tasks finish (same tables as local)."""
    ray = ray_init(address)
    task = ray.remote(_ray_task)
    pending = {task.remote(spec, sp): (sp, key) for sp, key in todo}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            sp, key = pending.pop(ref)
            collect(key, ray.get(ref))
            if bar:
                bar(spec.grid(sp.kinds).size)


def ray_init(address: str | None = None):
    """The ``ray`` module, connected to the cluster at ``address`` (default: a local one), or a one-line error
    when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise GraphsimError("executor", "--executor ray needs ray (pip install 'graphsim[ray]')") from None
    if not ray.is_initialized():
        import warnings

        with warnings.catch_warnings():  # Ray starts its processes by fork+exec: JAX's fork warning does not apply
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called")
            if address:
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
            else:
                ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    return ray


def _ray_task(spec: SweepSpec, sp: StructuralPoint) -> list:
    return list(structural_tables(spec, sp))


def _progress_bar(progress, total: int, label: str = "sweep"):
    """A callback advancing by n points: rich on stderr when asked for, a user callable, or nothing."""
    if callable(progress):
        done = [0]

        def cb(n):
            done[0] += n
            progress(done[0], total)

        return cb
    if not progress:
        return None
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    except ImportError:  # pragma: no cover - rich is a dependency
        return _PlainBar(total, label)
    prog = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=False)
    prog.start()
    task = prog.add_task(label, total=total)

    class _Rich:
        def __call__(self, n):
            prog.advance(task, n)

        def close(self):
            prog.stop()

    return _Rich()


class _PlainBar:
    def __init__(self, total: int, label: str = "sweep"):
        self.total, self.done, self.label = max(total, 1), 0, label

    def __call__(self, n):
        import sys

        self.done += n
        frac = self.done / self.total
        sys.stderr.write(f"\r{self.label} [{'#' * int(30 * frac):<30}] {self.done:,}/{self.total:,}")
        sys.stderr.flush()

    def close(self):
        import sys

        sys.stderr.write("\n")
