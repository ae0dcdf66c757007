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

A DeepMind Control Suite env through shimmy keeps the same in its dm_control `Environment` (the physics, the task's
random generator, its own step count and limit), with one difference: dm_control steps as mj_step2 then mj_step1,
so each step starts from what the previous one's mj_step1 computed at the current state, constraints included.
A restore therefore runs mj_step1 at the restored state, which computes exactly that again.

The state is a dict of numpy arrays and Python values (small to pickle through an actor's pipe); a checkpoint
stores its arrays as tensors (ppo_ddp/records/checkpointer.py), and `restore` takes either.
An env this module cannot capture (not a MuJoCo env, or wrapped in something other than gymnasium's own wrappers,
the partly observed envs' observation filter and the flattening of dm_control's observations) gives None.
tests/test_env_state.py steps every gymnasium MuJoCo v5 env on from a restored state and compares it with the
captured env's own continuation, bit for bit; tests/test_dmc.py does the same for dm_control's.
"""

from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium.envs.mujoco.mujoco_env import MujocoEnv
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

from ppo_ddp.envs.make import FlatDictObservation
from ppo_ddp.envs.partial import DropVelocities

EnvState = dict[str, Any]
INTEGRATION = mujoco.mjtState.mjSTATE_INTEGRATION
_STATELESS_WRAPPERS = (OrderEnforcing, PassiveEnvChecker, DropVelocities, FlatDictObservation)  # no state of theirs


def wrappers(env: gym.Env) -> list[gym.Wrapper]:
    """The wrappers around env, outermost first."""
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain


def time_limit(env: gym.Env) -> Optional[TimeLimit]:
    """The TimeLimit wrapper around env, or None."""
    return next((w for w in wrappers(env) if isinstance(w, TimeLimit)), None)


def _dm_control(env: gym.Env) -> Any:
    """The dm_control `Environment` inside a shimmy env, or None (shimmy and dm_control stay optional imports)."""
    inner = getattr(env.unwrapped, "_env", None)
    known = type(env.unwrapped).__name__ == "DmControlCompatibilityV0" and hasattr(inner, "_physics")
    return inner if known else None


def simulation(env: gym.Env) -> tuple[mujoco.MjModel, mujoco.MjData]:
    """The MjModel and MjData that a capturable env steps."""
    dm_env = _dm_control(env)
    if dm_env is not None:
        return dm_env._physics.model.ptr, dm_env._physics.data.ptr
    return env.unwrapped.model, env.unwrapped.data


def capturable(env: gym.Env) -> bool:
    """Whether env's whole state can be captured: a gymnasium MuJoCo env or a dm_control one through shimmy,
    wrapped only by wrappers whose state is known."""
    known = all(isinstance(w, (TimeLimit, *_STATELESS_WRAPPERS)) for w in wrappers(env))
    return known and (isinstance(env.unwrapped, MujocoEnv) or _dm_control(env) is not None)


def _rng_state(rng: Any) -> dict[str, Any]:
    """A Generator's bit-generator state, or a legacy RandomState's (dm_control's tasks) with its key as int64,
    which a checkpoint's tensors can hold."""
    if isinstance(rng, np.random.RandomState):
        state = rng.get_state(legacy=False)
        return {**state, "state": {**state["state"], "key": state["state"]["key"].astype(np.int64)}}
    return rng.bit_generator.state


def _set_rng_state(rng: Any, state: dict[str, Any]) -> None:
    if isinstance(rng, np.random.RandomState):
        key = np.asarray(state["state"]["key"]).astype(np.uint32)
        rng.set_state({**state, "state": {**state["state"], "key": key}})
    else:
        rng.bit_generator.state = state


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
    derived field is kept (derived None): the batch-stepped envs (ppo_ddp/envs/group.py) keep their state in a row,
    and their steps read no derived field before simulating."""
    model, data = simulation(env)
    if integration is None:
        integration = np.zeros(mujoco.mj_stateSize(model, INTEGRATION))
        mujoco.mj_getState(model, data, integration, INTEGRATION)
    limit, dm_env = time_limit(env), _dm_control(env)
    return {
        "integration": np.array(integration, dtype=np.float64),
        "derived": derived.pack(data) if derived is not None else None,
        "rng": _rng_state(env.unwrapped.np_random),
        "elapsed": None if limit is None else limit._elapsed_steps,
        # dm_control's own step count, and whether its time limit ended the episode (its next step is a reset)
        "dm_control": None if dm_env is None else [dm_env._step_count, dm_env._reset_next_step],
    }


def restore(env: gym.Env, state: EnvState, derived: Optional[Derived]) -> None:
    """Put a captured state into env (one made by the same `make_env` call as the captured one); `derived` is the
    env's model's layout (None: the state has no derived arrays, or they are not needed)."""
    model, data = simulation(env)
    if state["derived"] is not None and derived is not None:
        derived.unpack(state["derived"], data)
    mujoco.mj_setState(model, data, np.asarray(state["integration"], dtype=np.float64), INTEGRATION)
    _set_rng_state(env.unwrapped.np_random, state["rng"])
    dm_env = _dm_control(env)
    if dm_env is not None:
        dm_env._step_count, dm_env._reset_next_step = int(state["dm_control"][0]), bool(state["dm_control"][1])
        if dm_env._physics.legacy_step:  # its next step starts with mj_step2: what mj_step1 left at this state
            mujoco.mj_step1(model, data)
    limit = time_limit(env)
    if limit is not None:
        limit._elapsed_steps = state["elapsed"]
    for wrapper in wrappers(env):  # restored mid-episode: no reset first, and the first-call checks are done
        if isinstance(wrapper, OrderEnforcing):
            wrapper._has_reset = True
        elif isinstance(wrapper, PassiveEnvChecker):
            wrapper.checked_reset = wrapper.checked_step = wrapper.checked_data_reuse = True
