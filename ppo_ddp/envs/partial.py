"""Partly observed benchmark envs: gymnasium's robots with the velocities taken out of the observation.

A policy that sees only positions must infer velocities from their history, which an MLP cannot and a recurrent
policy can: these envs measure that (docs/benchmarks/). They are registered as gymnasium ids when ppo_ddp is
imported, so any library can make them:

    import gymnasium as gym, ppo_ddp
    env = gym.make("ppo_ddp/HopperNoVel-v5")       # or gym.make("ppo_ddp:ppo_ddp/HopperNoVel-v5") without the import

Each is its gymnasium env with the velocity block removed from the observation and nothing else changed: the same
reward, termination (Hopper's and Walker2d's health checks still read the whole state), truncation, reset and
seeding. The whole observation is still there for whoever may see it: `info["full_obs"]` at reset and at every
step (the final one of an episode included) is the base env's observation, velocities and all: what a privileged
critic reads (`--critic-obs full_obs`, docs/usage.md), never the policy.

For MuJoCo v5 envs the block is found from the env's own `observation_structure` (positions, then velocities);
Pendulum-v1's observation is (cos θ, sin θ, θ'), of which θ' goes.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

NAMESPACE = "ppo_ddp"
PARTLY_OBSERVED = {
    f"{NAMESPACE}/HalfCheetahNoVel-v5": "HalfCheetah-v5",
    f"{NAMESPACE}/HopperNoVel-v5": "Hopper-v5",
    f"{NAMESPACE}/Walker2dNoVel-v5": "Walker2d-v5",
    f"{NAMESPACE}/PendulumNoVel-v1": "Pendulum-v1",
}
"""Each partly observed env's id and the gymnasium env it hides the velocities of."""

FULL_OBS_KEY = "full_obs"
"""The key of `info` that holds the base env's whole observation at reset and at every step."""
PENDULUM_VELOCITY = 2  # Pendulum-v1's observation: cos(theta), sin(theta), theta_dot


class DropVelocities(gym.ObservationWrapper):
    """The wrapped env's observation without the entries of its velocity block (`kept`: the indices left)."""

    def __init__(self, env: gym.Env, kept: np.ndarray) -> None:
        super().__init__(env)
        self.kept = kept
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[kept], space.high[kept], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.kept]

    def reset(self, **kwargs) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(**kwargs)
        return self.observation(obs), {**info, FULL_OBS_KEY: obs}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self.observation(obs), reward, terminated, truncated, {**info, FULL_OBS_KEY: obs}


def velocity_indices(env: gym.Env) -> np.ndarray:
    """Where the velocities are in env's observation (a MuJoCo v5 robot's or Pendulum-v1's)."""
    structure = getattr(env.unwrapped, "observation_structure", None)
    if structure is not None:  # MuJoCo v5: [qpos without the skipped coordinates, qvel, ...]
        return np.arange(structure["qpos"], structure["qpos"] + structure["qvel"])
    if env.observation_space.shape == (3,):
        return np.array([PENDULUM_VELOCITY])
    raise ValueError(f"{env.spec.id if env.spec else env}: no known velocity block in its observation")


def make_partly_observed(base_id: str, **kwargs) -> gym.Env:
    """The entry point of every id in PARTLY_OBSERVED: the base env (its own class, without the wrappers gym.make
    adds, which gym.make adds again around this one) with its velocities dropped. kwargs go to the base env
    (render_mode, camera_name, the robots' options)."""
    base = gym.make(base_id, **kwargs).unwrapped
    hidden = velocity_indices(base)
    kept = np.setdiff1d(np.arange(base.observation_space.shape[0]), hidden)
    return DropVelocities(base, kept)


def register() -> None:
    """Register the partly observed envs with gymnasium (once per process; a second call changes nothing)."""
    for env_id, base_id in PARTLY_OBSERVED.items():
        if env_id not in gym.registry:
            base = gym.spec(base_id)
            gym.register(
                env_id,
                entry_point=make_partly_observed,
                kwargs={"base_id": base_id},
                max_episode_steps=base.max_episode_steps,
                reward_threshold=base.reward_threshold,
            )
