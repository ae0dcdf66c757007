"""Scaling PPO: the adaptive learning rate, value normalisation, the gradient-sync mode and the large-batch presets.

End-to-end runs use real torchrun (gloo) and MuJoCo envs on rounds of 128 steps, as tests/test_train.py does; the
presets' runs are train.py's main in this process. That two gradient-synced ranks with m samples each step as one
learner with 2m, and that their early stop is decided on the KL averaged over ranks, is checked on
tests/test_distributed.py's ranks (gloo, without a run to start).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from test_train import ROUNDS, read_csv, torchrun

from ppo_ddp import evaluate
from ppo_ddp.algorithm.learner import ADAPTIVE_LR_BOUNDS, adapted_learning_rate
from ppo_ddp.configuration.config import Config
from ppo_ddp.configuration.loading import parse_config
from ppo_ddp.models.flat import read_flat_parameters
from ppo_ddp.models.kernels import PolicyKernel
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import EPSILON, Moments, value_scale

ROOT = Path(__file__).resolve().parent.parent
STEPS = 128  # a round of SMALL on 2 ranks
LR0 = Config().learning_rate


# ---- the adaptive learning rate -------------------------------------------------------------------------------
def test_adaptive_rate_goes_down_above_the_band_and_up_below_it():
    target = 0.01
    assert adapted_learning_rate(3e-4, 2.01 * target, target) == pytest.approx(2e-4)
    assert adapted_learning_rate(3e-4, 0.49 * target, target) == pytest.approx(4.5e-4)
    for kl in (0.5 * target, target, 2.0 * target, math.nan):  # inside the band (edges included), or no update
        assert adapted_learning_rate(3e-4, kl, target) == 3e-4
    low, high = ADAPTIVE_LR_BOUNDS
    assert adapted_learning_rate(low, 1.0, target) == low and adapted_learning_rate(high, 0.0, target) == high


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--adaptive-lr"], "adaptive_lr=True: the rate follows the KL, so anneal_lr must be false (--no-anneal-lr)"),
        (["--sync-mode", "gradients", "--param-sync-interval", "2"], "param_sync_interval=2: must be 1 with sync_mode"),
        (["--lr-kl-target", "0"], "lr_kl_target=0.0: must be > 0"),
        (["--learner-threads", "0"], "learner_threads=0: must be a positive integer"),
        (["--shared-trunk", "--policy", "gru"], 'shared_trunk=True: needs policy "mlp"'),
    ],
)
def test_bad_scaling_flags_are_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(argv, check_env=False)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


# ---- a shared trunk -------------------------------------------------------------------------------------------
def test_a_shared_trunk_is_one_body_whose_features_both_linear_heads_read():
    torch.manual_seed(0)
    separate, shared = ActorCritic(10, 3, (64, 32), "elu"), ActorCritic(10, 3, (64, 32), "elu", shared_trunk=True)
    # the separate model's keys are those of every checkpoint written before shared_trunk existed
    assert [n for n, _ in separate.named_parameters()] == [
        "actor_logstd",
        *(f"critic.{i}.{w}" for i in (0, 2, 4) for w in ("weight", "bias")),
        *(f"actor_mean.{i}.{w}" for i in (0, 2, 4) for w in ("weight", "bias")),
    ]
    assert [tuple(p.shape) for n, p in shared.named_parameters() if not n.startswith("trunk.")] == [
        (3,), (1, 32), (1,), (3, 32), (3,)
    ]  # fmt: skip
    body = (10 * 64 + 64) + (64 * 32 + 32)
    assert sum(p.numel() for p in shared.parameters()) == body + (32 + 1) + (32 * 3 + 3) + 3
    # the value's gradient reaches the policy's layers through the trunk, and only there
    obs = torch.randn(5, 10)
    for model, reaches in ((separate, False), (shared, True)):
        model.zero_grad()
        model.value(obs).sum().backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        assert all(g is None or not g.any() for n, g in grads.items() if n.startswith("actor_mean."))
        assert any(g is not None and g.any() for n, g in grads.items() if n.startswith("trunk.")) == reaches


# ---- value normalisation --------------------------------------------------------------------------------------
def test_the_actors_scale_a_normalised_critic_back_to_reward_units():
    torch.manual_seed(0)
    model = ActorCritic(5, 2, (16, 16))
    obs = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    stats = Moments(np.array(3.0), np.array(4.0), 10.0)
    kernel = PolicyKernel(model, "tanh")
    kernel.load(model, stats)
    _, value = kernel(obs)
    expected = model.value(torch.from_numpy(obs)).detach().numpy() * math.sqrt(4.0 + EPSILON) + 3.0
    np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)


# ---- 2 ranks, gradients averaged, value normalisation and the adaptive rate -----------------------------------
def synced(lr_kl_target: float = 1e-7, target_kl: float = 1e-5) -> list[str]:
    """Gradient sync, value normalisation and the adaptive rate. By default every round's KL is far above both
    targets: the rate goes down after every round, and every update stops after its first epoch (so a rank's
    approx_kl is its first epoch's KL)."""
    return ["--sync-mode", "gradients", "--normalize-value", "--adaptive-lr", "--no-anneal-lr"] + [
        "--lr-kl-target",
        repr(lr_kl_target),
        "--target-kl",
        repr(target_kl),
    ]


@pytest.fixture(scope="module")
def synced_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("synced")
    proc = torchrun(tmp_path, *synced())
    return tmp_path, proc


def dump(tmp_path: Path, rank: int, iteration: int) -> dict:
    return torch.load(tmp_path / "debug" / f"rank{rank}_iter{iteration}.pt", weights_only=True)


def test_gradient_sync_keeps_the_ranks_bitwise_identical_after_every_round(synced_run):
    tmp_path, _ = synced_run
    start = dump(tmp_path, 0, 0)["params"]
    for i in range(1, ROUNDS + 1):
        a, b = dump(tmp_path, 0, i), dump(tmp_path, 1, i)
        assert torch.equal(a["params"], b["params"]), i
        assert a["metrics"]["losses/epochs"] == b["metrics"]["losses/epochs"]  # the early stop agreed
        # each rank trained on its own data, yet they moved together
        assert a["metrics"]["losses/policy_loss"] != b["metrics"]["losses/policy_loss"]
    assert not torch.equal(dump(tmp_path, 0, ROUNDS)["params"], start)


def test_value_statistics_are_the_moments_of_every_rank_s_returns(synced_run):
    tmp_path, _ = synced_run
    seen = []
    for i in range(0, ROUNDS + 1):
        a, b = dump(tmp_path, 0, i), dump(tmp_path, 1, i)
        seen += [a["returns"].reshape(-1).double(), b["returns"].reshape(-1).double()]
        everything = torch.cat(seen)
        for key in ("mean", "var", "count"):
            assert a["value_rms"][key] == b["value_rms"][key]
        assert a["value_rms"]["count"] == everything.numel() == (i + 1) * STEPS
        assert float(a["value_rms"]["mean"]) == pytest.approx(everything.mean().item(), rel=1e-9)
        assert float(a["value_rms"]["var"]) == pytest.approx(everything.var(unbiased=False).item(), rel=1e-9)
    saved = torch.load(tmp_path / "runs" / "t" / "model_t.pt", weights_only=True)
    for key in ("mean", "var", "count"):
        assert saved["value_rms_state"][key] == dump(tmp_path, 0, ROUNDS)["value_rms"][key]


def test_adaptive_rate_is_the_same_on_every_rank_and_follows_the_averaged_kl(synced_run):
    tmp_path, _ = synced_run
    rows = read_csv(tmp_path / "runs" / "t" / "metrics.csv")
    rates = [float(r["charts/learning_rate"]) for r in rows]
    assert rates == pytest.approx([LR0 / 1.5**k for k in range(ROUNDS)], rel=1e-12)
    for i, row in enumerate(rows, start=1):
        assert (
            dump(tmp_path, 0, i)["learning_rate"]
            == dump(tmp_path, 1, i)["learning_rate"]
            == float(row["charts/learning_rate"])
        )
        assert float(row["losses/approx_kl"]) > 2e-7
    saved = torch.load(tmp_path / "runs" / "t" / "model_t.pt", weights_only=True)
    assert saved["learning_rate"] == pytest.approx(LR0 / 1.5**ROUNDS, rel=1e-12)  # the next round's rate


def between(rank_values: list[float]) -> float:
    """A threshold above the ranks' mean and below the largest rank's value: a decision taken on the mean goes one
    way, one taken on the largest rank's own value the other."""
    assert rank_values[0] != rank_values[1]
    return (float(np.mean(rank_values)) + max(rank_values)) / 2


def round_one_kls(synced_run) -> list[float]:
    source, _ = synced_run
    return [dump(source, rank, 1)["metrics"]["losses/approx_kl"] for rank in (0, 1)]


def test_the_adaptive_rate_is_decided_on_the_kl_averaged_over_ranks(synced_run, tmp_path):
    """Round 1 as in the fixture (each update stops after its first epoch), whose KLs the fixture logged: with
    2 * lr_kl_target between their mean and the larger, the mean keeps the rate, one rank alone would lower it."""
    torchrun(tmp_path, *synced(lr_kl_target=between(round_one_kls(synced_run)) / 2), rounds=2)
    for rank in (0, 1):
        assert dump(tmp_path, rank, 2)["learning_rate"] == dump(tmp_path, rank, 1)["learning_rate"] == LR0


def test_the_actors_value_is_the_normalised_critic_scaled_back(synced_run):
    """Round k's values in the buffer are the critic of round k-1's update on the observations the actors saw,
    scaled back with the value statistics that update used."""
    tmp_path, _ = synced_run
    model = ActorCritic(11, 3, (64, 64), "tanh", 0.0)
    for k in range(2, ROUNDS + 1):
        before, now = dump(tmp_path, 0, k - 1), dump(tmp_path, 0, k)
        read_flat_parameters(model, before["params"])
        mean, std = value_scale(Moments.from_state(before["value_rms"]))
        with torch.no_grad():
            expected = model.value(now["obs"]) * std + mean
        torch.testing.assert_close(now["values"], expected, rtol=1e-4, atol=1e-4)


def test_adaptive_rate_and_value_statistics_come_back_on_resume(synced_run, tmp_path):
    source, _ = synced_run
    shutil.copytree(source / "runs", tmp_path / "runs")  # the fixture's run stays as it is for the other tests
    saved = torch.load(tmp_path / "runs" / "t" / "model_t.pt", weights_only=True)
    torchrun(tmp_path, *synced(), "--resume", "auto", rounds=ROUNDS + 1)  # one more round
    rows = read_csv(tmp_path / "runs" / "t" / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, ROUNDS + 2))
    assert float(rows[ROUNDS]["charts/learning_rate"]) == saved["learning_rate"]  # exactly the saved rate
    resumed = dump(tmp_path, 0, ROUNDS + 1)
    assert resumed["value_rms"]["count"] == saved["value_rms_state"]["count"] + STEPS  # merged once more, not reset


def test_evaluate_does_not_need_the_value_statistics(synced_run, tmp_path, capsys):
    source, _ = synced_run
    state = torch.load(source / "runs" / "t" / "model_t.pt", weights_only=True)
    del state["value_rms_state"]
    path = tmp_path / "policy.pt"
    torch.save(state, path)
    evaluate.main([str(path), "--episodes", "1"])  # `python -m ppo_ddp.evaluate`'s main, in this process
    assert "Hopper-v5: mean return" in capsys.readouterr().out


# ---- the presets ------------------------------------------------------------------------------------------------
PRESETS = sorted((ROOT / "ppo_ddp" / "configs" / "scale").glob("*.yaml"))


def test_there_are_large_batch_presets():
    assert {p.stem for p in PRESETS} >= {"humanoid", "ant"}


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_a_preset_loads_and_runs_two_rounds(preset, tmp_path, restore_signal_handlers):
    from ppo_ddp.runner.launch import main

    assert parse_config(["--config", str(preset)]).total_timesteps >= 10_000_000
    # The preset's actors, mini-batches, epochs and network, on rounds of 8 envs x 16 steps (its own 64 x 64 or 128
    # are what two rounds cost, not what they prove), evaluated over 2 episodes (a random Ant's last 1000 steps
    # each); not compiled (a new shape's compile is ~20 s; the compiled step has its own tests).
    short = ["--num-envs", "8", "--rollout-length", "16", "--eval-episodes", "2", "--no-compile"]
    argv = ["--config", str(preset), *short, "--runs-dir", str(tmp_path / "runs"), "--run-name", "p"]
    cfg = parse_config(argv)
    assert cfg.normalize_value and cfg.adaptive_lr and cfg.eval_interval > 0
    per_round = cfg.num_envs * cfg.rollout_length
    argv += ["--total-timesteps", str(3 * per_round)]  # round 0 seeds the statistics, then two rounds train
    main(parse_config(argv), ["train.py", *argv])
    rows = read_csv(tmp_path / "runs" / "p" / "metrics.csv")
    assert [int(r["global_step"]) for r in rows] == [2 * per_round, 3 * per_round]
    assert all(math.isfinite(float(r["losses/value_loss"])) for r in rows)
    assert yaml.safe_load((tmp_path / "runs" / "p" / "config.yaml").read_text())["config"]["normalize_value"] is True
    evaluations = read_csv(tmp_path / "runs" / "p" / "eval.csv")  # on by default: after the last round too
    assert [int(r["global_step"]) for r in evaluations] == [3 * per_round]
    assert int(evaluations[0]["episodes"]) == cfg.eval_episodes == 2
