"""The env's action from the policy's sample: clipped to the action space's bounds, and what the rollout stores."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

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
