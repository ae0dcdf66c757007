"""The env factory (ppo_ddp/envs/make.py) without dm_control: a Dict observation of Boxes reaches the policy as one
float32 vector in sorted key order (tests/test_dmc.py checks it on dm_control's own tasks)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from ppo_ddp.envs.make import FlatDictObservation, is_dm_control


class DictEnv(gym.Env):
    """Observes a Dict whose keys it lists unsorted, with a scalar entry and a 2-D one, as float64."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "velocity": gym.spaces.Box(-1.0, 1.0, (2,), np.float64),
                "height": gym.spaces.Box(0.0, 2.0, (), np.float64),
                "arm": gym.spaces.Box(-3.0, 3.0, (2, 2), np.float64),
            }
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _obs(self) -> dict[str, Any]:
        # dm_control's order, not the space's: the wrapper must look the keys up, not trust the order
        return {"velocity": np.array([0.1, 0.2]), "height": np.float64(1.5), "arm": np.array([[1.0, 2.0], [-3.0, 0.5]])}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        return self._obs(), 0.0, False, False, {}


def test_a_dict_observation_is_one_float32_vector_in_sorted_key_order():
    env = FlatDictObservation(DictEnv())
    obs, _ = env.reset(seed=0)
    assert env.keys == ["arm", "height", "velocity"]
    np.testing.assert_array_equal(obs, np.array([1, 2, -3, 0.5, 1.5, 0.1, 0.2], dtype=np.float32))
    assert obs.dtype == np.float32 and env.observation_space.dtype == np.float32
    assert env.observation_space.shape == (7,) and env.observation_space.contains(obs)
    np.testing.assert_array_equal(env.observation_space.low, [-3, -3, -3, -3, 0, -1, -1])
    np.testing.assert_array_equal(env.step(np.zeros(1))[0], obs)


def test_dm_control_ids():
    assert is_dm_control("dm_control/cheetah-run-v0") and is_dm_control("shimmy:dm_control/walker-walk-v0")
    assert not is_dm_control("HalfCheetah-v5") and not is_dm_control("ppo_ddp/HopperNoVel-v5")
