"""The actor-pool tests' helpers: a small config and model, snapshots of the shared buffers, and the check that a
closed pool left no process and no shared-memory segment behind (tests/test_actors.py, test_actor_faults.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

from ppo_ddp.configuration.config import Config
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.sampling.pool import ActorPool
from ppo_ddp.storage.shared import FLAG_SENTINEL, ROLLOUT_FIELDS

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # actors inherit sys.path, so they can import scripted_env too
    sys.path.insert(0, str(TESTS_DIR))

SCRIPTED = "scripted_env:Scripted-v0"


def _children() -> dict[int, str]:
    """Live child processes of this process, without multiprocessing's forkserver and resource tracker."""
    found = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and "forkserver" not in cmdline and "resource_tracker" not in cmdline:
            found[int(entry)] = cmdline
    return found


def assert_released(pool: ActorPool) -> None:
    """The pool is closed: actors ended and reaped, the shared memory unlinked, no stray children."""
    assert pool._closed
    for proc in pool._procs:
        assert proc.exitcode is not None, f"actor pid {proc.pid} still running after close"
    assert not os.path.exists(f"/dev/shm/{pool.buffers.name}"), "shared memory left in /dev/shm"
    assert _children() == {}, f"child processes left: {_children()}"


def make_cfg(env_id: str, **kw) -> Config:
    defaults = dict(
        env_id=env_id,
        actors_per_gpu=2,
        envs_per_actor=2,
        rollout_length=12,
        num_minibatches=1,
        seed=3,
        actor_timeout=30.0,
    )
    defaults.update(kw)
    return Config(**defaults)


def make_model(cfg: Config, obs_dim: int, act_dim: int, seed: int) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(obs_dim, act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init)


def snapshot(pool: ActorPool) -> dict[str, np.ndarray]:
    return {name: pool.buffers.arrays[name].copy() for name in ROLLOUT_FIELDS}


def assert_fully_written(data: dict[str, np.ndarray]) -> None:
    for name, array in data.items():
        if name in ("terminated", "truncated"):
            assert not (array == FLAG_SENTINEL).any(), f"{name}: sentinel left (a slot no actor wrote)"
        else:
            assert np.isfinite(array).all(), f"{name}: NaN sentinel left (a slot no actor wrote)"


@torch.no_grad()
def value_of(model: ActorCritic, obs: np.ndarray) -> np.ndarray:
    return model.value(torch.as_tensor(obs, dtype=torch.float32)).numpy()


@torch.no_grad()
def check_policy_outputs(model: ActorCritic, data: dict[str, np.ndarray], a: int) -> None:
    """Stored logp and values are what the model gives for the stored obs and raw actions."""
    obs = torch.from_numpy(data["obs"][a]).reshape(-1, data["obs"].shape[-1])
    actions = torch.from_numpy(data["actions"][a]).reshape(-1, data["actions"].shape[-1])
    logp, _, value = model.evaluate(obs, actions)
    np.testing.assert_allclose(data["logp"][a].reshape(-1), logp.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(data["values"][a].reshape(-1), value.numpy(), rtol=1e-5, atol=1e-5)
