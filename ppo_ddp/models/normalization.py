"""Running moments of observations and discounted returns: exact parallel merging, no torch.distributed.

Actors report the moments of what they saw *this round only* (increments). The learner merges the
increments of its actors, the ranks merge theirs with a collective, and the round's global increment is
merged into the history exactly once. Because the merge of disjoint data is exact and associative
(Chan et al.), the result is the mean/variance of all raw data ever seen, whatever the grouping.
Merging the history into itself again double-counts it and, round after round, freezes the normaliser;
nothing here does that, and the tests check the count grows by exactly the new rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

EPSILON = 1e-8


@dataclass(frozen=True)
class Moments:
    """Mean and population variance (float64) of `count` rows of data."""

    mean: np.ndarray
    var: np.ndarray
    count: float

    @functools.cached_property
    def std(self) -> np.ndarray:
        """sqrt(var + eps), what observations are divided by (float64): once per Moments, not once per step of the
        T steps an actor normalises with a round's frozen Moments."""
        return np.sqrt(self.var + EPSILON)

    def to_state(self) -> dict[str, Any]:
        """Plain tensors and floats, so a checkpoint holding it loads with weights_only=True."""
        return {
            "mean": torch.from_numpy(np.array(self.mean, dtype=np.float64)),
            "var": torch.from_numpy(np.array(self.var, dtype=np.float64)),
            "count": float(self.count),
        }

    @staticmethod
    def from_state(state: dict[str, Any]) -> Moments:
        def arr(v: Any) -> np.ndarray:
            return (
                v.detach().cpu().numpy().astype(np.float64)
                if isinstance(v, torch.Tensor)
                else np.asarray(v, np.float64)
            )

        return Moments(arr(state["mean"]), arr(state["var"]), float(state["count"]))


def compute_batch_moments(x: np.ndarray | torch.Tensor) -> Moments:
    """Moments of a batch [N, ...] over its first axis, in float64; empty or non-finite input is an error."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0 or x.shape[0] == 0:
        raise ValueError(f"compute_batch_moments: empty input of shape {x.shape}")
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise ValueError(
            f"compute_batch_moments: non-finite value {x[tuple(bad)]} at index {tuple(int(i) for i in bad)}"
        )
    return Moments(x.mean(axis=0), x.var(axis=0), float(x.shape[0]))


def tensor_moments(x: torch.Tensor) -> Moments:
    """Moments of a 1-D tensor of any device, in float64 on the CPU (MPS has no float64; on CUDA it is one copy
    of the round's values). Unlike compute_batch_moments, no finiteness check: the caller reports non-finite
    data with its own context."""
    x64 = x.detach().to("cpu", torch.float64)
    mean, var = torch.stack([x64.mean(), x64.var(unbiased=False)]).tolist()
    return Moments(np.array(mean), np.array(var), float(x.numel()))


def merge_rms_states(states: Iterable[Optional[Moments]]) -> Optional[Moments]:
    """Exact moments of the union of disjoint data sets; None entries and zero counts are skipped.

    Returns None when there is nothing to merge (no data seen yet).
    """
    merged: Optional[Moments] = None
    for s in states:
        if s is None or s.count == 0:
            continue
        if merged is None:
            merged = Moments(np.array(s.mean, np.float64), np.array(s.var, np.float64), float(s.count))
            continue
        if s.mean.shape != merged.mean.shape:
            raise ValueError(f"merge_rms_states: shapes differ: {merged.mean.shape} vs {s.mean.shape}")
        total = merged.count + s.count
        delta = s.mean - merged.mean
        mean = merged.mean + delta * (s.count / total)
        m2 = merged.var * merged.count + s.var * s.count + delta**2 * (merged.count * s.count / total)
        merged = Moments(mean, m2 / total, total)
    return merged


def normalize_obs(
    obs: np.ndarray, state: Optional[Moments], clip: float, out: Optional[np.ndarray] = None
) -> np.ndarray:
    """(obs - mean) / sqrt(var + eps) clipped to [-clip, clip], as float32; identity before any statistics.
    out: a float32 array to write into (an actor's rollout row), else a new one is returned."""
    if state is None:
        x = np.asarray(obs, dtype=np.float32)
    else:
        x = np.subtract(obs, state.mean)
        np.divide(x, state.std, out=x)
        np.maximum(x, -clip, out=x)  # np.clip's values, without its Python wrapper (~1 us a call)
        np.minimum(x, clip, out=x)
    if out is None:
        return x.astype(np.float32, copy=False)
    out[...] = x
    return out


class ObsNormalizer(torch.nn.Module):
    """normalize_obs as a torch module with the statistics frozen in buffers, for the evaluator and exported policies
    (ppo_ddp/evaluation/policy.py); the actors keep the numpy one, cheaper on their few rows a step. It computes in
    float64, as numpy does, so that both give the same float32 to the bit (tests/test_normalization.py)."""

    def __init__(self, state: Optional[Moments], clip: float) -> None:
        super().__init__()
        self.clip = float(clip)
        self.identity = state is None  # no statistics yet: a cast, and no clipping (as normalize_obs)
        mean, std = (np.zeros(0), np.ones(0)) if state is None else (state.mean, state.std)
        self.register_buffer("mean", torch.as_tensor(np.asarray(mean, np.float64)))
        self.register_buffer("std", torch.as_tensor(np.asarray(std, np.float64)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return obs.to(torch.float32)
        out = (obs.to(torch.float64) - self.mean) / self.std
        return out.clamp(-self.clip, self.clip).to(torch.float32)


def value_scale(return_state: Optional[Moments]) -> Optional[tuple[float, float]]:
    """(mean, std) that standardise the returns for a critic learning normalised values (None: no statistics);
    the learner divides targets by it, the actors multiply the critic's output back."""
    if return_state is None:
        return None
    return float(return_state.mean), math.sqrt(float(return_state.var) + EPSILON)


def unscale_value(value: np.ndarray, scale: Optional[tuple[float, float]]) -> np.ndarray:
    """A normalised critic's output in return units (value_scale's (mean, std); None: it already is), float32."""
    if scale is None:
        return value
    return value * np.float32(scale[1]) + np.float32(scale[0])


def scale_reward(reward: np.ndarray, return_state: Optional[Moments], clip: float) -> np.ndarray:
    """reward / std(discounted return), clipped; identity before any statistics (as gymnasium's NormalizeReward)."""
    if return_state is None:
        return np.asarray(reward, dtype=np.float32)
    out = reward / np.sqrt(float(return_state.var) + EPSILON)
    return np.clip(out, -clip, clip).astype(np.float32)


class DiscountedReturn:
    """Per-env discounted return G_t = gamma * G_{t-1} + r_t, restarted at every episode end.

    Its values over a round are the data whose moments drive reward scaling; the tracker lives in the
    actor and carries over between rounds, like the episodes themselves.
    """

    def __init__(self, num_envs: int, gamma: float) -> None:
        self.gamma = gamma
        self.value = np.zeros(num_envs, dtype=np.float64)

    def update(self, rewards: np.ndarray, episode_end: np.ndarray) -> np.ndarray:
        """Add this step's rewards; returns G after the step (before the restart of ended episodes)."""
        self.value = self.value * self.gamma + rewards
        out = self.value.copy()
        self.value[np.asarray(episode_end, dtype=bool)] = 0.0
        return out
