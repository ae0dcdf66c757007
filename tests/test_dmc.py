"""DeepMind Control Suite tasks through shimmy (the dmc extra, issue 27): the factory's flattening, the
1000-step time limit as a truncation, the video camera, and a short run that trains, saves and evaluates.

dm_control needs mujoco 3.17.0, so CI runs this file in a second step with the dmc extra's pins installed in a
folder of its own (`PYTHONPATH=.dmc-site`, .ci/run); in the main step, on mujoco 4.0.0, it is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("dm_control", reason="needs the dmc extra of pyproject.toml")
# Not importorskip("shimmy"): importing shimmy imports dm_control's renderer, which picks its OpenGL backend then,
# once; the factory chooses it first (ppo_ddp/envs/make.py), as it does in every training process.
if importlib.util.find_spec("shimmy") is None:
    pytest.skip("needs shimmy: the dmc extra of pyproject.toml", allow_module_level=True)

from ppo_ddp.configuration.config import Config
from ppo_ddp.configuration.loading import load_yaml_defaults
from ppo_ddp.configuration.validation import validate
from ppo_ddp.envs.make import make_env, make_video_env

ROOT = Path(__file__).resolve().parent.parent


def test_observations_are_the_task_s_arrays_in_sorted_key_order():
    env = make_env("dm_control/walker-walk-v0")
    task, physics = env.unwrapped.task, env.unwrapped.physics
    obs, _ = env.reset(seed=7)
    for t in range(3):
        raw = task.get_observation(physics)  # the dict the task built for this state, in dm_control's order
        assert list(raw) == ["orientations", "height", "velocity"]  # not sorted: the test would prove nothing
        expected = np.concatenate([np.ravel(raw[k]) for k in sorted(raw)]).astype(np.float32)
        np.testing.assert_array_equal(obs, expected)
        obs = env.step(np.full(env.action_space.shape, 0.3 * (t + 1)))[0]
    assert env.observation_space.shape == (24,) and obs.dtype == env.observation_space.dtype == np.float32
    assert np.shape(raw["height"]) == ()  # a scalar entry is one value of the vector
    env.close()


def test_an_episode_ends_at_step_1000_by_truncation_not_termination():
    env = make_env("dm_control/cheetah-run-v0")
    env.reset(seed=0)
    zero = np.zeros(env.action_space.shape)
    for step in range(1, 1001):
        _, _, terminated, truncated, _ = env.step(zero)
        assert not terminated, step  # PPO here bootstraps the value of a truncated episode, not of a terminated one
        assert truncated == (step == 1000), step
    env.close()


@pytest.mark.parametrize("env_id", ["dm_control/cheetah-run-v0", "dm_control/walker-walk-v0"])
def test_presets_are_valid_with_their_env(env_id):
    preset = ROOT / "ppo_ddp" / "configs" / f"dmc_{env_id.split('/')[1].removesuffix('-v0').replace('-', '_')}.yaml"
    cfg = Config(**load_yaml_defaults(preset))
    validate(cfg)
    assert cfg.env_id == env_id


def test_video_camera_is_the_one_that_follows_the_robot():
    env = make_video_env("dm_control/cheetah-run-v0")
    model = env.unwrapped.physics.model
    assert model.id2name(env.unwrapped.render_kwargs["camera_id"], "camera") == "side"
    assert env.metadata["render_fps"] == pytest.approx(100.0)  # a frame per 0.01 s step: the video plays in real time
    env.close()


# The cheetah moved 30 m along x (its root slider) after the episode's first frame: the pixels that change when its
# geoms are hidden (moved to a geom group the renderer does not draw) are where it is in the picture. A subprocess:
# the OpenGL backend is chosen once per process.
IN_VIEW = textwrap.dedent(
    """
    import json
    import numpy as np
    from ppo_ddp.envs.make import make_video_env
    try:
        env = make_video_env("dm_control/cheetah-run-v0")
        env.reset(seed=0)
        env.render()
    except Exception as e:
        print(json.dumps({"skip": f"{type(e).__name__}: {e}"})); raise SystemExit(0)
    physics = env.unwrapped.physics
    physics.data.qpos[0] += 30.0
    physics.forward()
    robot = env.render().astype(np.int16)
    physics.model.geom_group[physics.model.geom_bodyid != 0] = 5
    empty = env.render().astype(np.int16)
    print(json.dumps({"changed": float((np.abs(robot - empty).sum(-1) > 30).mean())}))
    """
)


def test_the_video_keeps_the_running_cheetah_in_view():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", IN_VIEW], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(f"no MuJoCo renderer here: {result['skip']}")
    assert result["changed"] > 0.01, result


def test_a_short_run_trains_saves_and_evaluates(run_train, tmp_path):
    # 3 rounds of 1 actor x 2 envs x 32 steps, then the evaluation after the last round (one 1000-step episode);
    # not compiled: the step's compilation (tests/test_train.py) would be most of the test's time
    proc = run_train(
        *("--env-id", "dm_control/cheetah-run-v0", "--total-timesteps", "192", "--actors-per-gpu", "1", "--no-compile"),
        *("--envs-per-actor", "2", "--rollout-length", "32", "--num-minibatches", "4", "--update-epochs", "1"),
        *("--eval-episodes", "1", "--runs-dir", str(tmp_path / "runs"), "--run-name", "dmc"),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "done:" in proc.stdout and "eval of round 2" in proc.stdout
    # dm_control changes the warning filters and logs MuJoCo warnings through absl when imported: both undone
    assert "DeprecationWarning" not in proc.stderr and "WARNING:absl" not in proc.stderr, proc.stderr[-3000:]
    checkpoint = tmp_path / "runs" / "dmc" / "model_dmc.pt"
    assert checkpoint.exists()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run(
        [sys.executable, "-m", "ppo_ddp.evaluate", str(checkpoint), "--episodes", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("dm_control/cheetah-run-v0: mean return"), out.stdout
    value = float(out.stdout.split("mean return")[1].split()[0])
    assert math.isfinite(value) and 0 <= value <= 1000  # 1000 steps of a reward in [0, 1]

    # ... and exports: the ONNX file, run by examples/play_exported.py (onnxruntime on the dict observations it
    # flattens itself, in the factory's order), scores what evaluate scored on the same episode
    pytest.importorskip("onnxruntime", reason="the export extra")
    onnx_file = tmp_path / "dmc.onnx"
    exported = subprocess.run(
        [sys.executable, "-m", "ppo_ddp.export", str(checkpoint), "--format", "onnx", "--output", str(onnx_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    played = subprocess.run(
        [sys.executable, "examples/play_exported.py", str(onnx_file), "--episodes", "1", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert played.returncode == 0, played.stderr[-3000:]
    assert json.loads(played.stdout) == pytest.approx([value], abs=0.05)  # evaluate prints one decimal


@pytest.mark.parametrize(
    "env_id", ["dm_control/cartpole-swingup-v0", "dm_control/cheetah-run-v0", "dm_control/walker-walk-v0"]
)
def test_a_restored_env_steps_on_as_the_captured_one(env_id, tmp_path):
    """Exact resume (ppo_ddp/envs/state.py): captured mid-episode, saved and loaded as a checkpoint does, restored
    into another env; both step on through dm_control's own 1000-step limit and the reset after it with the same
    results, bit for bit."""
    import torch

    from ppo_ddp.envs.group import make_env_group
    from ppo_ddp.storage.checkpoint import as_tensors

    def run(group, actions):
        obs, rewards, record = np.zeros((1, group.envs[0].observation_space.shape[0])), np.zeros(1), []
        for row in actions:
            ended = group.step(row, obs, rewards)
            record += [obs.tobytes(), rewards.tobytes(), repr(ended).encode()]
            record += [group.reset(e).tobytes() for e, _, _ in ended]
        return record

    original, restored = make_env_group([make_env(env_id)]), make_env_group([make_env(env_id)])
    original.reset(0, 3)
    restored.reset(0, 50)
    space = original.envs[0].action_space
    actions = np.random.default_rng(1).uniform(space.low, space.high, (1150, 1, *space.shape)).astype(np.float32)
    run(original, actions[:100])
    states = original.capture()
    assert states is not None
    torch.save(as_tensors(states), tmp_path / "states.pt")
    states = torch.load(tmp_path / "states.pt", weights_only=True)
    expected = run(original, actions[100:])  # 1050 steps: the episode's end at step 1000 and a new one
    restored.restore(states)
    assert run(restored, actions[100:]) == expected
