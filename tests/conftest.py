"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import signal_handlers_kept

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The checkout's root: where `python train.py` is run from, as a user would."""
    return REPO_ROOT


@pytest.fixture
def restore_signal_handlers() -> Iterator[None]:
    """For a test that runs train.py's main in its own process (no interpreter to start): the handlers put back."""
    with signal_handlers_kept():
        yield


@pytest.fixture(scope="session")
def run_train(repo_root: Path) -> Callable[..., subprocess.CompletedProcess]:
    """Run `python train.py ARGS...` from the repo root with this interpreter; returns the finished process.

    Each call costs a fresh interpreter (~0.5-2 s), so keep the subprocess tests few and let the
    in-process tests cover the rest.
    """

    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        # Whatever the caller's PYTHONPATH, the subprocess must import *this* checkout's package.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root), env.get("PYTHONPATH")) if p)
        return subprocess.run(
            [sys.executable, "train.py", *args],
            cwd=repo_root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    return run


# With --dist loadfile a file runs whole on one worker, so a long file dealt out last is the suite's tail: the files
# that train the most go first, longest first (seconds each alone on the 2-core machine, 2026-12-07), the rest after
# in their own order (pytest.ini turns off xdist's reordering by number of tests, which dealt these out last).
LONGEST_FIRST = (
    "test_reliability",  # 122 s
    "test_benchmarks",  # 101 s
    "test_tune",  # 97 s
    "test_train",  # 60 s
    "test_scale",  # 51 s
    "test_video",  # 46 s
    "test_package",  # 45 s
    "test_compiled",  # 44 s
    "test_track",  # 43 s
    "test_presets",  # 43 s
    "test_tune_workers",  # 35 s
    "test_docs_code",  # 34 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(LONGEST_FIRST)))  # stable: a file keeps its order
