"""Workers die with their parent (issue 26): SIGKILL a sweep running on the processes executor and no worker
survives it (graphsim.sweep.workers: parent-death signal and a watchdog on the parent's pid)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

SCRIPT = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path

    PIDS = Path(sys.argv[1])

    def task(spec, sp, key, parts):  # a worker's task: say who runs it, then work "for ever"
        (PIDS / str(os.getpid())).write_text("")
        time.sleep(120)

    if __name__ == "__main__":
        from graphsim.sweep import SweepSpec
        from graphsim.sweep.processes import run_processes

        spec = SweepSpec.from_dict({"name": "orphans", "structure": {"model": "deepseek-v3",
                                    "mapping": [{"tp": 4, "ep": 4}, {"dp": 8, "ep": 8}]},
                                    "axes": {"decode.context": [1024]}})
        todo = [(sp, sp.key(spec)) for sp in spec.structural_points()]
        run_processes(spec, todo, 2, None, {}, None, task=task)
''')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead (its parent has not reaped it yet)
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _children(pid: int) -> list[int]:
    """Every process whose parent is ``pid`` (the workers, and multiprocessing's resource tracker)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int(d.joinpath("stat").read_text().rsplit(") ", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _kill_and_outlived(parent, workers: list, within_s: float) -> list:
    """SIGKILL ``parent``; the ``workers`` still alive ``within_s`` seconds after it is gone."""
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + within_s
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [w for w in workers if _alive(w)]


def _kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_sigkill_of_a_processes_sweep_leaves_no_worker(tmp_path):
    script = tmp_path / "sweep_orphans.py"
    script.write_text(SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    parent = subprocess.Popen([sys.executable, str(script), str(pids)], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240  # two spawned workers import graphsim on a busy machine
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
        workers = [int(p.name) for p in pids.iterdir()]
        assert len(workers) == 2 and parent.poll() is None, "the workers never started"
        assert all(_alive(w) for w in workers)
        workers = sorted(set(workers) | set(_children(parent.pid)))  # the resource tracker too, if any
        assert not _kill_and_outlived(parent, workers, 30), "a worker outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        _kill_all(int(p.name) for p in pids.iterdir())


def test_die_with_parent_ends_a_process_whose_parent_is_gone(tmp_path):
    # a grandchild armed against a parent pid that is no longer its parent ends at once
    code = ("import os, time; from graphsim.sweep.workers import die_with_parent; "
            "die_with_parent(os.getppid() + 1000000); time.sleep(30)")
    p = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert p.returncode == -signal.SIGKILL


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_sigkill_of_a_search_with_jobs_leaves_no_worker(tmp_path):
    """The issue's reproducer: after SIGKILL of `graphsim search --jobs 2` its workers (and multiprocessing's
    resource tracker) stayed alive; they now die with it."""
    argv = [sys.executable, "-m", "graphsim", "search", "--model", "deepseek-v4.1-flash", "--hw", "gb300", "--gpus",
            "8", "--isl", "4000", "--osl", "1000", "--jobs", "2", "--exhaustive", "-o", str(tmp_path / "t.parquet")]
    parent = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        kids: list = []
        while time.monotonic() < deadline and parent.poll() is None:
            kids = _children(parent.pid)
            if len(kids) >= 2:
                break
            time.sleep(0.2)
        assert len(kids) >= 2 and parent.poll() is None, "the workers never started"
        time.sleep(3.0)  # every worker has imported graphsim, armed its lifeline and is compiling programs
        kids = sorted(set(kids) | set(_children(parent.pid)))
        # the parent-death signal ends a worker at once, mid-task (without it a worker finishes its mapping first)
        assert not _kill_and_outlived(parent, kids, 3), "a search worker outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        _kill_all(_children(parent.pid))
