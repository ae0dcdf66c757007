"""Which actor-critic a Config builds: the Gaussian MLP (models/mlp.py) or the GRU one (models/gru.py)."""

from __future__ import annotations

from ppo_ddp.configuration.config import Config
from ppo_ddp.models.gru import RecurrentActorCritic
from ppo_ddp.models.mlp import ActorCritic


def make_model(cfg: Config, obs_dim: int, act_dim: int, critic_dim: int = 0) -> ActorCritic | RecurrentActorCritic:
    """The network a config describes (policy, hidden_sizes, activation, shared_trunk, log_std_init,
    rnn_hidden_size, rnn_head_sizes; critic_dim: the width of the critic's own observation, cfg.critic_obs), on the
    CPU: every process that builds one (learner, actors, evaluator, evaluate) builds it here."""
    if cfg.policy == "gru":
        return RecurrentActorCritic(
            obs_dim, act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init, cfg.rnn_hidden_size, critic_dim,
            cfg.rnn_head_sizes,
        )  # fmt: skip
    return ActorCritic(
        obs_dim, act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init, cfg.shared_trunk, critic_dim
    )
