"""The learner's PPO update (DESIGN.md step 5) on one rank's on-policy rollout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ppo_ddp.config import Config
from ppo_ddp.model import ActorCritic


@dataclass
class RolloutBatch:
    """One round's samples of this rank, flattened to [B, ...] and on the learner's device."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def __len__(self) -> int:
        return self.obs.shape[0]

    @staticmethod
    def from_buffers(buffers, device: torch.device) -> "RolloutBatch":
        """Flatten the [A, T, E, ...] shared rollout; non_blocking copies when the buffers are pinned."""

        def flat(t: torch.Tensor, trailing: int) -> torch.Tensor:
            t = t.reshape(-1, *t.shape[t.dim() - trailing:]) if trailing else t.reshape(-1)
            return t.to(device, non_blocking=True)

        return RolloutBatch(
            obs=flat(buffers.obs, 1), actions=flat(buffers.actions, 1), logp=flat(buffers.logp, 0),
            values=flat(buffers.values, 0), advantages=flat(buffers.advantages, 0), returns=flat(buffers.returns, 0),
        )


# (mean, std) of the advantages over all ranks' data; a collective under torchrun.
GlobalMeanStd = Callable[[torch.Tensor], "tuple[float, float]"]


class Learner:
    def __init__(self, cfg: Config, model: ActorCritic, device: torch.device) -> None:
        self.cfg = cfg
        self.model = model
        self.device = device
        # fused Adam is one kernel per step on CUDA; foreach is the fast path on CPU.
        fused = device.type == "cuda"
        self.optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, eps=1e-5,
                                          fused=fused, foreach=None if fused else True)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(cfg.seed)

    def set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def train_step(self, batch: RolloutBatch, global_mean_std: GlobalMeanStd) -> dict[str, float]:
        """PPO epochs over the whole round; returns this rank's metrics (averaged over ranks by the caller)."""
        cfg = self.cfg
        buffer_size = len(batch)  # recorded before the buffer is released for the next round
        advantages = batch.advantages
        if cfg.norm_adv:
            mean, std = global_mean_std(advantages)
            advantages = (advantages - mean) / (std + 1e-8)
        minibatch_size = buffer_size // cfg.num_minibatches

        sums = torch.zeros(5, dtype=torch.float64, device=self.device)  # pg, v, entropy, approx_kl, clipfrac
        updates = 0
        epochs_done = 0
        for _ in range(cfg.update_epochs):
            permutation = torch.randperm(buffer_size, generator=self.generator, device=self.device)
            epoch_kl = torch.zeros((), dtype=torch.float64, device=self.device)
            for start in range(0, buffer_size, minibatch_size):
                idx = permutation[start:start + minibatch_size]
                losses = self._minibatch_step(batch, advantages, idx)
                sums += losses
                epoch_kl += losses[3]
                updates += 1
            epochs_done += 1
            if cfg.target_kl is not None and (epoch_kl / cfg.num_minibatches).item() > cfg.target_kl:
                break

        pg_loss, v_loss, entropy, approx_kl, clipfrac = (sums / updates).tolist()
        with torch.no_grad():
            var_returns = batch.returns.var()
            explained_var = (1 - (batch.returns - batch.values).var() / var_returns).item() if var_returns > 0 else float("nan")
        return {
            "losses/policy_loss": pg_loss,
            "losses/value_loss": v_loss,
            "losses/entropy": entropy,
            "losses/approx_kl": approx_kl,
            "losses/clipfrac": clipfrac,
            "losses/explained_variance": explained_var,
            "losses/epochs": float(epochs_done),
            "charts/buffer_size": float(buffer_size),
            "charts/learning_rate": self.optimizer.param_groups[0]["lr"],
        }

    def _minibatch_step(self, batch: RolloutBatch, advantages: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        new_logp, entropy, new_value = self.model.evaluate(batch.obs[idx], batch.actions[idx])
        log_ratio = new_logp - batch.logp[idx]
        ratio = log_ratio.exp()
        adv = advantages[idx]
        pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()

        returns, old_values = batch.returns[idx], batch.values[idx]
        if cfg.clip_vloss:
            clipped = old_values + (new_value - old_values).clamp(-cfg.clip_coef, cfg.clip_coef)
            v_loss = 0.5 * torch.max((new_value - returns).pow(2), (clipped - returns).pow(2)).mean()
        else:
            v_loss = 0.5 * (new_value - returns).pow(2).mean()
        entropy_mean = entropy.mean()
        loss = pg_loss - cfg.ent_coef * entropy_mean + cfg.vf_coef * v_loss

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm, foreach=True)
        self.optimizer.step()

        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()
            clipfrac = ((ratio - 1).abs() > cfg.clip_coef).float().mean()
            return torch.stack([pg_loss.detach(), v_loss.detach(), entropy_mean.detach(), approx_kl, clipfrac]).to(torch.float64)
