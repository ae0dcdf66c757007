"""Generalised advantage estimation over a round's [T, N] grid, with truncations bootstrapped. Pure torch, no
processes."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

ArrayT = TypeVar("ArrayT", torch.Tensor, np.ndarray)


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) over a [T, N] rollout; returns (advantages, returns = advantages + values).

    next_values[t] is V of the observation that followed step t *before any reset*: for a truncated
    step it is V(final observation), for the last step of the rollout it is V of the observation the
    next round starts from. A terminated step does not bootstrap (termination wins when a step is both
    terminated and truncated); a truncated one bootstraps from next_values[t]; either ends the episode,
    so the recursion is cut there and a new episode never leaks into the previous one.
    """
    shape = rewards.shape
    for name, t in (
        ("values", values),
        ("next_values", next_values),
        ("terminated", terminated),
        ("truncated", truncated),
    ):
        if t.shape != shape:
            raise ValueError(f"compute_gae: {name} has shape {tuple(t.shape)}, rewards has {tuple(shape)}")
    if rewards.dim() != 2:
        raise ValueError(f"compute_gae: expected [T, N] tensors, got shape {tuple(shape)}")
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    terminated = terminated.to(torch.bool)
    episode_end = terminated | truncated.to(torch.bool)
    bootstrap = (~terminated).to(dtype)
    continues = (~episode_end).to(dtype)
    deltas = rewards.to(dtype) + gamma * next_values.to(dtype) * bootstrap - values.to(dtype)
    decay = gamma * gae_lambda * continues  # the same float32 products the recursion took one step at a time
    advantages = torch.empty_like(deltas)
    _discounted_sum(*((t.numpy() if t.is_cpu else t) for t in (deltas, decay, advantages)))
    return advantages, advantages + values.to(dtype)


def _discounted_sum(deltas: ArrayT, decay: ArrayT, out: ArrayT) -> None:
    """out[t] = deltas[t] + decay[t] * out[t + 1], out[T] = 0: GAE's recursion, backwards over the rows.

    On CPU it runs on numpy views of the tensors: the same float32 operations one by one (no fused multiply-add
    either way), so the same bits, without torch's per-op dispatch, which costs more than the arithmetic on an
    actor's few columns (~1 us of every env step's ~40: docs/benchmarks/throughput.md)."""
    running = 0.0
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + decay[t] * running
        out[t] = running
