"""The ``processes`` executor: structural points on local worker processes.

Each worker is a one-process pool started with ``spawn`` (JAX is not fork-safe once initialised), so the
parent decides which worker runs what: a worker takes a whole *program group* (structural points that share
a compiled program, i.e. differ only in profile) and runs its points one by one, keeping the program in its
cache (:data:`graphsim.sweep.points._PROGRAMS`); a worker with nothing left takes the back half of the
largest group another worker still has. With an output, each worker streams its structural point into
``<output>.parts/<struct_id>.parquet`` itself (written to a temporary name, renamed once complete), so no
table crosses processes and memory stays bounded; without one, workers return the tables. Each worker
reports progress per chunk through its own pipe (no lock shared between workers that a killed one could
hold). Workers die with the parent (:mod:`graphsim.sweep.workers`: a killed sweep leaves no orphan). A point whose
worker dies (killed, out of memory) becomes one error row, not a part (a later run retries it), and a fresh
worker takes its place; an exception that is a bug stops the sweep as it does in the local executor
(finished parts stay).

Spawned workers import the parent's ``__main__`` module: a script that runs a sweep with this executor
needs the usual ``if __name__ == "__main__":`` guard.
"""
from __future__ import annotations

from collections import deque
from pathlib import Path

from .points import error_table, structural_tables

_PIPE = None  # the worker's end of its progress pipe (set by _init)


def _init(conn) -> None:
    global _PIPE
    _PIPE = conn


def _task(spec, sp, key: str, parts: str | None):
    from .results import _write_part

    def progress(n: int) -> None:
        if _PIPE is not None:
            _PIPE.send((key, n))

    tables = structural_tables(spec, sp, progress=progress)
    if parts is None:
        return list(tables)
    _write_part(Path(parts), key, tables)
    return None


class _Worker:
    """One worker process (a one-process pool, so the parent chooses what it runs) and its progress pipe."""

    def __init__(self, ctx):
        import os
        from concurrent.futures import ProcessPoolExecutor

        from .workers import pool_initializer

        self.reader, self.writer = ctx.Pipe(duplex=False)  # the pool may start its process lazily: keep both ends
        # the worker dies with this process (SIGKILL of the parent leaves no orphan)
        self.pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=pool_initializer,
                                        initargs=(os.getpid(), _init, self.writer))
        self.group: deque = deque()  # the rest of the program group this worker runs
        self.busy = False

    def messages(self):
        """(key, points) progress messages sent so far."""
        try:
            while self.reader.poll():
                yield self.reader.recv()
        except (EOFError, OSError):  # a broken pipe: the task's progress is settled when it ends
            return

    def stop(self, now: bool) -> None:
        """Shut the worker down; ``now``: cancel what is pending and end a running task."""
        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=not now, cancel_futures=True)
        if now:
            for p in procs:  # our own worker process; a part being written is a temporary file, never a part
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
        self.reader.close()
        self.writer.close()


def run_processes(spec, todo: list, jobs: int, parts: Path | None, tables_of: dict, bar, task=_task,
                  sealed=None) -> None:
    """Run ``todo`` ((structural point, struct_id) pairs, grouped by program) on ``jobs`` processes: parts are
    written to ``parts`` (or, without, the tables are put in ``tables_of``), rows that are not a part (a dead
    worker's point) in ``tables_of``; ``bar(n)`` advances the progress by n points. ``task``: a picklable
    function with :func:`_task`'s signature (tests); ``sealed(key)``: called once a point's part is written."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    from .spec import program_key

    groups: deque = deque()
    last = None
    for item in todo:
        k = program_key(item[0])
        if k != last:
            groups.append(deque())
            last = k
        groups[-1].append(item)
    ctx = mp.get_context("spawn")  # JAX is not fork-safe once initialised
    workers: list = []
    running: dict = {}  # future -> (worker, point, key)
    reported: dict = {}  # key -> points reported so far (the bar gets exactly a grid's size per point)
    part_dir = None if parts is None else str(parts)

    def advance(key: str, n: int) -> None:
        if key in reported:  # late messages of a finished point were already counted
            reported[key] += n
            if bar:
                bar(n)

    def drain() -> None:
        for w in workers:
            for key, n in w.messages():
                advance(key, n)

    def next_item(w: _Worker):
        if not w.group:
            if groups:
                w.group = groups.popleft()
            else:  # steal the back half of the largest group another worker still has
                donor = max(workers, key=lambda o: len(o.group))
                if not donor.group:
                    return None
                take = (len(donor.group) + 1) // 2
                w.group = deque(reversed([donor.group.pop() for _ in range(take)]))
        return w.group.popleft()

    def replace(w: _Worker) -> _Worker:
        """A fresh worker in the place of ``w`` (whose process died), taking over the rest of its group."""
        i = workers.index(w)
        w.stop(now=True)
        workers[i] = nw = _Worker(ctx)
        nw.group = w.group
        return nw

    ok = False
    try:
        for _ in range(max(1, min(jobs, len(todo)))):
            workers.append(_Worker(ctx))
        while True:
            for w in workers:
                if not w.busy:
                    item = next_item(w)
                    if item is not None:
                        sp, key = item
                        reported[key] = 0
                        try:
                            f = w.pool.submit(task, spec, sp, key, part_dir)
                        except BrokenProcessPool:  # its process died between tasks: a fresh one runs it
                            w = replace(w)
                            f = w.pool.submit(task, spec, sp, key, part_dir)
                        running[f] = (w, sp, key)
                        w.busy = True
            if not running:
                break
            done, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
            drain()
            for f in done:
                w, sp, key = running.pop(f)
                w.busy = False
                try:
                    got = f.result()
                except BrokenProcessPool:
                    replace(w)
                    got = [error_table(spec, sp, "executor: the worker process running this structural point "
                                       "died (out of memory?); run the sweep again to retry it", "executor")]
                if got is not None:
                    tables_of[key] = got
                elif sealed is not None:
                    sealed(key)
                if bar:
                    bar(max(spec.grid(sp.kinds).size - reported[key], 0))
                del reported[key]
        ok = True
    finally:
        for w in workers:
            w.stop(now=not ok)
