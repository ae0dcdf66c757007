"""An actor's envs as one group: gymnasium's `env.step` one env after another, or, for the MuJoCo robots whose step
this module reproduces bit for bit, MuJoCo's own batch stepping.

gymnasium's locomotion envs spend ~a quarter of a step in Python around MuJoCo (wrappers, a dict of reward terms,
`_get_obs` per env). `mujoco.batch.Batch` keeps each env's integration state (mjSTATE_INTEGRATION: positions,
velocities, warm start, controls, time) as a row and steps all rows in one call with the results of a loop of
`mj_step`; this module then computes the observations, rewards and terminations of HalfCheetah, Hopper, Walker2d
and Swimmer (v5) with numpy over all envs at once, in the same floating-point operations, in the same order, as
their `step` methods. Resets and seeds stay gymnasium's: a reset calls the env's own `reset`, whose random
generator it is, and copies the state it made into the env's row. tests/test_env_group.py checks every field
against gymnasium's with `np.array_equal` over thousands of steps, episode ends and several seeds.

Any other env, or one of these wrapped by more than gymnasium's own TimeLimit / OrderEnforcing / PassiveEnvChecker
(the partly observed ids, for instance), is stepped by `GymEnvs`, and so is any env whose critic reads a privileged
observation from `info` (critic_obs), which only gymnasium's step returns.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import mujoco
import mujoco.batch
import numpy as np
from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv
from gymnasium.envs.mujoco.hopper_v5 import HopperEnv
from gymnasium.envs.mujoco.swimmer_v5 import SwimmerEnv
from gymnasium.envs.mujoco.walker2d_v5 import Walker2dEnv
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

from ppo_ddp.envs import state as env_state
from ppo_ddp.envs.make import critic_observation
from ppo_ddp.envs.state import EnvState

Ended = list[tuple[int, bool, bool]]
"""The envs whose episode ended at a step: (env index, terminated, truncated)."""

_STATE = mujoco.mjtState.mjSTATE_INTEGRATION


class EnvFailure(Exception):
    """An env raised while stepping or resetting; `env` is its index, the original exception the cause."""

    def __init__(self, env: int) -> None:
        super().__init__(env)
        self.env = env


class GymEnvs:
    """E gymnasium envs, stepped one after another: any env `make_env` builds. With a critic_key, each reset and
    step also writes the env's privileged observation info[critic_key] into the caller's `critic` rows."""

    def __init__(self, envs: list[gym.Env], critic_key: Optional[str] = None) -> None:
        self.envs, self.critic_key = envs, critic_key

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self, e: int, seed: Optional[int] = None, critic: Optional[np.ndarray] = None) -> np.ndarray:
        """Env e's first observation of a new episode (its generator seeded first when `seed` is given); its
        privileged one into `critic` (a row) when given."""
        try:
            obs, info = self.envs[e].reset(seed=seed)
            if critic is not None:
                critic[:] = critic_observation(info, self.critic_key)
            return obs
        except Exception as exc:
            raise EnvFailure(e) from exc

    def step(
        self, actions: np.ndarray, obs: np.ndarray, rewards: np.ndarray, critic: Optional[np.ndarray] = None
    ) -> Ended:
        """Step env e with actions[e], writing its observation into obs[e], its reward into rewards[e] and its
        privileged observation into critic[e] (when given); returns the envs whose episode ended (their rows hold
        the final observations; the caller resets them)."""
        ended: Ended = []
        for e, env in enumerate(self.envs):
            try:
                obs[e], rewards[e], term, trunc, info = env.step(actions[e])
                if critic is not None:
                    critic[e] = critic_observation(info, self.critic_key)
            except Exception as exc:
                raise EnvFailure(e) from exc
            if term or trunc:
                ended.append((e, bool(term), bool(trunc)))
        return ended

    @functools.cached_property
    def _derived(self) -> env_state.Derived:
        """The layout of the derived arrays a captured state keeps (env_state.Derived), made on first use."""
        return env_state.Derived(env_state.simulation(self.envs[0])[0])

    @functools.cached_property
    def capturable(self) -> bool:
        """Whether every env's whole state can be captured (ppo_ddp/envs/state.py)."""
        return all(env_state.capturable(env) for env in self.envs)

    def capture(self) -> Optional[list[EnvState]]:
        """Every env's whole state, or None where an env's cannot be captured."""
        if not self.capturable:
            return None
        return [env_state.capture(env, self._derived) for env in self.envs]

    def restore(self, states: list[EnvState]) -> None:
        """Put back what `capture` took (from a group of the same env id and size, stepped either way)."""
        for env, state in zip(self.envs, states, strict=True):
            env_state.restore(env, state, self._derived)

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):
                env.close()


@dataclass(frozen=True)
class _Robot:
    """What one locomotion env's `step` computes around the simulation, read from the env instance."""

    frame_skip: int
    dt: float
    forward_weight: float
    ctrl_cost_weight: float
    skip_positions: int  # leading qpos entries left out of the observation
    clip_velocity: bool  # Hopper and Walker2d clip qvel to [-10, 10] in the observation
    healthy: Optional[Callable[[np.ndarray, np.ndarray], np.ndarray]]  # (qpos, qvel) -> healthy per env
    healthy_reward: float
    terminate_when_unhealthy: bool


def _hopper_healthy(env: HopperEnv) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    (min_state, max_state), (min_z, max_z) = env._healthy_state_range, env._healthy_z_range
    min_angle, max_angle = env._healthy_angle_range

    def healthy(qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:  # HopperEnv.is_healthy: state_vector()[2:]
        state_ok = ((min_state < qpos[:, 2:]) & (qpos[:, 2:] < max_state)).all(1)
        state_ok &= ((min_state < qvel) & (qvel < max_state)).all(1)
        z, angle = qpos[:, 1], qpos[:, 2]
        return state_ok & (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)

    return healthy


def _walker_healthy(env: Walker2dEnv) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    (min_z, max_z), (min_angle, max_angle) = env._healthy_z_range, env._healthy_angle_range

    def healthy(qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:  # Walker2dEnv.is_healthy
        z, angle = qpos[:, 1], qpos[:, 2]
        return (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)

    return healthy


def _robot(env: gym.Env) -> Optional[_Robot]:
    """The step of a supported, unmodified locomotion env, or None: exactly the class (a subclass may change its
    step), exactly gymnasium's own wrappers around it, and no rendering."""
    if any(type(wrapper) not in (TimeLimit, OrderEnforcing, PassiveEnvChecker) for wrapper in env_state.wrappers(env)):
        return None
    u = env.unwrapped
    if type(u) not in (HalfCheetahEnv, HopperEnv, Walker2dEnv, SwimmerEnv) or u.render_mode is not None:
        return None
    healthy, healthy_reward, terminate = None, 0.0, False
    if type(u) in (HopperEnv, Walker2dEnv):
        healthy = _hopper_healthy(u) if type(u) is HopperEnv else _walker_healthy(u)
        healthy_reward, terminate = u._healthy_reward, u._terminate_when_unhealthy
    skip = (2 if type(u) is SwimmerEnv else 1) if u._exclude_current_positions_from_observation else 0
    return _Robot(
        frame_skip=u.frame_skip,
        dt=u.dt,
        forward_weight=u._forward_reward_weight,
        ctrl_cost_weight=u._ctrl_cost_weight,
        skip_positions=skip,
        clip_velocity=type(u) in (HopperEnv, Walker2dEnv),
        healthy=healthy,
        healthy_reward=healthy_reward,
        terminate_when_unhealthy=terminate,
    )


class BatchedEnvs(GymEnvs):
    """The same envs, stepped together by `mujoco.batch.Batch` on the actor's own thread (module docstring)."""

    def __init__(self, envs: list[gym.Env], robot: _Robot) -> None:
        super().__init__(envs)
        limit = env_state.time_limit(envs[0])
        self.robot, self.max_steps = robot, None if limit is None else limit._max_episode_steps
        self.model = envs[0].unwrapped.model
        self.batch = mujoco.batch.Batch(self.model, len(envs), nthread=1)  # the actor's one core: no extra threads
        self.qpos, self.qvel, self.ctrl = self.batch.bind("qpos"), self.batch.bind("qvel"), self.batch.bind("ctrl")
        self.elapsed = np.zeros(len(envs), dtype=np.int64)  # TimeLimit's count, which env.step no longer runs

    def reset(self, e: int, seed: Optional[int] = None, critic: Optional[np.ndarray] = None) -> np.ndarray:
        obs = super().reset(e, seed)  # no critic rows: a group with a critic_key is never batched
        mujoco.mj_getState(self.model, self.envs[e].unwrapped.data, self.batch.state[e], _STATE)
        self.elapsed[e] = 0
        return obs

    def capture(self) -> list[EnvState]:
        """Each env's row is its state (its steps read no derived field before simulating), the count its own."""
        states = [env_state.capture(env, None, self.batch.state[e]) for e, env in enumerate(self.envs)]
        for state, elapsed in zip(states, self.elapsed):
            state["elapsed"] = int(elapsed)
        return states

    def restore(self, states: list[EnvState]) -> None:
        super().restore(states)
        for e, state in enumerate(states):
            self.batch.state[e] = np.asarray(state["integration"])
            self.elapsed[e] = state["elapsed"] or 0

    def step(
        self, actions: np.ndarray, obs: np.ndarray, rewards: np.ndarray, critic: Optional[np.ndarray] = None
    ) -> Ended:
        """As GymEnvs.step (critic is None: a group with a critic_key is never batched). The formulas are the envs'
        own `step`, `_get_obs`, `_get_rew` and `is_healthy`, over all envs at once; `actions` is float32, as
        gymnasium's envs receive it from the actor."""
        r = self.robot
        x_before = self.qpos[:, 0].copy()
        self.ctrl[:] = actions
        try:
            self.batch.step(nstep=r.frame_skip)
        except mujoco.batch.SimulationError as exc:
            raise EnvFailure(int(exc.ids[0])) from exc
        qpos, qvel = self.qpos, self.qvel
        x_velocity = (qpos[:, 0] - x_before) / r.dt
        n_pos = qpos.shape[1] - r.skip_positions
        obs[:, :n_pos] = qpos[:, r.skip_positions :]
        if r.clip_velocity:
            np.clip(qvel, -10, 10, out=obs[:, n_pos:])
        else:
            obs[:, n_pos:] = qvel
        forward = r.forward_weight * x_velocity
        ctrl_cost = r.ctrl_cost_weight * np.sum(np.square(actions), axis=1)
        if r.healthy is None:
            rewards[:] = forward - ctrl_cost
            terminated = np.zeros(len(self.envs), dtype=bool)
        else:
            healthy = r.healthy(qpos, qvel)
            rewards[:] = (forward + healthy * r.healthy_reward) - ctrl_cost
            terminated = ~healthy if r.terminate_when_unhealthy else np.zeros(len(self.envs), dtype=bool)
        self.elapsed += 1
        truncated = self.elapsed >= self.max_steps if self.max_steps is not None else np.zeros_like(terminated)
        return [(int(e), bool(terminated[e]), bool(truncated[e])) for e in np.flatnonzero(terminated | truncated)]


def make_env_group(envs: list[gym.Env], batched: bool = True, critic_key: Optional[str] = None) -> GymEnvs:
    """The envs as a group: batch-stepped where `batched` and the env is one this module reproduces, else
    gymnasium's step (always with a critic_key: the privileged observation is in the info of gymnasium's step)."""
    robot = _robot(envs[0]) if batched and critic_key is None else None
    return BatchedEnvs(envs, robot) if robot is not None else GymEnvs(envs, critic_key)
