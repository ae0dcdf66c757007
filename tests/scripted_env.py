"""Tiny gymnasium envs with a known script, for the actor tests (importable by spawned/forkserver actors).

Made with `make_env("scripted_env:Scripted-v0")`: gymnasium imports this module (tests/ is on the actors'
sys.path, inherited from the test process) and the import registers the ids below.

Scripted-v0, per env: episodes cycle through EPISODES = [(3 steps, terminated), (4 steps, truncated),
(2 steps, terminated and truncated)]. Observation after step s (1-based) of episode k is [tag, k, s]; the
episode's final observation is [tag, k, FINAL_MARKER + s]; reset gives [tag, k + 1, 0]. tag = seed % 1000
of the seeded first reset. Reward of step s of episode k: k + 0.1 * s. The env writes every observation
into one array and returns that same array each time, as some envs do: an actor that does not copy what
it stores sees it change under its feet.

Failure variants (for supervision tests; `target_seed` picks one env of one actor, others run normally):
ScriptedRaise-v0 raises at `at_step`; ScriptedNaNObs-v0 / ScriptedNaNReward-v0 return NaN there;
ScriptedHang-v0 sleeps (practically) forever there; ScriptedSlow-v0 sleeps `delay` seconds every step.

ScriptedPrivileged-v0 is Scripted-v0 that also gives `info["full_obs"] = privileged(obs)` at reset and every step:
[tag, k, s, 10 * s + k], another width than the policy's 3, for the privileged critic's tests.
Steps are counted over the env's lifetime from 0, like the actor's steps of its first round.

For the trainer's fault tests (tests/test_reliability.py: 1 actor x 2 envs x 32 steps a round, --seed 7):
ScriptedRaiseRank1-v0 / ScriptedNaNRewardRank1-v0 fail in rank 1's actor 0, env 1, at step 6 of round 3
(lifetime step 102), after the round-2 checkpoint; ScriptedHangRank0-v0 hangs there in rank 0's actor 0.
"""

from __future__ import annotations

import functools
import time

import gymnasium as gym
import numpy as np

from ppo_ddp.envs.make import env_seed

EPISODES = [(3, True, False), (4, False, True), (2, True, True)]
FINAL_MARKER = 1000.0
FAILURE_SEED = 7
"""Tests of the failure variants use Config(seed=FAILURE_SEED); the failing env is rank 0, actor 1, env 1 (of 2 envs
an actor: env 3 of the rank's round)."""
FAILURE_TARGET = env_seed(FAILURE_SEED, 0, 3)
LATE_STEP = 102
"""Lifetime step of the trainer tests' failures: step 6 of round 3 with 32-step rounds, after round 0 (which
seeds the statistics)."""


class ScriptedEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(
        self, failure: str | None = None, at_step: int = 0, target_seed: int | None = None, delay: float = 0.0
    ):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.failure, self.at_step, self.target_seed, self.delay = failure, at_step, target_seed, delay
        self._obs = np.zeros(3, dtype=np.float64)  # reused in place for every observation
        self._tag = 0.0
        self._seed: int | None = None
        self._episode = -1
        self._step_in_episode = 0
        self._lifetime_steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._seed = seed
            self._tag = float(seed % 1000)
        self._episode += 1
        self._step_in_episode = 0
        self._obs[:] = (self._tag, self._episode, 0.0)
        return self._obs, {}

    def step(self, action):
        if self.delay:
            time.sleep(self.delay)
        failing = self.failure is not None and self._lifetime_steps == self.at_step and self._seed == self.target_seed
        self._lifetime_steps += 1
        if failing and self.failure == "raise":
            raise RuntimeError(f"scripted failure at lifetime step {self.at_step}")
        if failing and self.failure == "hang":
            time.sleep(3600)
        length, terminated, truncated = EPISODES[self._episode % len(EPISODES)]
        self._step_in_episode += 1
        s = self._step_in_episode
        reward = self._episode + 0.1 * s
        ended = s == length
        self._obs[:] = (self._tag, self._episode, FINAL_MARKER + s if ended else s)
        if failing and self.failure == "nan_obs":
            self._obs[1] = np.nan
        if failing and self.failure == "nan_reward":
            reward = float("nan")
        return self._obs, reward, terminated and ended, truncated and ended, {}


class PrivilegedScriptedEnv(ScriptedEnv):
    """Scripted-v0 with the critic's own observation in info["full_obs"]."""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        return obs, {**info, "full_obs": privileged(obs)}

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "full_obs": privileged(obs)}


class UnboundedScriptedEnv(ScriptedEnv):
    """ScriptedEnv whose actions have no bounds: what a bounded distribution refuses (tests/test_distributions.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


def privileged(obs: np.ndarray) -> np.ndarray:
    """The privileged observation of ScriptedPrivileged-v0 for a policy observation (rows [..., 3])."""
    obs = np.asarray(obs, dtype=np.float64)
    return np.concatenate([obs, 10 * obs[..., 2:3] + obs[..., 1:2]], axis=-1)


def expected_script(tag: float, steps: int) -> dict[str, np.ndarray]:
    """What Scripted-v0 yields over its first `steps` steps: the observation each step starts from,
    reward, flags, and the final observation of steps that end an episode (NaN rows elsewhere)."""
    obs, final = np.zeros((steps, 3)), np.full((steps, 3), np.nan)
    rewards = np.zeros(steps)
    terminated, truncated = np.zeros(steps, bool), np.zeros(steps, bool)
    episode, s = 0, 0
    for t in range(steps):
        obs[t] = (tag, episode, s)
        length, term, trunc = EPISODES[episode % len(EPISODES)]
        s += 1
        rewards[t] = episode + 0.1 * s
        if s == length:
            terminated[t], truncated[t] = term, trunc
            final[t] = (tag, episode, FINAL_MARKER + s)
            episode, s = episode + 1, 0
    return {"obs": obs, "rewards": rewards, "terminated": terminated, "truncated": truncated, "final": final}


_ENTRY = "scripted_env:ScriptedEnv"
# gymnasium's passive checker warns about the in-place observation, which is the point here
_register = functools.partial(gym.register, entry_point=_ENTRY, disable_env_checker=True)
_register(id="Scripted-v0")
_register(id="ScriptedRaise-v0", kwargs={"failure": "raise", "at_step": 5, "target_seed": FAILURE_TARGET})
_register(id="ScriptedNaNObs-v0", kwargs={"failure": "nan_obs", "at_step": 4, "target_seed": FAILURE_TARGET})
_register(id="ScriptedNaNReward-v0", kwargs={"failure": "nan_reward", "at_step": 4, "target_seed": FAILURE_TARGET})
_register(id="ScriptedHang-v0", kwargs={"failure": "hang", "at_step": 3, "target_seed": FAILURE_TARGET})
_register(id="ScriptedSlow-v0", kwargs={"delay": 0.02})
_register(
    id="ScriptedRaiseRank1-v0",
    kwargs={"failure": "raise", "at_step": LATE_STEP, "target_seed": env_seed(FAILURE_SEED, 1, 1)},
)
_register(
    id="ScriptedNaNRewardRank1-v0",
    kwargs={"failure": "nan_reward", "at_step": LATE_STEP, "target_seed": env_seed(FAILURE_SEED, 1, 1)},
)
_register(
    id="ScriptedHangRank0-v0",
    kwargs={"failure": "hang", "at_step": LATE_STEP, "target_seed": env_seed(FAILURE_SEED, 0, 1)},
)
gym.register(id="ScriptedPrivileged-v0", entry_point="scripted_env:PrivilegedScriptedEnv", disable_env_checker=True)
gym.register(id="ScriptedUnbounded-v0", entry_point="scripted_env:UnboundedScriptedEnv", disable_env_checker=True)
