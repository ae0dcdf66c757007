"""The partly observed envs (ppo_ddp/envs/partial.py): the full env's observation minus its velocities, and nothing
else changed, for the same seed and actions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import ppo_ddp  # noqa: F401  (registers the ids)
from ppo_ddp.configuration.loading import parse_config
from ppo_ddp.envs.partial import FULL_OBS_KEY, PARTLY_OBSERVED
from ppo_ddp.records.run_log import default_run_name

# What each keeps of its full env's observation: the positions (MuJoCo v5 puts them before the velocities).
KEPT = {"HalfCheetah-v5": 8, "Hopper-v5": 5, "Walker2d-v5": 8, "Pendulum-v1": 2}


@pytest.mark.parametrize("env_id", list(PARTLY_OBSERVED))
def test_the_observation_is_the_full_one_without_the_velocities(env_id):
    base_id = PARTLY_OBSERVED[env_id]
    partial, full = gym.make(env_id), gym.make(base_id)
    n = KEPT[base_id]
    assert partial.observation_space.shape == (n,)
    assert partial.action_space == full.action_space
    assert partial.spec.max_episode_steps == full.spec.max_episode_steps
    if base_id == "Pendulum-v1":
        kept = [0, 1]  # cos, sin; the angular velocity goes
    else:
        structure = full.unwrapped.observation_structure
        kept = list(range(structure["qpos"]))  # the velocities follow the positions
        assert full.observation_space.shape[0] == structure["qpos"] + structure["qvel"]
    rng = np.random.default_rng(0)
    actions = rng.uniform(full.action_space.low, full.action_space.high, (400, *full.action_space.shape))
    obs_p, info = partial.reset(seed=7)
    obs_f, _ = full.reset(seed=7)
    ends = 0
    for step, action in enumerate(actions.astype(full.action_space.dtype)):
        np.testing.assert_array_equal(obs_p, obs_f[kept], err_msg=f"step {step}")
        # the whole observation for a privileged critic, the final one of an episode included (before the reset)
        np.testing.assert_array_equal(info[FULL_OBS_KEY], obs_f, err_msg=f"step {step}")
        obs_p, rew_p, term_p, trunc_p, info = partial.step(action)
        obs_f, rew_f, term_f, trunc_f, _ = full.step(action)
        assert (rew_p, term_p, trunc_p) == (rew_f, term_f, trunc_f), step
        if term_f or trunc_f:
            ends += 1
            np.testing.assert_array_equal(info[FULL_OBS_KEY], obs_f, err_msg=f"final observation of step {step}")
            obs_p, info = partial.reset()
            obs_f, _ = full.reset()
    if base_id in ("Hopper-v5", "Walker2d-v5"):
        assert ends > 0  # random actions make them fall: the termination was compared too


def test_a_partly_observed_env_trains_by_its_id():
    cfg = parse_config(["--env-id", "ppo_ddp/HopperNoVel-v5"])  # validated: registered, continuous, a Box
    assert cfg.env_id == "ppo_ddp/HopperNoVel-v5"


def test_the_default_run_name_of_a_namespaced_id_is_one_folder():
    name = default_run_name("ppo_ddp/HopperNoVel-v5", 3, 0.0)
    assert "/" not in name and name.startswith("ppo_ddp-HopperNoVel-v5__3__")
