"""A model's parameters as one flat tensor: the views the shared memory, the collectives and the update read and
write."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


def flat_views(model: nn.Module, flat: torch.Tensor) -> Iterator[tuple[nn.Parameter, torch.Tensor]]:
    """Each parameter of the model with its slice of a flat vector (shaped like it), in model.parameters() order:
    the one layout of every flat copy of the parameters (the learner's buffer, shared memory, collectives)."""
    offset = 0
    for p in model.parameters():
        n = p.numel()
        yield p, flat[offset : offset + n].view_as(p)
        offset += n


@torch.no_grad()
def flatten_parameters_(model: nn.Module) -> nn.Parameter:
    """Move the parameters into one flat buffer, in model.parameters() order, and return it.

    Every parameter stays an nn.Parameter of the model but becomes a view of the returned flat Parameter, so the PPO
    step (ppo_ddp/algorithm/ppo_step.py) updates the whole model as one tensor, the weight average is one all_reduce,
    and the model's own forward, state_dict and load_state_dict see the flat buffer's values. Call it once the model is
    on its device.
    """
    flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    for p, data in flat_views(model, flat.data):
        p.data = data
    return flat


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def write_flat_parameters(model: nn.Module, out: torch.Tensor) -> None:
    """Copy the parameters, in model.parameters() order, into a flat float32 vector (e.g. shared memory)."""
    for p, view in flat_views(model, out):
        view.copy_(p)


@torch.no_grad()
def read_flat_parameters(model: nn.Module, flat: torch.Tensor) -> None:
    """Load parameters from a flat vector written by write_flat_parameters."""
    for p, view in flat_views(model, flat):
        p.copy_(view)
