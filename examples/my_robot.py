"""A robot of your own as a gymnasium env class of your own: the trotter of examples/robots/trotter.xml, taught to
run at a speed you choose (docs/usage.md, "Train your own robot").

Importing this module registers `MyRobot-v0`; ppo_ddp imports it in every process when the env id names the
module, `module:Id` (run from the repository's root, where `examples` is importable):

    python train.py --env-id examples.my_robot:MyRobot-v0 --env-kwargs '{"target_speed": 1.5}'

The keywords of `MyRobotEnv.__init__` are the env's options (`--env-kwargs`), checked against their defaults'
types before training starts; MujocoEnv's own (width, height, camera_name, ...) pass through `**kwargs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

MODEL = Path(__file__).resolve().parent / "robots" / "trotter.xml"
ENV_ID = "MyRobot-v0"


class MyRobotEnv(MujocoEnv):
    """The trotter rewarded for running at `target_speed` (m/s): each step earns exp(-((speed - target_speed) /
    speed_tolerance)^2), 1 at the target speed and 0.02 standing still at the default 1 m/s, less the control cost.
    An episode ends when the torso's height leaves healthy_z_range or its pitch exceeds max_pitch (radians), and
    after 1000 steps (20 s). The observation is Walker2d's: qpos without the forward position, then qvel clipped
    to [-10, 10]."""

    metadata = {"render_modes": ["human", "rgb_array", "depth_array", "rgbd_tuple"]}  # render_fps: from dt

    def __init__(
        self,
        xml_file: str = str(MODEL),
        frame_skip: int = 5,
        target_speed: float = 1.0,
        speed_tolerance: float = 0.5,
        ctrl_cost_weight: float = 0.01,
        healthy_z_range: tuple[float, float] = (0.25, 1.0),
        max_pitch: float = 0.8,
        reset_noise_scale: float = 0.01,
        **kwargs: Any,
    ) -> None:
        self.target_speed, self.speed_tolerance = target_speed, speed_tolerance
        self.ctrl_cost_weight, self.reset_noise_scale = ctrl_cost_weight, reset_noise_scale
        self.healthy_z_range, self.max_pitch = tuple(healthy_z_range), max_pitch
        super().__init__(xml_file, frame_skip, observation_space=None, **kwargs)
        self.metadata = {**self.metadata, "render_fps": int(np.round(1.0 / self.dt))}
        size = self.model.nq - 1 + self.model.nv
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(size,), dtype=np.float64)

    def _observation(self) -> np.ndarray:
        return np.concatenate([self.data.qpos[1:], np.clip(self.data.qvel, -10, 10)])

    def _healthy(self) -> bool:
        height, pitch = self.data.qpos[1], self.data.qpos[2]
        low, high = self.healthy_z_range
        return bool(low < height < high and abs(pitch) < self.max_pitch)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        x_before = self.data.qpos[0]
        self.do_simulation(action, self.frame_skip)
        speed = (self.data.qpos[0] - x_before) / self.dt
        tracking = float(np.exp(-(((speed - self.target_speed) / self.speed_tolerance) ** 2)))
        ctrl_cost = self.ctrl_cost_weight * float(np.sum(np.square(action)))
        if self.render_mode == "human":
            self.render()
        info = {"x_velocity": speed, "reward_tracking": tracking, "reward_ctrl": -ctrl_cost}
        return self._observation(), tracking - ctrl_cost, not self._healthy(), False, info

    def reset_model(self) -> np.ndarray:
        noise = self.reset_noise_scale
        qpos = self.init_qpos + self.np_random.uniform(-noise, noise, self.model.nq)
        qvel = self.init_qvel + self.np_random.uniform(-noise, noise, self.model.nv)
        self.set_state(qpos, qvel)
        return self._observation()


if ENV_ID not in gym.registry:  # imported again by every actor process: register once per process
    gym.register(ENV_ID, entry_point=MyRobotEnv, max_episode_steps=1000)
