"""The few collectives PPO needs, each a communication failure made PeerLostError: small float64 vectors and the flat
parameters; only sync_mode "gradients" calls one per mini-batch (`average_` of the flat gradient) and, with
target_kl, one per epoch (of the KL)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from ppo_ddp.distributed.process_group import DistContext
from ppo_ddp.models.normalization import Moments, merge_rms_states


class PeerLostError(dist.DistError):
    """A collective failed because another rank is gone (killed, crashed): gloo and NCCL say so with a
    plain RuntimeError; the trainer turns this one into a one-line message and exit status 1."""


def _collective(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every collective below: a communication failure becomes PeerLostError."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except dist.DistError:
            raise
        except RuntimeError as e:
            raise PeerLostError(str(e)) from e

    return wrapper


def _f64(ctx: DistContext, values: Sequence[float] | np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float64), device=ctx.comm_device)


@_collective
@torch.no_grad()
def average_(ctx: DistContext, tensor: torch.Tensor) -> None:
    """Replace a tensor by its mean over ranks, in place: the learner's flat parameters at a weight average (not
    Adam's moments: each rank keeps its own), its flat gradient at every mini-batch step of sync_mode
    "gradients", the epoch's KL there.

    One all_reduce, and every rank divides the same sum by the same number, so the result is bitwise identical
    everywhere. The tensor lives on ctx.comm_device (the learner's device: NCCL on CUDA, gloo on the CPU).
    """
    if ctx.world_size == 1:
        return
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    tensor /= ctx.world_size


@_collective
@torch.no_grad()
def broadcast_parameters(ctx: DistContext, model: torch.nn.Module) -> None:
    """Make every rank start from rank 0's initial weights."""
    for p in model.parameters():
        dist.broadcast(p.data, src=0)


@_collective
def merge_moments_across_ranks(
    ctx: DistContext, local: Sequence[Optional[Moments]], shapes: Sequence[tuple[int, ...]]
) -> list[Optional[Moments]]:
    """Several moment sets, each merged over all ranks, in one all_gather of their (count, mean, var) rows.

    Each set is merged in rank order, so every rank gets the same result; a rank's None (or empty) set adds
    nothing to it. One collective for all the round's statistics: on a loopback gloo group each costs ~0.6 ms.
    """
    sizes = [int(np.prod(shape)) for shape in shapes]
    row = np.zeros(sum(1 + 2 * n for n in sizes))
    offset = 0
    for moments, n in zip(local, sizes):
        if moments is not None and moments.count > 0:
            row[offset] = moments.count
            row[offset + 1 : offset + 1 + n] = np.reshape(moments.mean, -1)
            row[offset + 1 + n : offset + 1 + 2 * n] = np.reshape(moments.var, -1)
        offset += 1 + 2 * n
    mine = _f64(ctx, row)
    gathered = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, mine)
    rows = [g.cpu().numpy() for g in gathered]
    merged: list[Optional[Moments]] = []
    offset = 0
    for shape, n in zip(shapes, sizes):
        merged.append(
            merge_rms_states(
                Moments(
                    r[offset + 1 : offset + 1 + n].reshape(shape),
                    r[offset + 1 + n : offset + 1 + 2 * n].reshape(shape),
                    float(r[offset]),
                )
                for r in rows
                if r[offset] > 0
            )
        )
        offset += 1 + 2 * n
    return merged


@_collective
def average_metrics(
    ctx: DistContext, metrics: dict[str, float], episodes: list[Any]
) -> tuple[dict[str, float], list[Any]]:
    """(mean of each metric over ranks, every rank's episodes in rank order), from one gather.

    Every rank must pass the same metric keys. The means are summed in rank order, the same on every rank.
    """
    per_rank: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(per_rank, (metrics, episodes))
    mean = {k: sum(m[k] for m, _ in per_rank) / ctx.world_size for k in metrics}
    return mean, [ep for _, eps in per_rank for ep in eps]


@_collective
def gather_objects(ctx: DistContext, obj: Any) -> list[Any]:
    """Small picklable objects from every rank, in rank order, on every rank."""
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


@_collective
def broadcast_object(ctx: DistContext, obj: Any) -> Any:
    """Rank 0's obj on every rank (e.g. the run name, which holds rank 0's start time)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@_collective
def agree(ctx: DistContext, stop_signal: int, failed: bool) -> tuple[int, bool]:
    """The round's agreement, one all_reduce (max) every rank joins at the same point of every round.

    stop_signal is the number of a stop signal this rank received (0: none), failed whether this rank's own
    work failed. Every rank gets the same answer: the highest signal number asked for anywhere, and whether
    any rank failed. A failing rank still calls this before it leaves, so no rank is left in a collective.
    """
    flags = _f64(ctx, [float(stop_signal), 1.0 if failed else 0.0])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    signum, any_failed = flags.tolist()
    return int(signum), any_failed > 0


@_collective
def gather_to_main(ctx: DistContext, obj: Any) -> Optional[list[Any]]:
    """Small picklable objects from every rank, in rank order, on rank 0 only (None elsewhere)."""
    out: Optional[list[Any]] = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out
