"""Creating gymnasium envs: the one place that calls gym.make, so every process builds envs the same way."""

from __future__ import annotations

import importlib
import sys
from typing import Optional

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


def env_problem(env_id: str) -> Optional[str]:
    """Why PPO here cannot train on env_id (not registered, not creatable, not continuous), or None."""
    registered_id = env_id
    if ":" in env_id:  # "module:Env-v0": gym.make imports the module that registers the env; so do we
        module, registered_id = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as e:
            return f"cannot import module {module!r} ({e})"
    try:
        gym.spec(registered_id)
    except gym.error.Error as e:
        return f"not a registered gymnasium env ({str(e).splitlines()[0]})"
    try:
        env = make_env(env_id)
    except Exception as e:  # missing mujoco, bad kwargs: the user needs the reason, not a traceback
        return f"gymnasium could not create it: {type(e).__name__}: {e}"
    try:
        if not isinstance(env.action_space, gym.spaces.Box):
            return f"action space is {env.action_space}; PPO here needs a continuous Box"
        if not isinstance(env.observation_space, gym.spaces.Box):
            return f"observation space is {env.observation_space}; a Box is needed"
    finally:
        env.close()
    return None


TRACKING_CAMERA = "track"
"""The camera of gymnasium's MuJoCo robots that follows the centre of mass (every v5 locomotion env has one)."""


def make_video_env(env_id: str) -> gym.Env:
    """An env that renders rgb_array frames in which the robot stays in view for the whole episode.

    gymnasium's default MuJoCo view is a free camera that stays where the episode started: a running HalfCheetah
    leaves the picture within ~100 steps. The robots' own "track" camera follows the centre of mass; an env without
    one renders from the free camera, and a non-MuJoCo env (which takes no camera) as it does by default.
    """
    try:
        return make_env(env_id, render_mode="rgb_array", camera_name=TRACKING_CAMERA)
    except TypeError:  # not a MuJoCo env: no camera_name argument
        return make_env(env_id, render_mode="rgb_array")


def env_seed(seed: int, rank: int, actor: int, env: int) -> int:
    """A distinct, deterministic 32-bit seed for every env of a run, from (seed, rank, actor, env)."""
    return int(np.random.SeedSequence([seed, rank, actor, env]).generate_state(1)[0])
