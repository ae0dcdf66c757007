"""Creating gymnasium envs: the one place that calls gym.make, so every process builds envs the same way.

Actors, the evaluator, `python -m ppo_ddp.evaluate`, videos and the trainer's probe all get their envs from
`make_env` / `make_video_env`, so an observation reaches the policy in one shape everywhere; each passes the run's
env_kwargs (the env's options, checked by `env_problems` through ppo_ddp/envs/options.py). DeepMind Control Suite
tasks (`dm_control/<domain>-<task>-v0`, registered by shimmy; the dmc extra) observe a Dict of arrays: it is
flattened here (`FlatDictObservation`) into one float32 vector, the entries in sorted key order.
"""

from __future__ import annotations

import ctypes.util
import importlib
import importlib.util
import os
import sys
import warnings
from typing import Any, Optional

import gymnasium as gym
import numpy as np

from ppo_ddp.envs.options import options_problem
from ppo_ddp.envs.partial import FULL_OBS_KEY, PARTLY_OBSERVED

# Deprecations inside gymnasium's own MuJoCo XML assets: nothing a user can act on, and printed once
# per env per process they would bury the training log.
_SILENCED_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)

DM_CONTROL_NAMESPACE = "dm_control/"
"""The gymnasium namespace shimmy registers the DeepMind Control Suite under: dm_control/cheetah-run-v0."""
DM_CONTROL_INSTALL = (  # pyproject.toml's dmc extra, spelled out: a wheel's user has no checkout to `pip install -e`
    "pip install mujoco==3.17.0 dm-control==1.0.50 'shimmy[dm-control]==2.0.1' (after pip uninstall -y mujoco "
    "mujoco-core mujoco-studio)"
)
"""What installs dm_control and shimmy at versions that work together (it pins mujoco 3.17.0; docs/usage.md)."""


def _mujoco_warning(message: str) -> None:
    if not message.startswith(_SILENCED_MUJOCO_WARNINGS):
        print(f"MuJoCo warning: {message}", file=sys.stderr)


def _install_mujoco_warning_filter() -> None:
    try:
        import mujoco
    except ImportError:  # a non-MuJoCo env: nothing to filter
        return
    mujoco.set_mju_user_warning(_mujoco_warning)


def is_dm_control(env_id: str) -> bool:
    """A DeepMind Control Suite id (`dm_control/...`, or `shimmy:dm_control/...`)."""
    return env_id.split(":", 1)[-1].startswith(DM_CONTROL_NAMESPACE)


def missing_dm_control() -> Optional[str]:
    """What to install when dm_control or shimmy is missing, else None."""
    missing = [m for m in ("dm_control", "shimmy") if importlib.util.find_spec(m) is None]
    return f"needs {' and '.join(missing)}: {DM_CONTROL_INSTALL}" if missing else None


def _choose_dm_control_gl() -> None:
    """dm_control picks its OpenGL backend once, when first imported (gymnasium's robots pick theirs at their first
    render). Without a display its default, GLFW, warns in every process and cannot render; so there, unless the
    user chose, EGL (video.choose_gl's choice for renders), where the machine has it: dm_control's import fails on
    a backend it cannot load, and training needs no renderer."""
    headless = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if "MUJOCO_GL" not in os.environ and headless and ctypes.util.find_library("EGL"):
        os.environ["MUJOCO_GL"] = "egl"


def _register_dm_control() -> None:
    """shimmy registers the dm_control ids when imported; gymnasium does not import it by itself."""
    _choose_dm_control_gl()
    # catch_warnings restores the filters dm_control.composer changes when imported (simplefilter "always" for
    # DeprecationWarning): every library's deprecations would print, in every actor
    with warnings.catch_warnings():
        import shimmy  # noqa: F401


class FlatDictObservation(gym.ObservationWrapper):
    """A Dict observation of Boxes as one float32 Box: each entry flattened (C order, a scalar as one value), the
    entries concatenated in sorted key order. Sorted, not the order the env lists them in: a checkpoint then reads
    the same vector whatever order a shimmy version gives (gymnasium's Dict sorts the keys of a plain dict, which
    is how shimmy 2.0.1 builds it, so the two agree today). float32 like the policy's input; the actors keep their
    own float64 copy for the statistics either way."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        spaces = env.observation_space.spaces
        self.keys = sorted(spaces)
        low = np.concatenate([np.asarray(spaces[k].low, dtype=np.float32).reshape(-1) for k in self.keys])
        high = np.concatenate([np.asarray(spaces[k].high, dtype=np.float32).reshape(-1) for k in self.keys])
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation: dict[str, Any]) -> np.ndarray:
        return np.concatenate([np.asarray(observation[k], dtype=np.float32).reshape(-1) for k in self.keys])


def _dict_of_boxes(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Dict) and all(isinstance(s, gym.spaces.Box) for s in space.spaces.values())


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """gym.make(env_id) with MuJoCo's asset deprecation warnings filtered out; shimmy imported for a dm_control
    id, and a Dict observation of Boxes flattened (FlatDictObservation)."""
    if is_dm_control(env_id):
        _register_dm_control()
    _install_mujoco_warning_filter()  # after dm_control's import, which installs its own (an absl log line each)
    env = gym.make(env_id, **kwargs)
    return FlatDictObservation(env) if _dict_of_boxes(env.observation_space) else env


def env_problems(env_id: str, env_kwargs: Optional[dict[str, Any]] = None) -> tuple[Optional[str], Optional[str]]:
    """(why PPO here cannot train on env_id: not registered, not creatable, not continuous; why env_kwargs cannot
    be given to it: options_problem's reasons, or gymnasium's error creating it with them), at most one not None."""
    if is_dm_control(env_id):  # before any import of shimmy (`shimmy:dm_control/...`): it picks the GL backend
        if problem := missing_dm_control():
            return problem, None
        _register_dm_control()
    registered_id = env_id
    if ":" in env_id:  # "module:Env-v0": gym.make imports the module that registers the env; so do we
        module, registered_id = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as e:
            return f"cannot import module {module!r} ({e})", None
    try:
        gym.spec(registered_id)
    except gym.error.Error as e:
        return f"not a registered gymnasium env ({str(e).splitlines()[0]})", None
    if env_kwargs and (problem := options_problem(env_id, env_kwargs)):
        return None, problem
    try:
        env = make_env(env_id, **(env_kwargs or {}))
    except Exception as e:  # missing mujoco, bad kwargs: the user needs the reason, not a traceback
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if env_kwargs:
            return None, f"gymnasium could not create {env_id} with them: {reason}"
        # dm_control 1.0.50 on mujoco 4.0.0 fails here (MjModel has no flex_vertedge): the pins fix that
        hint = f"; {DM_CONTROL_INSTALL} pins versions that work together" if is_dm_control(env_id) else ""
        return f"gymnasium could not create it: {reason}{hint}", None
    try:
        if not isinstance(env.action_space, gym.spaces.Box):
            return f"action space is {env.action_space}; PPO here needs a continuous Box", None
        if not isinstance(env.observation_space, gym.spaces.Box):
            return f"observation space is {env.observation_space}; a Box (or a Dict of Boxes) is needed", None
    finally:
        env.close()
    return None, None


def env_problem(env_id: str, env_kwargs: Optional[dict[str, Any]] = None) -> Optional[str]:
    """Why PPO here cannot train on env_id made with env_kwargs (env_problems' reasons as one), or None."""
    id_problem, options = env_problems(env_id, env_kwargs)
    return id_problem or (f"env_kwargs={env_kwargs!r}: {options}" if options else None)


def critic_observation(info: dict[str, Any], key: str) -> np.ndarray:
    """info[key] as the critic's observation vector (float64, flattened); ValueError naming the key when an env
    does not provide one."""
    if key not in info:
        raise ValueError(f'the env gave no info["{key}"]')
    value = np.asarray(info[key], dtype=np.float64).reshape(-1)
    if value.size == 0:
        raise ValueError(f'info["{key}"] is empty')
    return value


def critic_obs_dim(env: gym.Env, key: str) -> int:
    """The width of env's privileged observation info[key], read from a reset (seed 0); ValueError with the reason
    the critic cannot read one (the env does not provide the key, or not as numbers)."""
    _, info = env.reset(seed=0)
    try:
        return int(critic_observation(info, key).size)
    except (ValueError, TypeError) as e:
        partly = ", ".join(sorted(PARTLY_OBSERVED))
        raise ValueError(f'{e} at reset; the partly observed envs ({partly}) give "{FULL_OBS_KEY}"') from None


def critic_obs_problem(env_id: str, key: str, env_kwargs: Optional[dict[str, Any]] = None) -> Optional[str]:
    """Why a critic cannot read env_id's info[key] (critic_obs_dim's reason), or None."""
    env = make_env(env_id, **(env_kwargs or {}))
    try:
        critic_obs_dim(env, key)
    except ValueError as e:
        return str(e)
    finally:
        env.close()
    return None


TRACKING_CAMERA = "track"
"""The camera of gymnasium's MuJoCo robots that follows the centre of mass (every v5 locomotion env has one)."""


def dm_control_camera(model: Any) -> int:
    """The camera of a dm_control model that keeps the robot in view: the first that follows a body's centre of
    mass (cheetah's and walker's "side", hopper's "cam0", humanoid's "back"), else the model's first (a task that
    stays in place: cartpole's, reacher's "fixed"), else the free camera (-1)."""
    import mujoco

    modes = [int(mode) for mode in model.cam_mode]
    follows = int(mujoco.mjtCamLight.mjCAMLIGHT_TRACKCOM)
    return modes.index(follows) if follows in modes else (0 if modes else -1)


def make_video_env(env_id: str, **kwargs: Any) -> gym.Env:
    """An env that renders rgb_array frames in which the robot stays in view for the whole episode; kwargs are the
    env's options (env_kwargs).

    gymnasium's default MuJoCo view is a free camera that stays where the episode started: a running HalfCheetah
    leaves the picture within ~100 steps. The robots' own "track" camera follows the centre of mass; an env without
    one (another MJCF model may have none) renders from the free camera, a camera the options name from that one,
    and a non-MuJoCo env (which takes no camera) as it does by default. A dm_control task renders from
    `dm_control_camera`'s choice.
    """
    if is_dm_control(env_id):
        env = make_env(env_id, render_mode="rgb_array", **kwargs)
        base = env.unwrapped
        base.render_kwargs = {**base.render_kwargs, "camera_id": dm_control_camera(base.physics.model)}
        # shimmy 2.0.1 says render_fps = control timestep * 1000 (cheetah: 10 for 100 steps a second): the video
        # would play 10x slow; one frame per step is 1 / dt frames a second
        base.metadata = {**base.metadata, "render_fps": 1.0 / base.dt}
        return env
    if "camera_id" in kwargs or "camera_name" in kwargs:
        return make_env(env_id, render_mode="rgb_array", **kwargs)
    try:
        return make_env(env_id, render_mode="rgb_array", camera_name=TRACKING_CAMERA, **kwargs)
    except TypeError:  # not a MuJoCo env: no camera_name argument
        return make_env(env_id, render_mode="rgb_array", **kwargs)


def env_seed(seed: int, rank: int, env: int) -> int:
    """A distinct, deterministic 32-bit seed for every env of a run, from (seed, rank, env): env is the env's index
    in its rank's round, whichever actor steps it (ppo_ddp/sampling/split.py)."""
    return int(np.random.SeedSequence([seed, rank, env]).generate_state(1)[0])


def bounds_problem(env_id: str, env_kwargs: Optional[dict[str, Any]] = None) -> Optional[str]:
    """Why a bounded action distribution cannot act on env_id (bounds that are not finite, or a dimension whose
    low is not below its high), or None."""
    env = make_env(env_id, **(env_kwargs or {}))
    try:
        low, high = env.action_space.low, env.action_space.high
    finally:
        env.close()
    if not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
        return f"a bounded distribution needs finite action bounds with low < high; the env's are {low} .. {high}"
    return None
