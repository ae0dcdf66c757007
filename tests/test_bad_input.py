"""Bad input is one line and exit 2 (docs/reliability.md): checkpoints that cannot resume this run, bad run flags,
an unwritable runs folder, a torchrun topology that does not fit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from launches import TORCHRUN, Launch, worker_exit_codes
from test_train import SMALL


# ----------------------------------------------------------------------------------- 5: bad input
def fake_checkpoint(
    path: Path,
    env_id: str = "Hopper-v5",
    obs_dim: int = 11,
    act_dim: int = 3,
    hidden: tuple[int, ...] = (64, 64),
    policy_only: bool = False,
    per_tensor_adam: bool = False,
) -> Path:
    """A checkpoint as the trainer writes one, without training (cheap); per_tensor_adam: as before the
    learner's flat parameters (one Adam state per tensor)."""
    from ppo_ddp.configuration.config import Config, config_to_dict
    from ppo_ddp.models.flat import flatten_parameters_
    from ppo_ddp.models.mlp import ActorCritic
    from ppo_ddp.storage.checkpoint import save_checkpoint

    model = ActorCritic(obs_dim, act_dim, hidden)
    optimizer = torch.optim.Adam(model.parameters() if per_tensor_adam else [flatten_parameters_(model)])
    payload = {"actor": model.state_dict(), "obs_rms_state": None}
    if not policy_only:
        cfg = Config(env_id=env_id, hidden_sizes=hidden)
        payload.update(
            optimizer=optimizer.state_dict(),
            generator=torch.Generator().get_state(),
            iteration=3,
            global_step=384,
            best_return=1.0,
            config=config_to_dict(cfg),
            env_id=env_id,
            obs_dim=obs_dim,
            act_dim=act_dim,
            world_size=1,
            run_name="x",
        )
    save_checkpoint(path, payload)
    return path


def _corrupt(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"\x00 not a checkpoint " * 100)
    return path


def _truncated(tmp_path: Path) -> Path:
    path = fake_checkpoint(tmp_path / "whole.pt")
    cut = tmp_path / "truncated.pt"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return cut


def _pickled_object(tmp_path: Path) -> Path:
    path = tmp_path / "pickled.pt"
    torch.save({"actor": {}, "obs_rms_state": None, "x": Path("/")}, path)  # a class instance: refused by weights_only
    return path


def _plain_tensor(tmp_path: Path) -> Path:
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    return path


# (checkpoint maker, flags, the one line's pattern); run through main() in-process, as train.py would
CHECKPOINT_CASES = {
    "corrupt file": (_corrupt, [], r"checkpoint .*garbage\.pt: unreadable \(truncated, corrupt or not a torch file\)"),
    "truncated file": (
        _truncated,
        [],
        r"checkpoint .*truncated\.pt: unreadable \(truncated, corrupt or not a torch file\)",
    ),
    "pickled objects": (_pickled_object, [], r"checkpoint .*pickled\.pt: unreadable .*Unsupported global"),
    "not a ppo_ddp checkpoint": (_plain_tensor, [], r"checkpoint .*tensor\.pt: not a ppo_ddp checkpoint"),
    "another env": (
        lambda t: fake_checkpoint(t / "walker.pt", "Walker2d-v5", 17, 6),
        [],
        r"resume='.*walker\.pt': checkpoint is for Walker2d-v5 \(obs 17, act 6\), this run is Hopper-v5 \(obs 11, act 3\)",  # noqa: E501
    ),
    "another network shape": (
        lambda t: fake_checkpoint(t / "wide.pt", hidden=(32, 32)),
        [],
        r"resume='.*wide\.pt': checkpoint's network is hidden_sizes \[32, 32\], this run's is hidden_sizes \[64, 64\]$",
    ),
    "a shared trunk": (
        lambda t: fake_checkpoint(t / "separate.pt"),
        ["--shared-trunk"],
        r"resume='.*separate\.pt': checkpoint's network is shared_trunk False, this run's is shared_trunk True$",
    ),
    "another activation": (
        lambda t: fake_checkpoint(t / "tanh.pt"),
        ["--activation", "relu"],
        r"resume='.*tanh\.pt': checkpoint's network is activation tanh, this run's is activation relu$",
    ),
    "another distribution": (
        lambda t: fake_checkpoint(t / "gaussian.pt"),
        ["--distribution", "beta"],
        r"resume='.*gaussian\.pt': checkpoint's network is distribution gaussian, this run's is distribution beta$",
    ),
    "a GRU with a head": (
        lambda t: fake_checkpoint(t / "mlp.pt"),
        ["--policy", "gru", "--rnn-head-sizes", "64"],
        r"resume='.*mlp\.pt': checkpoint's network is policy mlp rnn_head_sizes \[\], this run's is policy gru "
        r"rnn_head_sizes \[64\]$",
    ),
    "policy-only file": (
        lambda t: fake_checkpoint(t / "policy.pt", policy_only=True),
        [],
        r"resume='.*policy\.pt': checkpoint has no 'optimizer' \(a policy-only file cannot resume training\)",
    ),
    "per-tensor Adam": (
        lambda t: fake_checkpoint(t / "old.pt", per_tensor_adam=True),
        [],
        r"resume='.*old\.pt': checkpoint's optimizer state has 13 parameter tensors, this learner steps one "
        r"flat tensor \(a checkpoint of an earlier ppo_ddp\): it can be evaluated but not resumed",
    ),
}


def main_error_line(cfg, capsys) -> str:
    """train.py's main on cfg, in this process: it must exit 2 with one line on stderr, which is returned."""
    from ppo_ddp.runner.launch import main

    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [text for text in err.splitlines() if text.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_bad_checkpoint_is_one_line_and_exit_2(case, tmp_path, capsys, restore_signal_handlers):
    from ppo_ddp.configuration.loading import parse_config

    make, flags, message = CHECKPOINT_CASES[case]
    path = make(tmp_path)
    cfg = parse_config([*SMALL, "--resume", str(path), "--runs-dir", str(tmp_path / "runs"), *flags])
    line = main_error_line(cfg, capsys)
    assert re.fullmatch(r"train\.py: error: " + message + ".*", line), line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing started


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--resume", "auto"], "resume='auto': needs --run-name: the run whose latest checkpoint to continue"),
        (["--resume", "."], "resume='.': must be 'auto' or the path of an existing checkpoint file"),
        (["--run-name", "a/b"], "run_name='a/b': must be a folder name (not empty, no '/')"),
        (
            ["--env-id", "no_such_module:Env-v0"],
            "env_id='no_such_module:Env-v0': cannot import module 'no_such_module'",
        ),
    ],
)
def test_bad_resume_and_run_flags(argv, message, capsys):
    from ppo_ddp.configuration.loading import parse_config

    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_unwritable_runs_dir_is_one_line_and_exit_2(tmp_path, capsys, restore_signal_handlers):
    # through main() in-process, as train.py runs it (the command line's own path: the test below)
    from ppo_ddp.configuration.loading import parse_config

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cfg = parse_config([*SMALL, "--total-timesteps", "64", "--runs-dir", str(blocker)])
    line = main_error_line(cfg, capsys)
    assert re.fullmatch(
        rf"train\.py: error: runs_dir='{re.escape(str(blocker))}': cannot write the run folder "
        rf"{re.escape(str(blocker))}/\S+: Not a directory",
        line,
    ), line


def test_corrupt_checkpoint_from_the_command_line(tmp_path, run_train):
    proc = run_train(*SMALL, "--resume", str(_corrupt(tmp_path)), "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("train.py: error: checkpoint ") and len(proc.stderr.strip().splitlines()) == 1, (
        proc.stderr
    )


def test_torchrun_topology_that_does_not_fit_is_one_line_per_node(tmp_path):
    # 3 actors are fine for one learner (validated before the launch) but do not split over the 2 that torchrun starts
    args = [
        "train.py",
        "--env-id",
        "Hopper-v5",
        "--num-actors",
        "3",
        "--envs-per-actor",
        "2",
        "--rollout-length",
        "32",
        "--num-minibatches",
        "4",
        "--total-timesteps",
        "256",
        "--runs-dir",
        str(tmp_path / "runs"),
    ]
    run = Launch([*TORCHRUN, "--standalone", "--nproc_per_node=2", *args], tmp_path, "t")
    assert run.wait() == 1  # torchrun's status for a failed group
    ours = [text for text in run.stderr.splitlines() if text.startswith("train.py: error:")]
    assert ours == [
        "train.py: error: num_actors=3 does not split evenly over num_gpus=2: give a multiple of 2, "
        "or set actors_per_gpu"
    ], run.output()
    assert 2 in worker_exit_codes(run.stderr) and not (tmp_path / "runs").exists()
