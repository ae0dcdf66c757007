"""Small helpers shared by test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os


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
