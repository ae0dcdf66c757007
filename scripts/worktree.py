"""A git revision checked out beside this checkout, for the scripts that compare it with this one side by side
(bench_update.py, bench_overlap.py, same_numbers.py)."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def base_worktree(revision: str, prefix: str) -> Iterator[tuple[Path, Path]]:
    """(a detached worktree of revision, the temporary folder that holds it, for the runs' outputs); both are
    removed at the end, the worktree from git's list too."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base), revision], cwd=ROOT, check=True, capture_output=True
        )
        try:
            yield base, Path(tmp)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
