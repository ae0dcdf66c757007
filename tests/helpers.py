"""Small helpers shared by test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator


def process_alive(pid: int) -> bool:
    """True while pid runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def thread_names(pid: int) -> list[str]:
    """The names of the pid's threads (sorted); [] once the process is gone. A thread that ends while they are read
    is left out."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    names = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return sorted(names)


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Around train.py's main run in the test process: it installs its own SIGINT and SIGTERM handlers, and these
    put the test's back, whatever the run's end."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
