"""Videos of episodes: an env wrapper that writes the episodes it is asked to as mp4 files.

Frames go to ffmpeg one at a time (moviepy's writer), so a 1000-step episode never sits in memory at full size; a
shrunken copy of it is kept as a preview for TensorBoard, which shows videos as animated GIFs. moviepy is optional:
only a process that records imports it. MuJoCo renders through an OpenGL backend chosen by MUJOCO_GL when a
process first renders; without a display its default (glfw) cannot work, so `choose_gl` picks EGL there unless the
user chose. The env should come from `envs.make_video_env`, whose camera follows the robot.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from pathlib import Path
from typing import Any, Optional

import gymnasium as gym
import numpy as np

HEADLESS_GL = "egl"
"""MUJOCO_GL where there is no display and the user set none (OSMesa, the CPU fallback, is much slower)."""
PREVIEW_SIDE = 120
"""The preview's frames are shrunk to about this many pixels a side."""
PREVIEW_FRAMES = 100
"""At most this many frames, evenly spaced over the episode, make the preview (a GIF of ~1 MB)."""
GIF_SIDE = 160
GIF_SECONDS = 5.0
GIF_FPS = 20
"""`evaluate --gif`: the episode's first GIF_SECONDS (simulated time), frames shrunk to about GIF_SIDE pixels a side,
GIF_FPS of them a second (a frame lasts 50 ms: GIF counts in hundredths of a second, so it plays in real time): a loop
of the robot in motion under 1 MB, for a README."""
INSTALL_HINT = (
    "a headless machine needs EGL (apt install libegl1; MUJOCO_GL=egl, the default without a display) or OSMesa "
    "(apt install libosmesa6, then set MUJOCO_GL=osmesa)"
)


def choose_gl() -> str:
    """MUJOCO_GL for this process's renders: the user's, else egl when there is no display; returns it."""
    if "MUJOCO_GL" not in os.environ and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ["MUJOCO_GL"] = HEADLESS_GL
    return os.environ.get("MUJOCO_GL", "glfw")


def render_problem(env: gym.Env) -> Optional[str]:
    """Why env cannot render a frame here, with what to install, or None. Resets env."""
    gl = choose_gl()
    try:
        with warnings.catch_warnings():  # a backend's warnings (GLFW's) before its error: the error says it
            warnings.simplefilter("ignore")
            env.reset(seed=0)
            frame = env.render()
    except Exception as e:  # the GL backend's own error, whatever its type
        reason = str(e).strip().splitlines()
        return f"MuJoCo cannot render here (MUJOCO_GL={gl}: {type(e).__name__}: {reason[0] if reason else ''}); " + (
            INSTALL_HINT
        )
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        return f"the env rendered {type(frame).__name__}, not an RGB frame (MUJOCO_GL={gl})"
    return None


class EpisodeVideo(gym.Wrapper):
    """Writes the episode that follows `record_next(path)` to path (mp4) and keeps its preview (`take_preview`);
    after `record_all(folder)`, every episode, as folder/episode_<k>.mp4."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.fps = float(env.metadata.get("render_fps") or 30)
        self._next: Optional[Path] = None
        self._folder: Optional[Path] = None
        self._episodes = 0
        self._writer: Any = None
        self._shrunk: list[np.ndarray] = []

    def record_next(self, path: Path) -> None:
        self._next = Path(path)

    def record_all(self, folder: Path) -> None:
        self._folder = Path(folder)

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        self._close_writer()
        obs, info = self.env.reset(**kwargs)
        if self._folder is not None:
            self._next, self._episodes = self._folder / f"episode_{self._episodes}.mp4", self._episodes + 1
        if self._next is not None:
            self._open(self._next)
            self._next = None
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._writer is not None:
            self._add_frame()
            if terminated or truncated:
                self._close_writer()
        return obs, reward, terminated, truncated, info

    def take_preview(self) -> tuple[np.ndarray, float]:
        """The last recorded episode shrunk, at most PREVIEW_FRAMES evenly spaced frames (T, H, W, 3 uint8), and
        the frame rate that plays it in real time."""
        frames, self._shrunk = self._shrunk, []
        if not frames:
            return np.zeros((0, 1, 1, 3), np.uint8), self.fps
        keep = np.unique(np.linspace(0, len(frames) - 1, min(len(frames), PREVIEW_FRAMES)).round().astype(int))
        return np.stack([frames[i] for i in keep]), self.fps * len(keep) / len(frames)

    def close(self) -> None:
        self._close_writer()
        super().close()

    def _open(self, path: Path) -> None:
        from moviepy.video.io.ffmpeg_writer import FFMPEG_VideoWriter

        path.parent.mkdir(parents=True, exist_ok=True)
        first = self.env.render()
        height, width = first.shape[:2]
        # one encoder thread: the evaluator shares the machine with the actors and learners
        self._writer = FFMPEG_VideoWriter(str(path), (width, height), self.fps, threads=1)
        self._shrunk = []
        self._add_frame(first)

    def _add_frame(self, frame: Optional[np.ndarray] = None) -> None:
        frame = self.env.render() if frame is None else frame
        self._writer.write_frame(frame)
        self._shrunk.append(shrink(frame, PREVIEW_SIDE))

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class EpisodeGif(gym.Wrapper):
    """Keeps the first episode's first GIF_SECONDS as shrunk frames and writes them as a looping GIF (`save`).

    A frame is kept each time the simulated clock passes the next 1 / GIF_FPS s (the reset's frame at 0), so a
    Hopper stepping at 125 Hz keeps steps 7, 13, 19, 25, ... and plays in real time; only kept frames are rendered.
    An env slower than GIF_FPS keeps every step at its own rate."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.env_fps = float(env.metadata.get("render_fps") or 30)
        self.fps = min(float(GIF_FPS), self.env_fps)
        self.max_frames = max(1, round(GIF_SECONDS * self.fps))
        self.frames: list[np.ndarray] = []
        self._steps, self._recording = 0, False

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self._recording, self._steps = not self.frames, 0  # the first episode only
        if self._recording:
            self._keep()
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._steps += 1
        # the k-th frame after the reset's shows the first step at or past k / fps seconds
        if self._recording and self._steps >= math.ceil(len(self.frames) * self.env_fps / self.fps - 1e-9):
            self._keep()
        if terminated or truncated:
            self._recording = False
        return obs, reward, terminated, truncated, info

    def save(self, path: str | Path) -> int:
        """Write the kept frames to path as a GIF; returns its size in bytes."""
        data = gif_bytes(np.stack(self.frames), self.fps)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return len(data)

    def _keep(self) -> None:
        if len(self.frames) >= self.max_frames:
            self._recording = False
            return
        self.frames.append(shrink(self.env.render(), GIF_SIDE))


def shrink(frame: np.ndarray, side: int) -> np.ndarray:
    """frame (H, W, 3 uint8) resized so that its longer side is about `side` pixels (antialiased)."""
    from PIL import Image

    scale = side / max(frame.shape[:2])
    if scale >= 1:
        return frame
    height, width = max(1, round(frame.shape[0] * scale)), max(1, round(frame.shape[1] * scale))
    return np.asarray(Image.fromarray(frame).resize((width, height), Image.Resampling.LANCZOS))


def gif_bytes(frames: np.ndarray, fps: float) -> bytes:
    """An animated GIF (looping) of frames (T, H, W, 3 uint8): what TensorBoard shows as a video."""
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    out = io.BytesIO()
    duration = max(20, round(1000 / fps))  # ms per frame; browsers slow down GIFs faster than 50 frames/s
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0)
    return out.getvalue()
