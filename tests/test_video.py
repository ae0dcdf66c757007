"""Videos: the camera follows the robot (issue 14). Rendering runs in a subprocess with MUJOCO_GL=egl, since the
GL backend is chosen when MuJoCo first renders in a process; without a renderer the test is skipped, saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENVS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]

# The robot moved 30 m along x after the episode's first frame (its free joint's or slider's first coordinate): the
# pixels that change when its geoms are hidden (moved to a geom group the renderer does not draw) are where it is
# in the picture.
IN_VIEW = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from ppo_ddp.envs import make_video_env
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


@pytest.mark.parametrize("env_id", ENVS)
def test_the_video_camera_keeps_the_robot_in_view(env_id):
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", IN_VIEW, env_id], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(f"no MuJoCo renderer here: {result['skip']}")
    assert result["changed"] > 0.01, result  # the robot, 30 m from where the episode started, is in the picture
