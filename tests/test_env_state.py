"""An env group's captured state (ppo_ddp/envs/state.py): restored into fresh envs, they step on exactly as the
captured envs do, bit for bit, across resets and truncations, for every gymnasium MuJoCo v5 env and both ways of
stepping (ppo_ddp/envs/group.py); through a weights_only checkpoint too."""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest
import torch

from ppo_ddp.envs.group import BatchedEnvs, GymEnvs, make_env_group
from ppo_ddp.envs.make import make_env
from ppo_ddp.storage.checkpoint import as_tensors

MUJOCO_V5 = (
    "Ant-v5 HalfCheetah-v5 Hopper-v5 Humanoid-v5 HumanoidStandup-v5 InvertedDoublePendulum-v5 InvertedPendulum-v5 "
    "Pusher-v5 Reacher-v5 Swimmer-v5 Walker2d-v5 ppo_ddp/HopperNoVel-v5"
).split()
LIMIT = 120  # a short time limit, so that truncations (and the resets after them) fall inside the compared steps


def _group(env_id: str, batched: bool, n: int = 2, seed: int = 0) -> GymEnvs:
    group = make_env_group([make_env(env_id, max_episode_steps=LIMIT) for _ in range(n)], batched)
    for e in range(n):
        group.reset(e, seed + e)
    return group


def _run(group: GymEnvs, actions: np.ndarray) -> list[bytes]:
    """Step the group through `actions` [T, n, act_dim], resetting ended envs; every result as bytes."""
    n, obs_dim = len(group), group.envs[0].observation_space.shape[0]
    obs, rewards, record = np.zeros((n, obs_dim)), np.zeros(n), []
    for row in actions:
        ended = group.step(row, obs, rewards)
        record += [obs.tobytes(), rewards.tobytes(), repr(ended).encode()]
        record += [group.reset(e).tobytes() for e, _, _ in ended]
    return record


def _actions(group: GymEnvs, steps: int, seed: int) -> np.ndarray:
    space = group.envs[0].action_space
    drawn = np.random.default_rng(seed).normal(0.0, 1.0, (steps, len(group), space.shape[0]))
    return np.minimum(np.maximum(drawn, space.low), space.high).astype(np.float32)


def _check(env_id: str, captured_by: bool, restored_by: bool, through_file: bool = False) -> None:
    original = _group(env_id, captured_by)
    _run(original, _actions(original, 150, seed=1))  # into the second episode of each env
    states = original.capture()
    assert states is not None
    if through_file:  # what a checkpoint does: torch.save, then torch.load(weights_only=True)
        buffer = io.BytesIO()
        torch.save(as_tensors(states), buffer)
        buffer.seek(0)
        states = torch.load(buffer, weights_only=True)
    later = _actions(original, 2 * LIMIT, seed=2)
    expected = _run(original, later)
    restored = _group(env_id, restored_by, seed=50)  # other episodes until the restore
    restored.restore(states)
    assert _run(restored, later) == expected


@pytest.mark.parametrize("env_id", MUJOCO_V5)
def test_a_restored_group_steps_on_as_the_captured_one(env_id: str) -> None:
    _check(env_id, captured_by=False, restored_by=False)


@pytest.mark.parametrize("captured_by, restored_by", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5"])
def test_batched_and_gymnasium_steps_share_one_state(env_id: str, captured_by: bool, restored_by: bool) -> None:
    assert isinstance(_group(env_id, True), BatchedEnvs)
    _check(env_id, captured_by, restored_by)


@pytest.mark.parametrize("batched", [True, False])
def test_a_state_survives_a_weights_only_checkpoint(batched: bool) -> None:
    _check("Hopper-v5", batched, batched, through_file=True)


def test_an_env_whose_state_is_unknown_is_not_captured() -> None:
    assert make_env_group([make_env("Pendulum-v1")]).capture() is None  # not a MuJoCo env
    clipped = gym.wrappers.ClipReward(make_env("Hopper-v5"), -1.0, 1.0)  # a wrapper this module does not know
    assert make_env_group([clipped]).capture() is None
