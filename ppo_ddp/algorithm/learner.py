"""The learner's PPO update on one rank's on-policy rollout (docs/design.md, "a round", step 5)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Optional

import torch

from ppo_ddp.algorithm import compiled
from ppo_ddp.algorithm.gae import compute_gae
from ppo_ddp.algorithm.ppo_step import FlatAdam, Minibatch, PPOStep
from ppo_ddp.configuration.config import Config
from ppo_ddp.errors import NonFiniteError
from ppo_ddp.models.flat import flatten_parameters_
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.storage.batch import RolloutBatch

# (mean, std) of the advantages over all ranks' data; a collective under torchrun.
GlobalMeanStd = Callable[[torch.Tensor], "tuple[float, float]"]
# Replace a tensor by its mean over ranks, in place (distributed.average_); nothing to do with one rank.
RankMean = Callable[[torch.Tensor], None]


def _no_other_ranks(tensor: torch.Tensor) -> None:
    pass


def check_finite(model: torch.nn.Module, metrics: dict[str, float], rank: int, iteration: int) -> None:
    """A NaN must not reach the weight average (it would spread to every rank) nor a checkpoint."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if not bool(torch.isfinite(flat).all()):
        bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
        raise NonFiniteError(
            f"rank {rank}: non-finite parameters ({', '.join(bad)}) after the update of round {iteration}"
        )
    for key in ("losses/policy_loss", "losses/value_loss"):
        if not math.isfinite(metrics[key]):
            raise NonFiniteError(f"rank {rank}: non-finite {key} ({metrics[key]}) in the update of round {iteration}")


def annealed_learning_rate(initial: float, global_step: int, total_timesteps: int) -> float:
    """The linearly annealed rate of a round that starts after global_step env steps: a function of the steps
    alone, so it continues unchanged across a resume on another world size or round size."""
    return initial * max(0.0, 1.0 - global_step / total_timesteps)


ADAPTIVE_LR_FACTOR = 1.5
ADAPTIVE_LR_BOUNDS = (1e-6, 1e-2)


def adapted_learning_rate(lr: float, kl: float, kl_target: float) -> float:
    """rl_games' adaptive schedule, once a round: the next round's rate from this round's KL (averaged over ranks,
    so every rank computes the same rate). A NaN KL (no update) leaves the rate as it is."""
    low, high = ADAPTIVE_LR_BOUNDS
    if kl > 2.0 * kl_target:
        return max(lr / ADAPTIVE_LR_FACTOR, low)
    if kl < 0.5 * kl_target:
        return min(lr * ADAPTIVE_LR_FACTOR, high)
    return lr


class Learner:
    """PPO on one rank: the epochs, the shuffling and the metrics around the mini-batch step of
    ppo_ddp/algorithm/ppo_step.py.

    With cfg.sync_mode "gradients", `rank_mean` averages the flat gradient over ranks between the step's two
    parts (gradient, then clip and Adam) and the early-stop KL at every epoch, so all ranks take the same
    steps; the learner itself knows nothing of torch.distributed.
    """

    def __init__(
        self, cfg: Config, model: ActorCritic, device: torch.device, rank_mean: RankMean = _no_other_ranks
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.device = device
        self.sync_gradients = cfg.sync_mode == "gradients"
        self.rank_mean = rank_mean
        self.flat_params = flatten_parameters_(model)
        self.params = self.flat_params.detach()  # what the step updates in place; the model's parameters view it
        self.optimizer = FlatAdam(self.params, cfg.learning_rate)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(cfg.seed)
        # The step's parts as they run: the functions themselves (eager) until compile() replaces them.
        self.ppo = PPOStep(cfg, model)
        self.step, self.gradient, self.apply = self.ppo, self.ppo.gradient, self.ppo.apply

    def compile(self, minibatch_size: int) -> Optional[str]:
        """Compile the step for mini-batches of this size (the run's only shape) and run it once, so that the first
        round pays nothing; returns None, or why the step stays eager (the learner then trains eagerly)."""
        example = self._example(minibatch_size)
        if self.sync_gradients:  # the all_reduce between the two parts stays outside the compiled graphs

            def warm_up(gradient: Callable, apply: Callable) -> None:
                apply(self.params, gradient(self.params, example)[0], self.optimizer)

            parts, problem = compiled.compile_functions([self.ppo.gradient, self.ppo.apply], warm_up, self._state())
            self.gradient, self.apply = parts
        else:

            def warm_up(step: Callable) -> None:
                step(self.params, self.optimizer, example)

            (self.step,), problem = compiled.compile_functions([self.ppo], warm_up, self._state())
        return problem

    def _example(self, rows: int) -> Minibatch:
        """Zeros shaped as a mini-batch of `rows` rows: the compile's example input."""
        model, steps = self.model, ((self.cfg.seq_length,) if self.cfg.policy == "gru" else ())
        dims = {"obs": (*steps, model.obs_dim), "actions": (*steps, model.act_dim), "old_logp": steps,
                "old_values": steps, "neg_adv": steps, "returns": steps}  # fmt: skip
        if self.cfg.policy == "gru":
            dims.update(hidden=(self.cfg.rnn_hidden_size,), episode_start=steps)
        if model.critic_dim:
            dims["critic_obs"] = (*steps, model.critic_dim)
        if self.cfg.overlap:
            dims["prox_logp"] = steps
        return Minibatch(**{name: torch.zeros(rows, *d, device=self.device) for name, d in dims.items()})

    def _state(self) -> list[torch.Tensor]:
        """The tensors a step changes: compile() runs one on example data and puts them back as they were."""
        adam = self.optimizer
        return [self.params, adam.exp_avg, adam.exp_avg_sq, adam.step]

    def set_learning_rate(self, lr: float) -> None:
        self.optimizer.set_lr(lr)

    @property
    def learning_rate(self) -> float:
        return self.optimizer.lr_value

    def train_step(
        self, batch: RolloutBatch, global_mean_std: GlobalMeanStd, value_stats: Optional[tuple[float, float]] = None
    ) -> dict[str, float]:
        """PPO epochs over the whole round; returns this rank's metrics (averaged over ranks by the caller).

        value_stats: (mean, std) of the returns over all ranks and rounds when the critic learns normalised
        returns (cfg.normalize_value); the rollout's values and returns are in reward units and get standardised.
        """
        cfg = self.cfg
        buffer_size = batch.advantages.numel()  # samples; recorded before the buffer is released for the next round
        old_values = batch.values
        if value_stats is not None:
            old_values = (old_values - value_stats[0]) / value_stats[1]
        rows = len(batch)  # samples, or a GRU's chunks
        minibatch_size = rows // cfg.num_minibatches

        # Each epoch gathers the round in its shuffled order once, so that mini-batches are contiguous slices
        # (views) instead of six index ops each; the samples of each mini-batch are the same either way.
        # The advantages are negated once here rather than twice in every mini-batch (-a * r is (-a) * r).
        neg_adv, returns = self._targets(batch, global_mean_std, value_stats)
        named = {"obs": batch.obs, "actions": batch.actions, "old_logp": batch.logp, "old_values": old_values,
                 "neg_adv": neg_adv, "returns": returns}  # fmt: skip
        if batch.hidden is not None:
            named.update(hidden=batch.hidden, episode_start=batch.episode_start)
        if batch.critic_obs is not None:
            named["critic_obs"] = batch.critic_obs
        if cfg.overlap:  # the round acted with older weights: the clip is around those the update starts with
            named["prox_logp"] = self._log_probs(batch)
        names, columns = list(named), list(named.values())
        # contiguous whatever the columns are: the compiled step was traced on contiguous mini-batches
        shuffled = [torch.empty_like(c, memory_format=torch.contiguous_format) for c in columns]
        losses: list[torch.Tensor] = []  # [pg, v, entropy] of each mini-batch
        log_ratios: list[torch.Tensor] = []  # from the update's starting weights: clipfrac and approx_kl
        epochs_done = 0
        for epoch in range(cfg.update_epochs):
            if epoch > 0 and batch.steps is not None:  # the critic has learned: its advantages of the round, again
                columns[4:6] = self._targets(batch, global_mean_std, value_stats)
            permutation = torch.randperm(rows, generator=self.generator, device=self.device)
            for column, out in zip(columns, shuffled):
                torch.index_select(column, 0, permutation, out=out)
            for start in range(0, rows, minibatch_size):
                step_losses, log_ratio = self._minibatch_step(
                    Minibatch(**{n: c[start : start + minibatch_size] for n, c in zip(names, shuffled)})
                )
                losses.append(step_losses)
                log_ratios.append(log_ratio)
            epochs_done += 1
            if cfg.target_kl is not None and self._epoch_kl(log_ratios[-cfg.num_minibatches :]) > cfg.target_kl:
                break

        log_ratio = torch.stack(log_ratios)
        # float64 for the mean of a few hundred values, on the CPU: the learner's device may have none (MPS)
        pg_loss, v_loss, entropy = torch.stack(losses).cpu().double().mean(0).tolist()
        kl = approx_kl(log_ratio).item()  # what adaptive_lr reads
        clipfrac = ((log_ratio.exp() - 1).abs() > cfg.clip_coef).float().mean().item()
        with torch.no_grad():
            var_returns = batch.returns.var()
            explained_var = (
                (1 - (batch.returns - batch.values).var() / var_returns).item() if var_returns > 0 else float("nan")
            )
        return {
            "losses/policy_loss": pg_loss,
            "losses/value_loss": v_loss,
            "losses/entropy": entropy,
            "losses/approx_kl": kl,
            "losses/clipfrac": clipfrac,
            "losses/explained_variance": explained_var,
            "losses/epochs": float(epochs_done),
            "charts/buffer_size": float(buffer_size),
            "charts/learning_rate": self.learning_rate,
        }

    @torch.no_grad()
    def _log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """The round's log-probs under the current weights (those the update starts from), shaped as batch.logp."""
        return self.model.evaluate_minibatch(whole_round(batch), list(self.model.parameters()))[0]

    def _targets(
        self, batch: RolloutBatch, global_mean_std: GlobalMeanStd, value_stats: Optional[tuple[float, float]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The epoch's (-advantages, returns), normalised as cfg asks: the actors' advantages with the statistics of
        all ranks, or (batch.steps: cfg.recompute_advantages) those of the current critic with this rank's own, as
        a collective at every epoch could wait forever on a rank that stopped early (target_kl)."""
        if batch.steps is None:
            advantages, returns = batch.advantages, batch.returns
            adv_stats = global_mean_std(advantages) if self.cfg.norm_adv else None
        else:
            advantages, returns = recompute_advantages(self.model, batch, self.cfg, value_stats)
            adv_stats = (advantages.mean(), advantages.std()) if self.cfg.norm_adv else None
        if adv_stats is not None:
            advantages = (advantages - adv_stats[0]) / (adv_stats[1] + 1e-8)
        if value_stats is not None:
            returns = (returns - value_stats[0]) / value_stats[1]
        return -advantages, returns

    def _minibatch_step(self, mb: Minibatch) -> tuple[torch.Tensor, torch.Tensor]:
        """One clipped-PPO step on one mini-batch; ([pg_loss, v_loss, entropy], log-ratio), detached."""
        if not self.sync_gradients:
            return self.step(self.params, self.optimizer, mb)
        grad, stats, log_ratio = self.gradient(self.params, mb)
        self.rank_mean(grad)  # one all_reduce: every rank then clips and steps the same gradient
        self.apply(self.params, grad, self.optimizer)
        return stats, log_ratio

    def _epoch_kl(self, log_ratios: list[torch.Tensor]) -> float:
        """The epoch's approximate KL for the early stop; averaged over ranks when they step together, so that
        every rank stops after the same epoch (one that stopped alone would leave the others waiting)."""
        kl = approx_kl(torch.stack(log_ratios)).reshape(1)
        if self.sync_gradients:
            self.rank_mean(kl)
        return kl.item()


def recompute_advantages(
    model: ActorCritic, batch: RolloutBatch, cfg: Config, value_stats: Optional[tuple[float, float]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE of the round with the model's current critic: (advantages, returns) as rows, in the units of the scaled
    rewards, as the actors compute them with the critic of the round (value_stats: the critic learns returns
    standardised with these, so its output is de-normalised first)."""
    steps = batch.steps
    with torch.no_grad():
        values, next_values = model.value(batch.critic_input), model.value(steps.next_obs)
    if value_stats is not None:
        values, next_values = (v * value_stats[1] + value_stats[0] for v in (values, next_values))
    advantages, returns = compute_gae(
        steps.rewards,
        steps.grid(values),
        steps.grid(next_values),
        steps.terminated,
        steps.truncated,
        cfg.gamma,
        cfg.gae_lambda,
    )
    return steps.rows(advantages), steps.rows(returns)


def whole_round(batch: RolloutBatch) -> Minibatch:
    """The whole round as one mini-batch (its advantages as stored, not negated): for a forward pass over all of it."""
    return Minibatch(batch.obs, batch.actions, batch.logp, batch.values, batch.advantages, batch.returns,
                     batch.hidden, batch.episode_start, batch.critic_obs)  # fmt: skip


def approx_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(old || new), E[(r - 1) - log r], which is unbiased and never negative."""
    return ((log_ratio.exp() - 1) - log_ratio).mean()
