"""In-process pieces of docs/reliability.md: stop requests, the resume hint, the CSV on resume, finding an
elastic run, and actors that continue their noise from a checkpoint. Seconds, no torchrun."""

from __future__ import annotations

import csv
import dataclasses
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # actors inherit sys.path, so they can import scripted_env too
    sys.path.insert(0, str(TESTS_DIR))

from pools import SCRIPTED, make_cfg  # noqa: E402

from ppo_ddp.algorithm.learner import check_finite  # noqa: E402
from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.distributed import signals  # noqa: E402
from ppo_ddp.distributed.agreement import Stopped  # noqa: E402
from ppo_ddp.distributed.signals import ForcedStop, StopRequests  # noqa: E402
from ppo_ddp.errors import NonFiniteError  # noqa: E402
from ppo_ddp.models.mlp import ActorCritic  # noqa: E402
from ppo_ddp.records.checkpointer import find_elastic_run  # noqa: E402
from ppo_ddp.records.run_log import RunLogger  # noqa: E402
from ppo_ddp.runner import launch  # noqa: E402
from ppo_ddp.runner.launch import resume_command, stop_message  # noqa: E402
from ppo_ddp.runner.programs import TRAIN_FILE, program  # noqa: E402
from ppo_ddp.sampling.pool import ActorPool  # noqa: E402


def deliver(sig: int) -> None:
    """Send a signal to this process and let the handler run (it runs in the main thread between bytecodes)."""
    os.kill(os.getpid(), sig)
    time.sleep(0.01)


def test_first_signal_asks_to_stop_a_repeat_is_ignored_a_second_one_forces(monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(signals, "DUPLICATE_WINDOW", 0.2)
    with StopRequests(announce=False) as stop:
        assert stop.signum == 0
        deliver(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        deliver(signal.SIGTERM)  # the same request delivered twice (Slurm and torchrun both send it)
        time.sleep(0.25)
        with pytest.raises(ForcedStop) as info:
            deliver(signal.SIGINT)
        assert info.value.signum == signal.SIGINT
        assert stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # restored


def test_after_finish_stop_signals_are_ignored():
    saved = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    try:
        with StopRequests(announce=False) as stop:
            deliver(signal.SIGTERM)
            stop.finish()  # checkpoint written; torchrun's SIGTERM to the last ranks must not kill them
            deliver(signal.SIGTERM)
            deliver(signal.SIGINT)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # kept while the process exits
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_exit_codes():
    assert signals.exit_code(signal.SIGINT) == 130 and signals.exit_code(signal.SIGTERM) == 143


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["train.py", "--env-id", "Ant-v5", "--run-name", "old", "--resume", "runs/x.pt"],
            "python train.py --env-id Ant-v5 --resume auto --run-name r1",
        ),
        (
            ["train.py", "--run-name=old", "--resume=auto", "--config", "my cfg.yaml"],
            "python train.py --config 'my cfg.yaml' --resume auto --run-name r1",
        ),
    ],
)
def test_resume_command_keeps_the_flags_and_names_the_run(argv, expected, monkeypatch):
    for var in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "PPO_DDP_ACTORS_PER_LEARNER"):
        monkeypatch.delenv(var, raising=False)
    assert resume_command("r1", argv) == expected


def test_resume_command_names_the_program_as_it_was_started(monkeypatch):
    for var in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "PPO_DDP_ACTORS_PER_LEARNER"):
        monkeypatch.delenv(var, raising=False)
    module = str(TRAIN_FILE)  # sys.argv[0] of `python -m ppo_ddp.train`: ppo_ddp/train.py
    assert (
        resume_command("r1", [module, "--seed", "2"]) == "python -m ppo_ddp.train --seed 2 --resume auto --run-name r1"
    )
    script = shutil.which("ppo-ddp-train")  # a console script: by its name where the PATH finds it
    if script is not None:
        assert resume_command("r1", [script]) == "ppo-ddp-train --resume auto --run-name r1"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resume_command("r1", [module]) == (
        "torchrun --standalone --nproc_per_node=2 -m ppo_ddp.train --resume auto --run-name r1"
    )


def test_the_apis_launch_command_trains_the_same_config(tmp_path):
    from ppo_ddp.configuration.loading import parse_config

    cfg = Config(env_id="Hopper-v5", seed=3, hidden_sizes=(32, 16), runs_dir=str(tmp_path), run_name="api")
    argv = launch.launch_command(cfg)
    assert program(argv[0]) == ["-m", "ppo_ddp.train"] and argv[1:] == [
        "--config",
        str(tmp_path / "api" / "launch.yaml"),
    ]
    assert dataclasses.replace(parse_config(argv[1:]), config=None) == cfg


def test_resume_command_under_torchrun(monkeypatch):
    monkeypatch.delenv("PPO_DDP_ACTORS_PER_LEARNER", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert (
        resume_command("r1", ["train.py", "--seed", "2"])
        == "torchrun --standalone --nproc_per_node=4 train.py --seed 2 --resume auto --run-name r1"
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two nodes: the launcher options are the user's
    assert (
        resume_command("r1", ["train.py"])
        == "torchrun <the same launcher options on every node> train.py --resume auto --run-name r1"
    )


def test_the_stop_line_says_what_was_kept(monkeypatch):
    for var in ("TORCHELASTIC_RUN_ID", "PPO_DDP_ACTORS_PER_LEARNER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    kept = stop_message(Stopped(signal.SIGTERM, 3, 10, 8192, Path("runs/r1/model_r1.pt"), "r1"))
    assert kept == (
        "stopped by SIGTERM after round 3 of 10 (8,192 steps); checkpoint runs/r1/model_r1.pt. "
        "Resume with: python train.py --resume auto --run-name r1"
    )
    nothing = stop_message(Stopped(signal.SIGINT, 0, 10, 0, None, "r1"))  # Ctrl-C during the first round
    assert (
        nothing == "stopped by SIGINT before the first round finished; nothing saved. Start again with: python train.py"
    )
    api = stop_message(Stopped(signal.SIGINT, 3, 10, 8192, Path("runs/r1/model_r1.pt"), "r1"), api=True)
    assert api.endswith("Resume with: train(..., resume='auto', run_name='r1')")  # the Python API: a call


def test_resumed_logger_drops_the_rows_a_crashed_run_wrote_past_its_checkpoint(tmp_path):
    logger = RunLogger(tmp_path, tmp_path / "metrics.csv", 1000, resumed=False, start_step=0)
    for i in range(1, 6):
        logger.log(i, 100 * i, {"losses/policy_loss": float(i)})
    logger.close()
    with open(tmp_path / "metrics.csv", "a") as f:
        f.write("6,600,0.")  # a line torn by a kill
    # the checkpoint was at round 3: rows 4-6 are redone by the resumed run
    logger = RunLogger(tmp_path, tmp_path / "metrics.csv", 1000, resumed=True, start_step=300)
    logger.log(4, 400, {"losses/policy_loss": 40.0})
    logger.close()
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["iteration"], r["losses/policy_loss"]) for r in rows] == [
        ("1", "1.0"),
        ("2", "2.0"),
        ("3", "3.0"),
        ("4", "40.0"),
    ]


def test_find_elastic_run_by_the_recorded_rendezvous_id(tmp_path):
    for name, run_id in (("a", "id-1"), ("b", "id-2"), ("c", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump({"run_name": name, "torchelastic_run_id": run_id}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.yaml").write_text("{unbalanced")
    assert find_elastic_run(tmp_path, "id-2") == "b"
    assert find_elastic_run(tmp_path, "id-3") is None
    assert find_elastic_run(tmp_path / "missing", "id-1") is None


def test_a_round_s_noise_is_its_own_so_a_resumed_pool_draws_the_uninterrupted_one_s():
    # logp depends on the noise alone (state-independent std), so it shows which noise an actor drew even
    # though a resumed actor's envs restart their episodes: a pool whose first round is round 2 draws round 2's.
    cfg = make_cfg(SCRIPTED, rollout_length=6)
    torch.manual_seed(0)
    model = ActorCritic(3, 2, cfg.hidden_sizes, cfg.activation, cfg.log_std_init)
    with ActorPool(cfg, 0, 2, 3, 2, False) as pool:
        pool.collect(model, None, None)
        first_logp = pool.buffers.arrays["logp"].copy()
        pool.collect(model, None, None)
        second_logp = pool.buffers.arrays["logp"].copy()
    assert not np.array_equal(first_logp, second_logp)
    with ActorPool(cfg, 0, 2, 3, 2, False, first_round=2) as resumed:
        resumed.collect(model, None, None)
        np.testing.assert_array_equal(resumed.buffers.arrays["logp"], second_logp)


def test_non_finite_update_is_an_error_naming_the_rank_and_round():
    model = ActorCritic(3, 2)
    finite = {"losses/policy_loss": 0.1, "losses/value_loss": 1.0}
    check_finite(model, finite, rank=0, iteration=1)
    with pytest.raises(NonFiniteError, match=r"rank 1: non-finite losses/value_loss \(nan\) in the update of round 7"):
        check_finite(model, {**finite, "losses/value_loss": float("nan")}, rank=1, iteration=7)
    with torch.no_grad():
        model.critic[0].weight[0, 0] = float("inf")
    with pytest.raises(
        NonFiniteError, match=r"rank 0: non-finite parameters \(critic.0.weight\) after the update of round 3"
    ):
        check_finite(model, finite, rank=0, iteration=3)
