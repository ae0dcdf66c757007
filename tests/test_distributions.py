"""The action distributions (cfg.distribution, issue 61): their log-probs against torch.distributions at and near
the bounds, finite gradients there, the entropy each gives, the deterministic action; then through the program: an
actor's stored actions are the ones its envs got and its log-probs the learner's at the first epoch (MLP and GRU),
the compiled step equals the eager one (tests/test_compiled.py's CONFIGS), two ranks stay bit-identical, and an
exported file acts as the checkpoint (tests/test_export.py's KINDS)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributions import Beta, Normal, TransformedDistribution
from torch.distributions.transforms import AffineTransform, TanhTransform

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from test_compiled import BOUNDS, ThreadRanks, batch_for, mean_std, state  # noqa: E402

from ppo_ddp.algorithm.learner import Learner  # noqa: E402
from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.configuration.validation import validate  # noqa: E402
from ppo_ddp.errors import ConfigError  # noqa: E402
from ppo_ddp.models.distributions import EDGE, ActionDistribution, initial_spread  # noqa: E402
from ppo_ddp.models.factory import make_model  # noqa: E402
from ppo_ddp.models.flat import num_parameters, write_flat_parameters  # noqa: E402
from ppo_ddp.sampling.actor import Actor  # noqa: E402
from ppo_ddp.storage.batch import RolloutBatch  # noqa: E402
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers  # noqa: E402

LOW = torch.tensor([-0.4, -1.0, 0.0, -3.0])  # Humanoid's ±0.4, the usual ±1, an offset range, a wide one
HIGH = torch.tensor([0.4, 1.0, 2.0, 3.0])
CENTER, HALF = (HIGH + LOW) / 2, (HIGH - LOW) / 2
BOUNDED = ("beta", "tanh_gaussian")


def reference(kind: str, out: torch.Tensor, spread: torch.Tensor) -> torch.distributions.Distribution:
    """The same distribution built from torch.distributions."""
    if kind == "gaussian":
        return Normal(out, spread.exp())
    if kind == "tanh_gaussian":
        return TransformedDistribution(Normal(out, spread.exp()), [TanhTransform(), AffineTransform(CENTER, HALF)])
    m, kappa = torch.sigmoid(out), spread.exp()
    return TransformedDistribution(Beta(1 + m * kappa, 1 + (1 - m) * kappa), [AffineTransform(LOW, HIGH - LOW)])


def outputs(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return 1.5 * torch.randn(rows, 4, generator=g, dtype=torch.float64), 0.5 * torch.randn(4, generator=g).double()


def near_bounds(rows: int) -> torch.Tensor:
    """Actions 1e-4 .. 1e-3 of a half-range inside each bound, half of them at the low ones."""
    inside = torch.linspace(1e-4, 1e-3, rows, dtype=torch.float64)[:, None] * HALF.double()
    side = torch.where(torch.arange(rows)[:, None] % 2 == 0, 1.0, -1.0).double()
    return CENTER.double() + side * (HALF.double() - inside)


@pytest.mark.parametrize("kind", ["gaussian", *BOUNDED])
def test_log_probs_are_torch_distributions_inside_and_near_the_bounds(kind):
    # float64, so that the comparison sees the formulas rather than float32 rounding near the bounds
    dist = ActionDistribution(kind, CENTER.double(), HALF.double())
    out, spread = outputs(64)
    sampled = dist.sample(out, spread, torch.Generator().manual_seed(1))
    for actions in (sampled, near_bounds(64)):
        expected = reference(kind, out, spread).log_prob(actions).sum(-1)
        torch.testing.assert_close(dist.log_prob(out, spread, actions), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", BOUNDED)
def test_at_a_bound_the_log_prob_is_the_one_edge_inside_and_its_gradients_are_finite(kind):
    out, spread = (t.float().requires_grad_(True) for t in outputs(8))
    dist = ActionDistribution(kind, CENTER, HALF)
    at_bounds = torch.where(torch.arange(8)[:, None] % 2 == 0, HIGH, LOW)
    logp = dist.log_prob(out, spread, at_bounds)
    inside = CENTER + HALF * torch.where(at_bounds > CENTER, 1 - EDGE, -1 + EDGE)
    torch.testing.assert_close(logp, dist.log_prob(out, spread, inside))
    assert torch.isfinite(logp).all()
    (logp.sum() + dist.entropy(out, spread, at_bounds)).backward()
    assert torch.isfinite(out.grad).all() and torch.isfinite(spread.grad).all()
    assert out.grad.abs().sum() > 0 and spread.grad.abs().sum() > 0


def test_the_entropies():
    out, spread = outputs(4096)
    actions = {k: ActionDistribution(k, CENTER.double(), HALF.double()).sample(out, spread, None) for k in BOUNDED}
    gaussian = ActionDistribution("gaussian").entropy(out, spread, out)
    torch.testing.assert_close(gaussian, Normal(out[0], spread.exp()).entropy().sum())
    beta = ActionDistribution("beta", CENTER.double(), HALF.double()).entropy(out, spread, actions["beta"])
    ref = reference("beta", out, spread)
    torch.testing.assert_close(beta, ref.base_dist.entropy().sum(-1).mean() + torch.log(HIGH - LOW).double().sum())
    # tanh: no closed form. Its estimate at the rollout's samples and -log p of the same samples estimate the same
    # entropy; over 4096 samples they agree to well within their spread
    tanh = ActionDistribution("tanh_gaussian", CENTER.double(), HALF.double())
    estimate = tanh.entropy(out, spread, actions["tanh_gaussian"])
    minus_logp = -tanh.log_prob(out, spread, actions["tanh_gaussian"])
    assert abs(estimate - minus_logp.mean()) < 4 * minus_logp.std() / 4096**0.5


def test_the_deterministic_actions():
    out, spread = outputs(16)
    assert torch.equal(ActionDistribution("gaussian").mode(out, spread), out)
    tanh = ActionDistribution("tanh_gaussian", CENTER.double(), HALF.double()).mode(out, spread)
    torch.testing.assert_close(tanh, CENTER.double() + HALF.double() * torch.tanh(out))
    beta = ActionDistribution("beta", CENTER.double(), HALF.double()).mode(out, spread)
    torch.testing.assert_close(
        beta, LOW.double() + (HIGH - LOW).double() * reference("beta", out, spread).base_dist.mean
    )


def test_beta_starts_at_the_std_log_std_init_names_capped_at_half_a_half_range():
    for log_std_init, std in ((-1.0, np.exp(-1.0)), (-2.0, np.exp(-2.0)), (0.0, 0.5), (-0.5, 0.5)):
        kappa = np.exp(initial_spread("beta", log_std_init))
        alpha = 1 + kappa / 2  # at the centre
        unit_std = np.sqrt(alpha * alpha / ((2 * alpha) ** 2 * (2 * alpha + 1)))  # on [0, 1]
        assert 2 * unit_std == pytest.approx(std), log_std_init


def test_an_env_without_finite_bounds_refuses_a_bounded_distribution():
    with pytest.raises(ConfigError, match=r"^distribution='beta': scripted_env:ScriptedUnbounded-v0: .*finite action"):
        validate(Config(env_id="scripted_env:ScriptedUnbounded-v0", distribution="beta"))
    validate(Config(env_id="scripted_env:ScriptedUnbounded-v0"))  # the Gaussian's samples need no bounds


# ---- through the actor ---------------------------------------------------------------------------------------------
T, E = 16, 3


@pytest.mark.parametrize("policy", ["mlp", "gru"])
@pytest.mark.parametrize("kind", BOUNDED)
def test_an_actor_stores_what_its_envs_got_and_the_learner_s_log_probs(kind, policy):
    """Hopper-v5 stepped by gymnasium (batch_envs off: each env's MjData keeps the last control it got). Every
    stored action is strictly inside the bounds and is the env's control; at the first epoch the learner's
    log-probs of the round's rows are the actor's."""
    cfg = Config(env_id="Hopper-v5", distribution=kind, policy=policy, seq_length=4, rnn_hidden_size=8,
                 hidden_sizes=(16,), rollout_length=T, envs_per_actor=E, actors_per_gpu=1, num_minibatches=1,
                 batch_envs=False, log_std_init=0.0)  # fmt: skip
    model = make_model(cfg, 11, 3, 0, BOUNDS_HOPPER)
    buffers = SharedBuffers.create(BufferSpec.for_config(cfg, 1, 11, 3, num_parameters(model), 0))
    actor = Actor(cfg, 0, 0, buffers)
    try:
        for k in range(2):
            torch.manual_seed(k)
            model = make_model(cfg, 11, 3, 0, BOUNDS_HOPPER)
            write_flat_parameters(model, buffers.weights)
            actor.sample(k)
            stored = buffers.arrays["actions"][0]
            assert (stored > -1).all() and (stored < 1).all()
            ended = buffers.arrays["terminated"][0][-1].astype(bool) | buffers.arrays["truncated"][0][-1].astype(bool)
            going = ~ended  # a reset zeroes the control
            controls = np.stack([env.unwrapped.data.ctrl for env in actor.envs.envs])
            np.testing.assert_array_equal(controls[going], stored[-1][going])
            assert going.any()
            batch = RolloutBatch.from_buffers(buffers, torch.device("cpu"))
            with torch.no_grad():
                if batch.hidden is None:
                    logp = model.evaluate(batch.obs, batch.actions)[0]
                else:
                    logp = model.evaluate_chunks(batch.obs, batch.actions, batch.hidden, batch.episode_start)[0]
            torch.testing.assert_close(logp, batch.logp, rtol=1e-5, atol=1e-5)
    finally:
        actor.close()
        buffers.close()


BOUNDS_HOPPER = (np.full(3, -1.0, np.float32), np.full(3, 1.0, np.float32))


def test_two_ranks_averaging_gradients_stay_bit_identical_with_a_beta_policy():
    ranks = ThreadRanks(2)
    cfg = Config(sync_mode="gradients", update_epochs=2, num_minibatches=4, distribution="beta", ent_coef=0.01)
    learners = []
    for rank in range(2):
        torch.manual_seed(0)
        learners.append(Learner(cfg, make_model(cfg, 11, 3, 0, BOUNDS), torch.device("cpu"), ranks.rank_mean(rank)))

    def train(rank: int) -> dict[str, torch.Tensor]:
        learners[rank].train_step(batch_for(learners[rank].model, seed=10 + rank), mean_std)
        return state(learners[rank])

    start = learners[0].params.clone()
    first, second = ranks.run(train)
    for key, value in first.items():
        assert torch.equal(value, second[key]), key
    assert not torch.equal(first["params"], start)  # it trained
