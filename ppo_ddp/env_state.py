"""An env's whole state, captured so that a restored env steps on exactly as the captured one would have.

A gymnasium MuJoCo env's next step depends on four things:

- the simulation's integration state (`mj_getState` with mjSTATE_INTEGRATION: time, positions, velocities,
  actuator activations, the solver's warm start, controls, applied forces);
- the derived fields its `step` reads before simulating: Ant, Humanoid, Reacher and Pusher read body positions or
  contact forces (`xpos`, `xipos`, `cfrc_ext`) that the previous step's last substep computed, one substep behind
  the state. Every MjData array whose size the model fixes is kept (~37 KB for Humanoid); the arrays sized by the
  step's contacts and constraints are outputs the next step recomputes before reading;
- the env's random generator (its resets' noise);
- the TimeLimit wrapper's count of the episode's steps.

The state is a dict of numpy arrays and Python values (small to pickle through an actor's pipe); a checkpoint
stores its arrays as tensors (ppo_ddp/checkpointer.py), and `restore` takes either.
An env this module cannot capture (not a MuJoCo env, or wrapped in something other than gymnasium's own wrappers
and the partly observed envs' observation filter) gives None. tests/test_env_state.py steps every gymnasium MuJoCo
v5 env on from a restored state and compares it with the captured env's own continuation, bit for bit.
"""

from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium.envs.mujoco.mujoco_env import MujocoEnv
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

from ppo_ddp.partial_envs import DropVelocities

EnvState = dict[str, Any]
INTEGRATION = mujoco.mjtState.mjSTATE_INTEGRATION
_STATELESS_WRAPPERS = (OrderEnforcing, PassiveEnvChecker, DropVelocities)  # none changes a step's numbers


def _wrappers(env: gym.Env) -> list[gym.Wrapper]:
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain


def time_limit(env: gym.Env) -> Optional[TimeLimit]:
    """The TimeLimit wrapper around env, or None."""
    return next((w for w in _wrappers(env) if isinstance(w, TimeLimit)), None)


def capturable(env: gym.Env) -> bool:
    """Whether env's whole state can be captured: a MuJoCo env, wrapped only by wrappers whose state is known."""
    known = all(isinstance(w, (TimeLimit, *_STATELESS_WRAPPERS)) for w in _wrappers(env))
    return known and isinstance(env.unwrapped, MujocoEnv)


class Derived:
    """Where a model's derived MjData arrays go in a captured state: the arrays whose sizes the model fixes (their
    shapes in a fresh MjData are non-empty, as after any step; the contact- and constraint-sized ones are empty
    there), packed into one flat array per dtype, so that a state pickles as a few arrays, not a hundred."""

    def __init__(self, model: mujoco.MjModel) -> None:
        fresh = mujoco.MjData(model)
        self.fields: dict[str, list[str]] = {}  # dtype: names, in a fixed order
        for name in dir(fresh):
            value = None if name.startswith("_") else getattr(fresh, name, None)
            if isinstance(value, np.ndarray) and value.size and value.flags.writeable:
                self.fields.setdefault(value.dtype.str, []).append(name)

    def pack(self, data: mujoco.MjData) -> dict[str, np.ndarray]:
        fields = self.fields.items()
        return {dtype: np.concatenate([getattr(data, name).ravel() for name in names]) for dtype, names in fields}

    def unpack(self, packed: dict[str, Any], data: mujoco.MjData) -> None:
        for dtype, names in self.fields.items():
            flat, start = np.asarray(packed[dtype]), 0
            for name in names:
                target = getattr(data, name)
                target[...] = flat[start : start + target.size].reshape(target.shape)
                start += target.size


def capture(env: gym.Env, derived: Optional[Derived], integration: Optional[np.ndarray] = None) -> EnvState:
    """env's state (module docstring). `integration` replaces the MjData's own integration state and then no
    derived field is kept (derived None): the batch-stepped envs (ppo_ddp/env_group.py) keep their state in a row,
    and their steps read no derived field before simulating."""
    u = env.unwrapped
    if integration is None:
        integration = np.zeros(mujoco.mj_stateSize(u.model, INTEGRATION))
        mujoco.mj_getState(u.model, u.data, integration, INTEGRATION)
    limit = time_limit(env)
    return {
        "integration": np.array(integration, dtype=np.float64),
        "derived": derived.pack(u.data) if derived is not None else None,
        "rng": u.np_random.bit_generator.state,
        "elapsed": None if limit is None else limit._elapsed_steps,
    }


def restore(env: gym.Env, state: EnvState, derived: Optional[Derived]) -> None:
    """Put a captured state into env (one made by the same `make_env` call as the captured one); `derived` is the
    env's model's layout (None: the state has no derived arrays, or they are not needed)."""
    u = env.unwrapped
    if state["derived"] is not None and derived is not None:
        derived.unpack(state["derived"], u.data)
    mujoco.mj_setState(u.model, u.data, np.asarray(state["integration"], dtype=np.float64), INTEGRATION)
    u.np_random.bit_generator.state = state["rng"]
    limit = time_limit(env)
    if limit is not None:
        limit._elapsed_steps = state["elapsed"]
    for wrapper in _wrappers(env):  # restored mid-episode: no reset first, and the first-call checks are done
        if isinstance(wrapper, OrderEnforcing):
            wrapper._has_reset = True
        elif isinstance(wrapper, PassiveEnvChecker):
            wrapper.checked_reset = wrapper.checked_step = wrapper.checked_data_reuse = True
