"""Overlapped rounds (--overlap, ppo_ddp/runner/rounds.py): the actors collect round k+1 while the learner updates on
round k, with the weights of round k-1, into the other rollout slot.

End to end on CPU like tests/test_train.py: real torchrun (gloo), real actors, tiny rounds; every rank dumps its view
of each round (PPO_DDP_DEBUG_DIR), with the weights its actors acted with (`behaviour_params`).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

import pytest
import torch
from launches import DETERMINISTIC, Launch, assert_same_state, torchrun
from test_train import SMALL, read_csv

from ppo_ddp.configuration.config import Config
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers

ROUNDS = 5
ONE_LEARNER_ROUND = 64  # 1 actor x 2 envs x 32 steps


def one_learner(tmp_path: Path, name: str, rounds: int) -> list[str]:
    """python train.py, overlapped, `rounds` training rounds after round 0."""
    total = (rounds + 1) * ONE_LEARNER_ROUND
    return [sys.executable, "train.py", *SMALL, "--overlap", "--total-timesteps", str(total),
            "--runs-dir", str(tmp_path / "runs"), "--run-name", name]  # fmt: skip


def dump(debug: Path, rank: int, k: int) -> dict:
    return torch.load(debug / f"rank{rank}_iter{k}.pt", weights_only=True)


def behaviour_round(k: int) -> int:
    """The round whose updated weights round k acts with, overlapped: k-2 (round 0 seeds the statistics and trains
    nothing, so rounds 1 and 2 both act with the initial weights)."""
    return max(k - 2, 0)


@pytest.fixture(scope="module")
def gradients_run(tmp_path_factory):
    """2 ranks averaging gradients, overlapped."""
    tmp = tmp_path_factory.mktemp("overlap")
    run = Launch(torchrun(tmp, "o", ROUNDS, "--overlap", "--sync-mode", "gradients"), tmp, "o", debug=tmp / "debug")
    assert run.wait() == 0, run.output()
    return tmp


def test_each_round_acts_with_the_weights_of_the_round_before_the_last(gradients_run):
    debug = gradients_run / "debug"
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
    debug = gradients_run / "debug"
    model = ActorCritic(11, 3, (64, 64))
    for k in range(1, ROUNDS + 1):
        d = dump(debug, 0, k)
        torch.nn.utils.vector_to_parameters(d["behaviour_params"], model.parameters())
        with torch.no_grad():
            logp = model.evaluate(d["obs"].reshape(-1, 11), d["actions"].reshape(-1, 3))[0]
        torch.testing.assert_close(logp, d["logp"].reshape(-1), rtol=1e-5, atol=1e-5)
        if k > 1:  # every round is new data
            assert not torch.equal(d["obs"], dump(debug, 0, k - 1)["obs"])


def test_ranks_that_average_gradients_stay_bitwise_identical_overlapped(gradients_run):
    debug = gradients_run / "debug"
    for k in range(1, ROUNDS + 1):
        a, b = dump(debug, 0, k), dump(debug, 1, k)
        assert torch.equal(a["params"], b["params"]), k
        assert not torch.equal(a["obs"], b["obs"]), k  # each on its own data
    rows = read_csv(gradients_run / "runs" / "o" / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, ROUNDS + 1))


def test_a_stopped_overlapped_run_resumes_with_the_round_it_had_in_flight(tmp_path):
    """SIGTERM after round 3, then the printed resume command: the first resumed round acts with the weights the
    uninterrupted run's did (kept in the checkpoint), with the same frozen statistics, noise and env states; the
    resumed run is the uninterrupted one."""
    u = Launch(one_learner(tmp_path, "u", 8), tmp_path, "u", debug=tmp_path / "debug_u")
    assert u.wait() == 0, u.output()
    i = Launch(one_learner(tmp_path, "r", 8), tmp_path, "i", debug=tmp_path / "debug_i")
    os.kill(i.wait_for_dump(0, 3)["pid"], signal.SIGTERM)
    assert i.wait() == 143, i.output()
    line = next(text for text in i.stdout.splitlines() if text.startswith("stopped by"))
    k = int(line.split("after round ", 1)[1].split()[0])
    state = torch.load(tmp_path / "runs" / "r" / "model_r.pt", weights_only=True)
    assert state["iteration"] == k
    (saved,) = state["rank_states"]
    assert torch.equal(saved["behaviour_weights"], dump(tmp_path / "debug_u", 0, k + 1)["behaviour_params"])
    command = shlex.split(line.split("Resume with: ", 1)[1])
    assert command[:2] == ["python", "train.py"], command
    r = Launch([sys.executable, *command[1:]], tmp_path, "r", debug=tmp_path / "debug_r")
    assert r.wait() == 0, r.output()
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


def test_a_gru_policy_trains_overlapped(tmp_path):
    """A GRU's rollout (chunk states, episode starts) through both slots, 2 ranks averaging parameters."""
    gru = ["--policy", "gru", "--seq-length", "4", "--rnn-hidden-size", "8", "--hidden-sizes", "16"]
    run = Launch(torchrun(tmp_path, "g", 3, "--overlap", *gru), tmp_path, "g", debug=tmp_path / "debug")
    assert run.wait() == 0, run.output()
    for k in (1, 2, 3):
        a, b = dump(tmp_path / "debug", 0, k), dump(tmp_path / "debug", 1, k)
        assert torch.equal(a["behaviour_params"], dump(tmp_path / "debug", 0, behaviour_round(k))["params"]), k
        assert torch.equal(a["params"], b["params"]), k


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
