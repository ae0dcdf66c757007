"""Overlapped rounds (--overlap, ppo_ddp/runner/rounds.py): the actors collect round k+1 while the learner updates on
round k, with the weights of round k-1, into the other rollout slot.

End to end on CPU like tests/test_train.py: real torchrun (gloo), real actors, tiny rounds; every rank dumps its view
of each round (PPO_DDP_DEBUG_DIR), with the weights its actors acted with (`behaviour_params`). A torchrun launch costs
~10 s of CPU before its first round, so the two-rank run of the first tests serves others too: Ctrl-C stops it, and it
trains a privileged critic (tests/test_critic_obs.py's checks of it on two ranks are here). The one-learner runs train
in this process (tests/fixtures_resume.py). Overlapped GRU ranks: tests/test_launch_security.py, on the run of its
launch test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from fixtures_resume import run_here, stop_here
from launches import DETERMINISTIC, TIMEOUT, Launch, assert_same_state, torchrun, worker_exit_codes
from test_train import SMALL, read_csv

from ppo_ddp import evaluate, export
from ppo_ddp.configuration.config import Config
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers

ROUNDS = 5  # the rounds of the two-rank run that the first tests check; Ctrl-C stops it after them
ONE_LEARNER_ROUND = 64  # 1 actor x 2 envs x 32 steps
GRU = ["--policy", "gru", "--seq-length", "4", "--rnn-hidden-size", "8", "--hidden-sizes", "16"]


def one_learner(tmp_path: Path, name: str, rounds: int, *extra: str) -> list[str]:
    """python train.py, overlapped, `rounds` training rounds after round 0."""
    total = (rounds + 1) * ONE_LEARNER_ROUND
    return [sys.executable, "train.py", *SMALL, "--overlap", "--total-timesteps", str(total),
            "--runs-dir", str(tmp_path / "runs"), "--run-name", name, *extra]  # fmt: skip


def dump(debug: Path, rank: int, k: int) -> dict:
    return torch.load(debug / f"rank{rank}_iter{k}.pt", weights_only=True)


def behaviour_round(k: int) -> int:
    """The round whose updated weights round k acts with, overlapped: k-2 (round 0 seeds the statistics and trains
    nothing, so rounds 1 and 2 both act with the initial weights)."""
    return max(k - 2, 0)


# The two-rank run trains a privileged critic as well (cfg.critic_obs, issue 46, tests/test_critic_obs.py), whose
# statistics merged over ranks, evaluation and export are checked here: one launch for both (~10 s of CPU before its
# first round). ppo_ddp/HopperNoVel-v5's full_obs (11 entries) starts with the policy's five positions; the critic
# values the privileged next observations again at every epoch (recompute_advantages).
PRIVILEGED = ["--env-id", "ppo_ddp/HopperNoVel-v5", "--critic-obs", "full_obs", "--recompute-advantages"]
POSITIONS, CRITIC_DIM = 5, 11


@pytest.fixture(scope="module")
def gradients_run(tmp_path_factory):
    """2 ranks averaging gradients, overlapped, 80 rounds, evaluated every 2; once both have dumped round ROUNDS and
    an evaluation was logged, Ctrl-C: SIGINT to torchrun's process group, as a terminal sends it. (tmp, the launch.)"""
    tmp = tmp_path_factory.mktemp("overlap")
    args = torchrun(tmp, "o", 80, "--overlap", "--sync-mode", "gradients", *PRIVILEGED, "--eval-interval", "2")
    run = Launch(args, tmp, "o", debug=tmp / "debug", new_session=True)
    run.wait_for_dump(0, ROUNDS)
    run.wait_for_dump(1, ROUNDS)
    deadline = time.monotonic() + TIMEOUT
    while not re.search(r"^eval of round \d+ \(step", run.stdout, re.M):
        assert run.proc.poll() is None and time.monotonic() < deadline, run.output()
        time.sleep(0.05)
    os.killpg(run.proc.pid, signal.SIGINT)
    run.wait()
    return tmp, run


def test_each_round_acts_with_the_weights_of_the_round_before_the_last(gradients_run):
    debug = gradients_run[0] / "debug"
    for rank in (0, 1):
        for k in range(1, ROUNDS + 1):
            acted = dump(debug, rank, k)["behaviour_params"]
            assert torch.equal(acted, dump(debug, rank, behaviour_round(k))["params"]), (rank, k)
            if k >= 3:  # and not with the weights the learner held when the round began (those of round k-1)
                assert not torch.equal(acted, dump(debug, rank, k - 1)["params"]), (rank, k)


def test_the_stored_log_probs_are_the_behaviour_policys(gradients_run):
    """The learner's log-probs of a round's actions under the weights the round acted with are the actors' stored
    ones: the rollout the update read is the round's own slot, its fields from one round (a misplaced buffer, or a
    slot the actors were still writing, breaks the identity)."""
    debug = gradients_run[0] / "debug"
    model = ActorCritic(POSITIONS, 3, (64, 64), critic_dim=CRITIC_DIM)
    for k in range(1, ROUNDS + 1):
        d = dump(debug, 0, k)
        torch.nn.utils.vector_to_parameters(d["behaviour_params"], model.parameters())
        obs, critic_obs = d["obs"].reshape(-1, POSITIONS), d["critic_obs"].reshape(-1, CRITIC_DIM)
        with torch.no_grad():
            logp = model.evaluate(obs, d["actions"].reshape(-1, 3), critic_obs=critic_obs)[0]
        torch.testing.assert_close(logp, d["logp"].reshape(-1), rtol=1e-5, atol=1e-5)
        if k > 1:  # every round is new data
            assert not torch.equal(d["obs"], dump(debug, 0, k - 1)["obs"])


def test_ranks_that_average_gradients_stay_bitwise_identical_overlapped(gradients_run):
    debug = gradients_run[0] / "debug"
    for k in range(1, ROUNDS + 1):
        a, b = dump(debug, 0, k), dump(debug, 1, k)
        assert torch.equal(a["params"], b["params"]), k
        assert not torch.equal(a["obs"], b["obs"]), k  # each on its own data
    rows = read_csv(gradients_run[0] / "runs" / "o" / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= ROUNDS


def test_ctrl_c_to_torchrun_stops_the_overlapped_ranks_saves_and_exits_130(gradients_run):
    """torchrun forwards the SIGINT to its workers (which got it from the terminal too): both stop after the same
    round, with the round they had in flight, and save it; one announcement, no worker traceback."""
    tmp, run = gradients_run
    assert sorted(worker_exit_codes(run.stderr)) in ([], [130, 130]), run.output()  # the report lists failures, if any
    line = next(text for text in run.stdout.splitlines() if text.startswith("stopped by SIGINT"))
    k = int(re.search(r"after round (\d+) of", line).group(1))
    assert k >= ROUNDS and torch.load(tmp / "runs" / "o" / "model_o.pt", weights_only=True)["iteration"] == k
    assert len(read_csv(tmp / "runs" / "o" / "metrics.csv")) == k
    assert "stopping after this round" in run.stderr  # said once, by rank 0, when the signal arrived
    assert "[rank0]" not in run.stderr and "[rank1]" not in run.stderr  # no worker tracebacks


# torch.jit's deprecation warnings, from export and the test's load: a launch of `python -m ppo_ddp.export` hid them
@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")
def test_two_ranks_merge_the_critic_statistics_as_the_policy_s_then_evaluate_and_export(gradients_run, capsys):
    """(tests/test_critic_obs.py's, on this run.) After every round both ranks hold the same critic statistics,
    counting every row of both, and their entries of the policy's positions are the policy's statistics to the bit
    (the same data merged the same way); the run evaluates, and its checkpoint evaluates and exports the policy
    alone."""
    tmp, run = gradients_run
    assert re.search(r"^eval of round \d+ \(step \d+\): return", run.stdout, re.M), run.output()
    for k in range(ROUNDS + 1):
        a, b = dump(tmp / "debug", 0, k), dump(tmp / "debug", 1, k)
        assert a["critic_obs"].shape == (1, 32, 2, CRITIC_DIM)
        for key in ("mean", "var"):
            assert torch.equal(a["critic_rms"][key], b["critic_rms"][key])
            assert torch.equal(a["critic_rms"][key][:POSITIONS], a["obs_rms"][key])
        assert a["critic_rms"]["count"] == b["critic_rms"]["count"] == a["obs_rms"]["count"] == 128 * (k + 1)
    checkpoint = tmp / "runs" / "o" / "model_o.pt"
    state = torch.load(checkpoint, weights_only=True)
    assert state["critic_dim"] == CRITIC_DIM and state["critic_obs_rms_state"]["mean"].shape == (CRITIC_DIM,)
    # `python -m ppo_ddp.evaluate` and `python -m ppo_ddp.export`'s mains, here (an interpreter each would cost ~3 s)
    evaluate.main([str(checkpoint), "--episodes", "1"])
    assert "mean return" in capsys.readouterr().out
    export.main([str(checkpoint), "--format", "torchscript", "--output", str(tmp / "p.pt")])
    policy = torch.jit.load(str(tmp / "p.pt"))
    assert policy(torch.zeros(1, POSITIONS)).shape == (1, 3)  # the policy's observation in, no privileged one


def test_a_stopped_overlapped_run_resumes_with_the_round_it_had_in_flight(tmp_path):
    """SIGTERM after round 3, then the printed resume command: the first resumed round acts with the weights the
    uninterrupted run's did (kept in the checkpoint), with the same frozen statistics, noise and env states (a GRU's
    states and episode starts too: a GRU's own critic, overlapped); the resumed run is the uninterrupted one. The
    runs train in this process (tests/fixtures_resume.py), the uninterrupted one between the stop and the resume."""
    i = stop_here(one_learner(tmp_path, "r", 8, *GRU), tmp_path / "debug_i", after_round=3)
    assert i.rc == 143, i.output()
    run_here(one_learner(tmp_path, "u", 8, *GRU), tmp_path / "debug_u")
    line = next(text for text in i.stdout.splitlines() if text.startswith("stopped by"))
    k = int(line.split("after round ", 1)[1].split()[0])
    state = torch.load(tmp_path / "runs" / "r" / "model_r.pt", weights_only=True)
    assert state["iteration"] == k
    (saved,) = state["rank_states"]
    assert torch.equal(saved["behaviour_weights"], dump(tmp_path / "debug_u", 0, k + 1)["behaviour_params"])
    command = shlex.split(line.split("Resume with: ", 1)[1])
    assert command[:2] == ["python", "train.py"], command
    run_here(command, tmp_path / "debug_r")
    first_u, first_r = dump(tmp_path / "debug_u", 0, k + 1), dump(tmp_path / "debug_r", 0, k + 1)
    assert torch.equal(first_r["behaviour_params"], first_u["behaviour_params"])
    assert_same_state(first_r["frozen_obs_rms"], first_u["frozen_obs_rms"], "frozen statistics")
    u_rows, r_rows = (
        read_csv(tmp_path / "runs" / "u" / "metrics.csv"),
        read_csv(tmp_path / "runs" / "r" / "metrics.csv"),
    )
    assert [int(row["global_step"]) for row in r_rows] == [(n + 1) * ONE_LEARNER_ROUND for n in range(1, 9)]
    # the round in flight is collected again from the envs' state at its start (the checkpoint's), so the resumed
    # run is the uninterrupted one to the end, bit for bit
    for a, b in zip(u_rows, r_rows, strict=True):
        assert [a[c] for c in DETERMINISTIC] == [b[c] for c in DETERMINISTIC], (a["iteration"], a, b)
    last_u, last_r = dump(tmp_path / "debug_u", 0, 8), dump(tmp_path / "debug_r", 0, 8)
    assert torch.equal(last_u["params"], last_r["params"])
    assert_same_state(last_r["optimizer"], last_u["optimizer"], "Adam moments at the end")


# Two overlapped GRU ranks with a privileged critic that average gradients: tests/test_launch_security.py, on the run of
# its launch test (test_an_overlapped_gru_with_a_privileged_critic_acts_as_the_round_before_last_ranks_identical).


def test_two_rollout_slots_are_two_regions_of_one_block():
    spec = BufferSpec.for_config(Config(overlap=True, envs_per_actor=2, rollout_length=4), 2, 3, 2, 10)
    assert spec.slots == 2
    buffers = SharedBuffers.create(spec)
    try:
        one, two = buffers.slot(0), buffers.slot(1)
        assert one is buffers
        two.fill_sentinel()
        one.obs.fill_(1.0)
        assert torch.isnan(two.obs).all() and (one.obs == 1.0).all()
        assert two.weights.data_ptr() == one.weights.data_ptr()  # one parameter region
        assert two.obs.data_ptr() - one.obs.data_ptr() == spec.layout()[2]
    finally:
        buffers.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
