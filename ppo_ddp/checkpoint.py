"""Checkpoint files: `{"actor": state_dict, "obs_rms_state": state | None, ...}`, atomic and weights_only-loadable.

The two keys of Method.md are mandatory. Resume data (optimizer, iteration, global step, return
statistics, RNG, config) sits beside them as tensors and plain Python types only, so
`torch.load(path, weights_only=True)` reads every file we write and never unpickles code.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

REQUIRED_KEYS = ("actor", "obs_rms_state")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable or not ours; the message says which and why."""


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Write payload to path atomically: a crash mid-write leaves the previous file intact."""
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise ValueError(f"checkpoint payload lacks {missing}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def mean_policy(rank_policies: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The policy at a checkpoint's top level (what evaluate and users read): the mean over ranks of their
    parameters, which differ between the syncs of param_sync_interval > 1. Ranks that agree (every sync
    round, one rank) give their own tensors unchanged, not a mean that could round in the last bit."""
    first = rank_policies[0]
    if all(torch.equal(p[k], first[k]) for p in rank_policies[1:] for k in first):
        return first
    return {k: torch.stack([p[k] for p in rank_policies]).mean(0) for k in first}


def _load_error_reason(e: Exception) -> str:
    """One plain line from torch.load's error.

    For a weights_only failure torch's first line advises re-running with weights_only=False, which is
    the wrong advice for a corrupt file and unsafe for a foreign one: keep only the unpickler's own reason.
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # torch puts terminal bold codes in that message
    unpickler = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    if unpickler:
        text = unpickler.group(1).split(". ")[0]
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint onto the CPU with weights_only=True; CheckpointError on anything but a good file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, garbage bytes, pickled objects: all one answer for the user
        raise CheckpointError(f"checkpoint {path}: unreadable (truncated, corrupt or not a torch file): {_load_error_reason(e)}") from None
    if not isinstance(payload, dict) or any(k not in payload for k in REQUIRED_KEYS):
        keys = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"checkpoint {path}: not a ppo_ddp checkpoint (needs keys {list(REQUIRED_KEYS)}, has {keys})")
    return payload
