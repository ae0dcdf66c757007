"""Splits (issue 72): an env of a round is the env of its index, whichever actor steps it (ppo_ddp/sampling/split.py),
so the same envs split over actors 2x8, 4x4, 1x16 or 16x1 (actors x envs) make the same run: every logged number and
every tensor of the checkpoint (the model, Adam's moments, the statistics, the generators, the envs' own state), bit
for bit. Sync and overlapped rounds, MLP and GRU; a run stopped with one split resumes exactly with another. One
learner trains in this process (tests/fixtures_resume.py); two ranks: tests/test_splits_ranks.py... in a launch below.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_resume import run_here, stop_here
from launches import DETERMINISTIC, TORCHRUN, Launch, assert_same_state
from test_exact_resume import resume_command
from test_train import read_csv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import kernel_rows as kernel_rows_script  # noqa: E402

from ppo_ddp.models.kernels import FixedRows, kernel_rows, make_kernel
from ppo_ddp.sampling.split import deal, join

T = 8  # steps an env per round: rounds of 128 steps
ROUNDS = 4
SPLITS = {"2x8": (2, 8), "4x4": (4, 4), "1x16": (1, 16), "16x1": (16, 1), "1x8": (1, 8), "2x4": (2, 4)}
GRU = ["--policy", "gru", "--seq-length", "4", "--rnn-hidden-size", "16", "--hidden-sizes", "32"]
# Hopper's episodes end within the run (finals, resets, the order of episodes over actors); reward scaling on (each
# env's running return); one learner thread, as every split's
FLAGS = ["--env-id", "Hopper-v5", "--rollout-length", str(T), "--num-minibatches", "4", "--update-epochs", "2"]
FLAGS += ["--save-interval", "2", "--no-compile", "--eval-interval", "0", "--log-std-init", "0.0"]
FLAGS += ["--normalize-reward", "--learner-threads", "1", "--actor-timeout", "60"]


def split_flags(split: str) -> list[str]:
    actors, envs = SPLITS[split]
    return ["--actors-per-gpu", str(actors), "--envs-per-actor", str(envs)]


def train(tmp_path: Path, name: str, split: str, *extra: str, ranks: int = 1) -> list[str]:
    actors, envs = SPLITS[split]
    total = (ROUNDS + 1) * actors * envs * T * ranks  # round 0 seeds the statistics
    return [sys.executable, "train.py", *FLAGS, *split_flags(split), "--total-timesteps", str(total),
            "--runs-dir", str(tmp_path / "runs"), "--run-name", name, *extra]  # fmt: skip


def checkpoint(tmp_path: Path, name: str, split: str) -> dict:
    state = torch.load(tmp_path / "runs" / name / f"model_{name}.pt", weights_only=True)
    config = state.pop("config")  # the split itself and the run's name, and nothing else, differ
    assert (config["actors_per_gpu"], config["envs_per_actor"]) == SPLITS[split]
    state.pop("run_name")
    return state


def assert_same_run(tmp_path: Path, a: str, b: str, last_split: str = "") -> None:
    """Runs a and b (named as their splits; b's last session split as last_split) are the same, bit for bit."""
    rows_a, rows_b = read_csv(tmp_path / "runs" / a / "metrics.csv"), read_csv(tmp_path / "runs" / b / "metrics.csv")
    assert [int(row["iteration"]) for row in rows_b] == list(range(1, ROUNDS + 1))
    assert float(rows_a[-1]["charts/episodes"]) > 0  # episodes ended: their order over actors is in the numbers
    for x, y in zip(rows_a, rows_b, strict=True):
        assert [x[c] for c in DETERMINISTIC] == [y[c] for c in DETERMINISTIC], (x["iteration"], x, y)
    same = checkpoint(tmp_path, a, a), checkpoint(tmp_path, b, last_split or b)
    assert_same_state(*same, f"checkpoints of {a} and {b}")


CASES = {  # (flags, the splits compared with 2x8)
    "mlp, sync": (["--no-overlap"], ["4x4", "1x16", "16x1"]),
    "mlp, overlapped": (["--overlap"], ["4x4", "16x1"]),
    "gru, sync": ([*GRU, "--no-overlap"], ["1x16", "16x1"]),
    "gru, overlapped": ([*GRU, "--overlap"], ["4x4"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_split_of_the_envs_makes_the_same_run(tmp_path, case):
    extra, others = CASES[case]
    run_here(train(tmp_path, "2x8", "2x8", *extra))
    for split in others:
        run_here(train(tmp_path, split, split, *extra))
        assert_same_run(tmp_path, "2x8", split)


def test_a_run_stopped_with_one_split_resumes_exactly_with_another(tmp_path):
    stopped = stop_here(train(tmp_path, "r", "2x8", "--no-overlap"), tmp_path / "debug_r", after_round=2)
    assert stopped.rc == 143 and "stopped by SIGTERM" in stopped.stdout, stopped.output()
    run_here(train(tmp_path, "2x8", "2x8", "--no-overlap"))
    resumed = run_here([*resume_command(stopped), *split_flags("4x4")])
    assert "the envs start new episodes" not in resumed.stdout, resumed.output()
    assert_same_run(tmp_path, "2x8", "r", last_split="4x4")


def test_two_ranks_split_their_envs_either_way_and_make_the_same_run(tmp_path):
    # each rank's 8 envs as 1x8 in one launch, 2x4 in the other; parameters averaged every round, overlapped
    for split in ("1x8", "2x4"):
        args = train(tmp_path, split, split, "--overlap", "--param-sync-interval", "1", ranks=2)
        launch = Launch([*TORCHRUN, "--standalone", "--nproc_per_node=2", *args[1:]], tmp_path, split)
        assert launch.wait() == 0, launch.output()
    assert_same_run(tmp_path, "1x8", "2x4")


# ---- the parts, without processes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(kernel_rows_script.NETWORKS))
def test_an_env_s_policy_outputs_do_not_depend_on_how_many_envs_its_actor_steps(name):
    """FixedRows: 16 envs' outputs stepped as one actor's, or 1, 2, 3, 5 or 12 at a time (the last call short), are
    the same bits; kernel_rows(16) is 8. The presets' networks, as scripts/kernel_rows.py makes them."""
    obs_dim, act_dim, options = kernel_rows_script.NETWORKS[name]
    cfg, model, _ = kernel_rows_script.network(obs_dim, act_dim, options)
    kernel = FixedRows(make_kernel(model, cfg.activation), kernel_rows(16))
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((16, obs_dim)).astype(np.float32)
    state = rng.standard_normal((16, 64)).astype(np.float32) if cfg.policy == "gru" else None
    whole = kernel.step(obs, state)
    for actor_envs in (1, 2, 3, 5, 12):  # 12: a block of 8 and one of 4 padded
        parts = [kernel.step(obs[i : i + actor_envs], None if state is None else state[i : i + actor_envs])
                 for i in range(0, 16, actor_envs)]  # fmt: skip
        for j, out in enumerate(whole):
            if out is not None:
                assert np.array_equal(np.concatenate([p[j] for p in parts]), out), (actor_envs, j)


def test_kernel_rows_are_a_power_of_two_up_to_8_and_the_envs():
    assert [kernel_rows(n) for n in (1, 2, 3, 4, 5, 7, 8, 16, 64)] == [1, 2, 2, 4, 4, 4, 8, 8, 8]


def test_the_envs_state_joined_from_one_split_is_dealt_to_another():
    def actor(first: int, envs: int) -> dict:
        ids = np.arange(first, first + envs)
        return {"envs": [{"id": int(i)} for i in ids], "started": True, "observations": ids[:, None] * 1.0,
                "rnn_state": None, "episode_length": ids.copy()}  # fmt: skip

    joined = join([actor(0, 8), actor(8, 8)])  # 2x8
    dealt = deal(joined, 4, 4)  # 4x4
    assert [[s["id"] for s in d["envs"]] for d in dealt] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]
    assert all(d["rnn_state"] is None and d["started"] for d in dealt)
    assert np.array_equal(join(dealt)["episode_length"], np.arange(16))
    assert deal(joined, 3, 4) is None  # 12 envs are not this state's 16


def test_the_kernel_rows_measurement_finds_the_place_in_a_call_of_8_rows_does_not_matter():
    # scripts/kernel_rows.py, the measurement docs/design.md cites, on this machine: for the actors' numpy kernel, a
    # row's outputs in a call of kernel_rows(16) = 8 rows are the same wherever it sits (what FixedRows relies on)
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "scripts/kernel_rows.py"], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    numpy_lines = [line for line in proc.stdout.splitlines() if " numpy: " in line]
    assert len(numpy_lines) == 4
    for line in numpy_lines:
        place = line.split("place in a call of m:")[1].split()
        assert place[[1, 2, 3, 4, 5, 6, 7, 8, 16, 32].index(8)] == "=", line
