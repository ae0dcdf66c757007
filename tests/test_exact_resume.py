"""Exact resume (issue 47): a stopped and resumed run is the uninterrupted one, bit for bit, because each actor's
envs and carried state travel in the checkpoint (ppo_ddp/envs/state.py, Actor.carried). The two-rank case (a GRU,
stopped by SIGTERM to one rank) is tests/test_reliability.py's, the overlapped one tests/test_overlap.py's; here one
learner: a GRU stopped by SIGTERM, a learner killed by SIGKILL that resumes from its periodic checkpoint and redoes
the rounds since, a checkpoint written before exact resume, and an env whose state cannot be captured.

The runs train in this process (tests/fixtures_resume.py), but for the learner that is killed, a launch: its rounds
before the kill, in the resumed run's log, are checked against the run trained here too, bit for bit. (Resumes in
fresh processes: the two-rank runs of tests/test_reliability.py.)
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

import torch
from fixtures_resume import Trained, run_here, stop_here
from launches import DETERMINISTIC, Launch, assert_same_state, shm_blocks_of
from test_train import SMALL, read_csv

ROUND = 64  # 1 actor x 2 envs x 32 steps
ROUNDS = 8
GRU = ["--policy", "gru", "--seq-length", "8", "--rnn-hidden-size", "16", "--hidden-sizes", "32"]
NEW_EPISODES = "the envs start new episodes"


def learner(tmp_path: Path, name: str, *extra: str, rounds: int = ROUNDS) -> list[str]:
    return [sys.executable, "train.py", *SMALL, "--total-timesteps", str((rounds + 1) * ROUND),
            "--runs-dir", str(tmp_path / "runs"), "--run-name", name, *extra]  # fmt: skip


def dump(debug: Path, k: int, rank: int = 0) -> dict:
    return torch.load(debug / f"rank{rank}_iter{k}.pt", weights_only=True)


def assert_same_run(tmp_path: Path, u: str, r: str) -> None:
    """Every logged number of runs u and r, and the parameters and Adam moments of their last round, bit for bit."""
    u_rows, r_rows = read_csv(tmp_path / "runs" / u / "metrics.csv"), read_csv(tmp_path / "runs" / r / "metrics.csv")
    assert [int(row["iteration"]) for row in r_rows] == list(range(1, ROUNDS + 1))
    for a, b in zip(u_rows, r_rows, strict=True):
        assert [a[c] for c in DETERMINISTIC] == [b[c] for c in DETERMINISTIC], (a["iteration"], a, b)
    last_u, last_r = dump(tmp_path / f"debug_{u}", ROUNDS), dump(tmp_path / f"debug_{r}", ROUNDS)
    assert torch.equal(last_u["params"], last_r["params"]), "parameters"
    assert_same_state(last_r["optimizer"], last_u["optimizer"], "Adam moments at the end")


def resume_command(stopped: Trained) -> list[str]:
    """The command the stopped run printed: `python train.py ...`."""
    line = next(text for text in stopped.stdout.splitlines() if text.startswith("stopped by"))
    command = shlex.split(line.split("Resume with: ", 1)[1])
    assert command[:2] == ["python", "train.py"], command
    return command


def assert_a_stopped_learner_resumes_exactly(tmp_path: Path, *extra: str) -> None:
    """One learner stopped by SIGTERM after round 3 (i), the same run uninterrupted (u), and i resumed with the
    command it printed (r): r is u, bit for bit. u runs between i and r, so that nothing i left in this process
    can stand in for what the checkpoint should hold."""
    i = stop_here(learner(tmp_path, "r", *extra), tmp_path / "debug_r", after_round=3)
    assert i.rc == 143 and "stopped by SIGTERM" in i.stdout, i.output()
    run_here(learner(tmp_path, "u", *extra), tmp_path / "debug_u")
    r = run_here(resume_command(i), tmp_path / "debug_r")
    assert NEW_EPISODES not in r.stdout, r.output()
    assert_same_run(tmp_path, "u", "r")


def test_a_gru_run_stopped_by_sigterm_resumes_exactly(tmp_path):
    # with a Beta policy: each env draws its actions from its generator of the round, which nothing need carry
    assert_a_stopped_learner_resumes_exactly(tmp_path, *GRU, "--distribution", "beta")


def test_a_killed_learner_redoes_its_rounds_from_the_periodic_checkpoint_exactly(tmp_path):
    # SIGKILL saves nothing: the run continues from the checkpoint of round 4 (save_interval 2) and redoes round 5
    run_here(learner(tmp_path, "u"), tmp_path / "debug_u")
    i = Launch(learner(tmp_path, "r"), tmp_path, "i", debug=tmp_path / "debug_i", new_session=True)
    i.wait_for_dump(0, 5)
    os.killpg(i.proc.pid, signal.SIGKILL)  # the learner and its actors, as on a lost machine
    i.wait()
    left = shm_blocks_of(i.proc.pid)  # its shared memory, which a lost machine takes with it
    assert len(left) == 1, left
    os.unlink(left[0])
    saved = torch.load(tmp_path / "runs" / "r" / "model_r.pt", weights_only=True)["iteration"]
    assert 4 <= saved < ROUNDS  # round 4's (or, on a slow reaction, a later periodic one's)
    r = run_here(learner(tmp_path, "r", "--resume", "auto"), tmp_path / "debug_r")
    assert NEW_EPISODES not in r.stdout, r.output()
    assert_same_run(tmp_path, "u", "r")


def test_a_checkpoint_without_env_states_resumes_with_new_episodes(tmp_path):
    # as a checkpoint written before exact resume: no envs' state in its rank state
    run_here(learner(tmp_path, "old", rounds=2))
    path = tmp_path / "runs" / "old" / "model_old.pt"
    state = torch.load(path, weights_only=True)
    for rank_state in state["rank_states"]:
        del rank_state["envs_carried"]
    torch.save(state, path)
    again = run_here(learner(tmp_path, "old", "--resume", "auto"))
    notes = [line for line in again.stdout.splitlines() if NEW_EPISODES in line]
    assert len(notes) == 1 and "holds no env state" in notes[0], again.output()


def test_an_env_whose_state_cannot_be_captured_resumes_with_new_episodes(tmp_path):
    scripted = ["--env-id", "scripted_env:Scripted-v0"]
    run_here(learner(tmp_path, "s", *scripted, rounds=2))
    state = torch.load(tmp_path / "runs" / "s" / "model_s.pt", weights_only=True)
    assert state["rank_states"][0]["envs_carried"] is None
    again = run_here(learner(tmp_path, "s", *scripted, "--resume", "auto"))
    assert sum(NEW_EPISODES in line for line in again.stdout.splitlines()) == 1, again.output()
