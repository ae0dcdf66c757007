"""The actor-critic: a Gaussian MLP policy with state-independent log-std, and an MLP value head, either two MLPs or
one trunk with two linear heads (`shared_trunk`); and its forward pass in numpy (`PolicyKernel`), which the actors
run at every env step.

Initialisation follows CleanRL's ppo_continuous_action: orthogonal weights with gain sqrt(2) in the
hidden layers, 0.01 on the policy output and 1.0 on the value output, zero biases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
ACTIVATION_FUNCTIONS = {"tanh": torch.tanh, "relu": torch.relu, "elu": F.elu}  # the same, as functions
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
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


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log N(action; mean, exp(log_std)) summed over action dims, without a Distribution object."""
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z.pow(2) - log_std - LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of the diagonal Gaussian, summed over action dims (independent of the mean)."""
    return (log_std + 0.5 + LOG_SQRT_2PI).sum(-1)


class ActorCritic(nn.Module):
    """The policy's mean, the value and the log-std. Two MLPs of hidden_sizes (`critic`, `actor_mean`), or with
    shared_trunk one MLP body (`trunk`) whose features feed two linear heads (`actor_mean`, `critic`): rl_games'
    `separate: False`, half the arithmetic of a round for the same widths, the value loss shaping the policy's
    features too (vf_coef weighs it). The separate model's trunk is empty, so its checkpoints' keys are unchanged.

    With critic_dim the critic's MLP reads an observation of its own (cfg.critic_obs, privileged), so every call
    that values takes it (`critic_obs`); the policy's calls are unchanged.

    The nn.Sequential containers hold the layers (their names are the checkpoints' keys); the forward is
    `_mlp_forward` on the layers' tensors, so that the PPO step can run the same forward on views of its flat
    parameter (`evaluate(..., params=)`) without swapping the module's parameters."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
        shared_trunk: bool = False,
        critic_dim: int = 0,
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
        self.actor_logstd = nn.Parameter(torch.full((act_dim,), float(log_std_init)))
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
        """(raw Normal sample, its log-prob, value) for a batch of normalised observations."""
        log_std, mean, value = self._heads(obs, None, critic_obs)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
        action = mean + noise * torch.exp(log_std)
        return action, gaussian_log_prob(mean, log_std, action), value

    def initial_state(self, n: int) -> None:
        """The memory of n envs at their episodes' start: an MLP has none (RecurrentActorCritic's is zeros)."""
        return None

    def act(
        self, obs: torch.Tensor, state: None, deterministic: bool, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, None]:
        """(the action for a batch of normalised observations: the mean, or a sample; the next state) for evaluation;
        the same interface as RecurrentActorCritic.act, so an episode loop serves both."""
        mean = self.action_mean(obs)
        if deterministic:
            return mean, None
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
        return mean + noise * torch.exp(self.actor_logstd), None  # sample()'s draw, without valuing

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

        The std does not depend on the observation, so neither does the entropy: it comes back as one number
        (a 0-dim tensor) that holds for every sample, not as a [B] vector of copies of it.
        """
        return self._evaluate(obs, action, params, critic_obs)[:3]

    def _evaluate(self, obs, action, params: Optional[Sequence[torch.Tensor]], critic_obs=None) -> tuple:
        """(log-prob, entropy, value, action mean)."""
        log_std, mean, value = self._heads(obs, params, critic_obs)
        return gaussian_log_prob(mean, log_std, action), gaussian_entropy(log_std), value, mean


def _mlp_forward(x: torch.Tensor, tensors: Sequence[torch.Tensor], activation, last: bool = False) -> torch.Tensor:
    """An MLP from its (weight, bias) tensors in layer order, the activation between layers, and after the last
    one too when `last` (a trunk, whose features feed heads). No tensors: x itself."""
    layers = len(tensors) // 2
    for i in range(layers):
        x = F.linear(x, tensors[2 * i], tensors[2 * i + 1])
        if last or i < layers - 1:
            x = activation(x)
    return x
