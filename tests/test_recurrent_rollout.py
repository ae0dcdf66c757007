"""A GRU policy's rollout: what the actor writes (states entering chunks, episode starts, the bootstrap's state) is
what the learner needs to reproduce the actor's numbers exactly (issue 26).

The scripted env's episodes last 3 (terminated), 4 (truncated) and 2 (both) steps, so with chunks of 4 steps
episodes start inside chunks, at their first step and across rounds."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import scripted_env  # noqa: E402
from test_train import dump, torchrun  # noqa: E402

from ppo_ddp import evaluate  # noqa: E402
from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.envs.make import env_seed  # noqa: E402
from ppo_ddp.models.factory import make_model  # noqa: E402
from ppo_ddp.models.flat import num_parameters, write_flat_parameters  # noqa: E402
from ppo_ddp.models.gru import RecurrentActorCritic  # noqa: E402
from ppo_ddp.models.normalization import Moments, normalize_obs, value_scale  # noqa: E402
from ppo_ddp.sampling.actor import Actor  # noqa: E402
from ppo_ddp.storage.batch import RolloutBatch  # noqa: E402
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers  # noqa: E402

T, L, E, ROUNDS = 12, 4, 2, 3
OBS_RMS = Moments(np.array([100.0, 2.0, 3.0]), np.array([9.0, 4.0, 300.0]), 50.0)
VALUE_RMS = Moments(np.array(5.0), np.array(16.0), 40.0)  # the last round's: its critic learns normalised returns


def critic_scale(k: int) -> tuple[float, float]:
    """(mean, std) the actor multiplies round k's critic output back with (normalize_value)."""
    return value_scale(VALUE_RMS) if k == ROUNDS - 1 else (0.0, 1.0)


def config(**kw) -> Config:
    defaults = dict(env_id="scripted_env:Scripted-v0", policy="gru", seq_length=L, rnn_hidden_size=8,
                    hidden_sizes=(16,), rollout_length=T, envs_per_actor=E, actors_per_gpu=1, num_minibatches=1,
                    seed=3, normalize_reward=False, normalize_value=True)  # fmt: skip
    return Config(**{**defaults, **kw})


@pytest.fixture(scope="module")
def actor_rounds():
    """Rounds of one in-process actor, new weights each round: (model, the rollout's arrays) per round; sampled once
    for the tests that read them."""
    cfg = config()
    torch.manual_seed(0)
    model = make_model(cfg, 3, 2)
    assert isinstance(model, RecurrentActorCritic)
    buffers = SharedBuffers.create(BufferSpec.for_config(cfg, 1, 3, 2, num_parameters(model)))
    actor = None
    try:
        actor = Actor(cfg, 0, 0, buffers)
        rounds = []
        for k in range(ROUNDS):
            torch.manual_seed(k + 1)
            model = make_model(cfg, 3, 2)
            write_flat_parameters(model, buffers.weights)
            buffers.write_stats(OBS_RMS if k else None, None, VALUE_RMS if k == ROUNDS - 1 else None)
            actor.sample(k)
            batch = RolloutBatch.from_buffers(buffers, torch.device("cpu"))
            arrays = {name: buffers.arrays[name][0].copy() for name in buffers.spec.rollout_fields()}
            rounds.append((model, batch, arrays, OBS_RMS if k else None))
        yield cfg, rounds
    finally:
        if actor is not None:
            actor.close()
        buffers.close()


def test_the_learner_s_unroll_reproduces_the_actor_s_log_probs_and_values(actor_rounds):
    """At the start of the first epoch the PPO ratio is 1: every sample's log-prob and value, recomputed by the
    learner over whole chunks from their stored entering states, are the actor's."""
    _, rounds = actor_rounds
    for k, (model, batch, arrays, _) in enumerate(rounds):
        assert batch.obs.shape == (E * T // L, L, 3) and batch.hidden.shape == (E * T // L, 8)
        with torch.no_grad():
            logp, _, value = model.evaluate_chunks(batch.obs, batch.actions, batch.hidden, batch.episode_start)
        torch.testing.assert_close(logp, batch.logp, rtol=1e-5, atol=1e-5, msg=f"round {k}")
        mean, std = critic_scale(k)
        torch.testing.assert_close(value * std + mean, batch.values, rtol=1e-5, atol=1e-5, msg=f"round {k}")
        starts = arrays["episode_start"]  # [T, E]
        assert starts[1:].any() and (starts.sum(0) >= 2).all(), "episodes start inside the round"


def test_episode_starts_are_where_the_script_starts_episodes_and_their_state_is_zero(actor_rounds):
    cfg, rounds = actor_rounds
    for e in range(E):
        script = scripted_env.expected_script(float(env_seed(cfg.seed, 0, e) % 1000), ROUNDS * T)
        starts = np.concatenate([arrays["episode_start"][:, e] for _, _, arrays, _ in rounds]).astype(bool)
        np.testing.assert_array_equal(starts, script["obs"][:, 2] == 0)  # step 0 of an episode
        for _, _, arrays, _ in rounds:  # a chunk that starts an episode is unrolled from zeros
            for c in range(T // L):
                hidden = arrays["hidden"][c, e]
                assert (hidden == 0).all() == bool(arrays["episode_start"][c * L, e]), (c, e)


def test_a_truncation_bootstraps_from_the_state_after_its_step(actor_rounds):
    """By hand: unroll the env's round up to the truncated step with the torch model, then V(final obs) from the
    state that step left (not a zero state, not the state before the step)."""
    cfg, rounds = actor_rounds
    checked = 0
    for k, (model, _, arrays, obs_rms) in enumerate(rounds):
        for e in range(E):
            script = scripted_env.expected_script(float(env_seed(cfg.seed, 0, e) % 1000), ROUNDS * T)
            for t in np.flatnonzero(arrays["truncated"][:, e] & ~arrays["terminated"][:, e]):
                obs = torch.as_tensor(arrays["obs"][: t + 1, e]).unsqueeze(0)  # the round so far, one chunk
                starts = torch.as_tensor(arrays["episode_start"][: t + 1, e], dtype=torch.float32).unsqueeze(0)
                h0 = torch.as_tensor(arrays["hidden"][0, e]).unsqueeze(0)
                final = normalize_obs(script["final"][k * T + t], obs_rms, cfg.obs_clip)
                with torch.no_grad():
                    _, _, after = model.forward_chunks(obs, h0, starts)  # the state after step t
                    _, value, _ = model.forward_chunks(torch.as_tensor(final).view(1, 1, 3), after, torch.zeros(1, 1))
                    _, wrong, _ = model.forward_chunks(
                        torch.as_tensor(final).view(1, 1, 3), 0 * after, torch.zeros(1, 1)
                    )
                mean, std = critic_scale(k)
                assert arrays["next_values"][t, e] == pytest.approx(value.item() * std + mean, rel=1e-5, abs=1e-5)
                assert abs(value.item() - wrong.item()) > 1e-4  # the state matters: the check can fail
                checked += 1
    assert checked >= 3


# ---- runs: torchrun, both sync modes, resume, evaluate ---------------------------------------------------------
# One 2-rank run in sync_mode "gradients" serves both tests: its ranks are checked, then a copy of it is resumed in
# the default sync_mode "params" (a checkpoint resumes in either mode) and evaluated. Eager, as SMALL says: the
# compiled GRU step has its own tests (tests/test_compiled.py: against the eager one, compiled for the mini-batches
# of chunks a run compiles for, never recompiled).
GRU = ["--policy", "gru", "--seq-length", "4", "--rnn-hidden-size", "8", "--hidden-sizes", "16"]


@pytest.fixture(scope="module")
def gradients_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("gru_gradients")
    proc = torchrun(tmp_path, *GRU, "--sync-mode", "gradients", rounds=2)
    return tmp_path, proc


def test_gru_ranks_that_average_gradients_stay_bitwise_identical(gradients_run):
    tmp_path, _ = gradients_run
    for i in (1, 2):
        a, b = dump(tmp_path, 0, i), dump(tmp_path, 1, i)
        assert torch.equal(a["params"], b["params"]), i
        assert a["metrics"]["losses/policy_loss"] != b["metrics"]["losses/policy_loss"]  # each on its own chunks


def test_a_gru_policy_trains_on_two_ranks_resumes_and_evaluates(gradients_run, tmp_path, capsys):
    source, first = gradients_run
    assert "done: 384 steps" in first.stdout, first.stdout
    shutil.copytree(source / "runs", tmp_path / "runs")  # the fixture's run stays as it is for the other test
    resumed = torchrun(tmp_path, *GRU, "--resume", "auto", rounds=3)  # one more round
    assert "resumed from" in resumed.stdout and "done: 512 steps" in resumed.stdout, resumed.stdout
    checkpoint = tmp_path / "runs" / "t" / "model_t.pt"
    assert torch.load(checkpoint, weights_only=True)["config"]["policy"] == "gru"
    evaluate.main([str(checkpoint), "--episodes", "2"])  # `python -m ppo_ddp.evaluate`'s main
    assert "mean return" in capsys.readouterr().out
