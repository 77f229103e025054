"""Worker processes die with their parent: a sweep's or a search's workers (spawned, so never forked children
that the kernel would reap with a process group) must not outlive a parent killed by SIGKILL or the OOM
killer — an orphan holds memory, CPU and the multiprocessing resource tracker for ever.

Call :func:`die_with_parent` first thing in a worker (a pool's ``initializer``): on Linux the kernel sends
the worker SIGKILL when its parent exits (``prctl(PR_SET_PDEATHSIG)``); everywhere, a daemon thread polls
the parent's pid and ends the worker once it has changed (the parent died and the worker was re-parented),
which also covers a parent that died before the worker got this far.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def _end() -> None:
    try:
        os.kill(os.getpid(), signal.SIGKILL)
    finally:  # pragma: no cover - SIGKILL does not return
        os._exit(1)


def die_with_parent(parent_pid: int | None = None, poll_s: float = 0.5) -> None:
    """End this process when ``parent_pid`` (default: the current parent) exits."""
    parent = parent_pid or os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the watchdog below still holds
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        _end()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                _end()

    threading.Thread(target=watch, name="graphsim-lifeline", daemon=True).start()


def pool_initializer(parent_pid: int, init=None, *args) -> None:
    """A ``ProcessPoolExecutor`` initializer: :func:`die_with_parent`, then ``init(*args)``::

        ProcessPoolExecutor(n, mp_context=ctx, initializer=pool_initializer, initargs=(os.getpid(), f, x))
    """
    die_with_parent(parent_pid)
    if init is not None:
        init(*args)


__all__ = ["die_with_parent", "pool_initializer"]
