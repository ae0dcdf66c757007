"""Nothing lost (docs/reliability.md): a stop signal on one rank, resume, Ctrl-C, elastic restarts and faults; and
two nodes on one machine, the launch of the resume tests' uninterrupted run.

End to end with real torchrun and actor processes (tests/launches.py); every launch has a timeout. The one-learner
runs (resumes of the stopped run, the Ctrl-C'd one) train in this process (tests/fixtures_resume.py): a launch would
pay ~4.5 s of CPU to start before its first round. Ctrl-C to torchrun: tests/test_overlap.py, with its two-rank run.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from fixtures_resume import run_here, stop_here
from helpers import process_alive
from launches import (
    DETERMINISTIC,
    STEPS_PER_ROUND,
    TORCHRUN,
    Launch,
    assert_same_state,
    dump,
    steps_after,
    tensorboard_steps,
    torchrun,
    train_args,
    worker_exit_codes,
)
from launches import TIMEOUT as LAUNCH_TIMEOUT
from test_train import read_csv

from ppo_ddp.configuration.config import Config
from ppo_ddp.models.normalization import EPSILON

# Seconds within which every rank must be gone after a fault: generous for a loaded machine, and still far
# below the 10-minute collective timeout a rank left waiting for a lost peer would run into.
FAULT_BOUND = 120.0


# ------------------------------------------------------------ 1-2: a stop signal on one rank, then resume
ROUNDS = 16  # the stop lands around round 4; the margin is for a slow machine
# Exact resume on two ranks (issue 47) with the most state a rank's actors carry across a stop: GRU states,
# episode-start flags and discounted returns (reward scaling on), each rank's own; a tanh-squashed Gaussian policy.
# (One learner: tests/test_exact_resume.py, a GRU stopped and an MLP killed; tests/test_overlap.py, an overlapped GRU.)
# obs_clip huge, so that nothing is clipped: test_two_nodes_on_one_machine undoes the normalisation. One learner
# thread (the default, said here): a rank's update is then the same whichever node it runs on (see `runs`).
POLICY = ["--policy", "gru", "--seq-length", "8", "--rnn-hidden-size", "16", "--hidden-sizes", "32"]
POLICY += ["--distribution", "tanh_gaussian", "--obs-clip", "1e9", "--learner-threads", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """U: 16 rounds uninterrupted. I: the same, SIGTERM to rank 1 alone after its round-3 dump. R: I's printed
    resume command. U goes through `--resume auto` with no checkpoint yet, i.e. a fresh start.

    U is launched as two nodes on this machine: two torchrun launches of one process each, meeting through a c10d
    rendezvous on 127.0.0.1 (docs/reliability.md), which test_two_nodes_on_one_machine checks; I and R are launched
    with --standalone. The learners use one thread each whatever their node (--learner-threads 1), so U is, bit for
    bit, the run a standalone launch would make (one launch fewer: ~10 s of CPU before the first round)."""
    tmp = tmp_path_factory.mktemp("resume")
    launcher = [*TORCHRUN, "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d"]
    launcher += [f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--rdzv-id=two-nodes"]
    args = train_args(tmp, "u", ROUNDS, *POLICY, "--resume", "auto")
    nodes = [Launch([*launcher, *args], tmp, f"node{n}", debug=tmp / "debug_u") for n in range(2)]
    for node in nodes:
        assert node.wait() == 0, node.output()

    i = Launch(torchrun(tmp, "r", ROUNDS, *POLICY), tmp, "i", debug=tmp / "debug_i")
    victim = i.wait_for_dump(1, 3)["pid"]
    os.kill(victim, signal.SIGTERM)
    signalled = time.monotonic()
    i_rc = i.wait()

    line = next((text for text in i.stdout.splitlines() if text.startswith("stopped by")), None)
    assert line is not None, i.output()
    command = shlex.split(line.split("Resume with: ", 1)[1])
    assert command[:3] == ["torchrun", "--standalone", "--nproc_per_node=2"], command
    stopped = tmp / "stopped.pt"  # the resumed run overwrites the run's checkpoint
    stopped.write_bytes((tmp / "runs" / "r" / "model_r.pt").read_bytes())
    r = Launch([*TORCHRUN, *command[1:]], tmp, "r", debug=tmp / "debug_r")
    assert r.wait() == 0, r.output()
    return {
        "tmp": tmp,
        "u": nodes,
        "i": i,
        "i_rc": i_rc,
        "r": r,
        "stop_seconds": i.ended - signalled,
        "line": line,
        "stopped": torch.load(stopped, weights_only=True),
    }


def stopped_round(runs) -> int:
    return int(re.search(r"after round (\d+) of", runs["line"]).group(1))


def stopped(runs) -> Path:
    """A copy of I's checkpoint, as the stop wrote it (R overwrote the run's own)."""
    return runs["tmp"] / "stopped.pt"


def test_sigterm_to_one_rank_stops_every_rank_after_the_same_round(runs):
    i, k = runs["i"], stopped_round(runs)
    assert 3 <= k < ROUNDS, runs["line"]
    # both ranks stopped on their own, with the documented status; torchrun reports a failed group (1)
    assert runs["i_rc"] == 1 and sorted(worker_exit_codes(i.stderr)) == [143, 143], i.output()
    assert runs["stop_seconds"] < FAULT_BOUND
    assert i.stdout.count("stopped by SIGTERM") == 1  # one line, from rank 0
    assert "[rank" not in i.stderr, i.output()  # no worker traceback
    # the checkpoint holds the last completed round; the resume hint keeps every flag of the run
    state = runs["stopped"]
    assert state["iteration"] == k and state["global_step"] == steps_after(k)
    assert "--resume auto --run-name r" in runs["line"] and "--save-interval 2" in runs["line"]
    for rank in (0, 1):  # both ranks trained exactly k rounds
        assert (runs["tmp"] / "debug_i" / f"rank{rank}_iter{k}.pt").exists()
        assert not (runs["tmp"] / "debug_i" / f"rank{rank}_iter{k + 1}.pt").exists()


def test_checkpoint_at_the_stop_is_the_uninterrupted_state_exactly(runs):
    """Parameters, Adam moments, generators, actors' noise and statistics (count included) at round k are
    bit for bit those of the uninterrupted run at round k: everything a checkpoint can hold is restored."""
    tmp, k, state = runs["tmp"], stopped_round(runs), runs["stopped"]
    u0 = dump(tmp / "debug_u", 0, k)
    params = torch.cat([v.reshape(-1) for k_, v in state["actor"].items()])
    assert torch.equal(params, u0["params"])
    assert_same_state(state["obs_rms_state"], u0["obs_rms"], "obs_rms")
    assert state["obs_rms_state"]["count"] == steps_after(k)  # never multiplied by the world size
    assert len(state["rank_states"]) == 2
    for rank, saved in enumerate(state["rank_states"]):
        u = dump(tmp / "debug_u", rank, k)
        assert torch.equal(torch.cat([v.reshape(-1) for v in saved["actor"].values()]), u["params"])
        assert_same_state(saved["optimizer"], u["optimizer"], f"rank {rank} optimizer")
        assert_same_state(saved["generator"], u["generator"], f"rank {rank} generator")


def test_resumed_run_continues_the_uninterrupted_one(runs):
    tmp, k = runs["tmp"], stopped_round(runs)
    u_rows, r_rows = read_csv(tmp / "runs" / "u" / "metrics.csv"), read_csv(tmp / "runs" / "r" / "metrics.csv")
    # metrics.csv appended: every round once, counters exact
    assert [int(r["iteration"]) for r in r_rows] == list(range(1, ROUNDS + 1))
    assert [int(r["global_step"]) for r in r_rows] == [steps_after(i) for i in range(1, ROUNDS + 1)]
    # the resumed run is the uninterrupted one, before the stop and after it: the actors continue their episodes
    # from the envs' state in the checkpoint (ppo_ddp/envs/state.py), so every logged number is the same
    for u, r in zip(u_rows, r_rows):
        assert [u[c] for c in DETERMINISTIC] == [r[c] for c in DETERMINISTIC], (u["iteration"], u, r)
    assert_same_state(
        dump(tmp / "debug_r", 0, k + 1)["frozen_obs_rms"],
        dump(tmp / "debug_u", 0, k + 1)["frozen_obs_rms"],
        "statistics the actors used in the first resumed round",
    )
    u_end, r_end = dump(tmp / "debug_u", 0, ROUNDS), dump(tmp / "debug_r", 0, ROUNDS)
    assert r_end["obs_rms"]["count"] == u_end["obs_rms"]["count"] == steps_after(ROUNDS)
    for rank in (0, 1):  # every rank's parameters, Adam moments and statistics at the end, bit for bit
        u_rank, r_rank = dump(tmp / "debug_u", rank, ROUNDS), dump(tmp / "debug_r", rank, ROUNDS)
        assert torch.equal(u_rank["params"], r_rank["params"]), f"rank {rank} parameters"
        assert_same_state(r_rank["optimizer"], u_rank["optimizer"], f"rank {rank} optimizer")
        assert_same_state(r_rank["obs_rms"], u_rank["obs_rms"], f"rank {rank} statistics")
    assert "the envs start new episodes" not in runs["r"].stdout, runs["r"].output()  # the actors' state came back
    # ranks stay identical after the resume (param_sync_interval 1)
    assert torch.equal(r_end["params"], dump(tmp / "debug_r", 1, ROUNDS)["params"])
    # TensorBoard continues at the right step: no point twice, none missing
    assert tensorboard_steps(tmp / "runs" / "r", "charts/SPS") == [steps_after(i) for i in range(1, ROUNDS + 1)]
    assert f"resumed from {tmp / 'runs' / 'r' / 'model_r.pt'} at round {k}" in runs["r"].stdout


def test_two_nodes_on_one_machine(runs):
    """U's two launches: their processes are ranks 0 and 1 of one world, each local rank 0 of its node; they train
    one policy on statistics merged over both."""
    debug = runs["tmp"] / "debug_u"
    rounds = [(dump(debug, 0, i), dump(debug, 1, i)) for i in range(0, 5)]  # 0: seeding
    a, b = rounds[0]
    assert (a["rank"], b["rank"], a["world_size"], b["world_size"]) == (0, 1, 2, 2)
    assert a["local_rank"] == b["local_rank"] == 0 and {a["node_rank"], b["node_rank"]} == {0, 1}
    seen = []
    for a, b in rounds:
        assert torch.equal(a["params"], b["params"])
        for d in (a, b):
            obs = d["obs"].reshape(-1, d["obs"].shape[-1]).double().numpy()
            frozen = d["frozen_obs_rms"]
            if frozen is not None:  # undo the actors' normalisation (obs_clip is huge: nothing was clipped)
                obs = obs * np.sqrt(frozen["var"].numpy() + EPSILON) + frozen["mean"].numpy()
            seen.append(obs)
        everything = np.concatenate(seen)
        assert_same_state(a["obs_rms"], b["obs_rms"], "statistics on both nodes")
        assert a["obs_rms"]["count"] == len(everything)
        np.testing.assert_allclose(a["obs_rms"]["mean"].numpy(), everything.mean(0), rtol=1e-4, atol=1e-5)
    saved = yaml.safe_load((runs["tmp"] / "runs" / "u" / "config.yaml").read_text())
    assert saved["world_size"] == 2
    assert len(read_csv(runs["tmp"] / "runs" / "u" / "metrics.csv")) == ROUNDS


def test_resume_on_another_world_size(runs, tmp_path):
    """The 2-rank checkpoint on one learner: rank 0's state for everyone, said in a line, then training goes on."""
    k = stopped_round(runs)
    total = str(steps_after(k) + 64)
    run = run_here(train_args(tmp_path, "w", 0, *POLICY, "--total-timesteps", total, "--resume", str(stopped(runs))))
    assert "the checkpoint was written by 2 rank(s), this run has 1" in run.stdout, run.output()
    state = torch.load(tmp_path / "runs" / "w" / "model_w.pt", weights_only=True)
    assert state["global_step"] == steps_after(k) + 64 and len(state["rank_states"]) == 1


def test_learning_rate_follows_the_steps_across_resumes(runs, tmp_path):
    """The annealed rate of a round is lr0 * (1 - steps before it / total_timesteps) on every row: before the
    stop (2 ranks), after a resume on 1 rank (another round size), and after one with a larger total."""
    lr0 = Config().learning_rate

    def check(rows: list[dict[str, str]], total: int, step_before: int) -> None:
        for row in rows:
            assert float(row["charts/learning_rate"]) == pytest.approx(lr0 * (1 - step_before / total), rel=1e-6), row
            step_before = int(row["global_step"])

    k, total = stopped_round(runs), steps_after(ROUNDS)
    check(read_csv(runs["tmp"] / "runs" / "r" / "metrics.csv")[:k], total, STEPS_PER_ROUND)  # after round 0
    for name, run_total in (("one_rank", total), ("longer", total + 4 * 64)):
        run_here(
            train_args(tmp_path, name, 0, *POLICY, "--total-timesteps", str(run_total), "--resume", str(stopped(runs)))
        )
        rows = read_csv(tmp_path / "runs" / name / "metrics.csv")
        assert int(rows[-1]["global_step"]) == run_total and len(rows) == (run_total - steps_after(k)) // 64
        check(rows, run_total, steps_after(k))


def test_learning_rate_of_the_command_line_wins_over_the_checkpoints(runs, tmp_path):
    k = stopped_round(runs)
    flags = ["--resume", str(stopped(runs)), "--no-anneal-lr", "--learning-rate", "0.001"]
    run = run_here(train_args(tmp_path, "lr", 0, *POLICY, "--total-timesteps", str(steps_after(k) + 64), *flags))
    assert float(read_csv(tmp_path / "runs" / "lr" / "metrics.csv")[-1]["charts/learning_rate"]) == 0.001
    assert "learning_rate 0.001 (this run's) replaces the checkpoint's" in run.stdout, run.output()


# ----------------------------------------------------------------------------------- Ctrl-C, twice
# (Ctrl-C to torchrun's process group, once: tests/test_overlap.py, with the two-rank run it stops.)
def test_second_ctrl_c_quits_at_once_and_leaves_whole_files(tmp_path):
    """python train.py whose round 3 hangs in an actor: the first Ctrl-C waits for a round that does not end,
    the second quits at once; the round-2 checkpoint stays whole, no actor or temp file is left. The learner is this
    process (tests/fixtures_resume.py); 1.5 s apart is beyond the window in which a repeat counts as the same
    signal delivered twice."""
    hang = ["--env-id", "scripted_env:ScriptedHangRank0-v0", "--seed", "7", "--actor-timeout", "60"]
    ctrl_c_twice = ((0.5, signal.SIGINT), (1.5, signal.SIGINT))
    run = stop_here(train_args(tmp_path, "h", 10, *hang), tmp_path / "debug", 2, ctrl_c_twice)
    # the second came while the run still waited on round 3, and ended it at once, with the status of a stop by
    # SIGINT: not after the hang's 60-s actor timeout, which ends a run with an error (status 1)
    assert run.running == [True, True] and run.rc == 130, run.output()
    assert "quit on a second SIGINT without saving; the latest is" in run.stderr and "(round 2)" in run.stderr
    assert "Traceback" not in run.stderr, run.output()
    run_dir = tmp_path / "runs" / "h"
    assert torch.load(run_dir / "model_h.pt", weights_only=True)["iteration"] == 2
    assert not list(run_dir.glob(".*.tmp"))
    actors = dump(tmp_path / "debug", 0, 2)["actor_pids"]
    deadline = time.monotonic() + 10
    while any(process_alive(p) for p in actors) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_alive(p) for p in actors), "actors left running"


# ------------------------------------------------ 3-4: elastic restart; a killed rank stops every rank
def test_a_killed_rank_restarts_from_the_last_checkpoint_and_with_no_restart_left_stops_every_rank(tmp_path):
    """torchrun --max-restarts=1. SIGKILL to rank 1 after round 3: the group restarts and continues from the last
    checkpoint (every 2 rounds). SIGKILL to the restarted rank 1 three rounds on: no restart is left, so every rank
    stops, soon (rank 0 by itself, having lost contact, not after the collective timeout), keeping the last save."""
    # No --run-name: the restarted rank 0 must find the run the first attempt started.
    run = Launch(torchrun(tmp_path, None, 40, launcher=("--max-restarts=1",)), tmp_path, "e", debug=tmp_path / "debug")
    first = run.wait_for_dump(1, 3)["pid"]
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while (resumed := re.search(r"resumed from .* at round (\d+), step \d+ \(restart 1", run.stdout)) is None:
        assert run.proc.poll() is None and time.monotonic() < deadline, run.output()
        time.sleep(0.05)
    k = int(resumed.group(1))
    # the first attempt's rank 1 dumped at most one round past its last save (k): its round k + 3 is the new group's
    second = run.wait_for_dump(1, k + 3)["pid"]
    assert second != first
    os.kill(second, signal.SIGKILL)
    killed = time.monotonic()
    assert run.wait() != 0
    assert run.ended - killed < FAULT_BOUND, run.output()
    assert "rank 0: lost contact with another rank" in run.stderr, run.output()
    assert sorted(worker_exit_codes(run.stderr)) == [-9, 1], run.output()  # the last attempt's report
    (run_dir,) = (tmp_path / "runs").iterdir()
    resumes = re.findall(rf"resumed from .*model_{re.escape(run_dir.name)}\.pt at round (\d+)", run.stdout)
    assert resumes == [str(k)] and k % 2 == 0, run.output()  # the last save (every 2 rounds) before the first kill
    rows = read_csv(run_dir / "metrics.csv")
    n = len(rows)
    # rounds redone appear once; the restarted group logged round k + 2 at least (rank 1 went on to round k + 3)
    assert n >= k + 2 and [int(r["iteration"]) for r in rows] == list(range(1, n + 1))
    assert tensorboard_steps(run_dir, "charts/SPS") == [steps_after(i) for i in range(1, n + 1)]
    saved = torch.load(run_dir / f"model_{run_dir.name}.pt", weights_only=True)["iteration"]
    assert saved % 2 == 0 and k + 2 <= saved <= n  # a save round of the restarted group
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["torchelastic_restart_count"] == 1 and config["torchelastic_run_id"]


# -------------------------------------------------------------------------- 5: faults stop every rank
FAULTS = {
    "actor exception": (
        "scripted_env:ScriptedRaiseRank1-v0",
        r"rank 1 actor 0 failed \(env 1, step 6, round 3\): EnvError: env 1 failed at step 6 of round 3: "
        r"RuntimeError: scripted failure at lifetime step 102",
    ),
    # round 3 fails during round 2's update. An env's exception and its non-finite reward reach the learner the same
    # way (an EnvError raised in the actor): so one launch each, not two, covers both faults and both ways of running
    # rounds (a launch costs ~10 s of CPU before its first round).
    "non-finite reward, overlapped rounds": (
        "scripted_env:ScriptedNaNRewardRank1-v0",
        r"rank 1 actor 0 failed \(env 1, step 6, round 3\): EnvError: env 1 returned a non-finite reward "
        r"nan at step 6 of round 3",
    ),
    "actor killed": (None, r"rank 1 actor 0 \(pid \d+\) died unexpectedly, exit code -9 \(killed by SIGKILL\)"),
}
FAULTS["actor killed, overlapped rounds"] = FAULTS["actor killed"]  # killed while the learner updates, maybe


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_on_one_rank_stops_every_rank_and_keeps_the_last_checkpoint(fault, tmp_path):
    env_id, message = FAULTS[fault]
    extra = ["--env-id", env_id, "--seed", "7"] if env_id else []
    extra += ["--overlap"] if "overlapped" in fault else []
    run = Launch(torchrun(tmp_path, "f", 40, *extra), tmp_path, "f", debug=tmp_path / "debug")
    run.wait_for_dump(1, 2)
    if env_id is None:
        os.kill(run.wait_for_dump(1, 3)["actor_pids"][0], signal.SIGKILL)
    faulted = time.monotonic()  # the scripted faults come at round 3, a fraction of a second after round 2
    assert run.wait() == 1, run.output()
    assert run.ended - faulted < FAULT_BOUND
    assert sorted(worker_exit_codes(run.stderr)) == [1, 1], run.output()  # every rank, non-zero
    errors = [text for text in run.stderr.splitlines() if text.startswith("train.py: error:")]
    assert len(errors) == 1, run.output()  # one line for the user, from rank 0
    assert re.search(message, errors[0]), errors[0]
    kept = tmp_path / "runs" / "f" / "model_f.pt"
    assert f"(kept the last good checkpoint {kept}, round " in errors[0]
    state = torch.load(kept, weights_only=True)  # whole, and the state of a round that finished
    k = state["iteration"]
    assert k >= 2 and torch.equal(
        torch.cat([v.reshape(-1) for v in state["actor"].values()]), dump(run.debug, 0, k)["params"]
    )
    assert "[rank0]" not in run.stderr and "[rank1]" not in run.stderr
    if env_id is not None:  # the failing rank printed the actor's traceback, once
        assert run.stderr.count("--- traceback in actor process (rank 1 actor 0) ---") == 1
        assert k == 2
    if "overlapped" in fault:  # ranks that average parameters, overlapped: one policy, acting as the round before last
        for r in range(1, 3 if env_id else 4):  # the rounds both ranks finished before the fault
            a, b = dump(run.debug, 0, r), dump(run.debug, 1, r)
            assert torch.equal(a["params"], b["params"]), r
            assert torch.equal(a["behaviour_params"], dump(run.debug, 0, max(r - 2, 0))["params"]), r
