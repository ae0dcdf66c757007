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
