"""The actors' actions: each step's draw from the policy in numpy, what the rollout stores, what the env gets, and
the round's log-probs (ppo_ddp/models/distributions.py says what each distribution is)."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

from ppo_ddp.models.distributions import LOG_SQRT_2PI, beta_action, tanh_action

ArrayT = TypeVar("ArrayT", torch.Tensor, np.ndarray)


def prepare_action(sampled_action: ArrayT, action_low: ArrayT, action_high: ArrayT) -> tuple[ArrayT, ArrayT]:
    """Split a raw Normal sample into (policy_action, env_action).

    policy_action is the sample itself: it is what the buffer stores and what PPO's log-prob is computed
    on, so the on-policy ratio is exactly 1 before the first update. env_action is the same sample
    clipped to the action space and is only ever passed to env.step. Pairing the clipped action with the
    unclipped log-prob would bias the ratio wherever the policy reaches past the bounds.
    """
    if isinstance(sampled_action, torch.Tensor):
        low = torch.as_tensor(action_low, dtype=sampled_action.dtype, device=sampled_action.device)
        high = torch.as_tensor(action_high, dtype=sampled_action.dtype, device=sampled_action.device)
        return sampled_action, torch.minimum(torch.maximum(sampled_action, low), high)
    env_action = np.maximum(sampled_action, action_low)  # np.clip's values, without its Python wrapper
    return sampled_action, np.minimum(env_action, action_high, out=env_action)


class ActionSampler:
    """One actor's draws, a round at a time, for its model's distribution (the model holds the round's weights).

    `start_round` takes the round's generator of each env (ppo_ddp/sampling/split.py) and draws what can be drawn up
    front: each env's Gaussian noise [T, A] of the round (the gaussian's log-probs follow from it alone: log p(mean +
    noise * std) = Σ -noise²/2 - log std - log sqrt(2π)); the Beta, whose draw depends on each step's output, draws
    each env's action from that env's generator step by step.
    `act` makes step t's actions from the policy head's output; `end_round` takes the bounded distributions'
    log-probs of the round in one torch call, `ActionDistribution.log_prob` at the stored actions, the function the
    learner's loss calls.
    """

    def __init__(self, model: torch.nn.Module, low: np.ndarray, high: np.ndarray, steps: int, envs: int) -> None:
        self.model, self.kind, self.low, self.high = model, model.distribution, low, high
        self.shape = (steps, envs, low.size)
        self.bounded = self.kind != "gaussian"
        if self.bounded:  # float32 as the model computes them: the stored actions are what the learner reads
            self.center, self.half = model.action_center.numpy(), model.action_half.numpy()
        self.heads = np.zeros(self.shape, dtype=np.float32) if self.bounded else None  # each step's output
        self.noise = np.zeros((envs, steps, low.size), dtype=np.float32)  # env by env, as each env's draws are
        self.rngs: list[np.random.Generator] = []

    def start_round(self, rngs: list[np.random.Generator], logp: np.ndarray) -> None:
        """The round's generator of each env; the gaussian's log-probs [T, E] into logp."""
        self.spread = self.model.actor_logstd.numpy().astype(np.float32)
        self.rngs = rngs
        if self.kind == "beta":
            return
        self.std = np.exp(self.spread)
        for e, rng in enumerate(rngs):
            rng.standard_normal(out=self.noise[e], dtype=np.float32)
        self.noise_t = self.noise.swapaxes(0, 1)  # [T, E, A]
        if self.kind == "gaussian":
            logp[:] = (-0.5 * self.noise_t * self.noise_t - self.spread - np.float32(LOG_SQRT_2PI)).sum(-1)

    def act(self, t: int, out: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Step t's actions [E, A] into `action` (the rollout's row) from the head's output `out`; returns what the
        envs get: the Gaussian's sample clipped to the bounds, a bounded distribution's action itself."""
        if self.kind != "beta":  # the Normal's sample: the Gaussian's action, tanh_gaussian's before the squashing
            np.multiply(self.noise[:, t], self.std, out=action)
            action += out
            if self.kind == "gaussian":
                return prepare_action(action, self.low, self.high)[1]
        self.heads[t] = out
        unit = tanh_action(action) if self.kind == "tanh_gaussian" else beta_action(out, self.spread, self.rngs)
        np.multiply(unit, self.half, out=action)
        action += self.center
        return action

    def end_round(self, actions: np.ndarray, logp: np.ndarray) -> None:
        """A bounded distribution's log-probs [T, E] of the round's stored actions [T, E, A] into logp."""
        if self.bounded:
            spread = self.model.actor_logstd.detach()
            with torch.no_grad():
                logp[:] = self.model.dist.log_prob(torch.from_numpy(self.heads), spread, torch.from_numpy(actions))
