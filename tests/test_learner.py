"""Learner.train_step on synthetic on-policy batches: the PPO update contract (docs/design.md, "a round", step 5)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from ppo_ddp.algorithm.gae import compute_gae
from ppo_ddp.algorithm.learner import Learner
from ppo_ddp.algorithm.ppo_step import Minibatch
from ppo_ddp.configuration.config import Config
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import tensor_moments
from ppo_ddp.storage.batch import RolloutBatch, RoundSteps

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
    for key in (
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
    ):
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


@pytest.mark.parametrize("policy", ["mlp", "gru"])
def test_the_bounds_loss_is_the_weighted_squared_norm_of_the_action_mean(policy):
    from ppo_ddp.algorithm.ppo_step import Minibatch, PPOStep
    from ppo_ddp.models.factory import make_model

    cfg = Config(policy=policy, seq_length=4, hidden_sizes=(16,), rnn_hidden_size=8)
    torch.manual_seed(0)
    model = make_model(cfg, OBS, ACT)
    g = torch.Generator().manual_seed(1)
    shape = (8, 4) if policy == "gru" else (32,)
    mb = Minibatch(torch.randn(*shape, OBS, generator=g), torch.randn(*shape, ACT, generator=g),
                   torch.randn(shape, generator=g), torch.randn(shape, generator=g), torch.randn(shape, generator=g),
                   torch.randn(shape, generator=g), torch.zeros(8, 8) if policy == "gru" else None,
                   torch.zeros(8, 4) if policy == "gru" else None)  # fmt: skip
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]) + 0.3  # means well away from 0
    mean = model.evaluate_minibatch(mb, [t.view_as(p) for p, t in zip(model.parameters(), params.split(
        [p.numel() for p in model.parameters()]))])[3]  # fmt: skip
    without = PPOStep(cfg, model).loss(params, mb)[0]
    with_it = PPOStep(dataclasses.replace(cfg, bounds_loss_coef=0.05), model).loss(params, mb)[0]
    expected = 0.05 * mean.pow(2).sum(-1).mean()
    assert expected > 1e-3
    torch.testing.assert_close(with_it - without, expected, rtol=1e-5, atol=1e-7)


def test_set_learning_rate():
    learner, _ = make(Config())
    learner.set_learning_rate(1e-5)
    assert learner.learning_rate == 1e-5
    assert learner.optimizer.lr.item() == pytest.approx(1e-5)  # the tensor the step reads


def reference_round(cfg: Config, model: ActorCritic, batch: RolloutBatch, seed: int) -> list[float]:
    """The textbook update the learner's fast path must equal: per-tensor Adam, torch's clip_grad_norm_,
    mini-batches indexed out of the round, per-sample entropy; returns the per-step policy losses."""
    from torch import nn

    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, eps=1e-5, foreach=False)
    generator = torch.Generator().manual_seed(seed)
    adv = (batch.advantages - batch.advantages.mean()) / (batch.advantages.std() + 1e-8)
    size = len(batch) // cfg.num_minibatches
    pg_losses = []
    for _ in range(cfg.update_epochs):
        permutation = torch.randperm(len(batch), generator=generator)
        for start in range(0, len(batch), size):
            idx = permutation[start : start + size]
            mean = model.action_mean(batch.obs[idx])
            std = model.actor_logstd.exp().expand_as(mean)
            dist = torch.distributions.Normal(mean, std)
            logp, entropy = dist.log_prob(batch.actions[idx]).sum(-1), dist.entropy().sum(-1)
            ratio = (logp - batch.logp[idx]).exp()
            pg = torch.max(-adv[idx] * ratio, -adv[idx] * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
            v = 0.5 * (model.value(batch.obs[idx]) - batch.returns[idx]).pow(2).mean()
            loss = pg - cfg.ent_coef * entropy.mean() + cfg.vf_coef * v
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            pg_losses.append(pg.item())
    return pg_losses


def test_fast_update_equals_the_textbook_update():
    # Flat parameters with the step's own Adam, one gather per epoch, the entropy as one number: the same PPO as
    # the plain per-tensor version with torch's Adam, up to float rounding (an entropy bonus on, so its gradient
    # counts).
    cfg = Config(update_epochs=3, num_minibatches=4, clip_vloss=False, ent_coef=0.01, max_grad_norm=0.05, seed=7)
    learner, batch = make(cfg)
    torch.manual_seed(0)
    reference = ActorCritic(OBS, ACT)
    assert all(torch.equal(p, q) for p, q in zip(reference.parameters(), learner.model.parameters()))
    expected_pg = reference_round(cfg, reference, batch, cfg.seed)
    metrics = learner.train_step(batch, local_mean_std)
    for p, q in zip(reference.parameters(), learner.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    assert abs(metrics["losses/policy_loss"] - sum(expected_pg) / len(expected_pg)) < 1e-5
    assert (
        max(p.sub(q).abs().max().item() for p, q in zip(reference.parameters(), make(cfg)[0].model.parameters())) > 1e-3
    )


def test_parameters_live_in_the_flat_buffer():
    learner, batch = make(Config(update_epochs=1, num_minibatches=2))
    flat = learner.flat_params
    params = list(learner.model.parameters())
    assert flat.numel() == sum(p.numel() for p in params)
    learner.train_step(batch, local_mean_std)
    offset = 0
    for p in params:  # still views after the steps: nothing was cut loose
        assert p.data_ptr() == flat.data_ptr() + offset * flat.element_size()
        assert torch.equal(p.detach().reshape(-1), flat.detach()[offset : offset + p.numel()])
        offset += p.numel()
    # loading a state dict writes through to the buffer the optimizer steps
    state = {k: torch.zeros_like(v) for k, v in learner.model.state_dict().items()}
    learner.model.load_state_dict(state)
    assert flat.abs().sum().item() == 0.0


class NoFloat64(torch.Tensor):
    """A stand-in for a tensor on a device without float64 (MPS): any op on it that would make a float64 tensor
    raises, as MPS does. `.cpu()` leaves the device, so what follows it is a plain CPU tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = super().__torch_function__(func, types, args, kwargs)
        if func is torch.Tensor.cpu or (
            func is torch.Tensor.to and "cpu" in [str(a) for a in (*args[1:], *kwargs.values())]
        ):
            return out.as_subclass(torch.Tensor)
        results = out if isinstance(out, (tuple, list)) else (out,)
        if any(isinstance(r, torch.Tensor) and r.dtype == torch.float64 for r in results):
            raise TypeError(f"{getattr(func, '__name__', func)}: this device has no float64")
        return out


def on_device_without_float64(batch: RolloutBatch) -> RolloutBatch:
    fields = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    return RolloutBatch(*(t if t is None else t.as_subclass(NoFloat64) for t in fields))


def test_stand_in_refuses_float64_on_the_device_only():
    x = torch.ones(3).as_subclass(NoFloat64)
    with pytest.raises(TypeError, match="no float64"):
        x.double()
    assert type(x.cpu().double()) is torch.Tensor


def test_the_learners_statistics_run_on_a_device_without_float64():
    """The round's statistics on the learner's side (advantage moments, loss means) ask the device for no
    float64: they move to the CPU first. Same numbers as on plain CPU tensors."""
    learner, batch = make(Config(update_epochs=2, num_minibatches=4))
    moments = tensor_moments(on_device_without_float64(batch).advantages)
    assert moments == tensor_moments(batch.advantages)
    metrics = learner.train_step(on_device_without_float64(batch), local_mean_std)
    reference, _ = make(Config(update_epochs=2, num_minibatches=4))
    assert metrics == reference.train_step(batch, local_mean_std)


# ---- recompute_advantages ------------------------------------------------------------------------------------
def gae_of(model: ActorCritic, batch: RolloutBatch, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: GAE of the round with the model's critic, rows (env, step) put on the [T, N] grid by an index
    of their own."""
    steps, (T, n) = batch.steps, batch.steps.rewards.shape
    index = torch.arange(len(batch)).reshape(n, T).movedim(1, 0)
    with torch.no_grad():
        values, next_values = model.value(batch.obs)[index], model.value(steps.next_obs)[index]
    grid = compute_gae(steps.rewards, values, next_values, steps.terminated, steps.truncated, cfg.gamma, cfg.gae_lambda)
    advantages, returns = torch.empty(len(batch)), torch.empty(len(batch))
    advantages[index.reshape(-1)], returns[index.reshape(-1)] = (g.reshape(-1) for g in grid)
    return advantages, returns


def round_with_steps(model: ActorCritic, cfg: Config, actors: int = 2, T: int = 16, envs: int = 8) -> RolloutBatch:
    """A round of actors x T x envs steps with episode ends of both kinds, its advantages those of the model."""
    g = torch.Generator().manual_seed(5)
    rows = actors * T * envs
    obs = torch.randn(rows, OBS, generator=g)
    with torch.no_grad():
        actions, logp, values = model.sample(obs, g)
    steps = RoundSteps(
        next_obs=torch.randn(rows, OBS, generator=g),
        rewards=torch.randn(T, actors * envs, generator=g),
        terminated=torch.rand(T, actors * envs, generator=g) < 0.1,
        truncated=torch.rand(T, actors * envs, generator=g) < 0.1,
    )
    batch = RolloutBatch(obs, actions, logp, values, values, values, steps=steps)
    batch.advantages, batch.returns = gae_of(model, batch, cfg)
    return batch


def test_recomputed_advantages_are_those_of_the_critic_each_epoch_starts_with():
    # Two epochs with recomputation == one epoch, then one more on the round's advantages recomputed by the
    # reference with the critic the first left (the old values, for value clipping, stay the actors').
    cfg = Config(update_epochs=2, num_minibatches=4, recompute_advantages=True)
    learner, _ = make(cfg)
    batch = round_with_steps(learner.model, cfg)
    learner.train_step(batch, lambda adv: pytest.fail("normalised with this rank's statistics, no collective"))

    one_epoch = dataclasses.replace(cfg, update_epochs=1, recompute_advantages=False)
    reference, _ = make(one_epoch)
    reference.train_step(dataclasses.replace(batch, steps=None), local_mean_std)
    advantages, returns = gae_of(reference.model, batch, cfg)
    assert not torch.allclose(advantages, batch.advantages, atol=1e-3)  # the critic has learned
    reference.train_step(dataclasses.replace(batch, advantages=advantages, returns=returns, steps=None), local_mean_std)
    torch.testing.assert_close(learner.params, reference.params, rtol=1e-5, atol=1e-6)

    without, _ = make(dataclasses.replace(cfg, recompute_advantages=False))
    without.train_step(dataclasses.replace(batch, steps=None), local_mean_std)
    assert not torch.allclose(without.params, learner.params, atol=1e-5)


def test_overlapped_the_clip_and_the_kl_are_from_the_weights_the_update_starts_with():
    """Overlapped rounds act with weights a round old. The clip is centred on the weights the update starts with,
    and approx_kl (what adaptive_lr and target_kl read) and clipfrac are that update's own step, not the lag: one
    mini-batch step from the starting weights has moved nothing when they are taken, though the stored log-probs
    are another policy's."""
    sync, batch = make(Config(update_epochs=1, num_minibatches=1))
    stale = dataclasses.replace(batch, logp=batch.logp - 0.5)  # as if weights a round older had acted
    assert sync.train_step(stale, local_mean_std)["losses/approx_kl"] > 0.1
    overlapped, _ = make(Config(update_epochs=1, num_minibatches=1, overlap=True))
    m = overlapped.train_step(stale, local_mean_std)
    assert abs(m["losses/approx_kl"]) < 1e-6 and m["losses/clipfrac"] == 0.0


def test_overlapped_each_sample_is_weighted_by_the_starting_over_the_behaviour_policy():
    """The lag's correction: each sample's clipped term times pi_start / pi_behaviour. Behaviour log-probs lower by
    0.5 everywhere give e^0.5 times the policy gradient of the round collected with the starting weights."""
    learner, batch = make(Config(vf_coef=0.0))
    fresh = Minibatch(batch.obs, batch.actions, batch.logp, batch.values, -batch.advantages, batch.returns)
    stale = dataclasses.replace(fresh, old_logp=batch.logp - 0.5, prox_logp=batch.logp)
    on_policy, _, _ = learner.ppo.gradient(learner.params, fresh)
    lagged, _, log_ratio = learner.ppo.gradient(learner.params, stale)
    torch.testing.assert_close(lagged, math.exp(0.5) * on_policy)
    assert log_ratio.abs().max() == 0.0  # the ratio is to the starting weights


def test_overlapped_the_lag_weight_is_truncated_at_lag_weight_max():
    """V-trace's truncation: with lag_weight_max 1.2 a weight of e^0.5 (1.65) counts as 1.2, and a weight of e^-0.5
    (under the bound) is left as it is."""
    learner, batch = make(Config(vf_coef=0.0, lag_weight_max=1.2))
    fresh = Minibatch(batch.obs, batch.actions, batch.logp, batch.values, -batch.advantages, batch.returns)
    on_policy, _, _ = learner.ppo.gradient(learner.params, fresh)
    above = dataclasses.replace(fresh, old_logp=batch.logp - 0.5, prox_logp=batch.logp)
    below = dataclasses.replace(fresh, old_logp=batch.logp + 0.5, prox_logp=batch.logp)
    torch.testing.assert_close(learner.ppo.gradient(learner.params, above)[0], 1.2 * on_policy)
    torch.testing.assert_close(learner.ppo.gradient(learner.params, below)[0], math.exp(-0.5) * on_policy)


def test_overlapped_a_round_the_starting_weights_collected_is_updated_as_in_sync_rounds():
    """With no lag the weight is exactly 1 and the clip's centre is the behaviour policy: the sync update, bit for
    bit (the overlapped path adds no rounding of its own)."""
    cfg = Config(update_epochs=2, num_minibatches=4)
    sync, batch = make(cfg)
    overlapped, _ = make(dataclasses.replace(cfg, overlap=True))
    assert sync.train_step(batch, local_mean_std) == overlapped.train_step(batch, local_mean_std)
    assert torch.equal(sync.params, overlapped.params)
