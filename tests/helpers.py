"""Small helpers shared by test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations


def process_alive(pid: int) -> bool:
    """True while pid runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
