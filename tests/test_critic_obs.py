"""The privileged critic (cfg.critic_obs, issue 46): the critic's own observation from the env's info, normalised
with its own statistics, from the actor's env to the learner's mini-batch, for MLP and GRU policies.

In-process actors on ScriptedPrivileged-v0 (tests/scripted_env.py: episodes of 3 steps terminated, 4 truncated, 2
both; info["full_obs"] is [tag, k, s, 10 s + k]) check what arrives row for row, the on-policy identity and the
truncation's bootstrap by hand; a run on ppo_ddp/HopperNoVel-v5 (whose full_obs starts with the policy's five
positions) checks exact resume. The runs of several ranks share launches with other tests (a torchrun launch costs ~10 s
of CPU before its first round): the statistics merged over ranks, evaluation and export are checked on
tests/test_overlap.py's two-rank run, two overlapped GRU ranks that average gradients with a privileged critic on
tests/test_launch_security.py's launch test's run."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import scripted_env  # noqa: E402
from test_exact_resume import assert_a_stopped_learner_resumes_exactly  # noqa: E402
from test_train import ROOT  # noqa: E402

from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.configuration.validation import validate  # noqa: E402
from ppo_ddp.envs.make import env_seed  # noqa: E402
from ppo_ddp.errors import ConfigError  # noqa: E402
from ppo_ddp.models.factory import make_model  # noqa: E402
from ppo_ddp.models.flat import num_parameters, write_flat_parameters  # noqa: E402
from ppo_ddp.models.normalization import Moments, compute_batch_moments, merge_rms_states, normalize_obs, value_scale  # noqa: E402
from ppo_ddp.sampling.actor import Actor  # noqa: E402
from ppo_ddp.storage.batch import RolloutBatch  # noqa: E402
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers  # noqa: E402

T, L, E, ROUNDS, DC = 12, 4, 2, 3, 4
OBS_RMS = Moments(np.array([100.0, 2.0, 3.0]), np.array([9.0, 4.0, 300.0]), 50.0)
CRITIC_RMS = Moments(np.array([90.0, 1.0, 2.0, 30.0]), np.array([16.0, 1.0, 200.0, 900.0]), 70.0)
VALUE_RMS = Moments(np.array(5.0), np.array(16.0), 40.0)


def config(policy: str) -> Config:
    return Config(env_id="scripted_env:ScriptedPrivileged-v0", critic_obs="full_obs", policy=policy, seq_length=L,
                  rnn_hidden_size=8, hidden_sizes=(16,), rollout_length=T, envs_per_actor=E, actors_per_gpu=1,
                  num_minibatches=1, seed=3, normalize_reward=False, normalize_value=True)  # fmt: skip


@pytest.fixture(params=["mlp", "gru"])
def rounds(request):
    """ROUNDS rounds of one in-process actor, new weights each round (statistics from round 1 on, value
    statistics in the last): (cfg, [(model, batch, the rollout's arrays, report, critic_rms)])."""
    cfg = config(request.param)
    model = make_model(cfg, 3, 2, DC)
    buffers = SharedBuffers.create(BufferSpec.for_config(cfg, 1, 3, 2, num_parameters(model), DC))
    actor = None
    try:
        actor = Actor(cfg, 0, 0, buffers)
        out = []
        for k in range(ROUNDS):
            torch.manual_seed(k + 1)
            model = make_model(cfg, 3, 2, DC)
            write_flat_parameters(model, buffers.weights)
            stats = (OBS_RMS, CRITIC_RMS) if k else (None, None)
            buffers.write_stats(stats[0], None, VALUE_RMS if k == ROUNDS - 1 else None, stats[1])
            report = actor.sample(k)
            batch = RolloutBatch.from_buffers(buffers, torch.device("cpu"))  # on the CPU: views of the buffers
            batch = dataclasses.replace(batch, **{f: getattr(batch, f).clone() for f in ("obs", "actions", "logp",
                                                  "values", "critic_obs")})  # fmt: skip
            arrays = {name: buffers.arrays[name][0].copy() for name in buffers.spec.rollout_fields()}
            out.append((model, batch, arrays, report, stats[1]))
        yield cfg, out
    finally:
        if actor is not None:
            actor.close()
        buffers.close()


def script(cfg: Config, e: int) -> dict[str, np.ndarray]:
    return scripted_env.expected_script(float(env_seed(cfg.seed, 0, e) % 1000), ROUNDS * T)


def value_of(model, critic_obs: np.ndarray) -> float:
    """The critic's value of one normalised privileged observation, by the torch model (both kinds: an MLP)."""
    x = torch.as_tensor(critic_obs, dtype=torch.float32).view(1, -1)
    with torch.no_grad():
        return model.value(x).item() if model.__class__.__name__ == "ActorCritic" else _gru_value(model, x)


def _gru_value(model, x: torch.Tensor) -> float:
    obs, starts = torch.zeros(1, 1, 3), torch.ones(1, 1)
    return model.forward_chunks(obs, torch.zeros(1, 8), starts, critic_obs=x.view(1, 1, -1))[1].item()


def test_the_critic_observation_arrives_row_for_row_with_its_own_statistics(rounds):
    """Each step's privileged observation from info, across resets, terminations and truncations, normalised
    with the critic's statistics (not the policy's), in the rollout and in the learner's rows; the report's moments
    are those of the raw privileged rows."""
    cfg, out = rounds
    for k, (_, batch, arrays, report, critic_rms) in enumerate(out):
        raw = np.stack([scripted_env.privileged(script(cfg, e)["obs"][k * T : (k + 1) * T]) for e in range(E)], 1)
        expected = normalize_obs(raw, critic_rms, cfg.obs_clip)
        np.testing.assert_array_equal(arrays["critic_obs"], expected)
        moments = compute_batch_moments(raw.reshape(T * E, DC))
        merged = merge_rms_states(report.critic_moments)  # each env's, merged in env order
        np.testing.assert_allclose(merged.mean, moments.mean, rtol=1e-12)
        np.testing.assert_allclose(merged.var, moments.var, rtol=1e-12)
        assert merged.count == T * E
        rows = expected.transpose(1, 0, 2)  # env by env: rows (env, step), or chunks [E * T/L, L, DC]
        rows = rows.reshape(T * E, DC) if cfg.policy == "mlp" else rows.reshape(E * T // L, L, DC)
        np.testing.assert_array_equal(batch.critic_obs.numpy(), rows)
    assert any(arrays["truncated"].any() and arrays["terminated"].any() for _, _, arrays, _, _ in out)


def test_the_on_policy_identity_holds_with_a_privileged_critic(rounds):
    """At the first epoch the learner's log-probs and values of the round's rows are the actor's."""
    _, out = rounds
    for k, (model, batch, _, _, _) in enumerate(out):
        with torch.no_grad():
            if batch.hidden is None:
                logp, _, value = model.evaluate(batch.obs, batch.actions, critic_obs=batch.critic_obs)
            else:
                logp, _, value = model.evaluate_chunks(
                    batch.obs, batch.actions, batch.hidden, batch.episode_start, critic_obs=batch.critic_obs
                )
        mean, std = value_scale(VALUE_RMS) if k == ROUNDS - 1 else (0.0, 1.0)
        torch.testing.assert_close(logp, batch.logp, rtol=1e-5, atol=1e-5, msg=f"round {k}")
        torch.testing.assert_close(value * std + mean, batch.values, rtol=1e-5, atol=1e-5, msg=f"round {k}")


def test_a_truncation_bootstraps_from_the_final_privileged_observation(rounds):
    """By hand: next_values at a truncated step is V(the final privileged observation), not V of the privileged
    observation the reset gave, nor of anything the policy saw."""
    cfg, out = rounds
    checked = 0
    for k, (model, _, arrays, _, critic_rms) in enumerate(out):
        mean, std = value_scale(VALUE_RMS) if k == ROUNDS - 1 else (0.0, 1.0)
        for e in range(E):
            s = script(cfg, e)
            for t in np.flatnonzero(arrays["truncated"][:, e] & ~arrays["terminated"][:, e]):
                final = normalize_obs(scripted_env.privileged(s["final"][k * T + t]), critic_rms, cfg.obs_clip)
                after_reset = normalize_obs(scripted_env.privileged(s["obs"][k * T + t + 1]), critic_rms, cfg.obs_clip)
                value = value_of(model, final) * std + mean
                assert arrays["next_values"][t, e] == pytest.approx(value, rel=1e-5, abs=1e-5)
                assert abs(value_of(model, after_reset) * std + mean - value) > 1e-3  # the check can fail
                checked += 1
    assert checked >= 3


def test_a_shared_trunk_refuses_a_privileged_critic():
    with pytest.raises(ConfigError, match=r"critic_obs='full_obs': needs shared_trunk false"):
        validate(Config(critic_obs="full_obs", shared_trunk=True), check_env=False)


def test_an_env_without_the_key_is_refused_at_start_in_one_line():
    proc = subprocess.run([sys.executable, "train.py", "--env-id", "Hopper-v5", "--critic-obs", "privileged"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "train.py: error: critic_obs='privileged': Hopper-v5: the env gave no info[\"privileged\"] at reset; the "
        "partly observed envs (ppo_ddp/HalfCheetahNoVel-v5, ppo_ddp/HopperNoVel-v5, ppo_ddp/PendulumNoVel-v1, "
        'ppo_ddp/Walker2dNoVel-v5) give "full_obs"'
    ]


# ---- a run on HopperNoVel-v5 --------------------------------------------------------------------------------------
# Two ranks merging the critic's statistics, evaluation and export: tests/test_overlap.py, on its two-rank run.
PRIVILEGED = ["--env-id", "ppo_ddp/HopperNoVel-v5", "--critic-obs", "full_obs"]


def test_a_run_with_a_privileged_critic_stopped_by_sigterm_resumes_exactly(tmp_path):
    """The carried privileged observations and the critic's statistics travel in the checkpoint (a GRU policy
    with an MLP critic)."""
    extra = [*PRIVILEGED, "--policy", "gru", "--seq-length", "8", "--rnn-hidden-size", "8", "--hidden-sizes", "16"]
    assert_a_stopped_learner_resumes_exactly(tmp_path, *extra)
