"""How ppo_ddp starts its own programs in new processes: the learners of our own launch, a search's trials and
workers. Light on purpose (no torch): a search's worker imports it between trials."""

from __future__ import annotations

import os
from pathlib import Path

import ppo_ddp

TRAIN_MODULE = "ppo_ddp.train"
"""The command line's module: `python -m ppo_ddp.train`, `torchrun -m ppo_ddp.train`."""
TRAIN_FILE = Path(__file__).resolve().parents[1] / "train.py"
"""Its file: sys.argv[0] of `python -m ppo_ddp.train`."""


def program(argv0: str) -> list[str]:
    """How to start the training program again as the user did: `-m ppo_ddp.train`, or the script (train.py, or the
    console script ppo-ddp-train) argv0 names."""
    return ["-m", TRAIN_MODULE] if Path(argv0).resolve() == TRAIN_FILE else [argv0]


def package_env() -> dict[str, str]:
    """The environment of a process that runs `python -m ppo_ddp...`: it imports the ppo_ddp that this process runs
    (a checkout's, or the installed one), whatever the working directory."""
    home = str(Path(ppo_ddp.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH")) if p)}
