"""Learner.train_step on synthetic on-policy batches: the PPO update contract of DESIGN.md step 5."""

from __future__ import annotations

import dataclasses

import torch

from ppo_ddp.config import Config
from ppo_ddp.learner import Learner, RolloutBatch
from ppo_ddp.model import ActorCritic

OBS, ACT, B = 6, 3, 256


def local_mean_std(x: torch.Tensor) -> tuple[float, float]:
    return x.mean().item(), x.std().item()


def make_batch(model: ActorCritic, seed: int = 0) -> RolloutBatch:
    """An on-policy batch: actions, log-probs and values from the model itself."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, OBS, generator=g)
    with torch.no_grad():
        actions, logp, values = model.sample(obs, g)
    advantages = torch.randn(B, generator=g)
    return RolloutBatch(obs, actions, logp, values, advantages, advantages + values)


def make(cfg: Config) -> tuple[Learner, RolloutBatch]:
    torch.manual_seed(0)
    model = ActorCritic(OBS, ACT)
    return Learner(cfg, model, torch.device("cpu")), make_batch(model)


def test_first_minibatch_is_exactly_on_policy():
    # One epoch, one mini-batch: the metrics are those of the step taken at the data's own parameters.
    learner, batch = make(Config(update_epochs=1, num_minibatches=1))
    m = learner.train_step(batch, local_mean_std)
    assert abs(m["losses/approx_kl"]) < 1e-6
    assert m["losses/clipfrac"] == 0.0


def test_update_moves_the_policy_towards_positive_advantages():
    learner, batch = make(Config(update_epochs=10, num_minibatches=4, clip_coef=0.2))
    before = learner.model.evaluate(batch.obs, batch.actions)[0].detach()
    learner.train_step(batch, local_mean_std)
    after = learner.model.evaluate(batch.obs, batch.actions)[0].detach()
    change = after - before
    adv = batch.advantages
    assert change[adv > 0].mean() > 0 > change[adv < 0].mean()


def test_metrics_and_buffer_size():
    learner, batch = make(Config(update_epochs=2, num_minibatches=8))
    m = learner.train_step(batch, local_mean_std)
    assert m["charts/buffer_size"] == B
    assert m["losses/epochs"] == 2
    assert m["charts/learning_rate"] == Config().learning_rate
    for key in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
                "losses/clipfrac", "losses/explained_variance"):
        assert torch.isfinite(torch.tensor(m[key])), key


def test_kl_early_stop_ends_the_epochs():
    cfg = Config(update_epochs=10, num_minibatches=4, learning_rate=1e-2, target_kl=1e-6)
    learner, batch = make(cfg)
    assert learner.train_step(batch, local_mean_std)["losses/epochs"] == 1
    learner, batch = make(dataclasses.replace(cfg, target_kl=None))
    assert learner.train_step(batch, local_mean_std)["losses/epochs"] == 10


def test_advantages_are_normalised_with_the_global_statistics():
    seen = []

    def global_stats(adv: torch.Tensor) -> tuple[float, float]:
        seen.append(adv.clone())
        return 1000.0, 1.0  # far from the local mean: the update must follow these numbers

    learner, batch = make(Config(update_epochs=1, num_minibatches=1))
    before = learner.model.evaluate(batch.obs, batch.actions)[0].detach()
    learner.train_step(batch, global_stats)
    assert len(seen) == 1 and torch.equal(seen[0], batch.advantages)
    # every normalised advantage is about -1000: the policy moves away from all taken actions
    after = learner.model.evaluate(batch.obs, batch.actions)[0].detach()
    assert (after - before).mean() < 0


def test_value_clipping_bounds_how_far_values_move():
    # Returns far above the old values: with clip_vloss the value loss stops pulling once a value has
    # moved clip_coef away from its old value; without it the values chase the returns.
    def value_shift(clip_vloss: bool) -> float:
        learner, batch = make(Config(update_epochs=10, num_minibatches=2, learning_rate=3e-3, clip_vloss=clip_vloss))
        batch.returns += 50.0
        learner.train_step(batch, local_mean_std)
        with torch.no_grad():
            return (learner.model.value(batch.obs) - batch.values).mean().item()

    assert value_shift(clip_vloss=True) < 1.0 < value_shift(clip_vloss=False)


def test_set_learning_rate():
    learner, _ = make(Config())
    learner.set_learning_rate(1e-5)
    assert all(g["lr"] == 1e-5 for g in learner.optimizer.param_groups)
