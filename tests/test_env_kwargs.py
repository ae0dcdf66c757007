"""env_kwargs, the env's options: from a YAML file, the command line's JSON and the Python API into every env a run
makes (the actors', the probe's, the evaluator's), into config.yaml and checkpoints with a relative xml_file made
absolute, and from the checkpoint into `python -m ppo_ddp.evaluate` run elsewhere and an export's metadata. Bad
options are one line and exit status 2 before anything starts; a resume with other options is refused.

One small run (module fixture) serves the tests of what a run leaves: Walker2d-v5 made with the example robot of
examples/robots/trotter.xml (13 observations, 4 actions, not Walker2d's 17 and 6, so an env made without the options
would not fit the network), named by a path relative to the directory the run started in.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import signal_handlers_kept

from ppo_ddp import evaluate
from ppo_ddp.configuration.config import Config, config_from_dict, config_to_dict
from ppo_ddp.configuration.loading import load_config, load_yaml_defaults
from ppo_ddp.envs.group import BatchedEnvs
from ppo_ddp.envs.make import env_problem
from ppo_ddp.envs.options import accepted_options
from ppo_ddp.errors import ConfigError
from ppo_ddp.evaluation.playback import load_policy
from ppo_ddp.sampling.actor import Actor
from ppo_ddp.storage.checkpoint import check_compatible, load_checkpoint
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers

ROOT = Path(__file__).resolve().parent.parent
TROTTER = ROOT / "examples" / "robots" / "trotter.xml"
OPTIONS = {"xml_file": "robots/trotter.xml", "ctrl_cost_weight": 0.02, "max_episode_steps": 50}
"""The run's options: its xml_file relative to the run's directory; 50-step episodes keep its evaluation short."""
TINY = [
    "--env-id", "Walker2d-v5", "--actors-per-gpu", "1", "--envs-per-actor", "2", "--rollout-length", "32",
    "--num-minibatches", "2", "--update-epochs", "1", "--no-compile", "--eval-interval", "1", "--eval-episodes",
    "1", "--save-interval", "1", "--total-timesteps", "128",
]  # fmt: skip
TIMEOUT = 180


def python(args: list[str], cwd: Path) -> subprocess.Popen:
    """A python of this venv in cwd, importing this checkout's package, on the CPU."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)  # fmt: skip


def finished(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished run's folder: trained in a directory of its own that holds the robot as robots/trotter.xml, by
    train.py's main in this process (started in that directory; no interpreter to start)."""
    from ppo_ddp.configuration.loading import parse_config
    from ppo_ddp.runner.launch import main

    work = tmp_path_factory.mktemp("work")
    (work / "robots").mkdir()
    shutil.copy(TROTTER, work / "robots" / "trotter.xml")
    argv = [*TINY, "--env-kwargs", json.dumps(OPTIONS), "--runs-dir", "runs", "--run-name", "r"]
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with signal_handlers_kept():
            main(parse_config(argv), ["train.py", *argv])
    finally:
        os.chdir(cwd)
    return work / "runs" / "r"


def test_a_run_records_its_options_with_the_file_made_absolute(run):
    xml = str(run.parent.parent / "robots" / "trotter.xml")
    recorded = yaml.safe_load((run / "config.yaml").read_text())["config"]["env_kwargs"]
    assert recorded == {**OPTIONS, "xml_file": xml}
    assert load_checkpoint(run / "model_r.pt")["config"]["env_kwargs"] == recorded
    # the evaluator's env was made with them too: Walker2d-v5's own 17 observations would not fit the network
    rows = (run / "eval.csv").read_text().splitlines()
    assert len(rows) >= 2, rows


def test_evaluate_from_another_directory_makes_the_env_with_the_checkpoints_options(run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where robots/trotter.xml is not
    evaluate.main([str(run / "model_r.pt"), "--episodes", "1"])
    assert "Walker2d-v5: mean return" in capsys.readouterr().out


def test_the_export_metadata_names_the_options(run, tmp_path):
    from ppo_ddp.export import export_policy

    _, meta = export_policy(run / "model_r.pt", "torchscript", tmp_path / "policy.pt")
    assert meta["env_kwargs"] == {**OPTIONS, "xml_file": str(run.parent.parent / "robots" / "trotter.xml")}
    assert (meta["obs_dim"], meta["act_dim"]) == (13, 4)
    files = {"metadata.json": ""}
    torch.jit.load(str(tmp_path / "policy.pt"), _extra_files=files)
    assert json.loads(files["metadata.json"])["env_kwargs"] == meta["env_kwargs"]


def test_a_resume_with_other_options_is_refused_in_one_line(run):
    path = run / "model_r.pt"
    model, _, cfg = load_policy(path)
    state = load_checkpoint(path)
    check_compatible(state, cfg, model, 13, 4, path)  # the run's own options resume
    other = dataclasses.replace(cfg, env_kwargs={**cfg.env_kwargs, "ctrl_cost_weight": 0.5})
    with pytest.raises(ConfigError) as refused:
        check_compatible(state, other, model, 13, 4, path)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"resume={str(path)!r}: checkpoint's env_kwargs are {{"), line
    assert "'ctrl_cost_weight': 0.02" in line.split("this run's")[0] and "'ctrl_cost_weight': 0.5" in line, line


def test_an_actors_envs_are_made_with_the_options():
    cfg = Config(env_id="Walker2d-v5", env_kwargs={"xml_file": str(TROTTER), "ctrl_cost_weight": 0.02},
                 actors_per_gpu=1, envs_per_actor=2, rollout_length=4)  # fmt: skip
    buffers = SharedBuffers.create(BufferSpec.for_config(cfg, 1, 13, 4, 10_000))
    try:
        actor = Actor(cfg, 0, 0, buffers)
        env = actor.envs.envs[1].unwrapped
        assert env.model.nu == 4 and env.fullpath == str(TROTTER) and env._ctrl_cost_weight == 0.02
        assert isinstance(actor.envs, BatchedEnvs)  # the options keep batch stepping (tests/test_env_group.py)
        actor.close()
    finally:
        buffers.close()


BAD = {
    "unknown keyword": ('{"frame_skp": 5}', "frame_skp is not an option of Walker2d-v5 (its options: xml_file, "),
    "missing xml_file": ('{"xml_file": "robots/nowhere.xml"}', "xml_file='robots/nowhere.xml': no such file"),
    "mistyped value": ('{"healthy_z_range": 0.5}', "healthy_z_range=0.5 must be a list of 2 numbers"),
    "not JSON": ("{frame_skip: 5}", "must be a JSON object, e.g."),
}


def test_bad_options_are_one_line_and_exit_status_2(tmp_path):
    procs = {  # at once: each is mostly an interpreter's start
        case: python(
            [
                str(ROOT / "train.py"),
                "--env-id",
                "Walker2d-v5",
                "--env-kwargs",
                value,
                "--total-timesteps",
                "1",
                "--runs-dir",
                str(tmp_path),
            ],
            tmp_path,
        )  # fmt: skip
        for case, (value, _) in BAD.items()
    }
    for case, proc in procs.items():
        code, out, err = finished(proc)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and out == "", (case, err[-2000:])
        assert lines[0].startswith("train.py: error: env_kwargs="), (case, lines[0])
        assert BAD[case][1] in lines[0] and ("Walker2d-v5" in lines[0] or case == "not JSON"), (case, lines[0])


def test_yaml_and_the_python_api_take_a_mapping_and_resolve_a_relative_file(tmp_path, monkeypatch):
    (tmp_path / "robots").mkdir()
    shutil.copy(TROTTER, tmp_path / "robots" / "trotter.xml")
    preset = tmp_path / "trotter.yaml"
    preset.write_text("env_id: Walker2d-v5\nenv_kwargs:\n  xml_file: robots/trotter.xml\n  healthy_z_range: [0.2, 1]\n")
    monkeypatch.chdir(tmp_path)
    assert load_yaml_defaults(preset)["env_kwargs"] == {"xml_file": "robots/trotter.xml", "healthy_z_range": [0.2, 1]}
    from_yaml = load_config(str(preset))
    from_api = load_config(env_id="Walker2d-v5", env_kwargs={"xml_file": "robots/trotter.xml",
                                                            "healthy_z_range": (0.2, 1)})  # fmt: skip
    absolute = str(tmp_path / "robots" / "trotter.xml")
    assert from_yaml.env_kwargs == from_api.env_kwargs == {"xml_file": absolute, "healthy_z_range": [0.2, 1]}
    assert config_from_dict(yaml.safe_load(yaml.safe_dump(config_to_dict(from_api)))) == from_api
    with pytest.raises(ConfigError, match=r"env_kwargs=\['frame_skip'\]: must be a mapping"):
        load_config(env_kwargs=["frame_skip"])
    assert Config().env_kwargs == {} and Config().env_kwargs is not Config().env_kwargs


def test_options_of_a_users_env_class_and_of_a_partly_observed_env():
    # a class registered by the user's module: its own keywords and MujocoEnv's, checked by their annotations
    options = accepted_options("MyRobot-v0") if env_problem("examples.my_robot:MyRobot-v0") is None else None
    assert options is not None and {"target_speed", "xml_file", "camera_name", "max_episode_steps"} <= set(options)
    assert "target_speed='fast' must be a number (its default: 1.0), for examples.my_robot:MyRobot-v0" in (
        env_problem("examples.my_robot:MyRobot-v0", {"target_speed": "fast"}) or ""
    )
    # a partly observed env passes its options to its base env's class
    assert env_problem("ppo_ddp/HopperNoVel-v5", {"ctrl_cost_weight": 0.01, "healthy_z_range": [0.6, 3]}) is None
    assert "ctrl_cost is not an option of ppo_ddp/HopperNoVel-v5" in env_problem(
        "ppo_ddp/HopperNoVel-v5", {"ctrl_cost": 0.01}
    )
    assert "render_mode for Hopper-v5: ppo_ddp sets it" in env_problem("Hopper-v5", {"render_mode": "human"})
    assert "gymnasium could not create Hopper-v5 with them: ZeroDivisionError" in env_problem(
        "Hopper-v5", {"frame_skip": 0}
    )
