"""Which actor-critic a Config builds: the MLP (models/mlp.py) or the GRU one (models/gru.py), and its action
distribution."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ppo_ddp.configuration.config import Config
from ppo_ddp.models.gru import RecurrentActorCritic
from ppo_ddp.models.mlp import ActorCritic


def make_model(
    cfg: Config, obs_dim: int, act_dim: int, critic_dim: int = 0, bounds: Optional[tuple[np.ndarray, np.ndarray]] = None
) -> ActorCritic | RecurrentActorCritic:
    """The network a config describes (policy, hidden_sizes, activation, shared_trunk, log_std_init, distribution,
    rnn_hidden_size, rnn_head_sizes; critic_dim: the width of the critic's own observation, cfg.critic_obs; bounds:
    the action space's (low, high), which a bounded distribution acts within), on the CPU: every process that builds
    one (learner, actors, evaluator, evaluate) builds it here. Without bounds it still counts and holds parameters."""
    if cfg.policy == "gru":
        return RecurrentActorCritic(
            obs_dim, act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init, cfg.rnn_hidden_size, critic_dim,
            cfg.rnn_head_sizes, cfg.distribution, bounds,
        )  # fmt: skip
    return ActorCritic(
        obs_dim, act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init, cfg.shared_trunk, critic_dim,
        cfg.distribution, bounds,
    )  # fmt: skip
