"""The policy's action distributions (Config.distribution), as pure math on the network's two outputs.

Every network ends in the same two things: `out` [..., A], a linear head of the observation (or the GRU's state),
and `spread` [A], one state-independent parameter per action dimension (the parameter `actor_logstd`). What they
mean, and what an action is:

- **gaussian** (the default): a ~ N(out, exp(spread)²). The sample itself is stored and its log-prob is PPO's; the
  env receives it clipped to the bounds (ppo_ddp/models/actions.py), so the mass beyond a bound acts as the bound.
- **tanh_gaussian**: u ~ N(out, exp(spread)²), a = center + half * tanh(u): always inside the bounds.
  log p(a) = log N(u) - Σ log(1 - tanh²u) - Σ log half, the Jacobian in the stable form
  log(1 - tanh²u) = 2 (log 2 - u - softplus(-2u)), with u = atanh of the stored action.
- **beta**: x ~ Beta(α, β) on [0, 1], a = low + 2 half * x, with m = sigmoid(out) the position and
  κ = exp(spread) the concentration: α = 1 + m κ, β = 1 + (1 - m) κ. Both ≥ 1, so the density is finite at the
  bounds (no mass piles up there) and so are its gradients.

For the bounded two, the stored action is the one the env received: a sample is kept EDGE inside the bounds
(tanh(u) saturates to ±1 in float32 beyond |u| ≈ 9, a Beta sample can round to 0 or 1), and its log-prob is taken
at exactly that action, by `log_prob`, in the actors and in the learner alike.

The entropy each kind gives PPO's bonus (docs/design.md, "action distributions"): the Gaussian's closed form; the
Beta's closed form on [0, 1] plus Σ log(2 half); for tanh_gaussian, which has none, the Gaussian's plus the
Jacobian term at the stored action reparameterised through the current mean and std (u = out + std * sg(z)), so its
gradient sees both: Brax's estimate, with the rollout's sample as the draw. The KL that adaptive_lr and target_kl
read is the approximate KL of the log-ratios (ppo_ddp/algorithm/learner.py), the same for all three.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch.nn import functional as F

DISTRIBUTIONS = ("gaussian", "beta", "tanh_gaussian")
EDGE = 1e-6
"""How far inside its bounds a bounded action is kept, in units of the half-range (tanh) or the range (beta)."""
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
LOG_2 = math.log(2.0)
MIN_CONCENTRATION = 1.0
"""The Beta's smallest starting concentration: α = β = 1.5 at the centre, a std of half the half-range."""


def initial_spread(kind: str, log_std_init: float) -> float:
    """The starting value of `spread` for log_std_init: log std for the Gaussians; for the Beta the log of the
    concentration whose std at the centre is exp(log_std_init) half-ranges (std² = 1 / (3 + κ)), κ at least
    MIN_CONCENTRATION."""
    if kind != "beta":
        return float(log_std_init)
    return math.log(max(math.exp(-2.0 * log_std_init) - 3.0, MIN_CONCENTRATION))


# ---- torch: the learner's loss, evaluation, export ----------------------------------------------------------------
def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log N(action; mean, exp(log_std)) summed over action dims, without a Distribution object."""
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z.pow(2) - log_std - LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of the diagonal Gaussian, summed over action dims (independent of the mean)."""
    return (log_std + 0.5 + LOG_SQRT_2PI).sum(-1)


def _log_tanh_jacobian(u: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh²u), finite for every u: 2 (log 2 - u - softplus(-2u))."""
    return 2.0 * (LOG_2 - u - F.softplus(-2.0 * u))


def _beta_parameters(out: torch.Tensor, spread: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, kappa = torch.sigmoid(out), torch.exp(spread)
    return 1.0 + m * kappa, 1.0 + (1.0 - m) * kappa


def _log_beta_function(alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return torch.lgamma(alpha) + torch.lgamma(beta) - torch.lgamma(alpha + beta)


def _unit(action: torch.Tensor, center: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    """The action in [-1 + EDGE, 1 - EDGE]: where the bounds map to ±1."""
    return ((action - center) / half).clamp(-1.0 + EDGE, 1.0 - EDGE)


class ActionDistribution:
    """One kind's math over an action space's bounds (center ± half, tensors [A]; None for the Gaussian, which
    needs none). The network holds one and calls it with its outputs."""

    def __init__(self, kind: str, center: Optional[torch.Tensor] = None, half: Optional[torch.Tensor] = None) -> None:
        if kind not in DISTRIBUTIONS:
            raise ValueError(f"distribution={kind!r}: must be one of {', '.join(DISTRIBUTIONS)}")
        self.kind, self.center, self.half = kind, center, half

    def _bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.center is None or self.half is None:
            raise ValueError(f"distribution {self.kind!r} needs the action space's bounds (make_model's bounds)")
        return self.center, self.half

    def log_prob(self, out: torch.Tensor, spread: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log p(action) [...], summed over the action dims."""
        if self.kind == "gaussian":
            return gaussian_log_prob(out, spread, action)
        center, half = self._bounds()
        y = _unit(action, center, half)
        if self.kind == "tanh_gaussian":
            u = torch.atanh(y)
            return gaussian_log_prob(out, spread, u) - (_log_tanh_jacobian(u) + torch.log(half)).sum(-1)
        alpha, beta = _beta_parameters(out, spread)
        x = 0.5 * (y + 1.0)
        log_density = (alpha - 1.0) * torch.log(x) + (beta - 1.0) * torch.log1p(-x) - _log_beta_function(alpha, beta)
        return (log_density - torch.log(2.0 * half)).sum(-1)

    def entropy(self, out: torch.Tensor, spread: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The entropy bonus's value: one number, the mean over the batch (module docstring)."""
        if self.kind == "gaussian":
            return gaussian_entropy(spread)  # the same for every sample
        center, half = self._bounds()
        if self.kind == "tanh_gaussian":
            std = torch.exp(spread)
            z = ((torch.atanh(_unit(action, center, half)) - out) / std).detach()
            jacobian = _log_tanh_jacobian(out + std * z).sum(-1).mean()
            return gaussian_entropy(spread) + jacobian + torch.log(half).sum()
        alpha, beta = _beta_parameters(out, spread)
        total = alpha + beta
        unit_entropy = (
            _log_beta_function(alpha, beta)
            - (alpha - 1.0) * torch.digamma(alpha)
            - (beta - 1.0) * torch.digamma(beta)
            + (total - 2.0) * torch.digamma(total)
        )
        return unit_entropy.sum(-1).mean() + torch.log(2.0 * half).sum()

    def mode(self, out: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
        """The deterministic action (evaluation, export): the Gaussian's mean, tanh of the mean, the Beta's mean."""
        if self.kind == "gaussian":
            return out
        center, half = self._bounds()
        if self.kind == "tanh_gaussian":
            return center + half * torch.tanh(out)
        alpha, beta = _beta_parameters(out, spread)
        return center + half * (2.0 * alpha / (alpha + beta) - 1.0)

    def sample(self, out: torch.Tensor, spread: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
        """An action drawn from generator (evaluation's stochastic episodes); the Gaussian's unclipped."""
        if self.kind != "beta":
            noise = torch.randn(out.shape, generator=generator, dtype=out.dtype, device=out.device)
            u = out + noise * torch.exp(spread)
            return u if self.kind == "gaussian" else self._squash(u)
        seed = int(torch.randint(2**62, (1,), generator=generator).item())
        center, half = self._bounds()
        rows = out.detach().cpu().numpy().reshape(-1, out.shape[-1])
        drawn = beta_action(rows, spread.detach().cpu().numpy(), [np.random.default_rng(seed)] * len(rows))
        return center + half * torch.as_tensor(drawn.reshape(out.shape), dtype=out.dtype, device=out.device)

    def _squash(self, u: torch.Tensor) -> torch.Tensor:
        center, half = self._bounds()
        return center + half * torch.tanh(u).clamp(-1.0 + EDGE, 1.0 - EDGE)


# ---- numpy: the actors' per-step draw -----------------------------------------------------------------------------
def tanh_action(u: np.ndarray) -> np.ndarray:
    """tanh(u) kept EDGE inside ±1, in place (the unit action the env's bounds scale)."""
    np.tanh(u, out=u)
    return np.clip(u, -1.0 + EDGE, 1.0 - EDGE, out=u)


def beta_action(out: np.ndarray, spread: np.ndarray, rngs: list[np.random.Generator]) -> np.ndarray:
    """Beta draws [E, A] as unit actions in [-1 + 2 EDGE, 1 - 2 EDGE], float32: α, β from out [E, A] and spread as
    _beta_parameters computes them (float32), row e drawn by numpy's generator rngs[e] (each env its own)."""
    m = 0.5 * np.tanh(0.5 * out) + 0.5  # sigmoid without overflow
    kappa = np.exp(spread)
    a, b = 1.0 + m * kappa, 1.0 + (1.0 - m) * kappa
    x = np.stack([rng.beta(a[e], b[e]) for e, rng in enumerate(rngs)])
    return (2.0 * np.clip(x, EDGE, 1.0 - EDGE) - 1.0).astype(np.float32)
