"""Checkpoint files: `{"actor": state_dict, "obs_rms_state": state | None, ...}`, atomic and weights_only-loadable.

The two keys every reader relies on are mandatory: "actor" (the policy's state_dict) and "obs_rms_state" (the
observation statistics or None). Resume data (optimizer, round, global step, return statistics, RNG, every
rank's state, config) sits beside them as tensors and plain Python types only, so
`torch.load(path, weights_only=True)` reads every file we write and never unpickles code. The format, key by
key, is in docs/design.md ("the checkpoint"); when and what is saved is ppo_ddp/records/checkpointer.py's.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ppo_ddp.configuration.config import Config
from ppo_ddp.envs.options import plain
from ppo_ddp.errors import CheckpointError, ConfigError

REQUIRED_KEYS = ("actor", "obs_rms_state")


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


def as_tensors(obj: Any) -> Any:
    """A nested state's numpy arrays as CPU tensors (dicts, lists and tuples walked, other values kept): what a
    checkpoint may hold so that torch.load(weights_only=True) reads it back."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, dict):
        return {k: as_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_tensors(v) for v in obj)
    return obj


def as_arrays(obj: Any) -> Any:
    """The inverse of as_tensors: a nested state's tensors as numpy arrays (to pickle through a pipe)."""
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: as_arrays(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_arrays(v) for v in obj)
    return obj


def mean_policy(rank_policies: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The policy at a checkpoint's top level (what evaluate and users read): the mean over ranks of their
    parameters, which differ between the syncs of param_sync_interval > 1. Ranks that agree (every sync
    round, one rank) give their own tensors unchanged, not a mean that could round in the last bit."""
    first = rank_policies[0]
    if all(torch.equal(p[k], first[k]) for p in rank_policies[1:] for k in first):
        return first
    return {k: torch.stack([p[k] for p in rank_policies]).mean(0) for k in first}


POLICY_KEYS = (*REQUIRED_KEYS, "config", "env_id", "obs_dim", "act_dim", "critic_dim", "run_name", "global_step")
"""What a policy file keeps of a checkpoint (`policy_state`): enough to rebuild and play the policy, nothing to
resume training from."""


def policy_state(payload: dict[str, Any], env_kwargs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A checkpoint's policy alone: its network (the critic's weights included: the network loads whole), the
    observation statistics and the config, without the optimiser, RNG and every rank's resume state; the tensors
    copied out of the flat buffer they share in a training run, so the file holds only their own bytes.
    env_kwargs, where given, replaces the config's (a portable xml_file path)."""
    out = {k: payload[k] for k in POLICY_KEYS if k in payload}
    out["actor"] = {k: v.detach().clone() for k, v in payload["actor"].items()}
    if env_kwargs is not None:
        out["config"] = {**payload["config"], "env_kwargs": env_kwargs}
    return out


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
        raise CheckpointError(
            f"checkpoint {path}: unreadable (truncated, corrupt or not a torch file): {_load_error_reason(e)}"
        ) from None
    if not isinstance(payload, dict) or any(k not in payload for k in REQUIRED_KEYS):
        keys = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(
            f"checkpoint {path}: not a ppo_ddp checkpoint (needs keys {list(REQUIRED_KEYS)}, has {keys})"
        )
    return payload


# The Config fields that shape the network's parameters, or what they mean (activation, distribution): a resume
# across any of them cannot continue the policy.
NETWORK_FIELDS = (
    "policy",
    "distribution",
    "hidden_sizes",
    "activation",
    "shared_trunk",
    "critic_obs",
    "rnn_hidden_size",
    "rnn_head_sizes",
)


def _network_fields(saved: dict[str, Any], cfg: Config) -> tuple[dict[str, Any], dict[str, Any]]:
    """The network fields of the checkpoint's config (a field it predates: the default, which it ran with) and of
    this run: those that differ, or all of them where none does."""
    defaults = Config(env_id=cfg.env_id)
    theirs = {f: _plain(saved.get(f, getattr(defaults, f))) for f in NETWORK_FIELDS}
    own = {f: _plain(getattr(cfg, f)) for f in NETWORK_FIELDS}
    differ = [f for f in NETWORK_FIELDS if theirs[f] != own[f]] or list(NETWORK_FIELDS)
    return {f: theirs[f] for f in differ}, {f: own[f] for f in differ}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value  # a saved list equals the run's tuple


def _network(fields: dict[str, Any]) -> str:
    return " ".join(f"{name} {value}" for name, value in fields.items())


def check_compatible(
    state: dict[str, Any], cfg: Config, model: torch.nn.Module, obs_dim: int, act_dim: int, path: Path
) -> None:
    """A checkpoint this run can resume: ours, complete, of the same env and network, of this learner's kind.
    ConfigError (one line, exit 2) naming what differs."""
    for key in ("optimizer", "generator", "iteration", "global_step", "best_return", "env_id"):
        if key not in state:
            raise ConfigError(
                f"resume={str(path)!r}: checkpoint has no {key!r} (a policy-only file cannot resume training)"
            )
    if state.get("env_id") != cfg.env_id or state.get("obs_dim") != obs_dim or state.get("act_dim") != act_dim:
        raise ConfigError(
            f"resume={str(path)!r}: checkpoint is for {state.get('env_id')} (obs {state.get('obs_dim')}, "
            f"act {state.get('act_dim')}), this run is {cfg.env_id} (obs {obs_dim}, act {act_dim})"
        )
    saved = state.get("config") or {}
    theirs_options, own_options = plain(saved.get("env_kwargs", {})), plain(cfg.env_kwargs)
    if theirs_options != own_options:  # another robot, or the same one otherwise
        raise ConfigError(
            f"resume={str(path)!r}: checkpoint's env_kwargs are {theirs_options}, this run's are {own_options}"
        )
    own = model.state_dict()
    theirs = state["actor"]
    shapes_differ = set(own) != set(theirs) or any(tuple(theirs[k].shape) != tuple(own[k].shape) for k in own)
    # the same tensors computing something else; a checkpoint older than `distribution` ran a Gaussian
    meaning_differs = saved.get("activation", cfg.activation) != cfg.activation
    meaning_differs |= saved.get("distribution", "gaussian") != cfg.distribution
    if shapes_differ or meaning_differs:
        theirs_net, own_net = _network_fields(saved, cfg)
        raise ConfigError(
            f"resume={str(path)!r}: checkpoint's network is {_network(theirs_net)}, this run's is {_network(own_net)}"
        )
    tensors = [len(group.get("params", ())) for group in state["optimizer"].get("param_groups", [])]
    if tensors != [1]:
        raise ConfigError(
            f"resume={str(path)!r}: checkpoint's optimizer state has {sum(tensors)} parameter tensors, this "
            f"learner steps one flat tensor (a checkpoint of an earlier ppo_ddp): it can be evaluated but "
            f"not resumed"
        )
