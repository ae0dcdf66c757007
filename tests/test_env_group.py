"""MuJoCo's batch stepping (ppo_ddp/envs/group.py) against gymnasium's env.step: the same observations, rewards,
terminations, truncations and resets, bit for bit, over thousands of steps and several seeds."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import mujoco.batch
import numpy as np
import pytest
from gymnasium.envs.mujoco.hopper_v5 import HopperEnv

from ppo_ddp.configuration.config import Config
from ppo_ddp.envs.group import BatchedEnvs, EnvFailure, GymEnvs, make_env_group
from ppo_ddp.envs.make import make_env

BATCHED_IDS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Swimmer-v5")


def _pair(env_id: str, n: int, **kwargs) -> tuple[GymEnvs, GymEnvs]:
    gym_envs = GymEnvs([make_env(env_id, **kwargs) for _ in range(n)])
    batched = make_env_group([make_env(env_id, **kwargs) for _ in range(n)])
    assert isinstance(batched, BatchedEnvs)
    return gym_envs, batched


def _lockstep(env_id: str, seed: int, steps: int, n: int = 4, scale: float = 1.0, **kwargs) -> int:
    """Step both groups with the same float32 actions (clipped to the action space, as the actor sends them);
    assert every result equal, bit for bit; return how many episodes ended."""
    reference, batched = _pair(env_id, n, **kwargs)
    space = reference.envs[0].action_space
    obs_dim = reference.envs[0].observation_space.shape[0]
    obs_a, obs_b = np.zeros((n, obs_dim)), np.zeros((n, obs_dim))
    rew_a, rew_b = np.zeros(n), np.zeros(n)
    for e in range(n):
        obs_a[e], obs_b[e] = reference.reset(e, seed + e), batched.reset(e, seed + e)
    assert np.array_equal(obs_a, obs_b)
    rng, ends = np.random.default_rng(seed), 0
    for t in range(steps):
        actions = rng.normal(0.0, scale, (n, space.shape[0])).astype(np.float32)
        actions = np.minimum(np.maximum(actions, space.low), space.high)
        ended = reference.step(actions, obs_a, rew_a)
        assert batched.step(actions, obs_b, rew_b) == ended, f"step {t}"
        assert obs_a.tobytes() == obs_b.tobytes(), f"observations differ at step {t}"
        assert rew_a.tobytes() == rew_b.tobytes(), f"rewards differ at step {t}"
        for e, _, _ in ended:
            obs_a[e], obs_b[e] = reference.reset(e), batched.reset(e)
            assert obs_a[e].tobytes() == obs_b[e].tobytes(), f"reset of env {e} at step {t}"
        ends += len(ended)
    reference.close()
    batched.close()
    return ends


# Steps of 4 envs: HalfCheetah and Swimmer truncate at 1000 steps, so 2001 steps end each env's episode twice (8 ends),
# the second after a reset; Hopper and Walker2d fall every few dozen steps under random actions, so 700 steps cover
# terminations and the resets after them a hundred times over (2500 steps each measured ~3.6 s of CPU a seed).
STEPS = {"HalfCheetah-v5": 2001, "Hopper-v5": 700, "Walker2d-v5": 700, "Swimmer-v5": 2001}


@pytest.mark.parametrize("env_id", BATCHED_IDS)
@pytest.mark.parametrize("seed", [0, 11])
def test_batched_step_equals_gymnasium(env_id: str, seed: int) -> None:
    ends = _lockstep(env_id, seed, steps=STEPS[env_id])
    assert ends >= 8


def test_batched_step_equals_gymnasium_with_the_envs_options() -> None:
    # the formulas read the env's own weights and ranges, so a registered variant is reproduced too
    ends = _lockstep(
        "Hopper-v5",
        3,
        steps=600,
        ctrl_cost_weight=0.01,
        healthy_reward=0.5,
        healthy_z_range=(0.9, float("inf")),
        exclude_current_positions_from_observation=False,
        max_episode_steps=150,
    )
    assert ends > 0


OPTIONS = {  # every option the batch's formulas read from the env instance, changed (env_kwargs)
    "HalfCheetah-v5": dict(forward_reward_weight=0.5, ctrl_cost_weight=0.3, frame_skip=3,
                           exclude_current_positions_from_observation=False),
    "Hopper-v5": dict(forward_reward_weight=2.0, healthy_state_range=(-50.0, 50.0), healthy_angle_range=(-0.1, 0.1),
                      healthy_reward=0.25, frame_skip=2, reset_noise_scale=0.02),
    "Walker2d-v5": dict(healthy_z_range=(0.9, 1.8), healthy_angle_range=(-0.5, 0.5), healthy_reward=2.0,
                        terminate_when_unhealthy=False, frame_skip=6, exclude_current_positions_from_observation=False),
    "Swimmer-v5": dict(forward_reward_weight=2.0, ctrl_cost_weight=0.01, frame_skip=2,
                       exclude_current_positions_from_observation=False),
}  # fmt: skip
TROTTER = str(Path(__file__).resolve().parent.parent / "examples" / "robots" / "trotter.xml")
"""Another MJCF model: the planar robot of docs/usage.md's "Train your own robot" (4 motors, not the env's own)."""


@pytest.mark.parametrize("env_id", BATCHED_IDS)
def test_batched_step_equals_gymnasium_with_changed_options(env_id: str) -> None:
    ends = _lockstep(env_id, 5, steps=400, max_episode_steps=120, **OPTIONS[env_id])
    assert ends >= 8  # truncations at 120 steps at least


@pytest.mark.parametrize("env_id", ["Walker2d-v5", "Hopper-v5", "HalfCheetah-v5"])
def test_batched_step_equals_gymnasium_with_another_mjcf_model(env_id: str) -> None:
    # the trotter's first joints are x, height and pitch, as the planar robots' are: each env's formulas apply
    health = {} if env_id == "HalfCheetah-v5" else {"healthy_z_range": (0.25, 1.0)}  # HalfCheetah never falls
    ends = _lockstep(env_id, 2, steps=500, xml_file=TROTTER, frame_skip=5, **health)
    assert ends > 0 if health else ends == 0


def test_only_unmodified_supported_envs_are_batched() -> None:
    assert isinstance(make_env_group([make_env("HalfCheetah-v5")], batched=False), GymEnvs)
    assert not isinstance(make_env_group([make_env("HalfCheetah-v5")], batched=False), BatchedEnvs)
    assert not isinstance(make_env_group([make_env("Ant-v5")]), BatchedEnvs)  # its reward reads contact forces
    # a wrapper changes its observation
    assert not isinstance(make_env_group([make_env("ppo_ddp/HopperNoVel-v5")]), BatchedEnvs)
    wrapped = gym.wrappers.ClipReward(make_env("Hopper-v5"), -1.0, 1.0)
    assert not isinstance(make_env_group([wrapped]), BatchedEnvs)

    class Changed(HopperEnv):  # a subclass may change its step
        pass

    assert not isinstance(make_env_group([gym.wrappers.TimeLimit(Changed(), 1000)]), BatchedEnvs)


def test_the_actor_batches_by_default() -> None:
    # what test_actor_identity then compares, field by field, with the actor of gymnasium's step
    assert Config().batch_envs
    assert isinstance(make_env_group([make_env(Config().env_id)], Config().batch_envs), BatchedEnvs)


def test_an_unstable_simulation_is_handled_as_gymnasium_handles_it() -> None:
    # MuJoCo warns and resets a simulation whose state is not finite; the batch's row must do the same
    reference, batched = _pair("HalfCheetah-v5", 2)
    for e in range(2):
        reference.reset(e, e), batched.reset(e, e)
    reference.envs[1].unwrapped.data.qpos[2] = np.nan
    batched.batch.bind("qpos")[1, 2] = np.nan
    obs_a, obs_b, rew_a, rew_b = np.zeros((2, 17)), np.zeros((2, 17)), np.zeros(2), np.zeros(2)
    actions = np.full((2, 6), 0.5, dtype=np.float32)
    for _ in range(5):
        assert reference.step(actions, obs_a, rew_a) == batched.step(actions, obs_b, rew_b)
        assert obs_a.tobytes() == obs_b.tobytes() and rew_a.tobytes() == rew_b.tobytes()
    assert np.isfinite(obs_b).all()


def test_a_failing_simulation_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _, batched = _pair("HalfCheetah-v5", 3)
    for e in range(3):
        batched.reset(e, e)

    def fail(**_):  # what Batch.step raises when MuJoCo raised an error in simulation 1
        raise mujoco.batch.SimulationError(np.array([1]), "mj_step: an error")

    monkeypatch.setattr(batched.batch, "step", fail)
    with pytest.raises(EnvFailure) as failure:
        batched.step(np.zeros((3, 6), dtype=np.float32), np.zeros((3, 17)), np.zeros(3))
    assert failure.value.env == 1 and "an error" in str(failure.value.__cause__)
