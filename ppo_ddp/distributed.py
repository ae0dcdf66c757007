"""Everything that touches torch.distributed: process-group setup/teardown and the few collectives PPO needs.

Every run has a process group, even `python train.py` with one learner (world size 1, an in-memory
store), so every rank runs the same code path. Collectives move small float64 vectors; nothing
here is called per mini-batch (learners train independently between weight averages).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from contextlib import contextmanager

from ppo_ddp.config import ConfigError
from ppo_ddp.normalization import Moments, merge_rms_states
from ppo_ddp.topology import resolve_rank_device

# A collective that waits longer than this means a peer rank is gone or stuck; better a clear timeout
# than a hang. Rounds are seconds long, so ten minutes only ever fires on a real fault.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    """This rank's learner device."""
    comm_device: torch.device
    """Where collective tensors live: the GPU under NCCL, the CPU under gloo."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def setup(single_process_device: Optional[str] = None) -> DistContext:
    """Create the process group. Under torchrun: RANK/LOCAL_RANK/WORLD_SIZE from the environment
    (global rank, so several nodes work); otherwise a world of one on single_process_device."""
    if under_torchrun():
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        try:
            device = torch.device(resolve_rank_device(
                world_size, local_rank, local_world_size, torch.cuda.device_count(), _mps_available()))
        except ValueError as e:  # every rank of the node finds the same mismatch, before any collective
            raise ConfigError(str(e)) from None
        store = None
    else:
        rank, world_size, local_rank = 0, 1, 0
        device = torch.device(single_process_device or "cpu")
        store = dist.HashStore()
    if device.type == "cuda":
        # Bind before the first collective: otherwise every rank's NCCL communicator lands on cuda:0.
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    kwargs: dict[str, Any] = {"backend": backend, "timeout": COLLECTIVE_TIMEOUT}
    if store is not None:
        kwargs.update(store=store, rank=0, world_size=1)
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    return DistContext(rank, world_size, local_rank, device, device if backend == "nccl" else torch.device("cpu"))


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def process_group(single_process_device: Optional[str] = None) -> Iterator[DistContext]:
    """setup() ... teardown() in a finally, so a failing rank still releases its group."""
    ctx = setup(single_process_device)
    try:
        yield ctx
    finally:
        teardown()


def _f64(ctx: DistContext, values: Sequence[float] | np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float64), device=ctx.comm_device)


def all_reduce_sum(ctx: DistContext, values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Element-wise sum over ranks of a small float64 vector."""
    t = _f64(ctx, values)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().numpy()


@torch.no_grad()
def average_parameters(ctx: DistContext, model: torch.nn.Module) -> None:
    """Replace every rank's parameters by their mean over ranks (not Adam's moments: each rank keeps its own).

    One flat all_reduce; every rank divides the same sum by the same number, so the result is bitwise
    identical everywhere.
    """
    if ctx.world_size == 1:
        return
    params = [p for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= ctx.world_size
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


@torch.no_grad()
def broadcast_parameters(ctx: DistContext, model: torch.nn.Module) -> None:
    """Make every rank start from rank 0's initial weights."""
    for p in model.parameters():
        dist.broadcast(p.data, src=0)


def merge_moments_across_ranks(ctx: DistContext, local: Optional[Moments], shape: tuple[int, ...]) -> Optional[Moments]:
    """all_gather of (count, mean, var) from every rank, merged in rank order: the same result on every rank."""
    size = int(np.prod(shape))
    row = np.zeros(1 + 2 * size)
    if local is not None and local.count > 0:
        row[0] = local.count
        row[1:1 + size] = np.reshape(local.mean, -1)
        row[1 + size:] = np.reshape(local.var, -1)
    mine = _f64(ctx, row)
    gathered = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, mine)
    states = []
    for g in gathered:
        g = g.cpu().numpy()
        if g[0] > 0:
            states.append(Moments(g[1:1 + size].reshape(shape), g[1 + size:].reshape(shape), float(g[0])))
    return merge_rms_states(states)


def global_mean_std(ctx: DistContext, x: torch.Tensor) -> tuple[float, float]:
    """Mean and (unbiased) std of x over all ranks' elements, accumulated in float64."""
    x64 = x.detach().to(torch.float64)
    local = torch.stack([x64.sum(), (x64 * x64).sum(), torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)])
    total = local.to(ctx.comm_device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    s, ss, n = total.tolist()
    mean = s / n
    var = max(ss - n * mean * mean, 0.0) / max(n - 1, 1)
    return mean, math.sqrt(var)


def average_metrics(ctx: DistContext, metrics: dict[str, float]) -> dict[str, float]:
    """Mean of each metric over ranks (every rank must pass the same keys)."""
    keys = sorted(metrics)
    summed = all_reduce_sum(ctx, [metrics[k] for k in keys])
    return {k: float(v) / ctx.world_size for k, v in zip(keys, summed)}


def gather_objects(ctx: DistContext, obj: Any) -> list[Any]:
    """Small picklable objects from every rank, in rank order, on every rank."""
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(ctx: DistContext, obj: Any) -> Any:
    """Rank 0's obj on every rank (e.g. the run name, which holds rank 0's start time)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(ctx: DistContext, flag: bool) -> bool:
    """True on every rank if flag is True on any rank: how ranks agree to stop together."""
    return bool(all_reduce_sum(ctx, [1.0 if flag else 0.0])[0] > 0)
