"""The actor-critic: an MLP policy head with a state-independent spread (a Gaussian's log-std by default; the
distributions are ppo_ddp/models/distributions.py), and an MLP value head, either two MLPs or one trunk with two
linear heads (`shared_trunk`). The actors run its forward pass in numpy (ppo_ddp/models/kernels.py).

Initialisation follows CleanRL's ppo_continuous_action: orthogonal weights with gain sqrt(2) in the
hidden layers, 0.01 on the policy output and 1.0 on the value output, zero biases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ppo_ddp.models.distributions import ActionDistribution, initial_spread

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
ACTIVATION_FUNCTIONS = {"tanh": torch.tanh, "relu": torch.relu, "elu": F.elu}  # the same, as functions
PARTS = ("trunk", "critic", "actor_mean")  # ActorCritic's layer containers, in the order _parts returns them


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def hidden_layers(n_in: int, hidden: Sequence[int], activation: str) -> list[nn.Module]:
    """Linear layers of the hidden widths, each followed by the activation (an MLP's body, a GRU's encoder)."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [_layer(n_in, h, math.sqrt(2)), ACTIVATIONS[activation]()]
        n_in = h
    return layers


def _mlp(n_in: int, hidden: Sequence[int], n_out: int, activation: str, out_gain: float) -> nn.Sequential:
    return nn.Sequential(
        *hidden_layers(n_in, hidden, activation), _layer(hidden[-1] if hidden else n_in, n_out, out_gain)
    )


class ActionHead(nn.Module):
    """What both networks share about their actions: the distribution's kind, the state-independent spread
    `actor_logstd` [A], and the action space's bounds as buffers action_center and action_half (None without
    bounds), which move with .to(device) and stay out of state_dict, so checkpoints are the same for every
    distribution."""

    def _init_actions(
        self, act_dim: int, distribution: str, log_std_init: float, bounds: Optional[tuple[np.ndarray, np.ndarray]]
    ) -> None:
        self.distribution = distribution
        self.actor_logstd = nn.Parameter(torch.full((act_dim,), initial_spread(distribution, log_std_init)))
        center = half = None
        if bounds is not None:
            low, high = (torch.as_tensor(np.asarray(b, dtype=np.float32)) for b in bounds)
            center, half = (high + low) / 2, (high - low) / 2
        self.register_buffer("action_center", center, persistent=False)
        self.register_buffer("action_half", half, persistent=False)

    @property
    def dist(self) -> ActionDistribution:
        """The action distribution over the bounds this model holds (models/distributions.py)."""
        return ActionDistribution(self.distribution, self.action_center, self.action_half)


class ActorCritic(ActionHead):
    """The policy's mean, the value and the log-std. Two MLPs of hidden_sizes (`critic`, `actor_mean`), or with
    shared_trunk one MLP body (`trunk`) whose features feed two linear heads (`actor_mean`, `critic`): rl_games'
    `separate: False`, half the arithmetic of a round for the same widths, the value loss shaping the policy's
    features too (vf_coef weighs it). The separate model's trunk is empty, so its checkpoints' keys are unchanged.

    With critic_dim the critic's MLP reads an observation of its own (cfg.critic_obs, privileged), so every call
    that values takes it (`critic_obs`); the policy's calls are unchanged.

    The nn.Sequential containers hold the layers (their names are the checkpoints' keys); the forward is
    `_mlp_forward` on the layers' tensors, so that the PPO step can run the same forward on views of its flat
    parameter (`evaluate(..., params=)`) without swapping the module's parameters.

    `distribution` (Config.distribution) says what `actor_mean`'s output and `actor_logstd` mean; a bounded one
    needs the action space's `bounds` (low, high), which the model keeps as buffers outside its state_dict."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
        shared_trunk: bool = False,
        critic_dim: int = 0,
        distribution: str = "gaussian",
        bounds: Optional[tuple[np.ndarray, np.ndarray]] = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r}: must be one of {', '.join(ACTIVATIONS)}")
        if critic_dim and shared_trunk:
            raise ValueError("a critic of its own observation (critic_dim) cannot share the policy's trunk")
        self.obs_dim, self.act_dim, self.critic_dim = obs_dim, act_dim, critic_dim
        self.activation = ACTIVATION_FUNCTIONS[activation]
        body = hidden_sizes if shared_trunk else ()
        self.trunk = nn.Sequential(*hidden_layers(obs_dim, body, activation))
        heads_in, head_hidden = (hidden_sizes[-1], ()) if shared_trunk else (obs_dim, hidden_sizes)
        self.critic = _mlp(critic_dim or heads_in, head_hidden, 1, activation, out_gain=1.0)
        self.actor_mean = _mlp(heads_in, head_hidden, act_dim, activation, out_gain=0.01)
        self._init_actions(act_dim, distribution, log_std_init, bounds)
        # where each part's tensors are in model.parameters() order, the order of every flat copy (flat_views)
        names = [name for name, _ in self.named_parameters()]
        self._log_std_at = names.index("actor_logstd")
        self._at = {part: [i for i, n in enumerate(names) if n.startswith(part + ".")] for part in PARTS}

    def _parts(self, params: Optional[Sequence[torch.Tensor]]) -> tuple[torch.Tensor, list, list, list]:
        """(log-std, trunk tensors, critic tensors, actor tensors) of params, or of the model's own parameters."""
        params = list(self.parameters()) if params is None else params
        return params[self._log_std_at], *([params[i] for i in self._at[part]] for part in PARTS)

    def _heads(
        self, obs: torch.Tensor, params: Optional[Sequence[torch.Tensor]], critic_obs: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, ...]:
        """(log-std, action mean, value) of a batch of normalised observations (and the critic's own, critic_dim)."""
        log_std, trunk, critic, actor = self._parts(params)
        features = _mlp_forward(obs, trunk, self.activation, last=True)
        mean = _mlp_forward(features, actor, self.activation)
        value = _mlp_forward(features if critic_obs is None else critic_obs, critic, self.activation).squeeze(-1)
        return log_std, mean, value

    def value(self, critic_input: torch.Tensor) -> torch.Tensor:
        """V of what the critic reads: its own observations (critic_dim), else the policy's."""
        if self.critic_dim:
            return _mlp_forward(critic_input, self._parts(None)[2], self.activation).squeeze(-1)
        return self._heads(critic_input, None)[2]

    def action_mean(self, obs: torch.Tensor) -> torch.Tensor:
        _, trunk, _, actor = self._parts(None)
        return _mlp_forward(_mlp_forward(obs, trunk, self.activation, last=True), actor, self.activation)

    def sample(
        self, obs: torch.Tensor, generator: torch.Generator | None = None, critic_obs: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sampled action as stored, its log-prob, value) for a batch of normalised observations."""
        spread, out, value = self._heads(obs, None, critic_obs)
        action = self.dist.sample(out, spread, generator)
        return action, self.dist.log_prob(out, spread, action), value

    def initial_state(self, n: int) -> None:
        """The memory of n envs at their episodes' start: an MLP has none (RecurrentActorCritic's is zeros)."""
        return None

    def act(
        self, obs: torch.Tensor, state: None, deterministic: bool, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, None]:
        """(the action for a batch of normalised observations: the mean, or a sample; the next state) for evaluation;
        the same interface as RecurrentActorCritic.act, so an episode loop serves both."""
        out = self.action_mean(obs)
        if deterministic:
            return self.dist.mode(out, self.actor_logstd), None
        return self.dist.sample(out, self.actor_logstd, generator), None  # sample()'s draw, without valuing

    def evaluate_minibatch(self, mb, params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """evaluate() on a PPO mini-batch (ppo_ddp/algorithm/ppo_step.py's Minibatch), and the action mean [B, A] as its
        fourth value (for bounds_loss_coef): the loss's one call into the network."""
        return self._evaluate(mb.obs, mb.actions, params, mb.critic_obs)

    def evaluate(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        params: Optional[Sequence[torch.Tensor]] = None,
        critic_obs: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-prob of action, entropy, value) for the PPO loss, under the model's parameters or under `params`
        (tensors shaped as model.parameters() and in its order: the PPO step's views of its flat parameter).

        The entropy comes back as one number (a 0-dim tensor): the Gaussian's, whose std does not depend on the
        observation, holds for every sample; the bounded distributions' is the batch's mean.
        """
        return self._evaluate(obs, action, params, critic_obs)[:3]

    def _evaluate(self, obs, action, params: Optional[Sequence[torch.Tensor]], critic_obs=None) -> tuple:
        """(log-prob, entropy, value, the policy head's output: the action mean of a Gaussian)."""
        spread, out, value = self._heads(obs, params, critic_obs)
        dist = self.dist
        return dist.log_prob(out, spread, action), dist.entropy(out, spread, action), value, out


def _mlp_forward(x: torch.Tensor, tensors: Sequence[torch.Tensor], activation, last: bool = False) -> torch.Tensor:
    """An MLP from its (weight, bias) tensors in layer order, the activation between layers, and after the last
    one too when `last` (a trunk, whose features feed heads). No tensors: x itself."""
    layers = len(tensors) // 2
    for i in range(layers):
        x = F.linear(x, tensors[2 * i], tensors[2 * i + 1])
        if last or i < layers - 1:
            x = activation(x)
    return x
