"""Creating gymnasium envs: the one place that calls gym.make, so every process builds envs the same way."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np

# Deprecations inside gymnasium's own MuJoCo XML assets: nothing a user can act on, and printed once
# per env per process they would bury the training log.
_SILENCED_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)


def _mujoco_warning(message: str) -> None:
    if not message.startswith(_SILENCED_MUJOCO_WARNINGS):
        print(f"MuJoCo warning: {message}", file=sys.stderr)


def _install_mujoco_warning_filter() -> None:
    try:
        import mujoco
    except ImportError:  # a non-MuJoCo env: nothing to filter
        return
    mujoco.set_mju_user_warning(_mujoco_warning)


def make_env(env_id: str, **kwargs) -> gym.Env:
    """gym.make(env_id) with MuJoCo's asset deprecation warnings filtered out."""
    _install_mujoco_warning_filter()
    return gym.make(env_id, **kwargs)


def env_seed(seed: int, rank: int, actor: int, env: int) -> int:
    """A distinct, deterministic 32-bit seed for every env of a run, from (seed, rank, actor, env)."""
    return int(np.random.SeedSequence([seed, rank, actor, env]).generate_state(1)[0])
