"""The policy as its environment sees it: a raw observation in, the action the env receives out.

`EnvPolicy` holds a trained network with its frozen observation statistics and the env's action bounds, and does the
three things between the env and the network: normalise the observation (ObsNormalizer: the actors' normalize_obs, clip
included), act, clip the action to the bounds. `python -m ppo_ddp.evaluate`'s episodes
(ppo_ddp/evaluation/evaluator.py's play_episodes) act through it and `python -m ppo_ddp.export` writes it to a file, so
an exported policy computes what evaluate scores.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn

from ppo_ddp.models.gru import RecurrentActorCritic
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import Moments, ObsNormalizer


class EnvPolicy(nn.Module):
    """model (either network) between ObsNormalizer and a clip to [low, high]. A recurrent model's state [N, H]
    goes in and comes out of every step; zeros (`initial_state`) at the start of an episode."""

    def __init__(
        self,
        model: ActorCritic | RecurrentActorCritic,
        obs_rms: Optional[Moments],
        obs_clip: float,
        low: np.ndarray,
        high: np.ndarray,
    ) -> None:
        super().__init__()
        self.model = model
        self.normalize = ObsNormalizer(obs_rms, obs_clip)
        # float32, the actions' dtype (gymnasium's MuJoCo Boxes are float32): the clip then keeps the dtype
        self.register_buffer("low", torch.as_tensor(np.asarray(low, np.float32)))
        self.register_buffer("high", torch.as_tensor(np.asarray(high, np.float32)))

    @property
    def recurrent(self) -> bool:
        return isinstance(self.model, RecurrentActorCritic)

    def initial_state(self, n: int) -> Optional[torch.Tensor]:
        """The state of n envs at their episodes' start (None for an MLP)."""
        return self.model.initial_state(n)

    def act(
        self,
        obs: torch.Tensor,
        state: Optional[torch.Tensor],
        deterministic: bool = True,
        generator: Optional[torch.Generator] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(the actions for raw observations [N, obs_dim], clipped to the bounds; the next state). Deterministic:
        the distribution's deterministic action (the Gaussian's mean, tanh of it, the Beta's mean); else a sample,
        drawn from generator, clipped after sampling (as the actors' Gaussian actions; a bounded one is inside)."""
        action, state = self.model.act(self.normalize(obs), state, deterministic, generator)
        return torch.clamp(action, self.low, self.high), state

    def forward(
        self, obs: torch.Tensor, state: Optional[torch.Tensor] = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The deterministic step an exported file runs: obs -> action for an MLP, (obs, h) -> (action, h_next) for
        a GRU."""
        action, state = self.act(obs, state)
        return action if state is None else (action, state)
