"""Videos: the camera follows the robot (issue 14). Rendering runs in a subprocess with MUJOCO_GL=egl, since the
GL backend is chosen when MuJoCo first renders in a process; without a renderer the test is skipped, saying why."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parent.parent
ENVS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]

# The robot moved 30 m along x after the episode's first frame (its free joint's or slider's first coordinate): the
# pixels that change when its geoms are hidden (moved to a geom group the renderer does not draw) are where it is
# in the picture.
IN_VIEW = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from ppo_ddp.envs.make import make_video_env
    try:
        env = make_video_env(sys.argv[1])
        env.reset(seed=0)
        env.render()
    except Exception as e:
        print(json.dumps({"skip": f"{type(e).__name__}: {e}"})); raise SystemExit(0)
    u = env.unwrapped
    qpos = u.data.qpos.copy(); qpos[0] += 30.0
    u.set_state(qpos, u.data.qvel.copy())
    robot = env.render().astype(np.int16)
    u.model.geom_group[u.model.geom_bodyid != 0] = 5
    empty = env.render().astype(np.int16)
    print(json.dumps({"changed": float((np.abs(robot - empty).sum(-1) > 30).mean())}))
    """
)


@functools.cache  # one run per env and session: the Hopper one also tells renderer_here whether this machine renders
def in_view(env_id: str) -> subprocess.CompletedProcess:
    """IN_VIEW's process for env_id (a process each: the GL backend is chosen at the first render, and MuJoCo's
    renderer did not hide a second env's geoms in one process)."""
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", IN_VIEW, env_id], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


@pytest.mark.parametrize("env_id", ENVS)
def test_the_video_camera_keeps_the_robot_in_view(env_id):
    proc = in_view(env_id)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(f"no MuJoCo renderer here: {result['skip']}")
    assert result["changed"] > 0.01, result  # the robot, 30 m from where the episode started, is in the picture


# The evaluation's first episode replayed from the best checkpoint (the policy of the run's only evaluation): its
# last state rendered with and without the robot, against the video's decoded last frame where the robot is.
LAST_FRAME = textwrap.dedent(
    """
    import json, sys
    import imageio.v3 as iio
    import numpy as np
    import torch
    from ppo_ddp.envs.make import make_video_env
    from ppo_ddp.evaluation.playback import load_policy
    from ppo_ddp.evaluation.evaluator import eval_seed, play_episodes
    torch.set_num_threads(1)
    model, obs_rms, cfg = load_policy(sys.argv[1])
    video = iio.imread(sys.argv[2])
    env = make_video_env(cfg.env_id, **cfg.env_kwargs)  # the run's frame size and episode limit
    ((_, length),) = play_episodes(env, model, obs_rms, cfg.obs_clip, 1, eval_seed(cfg.seed))
    robot = env.render().astype(np.int16)
    u = env.unwrapped
    u.model.geom_group[u.model.geom_bodyid != 0] = 5
    empty = env.render().astype(np.int16)
    last = video[-1].astype(np.int16)
    where = np.abs(robot - empty).sum(-1) > 30  # the pixels of the robot
    error = lambda render: float(np.abs(last - render)[where].mean())  # the video's lossy colours, there
    print(json.dumps({"frames": len(video), "length": length, "shape": list(video.shape[1:]),
                      "robot_pixels": float(where.mean()), "vs_robot": error(robot), "vs_empty": error(empty)}))
    """
)


# Frames of 240 x 240 (MujocoEnv's width and height) and episodes of at most 50 steps: a software renderer draws
# gymnasium's default 480 x 480 about 4x slower, each frame costs EGL's software renderer here ~0.1 s of CPU (the
# evaluated episode would run ~90 steps), and the options reach the evaluator's video env this way.
VIDEO_OPTIONS = {"width": 240, "height": 240, "max_episode_steps": 50}


def train_with_video(tmp_path: Path, gl: str | None, *flags: str):
    from test_train import SMALL

    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")}
    env.update(PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", **({"MUJOCO_GL": gl} if gl else {}))
    args = [*SMALL, "--total-timesteps", "192", "--eval-interval", "2", "--eval-episodes", "2", "--capture-video"]
    args += ["--env-kwargs", json.dumps(VIDEO_OPTIONS)]
    args += ["--runs-dir", str(tmp_path), "--run-name", "v", *flags]
    cmd = [sys.executable, "train.py", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def renderer_here() -> bool:
    proc = in_view("Hopper-v5")
    return proc.returncode == 0 and "skip" not in proc.stdout


# A GRU policy's video: the recorded episode carries the policy's state step by step, as the replay does, so the
# replay ends where the video does only if both start from a zero state and step it alike.
GRU = ["--policy", "gru", "--seq-length", "4", "--rnn-hidden-size", "8", "--hidden-sizes", "16"]


@pytest.mark.parametrize("flags", [[], GRU], ids=["mlp", "gru"])
def test_capture_video_records_an_evaluation_episode_with_the_robot_in_its_last_frame(tmp_path, flags):
    pytest.importorskip("moviepy", reason="pip install -e '.[video]'")
    proc = train_with_video(tmp_path, os.environ.get("MUJOCO_GL"), *flags)  # unset: egl, the headless default
    if not renderer_here():  # the other outcome the issue allows: a refusal at start
        assert proc.returncode == 2 and "capture_video=True: MuJoCo cannot render here" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    (video,) = sorted((tmp_path / "v" / "videos").glob("*.mp4"))
    assert video.name == "eval_000000192.mp4"  # the evaluation of round 2, at its global step
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), PYTHONPATH=str(ROOT))
    check = subprocess.run(
        [sys.executable, "-c", LAST_FRAME, str(tmp_path / "v" / "model_v_best.pt"), str(video)],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr[-3000:]
    result = json.loads(check.stdout.strip().splitlines()[-1])
    assert result["frames"] == result["length"] + 1 and result["shape"] == [240, 240, 3], result  # reset + steps
    assert result["length"] <= VIDEO_OPTIONS["max_episode_steps"], result
    # where the robot is at the episode's end, the last frame shows the robot, not the floor behind it
    assert result["robot_pixels"] > 0.01 and result["vs_robot"] < result["vs_empty"] / 4, result
    events = EventAccumulator(str(tmp_path / "v"), size_guidance={"images": 0})
    events.Reload()
    (preview,) = events.Images("eval/video")
    assert preview.step == 192 and preview.encoded_image_string.startswith(b"GIF89a")


def test_capture_video_without_a_renderer_refuses_at_start(tmp_path):
    pytest.importorskip("moviepy", reason="pip install -e '.[video]'")
    # GLFW without a display: MuJoCo imports and simulates (the run could train), but cannot render
    proc = train_with_video(tmp_path, "glfw")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: capture_video=True: MuJoCo cannot render here")
    assert "MUJOCO_GL=glfw" in lines[0] and "apt install libegl1" in lines[0]
    assert "iter " not in proc.stdout and not (tmp_path / "v" / "metrics.csv").read_text().strip()  # no round ran


# evaluate --gif: the first episode's first 5 s at 20 frames a second (Hopper steps 125 times a second)
GIF_CHECK = textwrap.dedent(
    """
    import json, sys
    from PIL import Image
    from ppo_ddp.evaluate import main
    main([sys.argv[1], "--episodes", "2", "--gif", sys.argv[2]])
    gif = Image.open(sys.argv[2])
    print(json.dumps({"frames": gif.n_frames, "size": list(gif.size), "duration": gif.info["duration"],
                      "loop": gif.info.get("loop")}))
    """
)


def test_evaluate_gif_writes_the_first_episodes_start_as_a_looping_gif(tmp_path):
    from test_export import make_checkpoint

    from ppo_ddp.evaluation.evaluator import play_episodes
    from ppo_ddp.evaluation.playback import load_policy

    checkpoint = make_checkpoint(tmp_path / "model.pt", "mlp")
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", GIF_CHECK, str(checkpoint), str(tmp_path / "a" / "hopper.gif")],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    if not renderer_here():
        assert proc.returncode == 2 and "--gif: MuJoCo cannot render here" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    gif = json.loads(proc.stdout.strip().splitlines()[-1])
    model, obs_rms, cfg = load_policy(checkpoint)
    (_, length), _ = play_episodes(make_env_for(cfg), model, obs_rms, cfg.obs_clip, 2, 12345)
    # the reset's frame, then one at each step that passes the next 50 ms (8 ms a step: steps 7, 13, 19, 25, ...)
    assert gif["frames"] == min(1 + sum(math.ceil(6.25 * k) <= length for k in range(1, 100)), 100), (gif, length)
    assert gif["size"] == [160, 160] and gif["duration"] == 50 and gif["loop"] == 0, gif  # 20 frames a second
    # the recording changes no episode: the returns printed are evaluate's without it
    printed = float(proc.stdout.split("mean return ")[1].split()[0])
    plain = [r for r, _ in play_episodes(make_env_for(cfg), model, obs_rms, cfg.obs_clip, 2, 12345)]
    assert printed == pytest.approx(sum(plain) / 2, abs=0.06)


def make_env_for(cfg):
    from ppo_ddp.envs.make import make_env

    return make_env(cfg.env_id, **cfg.env_kwargs)


class Clock(gym.Env):
    """An env at 125 steps a second whose frame shows its step count (the pixel at 0, 0), never ending by itself."""

    metadata = {"render_fps": 125}
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,))
    action_space = gym.spaces.Box(-1.0, 1.0, (1,))

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 0.0, False, self.t >= 1000, {}

    def render(self):
        frame = np.zeros((480, 320, 3), np.uint8)
        frame[:48, :48] = self.t % 256  # a block the shrink keeps whole
        return frame


def test_a_gif_keeps_a_frame_every_50_ms_of_the_first_episode_for_5_seconds(tmp_path):
    from PIL import Image

    from ppo_ddp.envs.video import EpisodeGif

    env = EpisodeGif(Clock())
    for _ in range(2):  # the second episode is not recorded
        env.reset()
        done = False
        while not done:
            *_, terminated, truncated, _ = env.step(np.zeros(1))
            done = terminated or truncated
    assert len(env.frames) == 100 and env.frames[0].shape == (160, 107, 3)  # longer side 160, aspect kept
    shown = [int(f[0, 0, 0]) for f in env.frames]
    assert shown == [math.ceil(6.25 * k) % 256 for k in range(100)]  # the step at or past k x 50 ms
    env.save(tmp_path / "clock.gif")
    gif = Image.open(tmp_path / "clock.gif")
    assert gif.n_frames == 100 and gif.info["duration"] == 50 and gif.info["loop"] == 0
