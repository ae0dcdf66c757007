"""The GRU core of a recurrent policy (issue 26): its step, its unroll over a chunk with episode resets, and the
same step in numpy for the actors. Pure math: nothing here knows of actors, ranks or buffers.

The cell is torch.nn.GRU's (gates r, z, n in that order, torch's weight layout), written on plain tensors so that
the PPO step can run it on views of its flat parameter and compile the unroll into its graph, as it does the MLP:

    r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
    z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
    h' = (1 - z) * n + z * h

The input's part (W_i* x + b_i*) of a whole chunk is one matrix product before the loop over time; only the
recurrent part runs step by step.

Resets: `episode_start[t]` is 1 where the observation of step t is the first of an episode. The state entering
that step is zeroed first (`h = (1 - episode_start[t]) * h`), in the learner's unroll and in the actor alike, so an
episode never sees its predecessor's memory, whichever step of a chunk it starts at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch
from torch import nn

from ppo_ddp.config import Config
from ppo_ddp.model import (
    ACTIVATION_FUNCTIONS,
    ActorCritic,
    PolicyKernel,
    _layer,
    _mlp_forward,
    gaussian_entropy,
    gaussian_log_prob,
    hidden_layers,
    numpy_linear,
)
from ppo_ddp.normalization import Moments, value_scale

CORES = ("actor", "critic")
"""The recurrent cores, in the order of the state's second axis: the actor and the critic each have their own
encoder and GRU (sb3-contrib's RecurrentPPO default), so the value loss does not shape the policy's memory."""


def input_projection(x: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor) -> torch.Tensor:
    """W_ih x + b_ih for every step at once: [..., in] -> [..., 3H]."""
    return torch.nn.functional.linear(x, w_ih, b_ih)


def gru_cell(x_proj: torch.Tensor, h: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
    """One step of K cores at once from the input's projection [K, N, 3H] and the entering state [K, N, H], with
    each core's w_hh [K, 3H, H] and b_hh [K, 3H]: the new state [K, N, H]."""
    h_proj = torch.baddbmm(b_hh.unsqueeze(1), h, w_hh.transpose(1, 2))
    x_r, x_z, x_n = x_proj.chunk(3, dim=-1)
    h_r, h_z, h_n = h_proj.chunk(3, dim=-1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return n + z * (h - n)  # (1 - z) * n + z * h


def unroll(
    x_proj: torch.Tensor, h0: torch.Tensor, episode_start: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The states of K cores over a chunk, time first: x_proj [T, K, N, 3H], h0 [K, N, H] (the state entering
    step 0), episode_start [T, N] (1.0 where step t starts an episode), w_hh [K, 3H, H], b_hh [K, 3H]. Returns
    (the state after each step [T, K, N, H], the last one [K, N, H]).

    The cores step together (one batched product a step rather than one per core): the loop over T (seq_length,
    fixed for a run) is the sequential part, and dynamo unrolls it into the compiled step's one graph."""
    keep = 1.0 - episode_start[:, None, :, None]
    h, out = h0, []
    for t in range(x_proj.shape[0]):
        h = gru_cell(x_proj[t], h * keep[t], w_hh, b_hh)
        out.append(h)
    return torch.stack(out), h


def _sigmoid_(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in place, as 0.5 * tanh(x / 2) + 0.5 (no overflow for large -x)."""
    x *= 0.5
    np.tanh(x, out=x)
    x *= 0.5
    x += 0.5
    return x


class NumpyGRU:
    """The GRU step in numpy for an actor's few rows a step (as ppo_ddp/model.py's PolicyKernel is the MLP's):
    `load(w_ih, b_ih, w_hh, b_hh)` takes torch's tensors, `step(x, h)` returns the new state, float32."""

    def load(self, w_ih: torch.Tensor, b_ih: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor) -> None:
        self.w_ih_t, self.b_ih = numpy_linear(w_ih, b_ih)
        self.w_hh_t, self.b_hh = numpy_linear(w_hh, b_hh)
        self.hidden = self.b_hh.shape[0] // 3

    def step(self, x: np.ndarray, h: np.ndarray) -> np.ndarray:
        """x [N, in] (float32), h [N, H] (the entering state, resets already applied) -> h' [N, H]."""
        H = self.hidden
        gx = x @ self.w_ih_t
        gx += self.b_ih
        gh = h @ self.w_hh_t
        gh += self.b_hh
        rz = _sigmoid_(gx[:, : 2 * H] + gh[:, : 2 * H])
        r, z = rz[:, :H], rz[:, H:]
        n = gh[:, 2 * H :]
        n *= r
        n += gx[:, 2 * H :]
        np.tanh(n, out=n)
        return n + z * (h - n)


def _gru(n_in: int, hidden: int) -> nn.GRU:
    gru = nn.GRU(n_in, hidden)
    for name, p in gru.named_parameters():  # orthogonal weights, zero biases, as the MLP layers (CleanRL's LSTM)
        nn.init.orthogonal_(p) if name.startswith("weight") else nn.init.zeros_(p)
    return gru


class RecurrentActorCritic(nn.Module):
    """A Gaussian policy and a value function, each an MLP encoder (hidden_sizes) → GRU (rnn_hidden_size) → linear
    head, and the state-independent log-std. The state of one env is [2, H]: the actor's core's, the critic's.

    As ActorCritic, the forward is written on the layers' tensors, so that the PPO step can run it on views of its
    flat parameter (`evaluate_chunks(..., params=)`)."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
        rnn_hidden_size: int = 64,
    ) -> None:
        super().__init__()
        self.obs_dim, self.act_dim, self.rnn_hidden_size = obs_dim, act_dim, rnn_hidden_size
        self.activation = ACTIVATION_FUNCTIONS[activation]
        width = hidden_sizes[-1] if hidden_sizes else obs_dim
        # the encoders: every layer followed by the activation (the GRU reads their output)
        self.critic_encoder = nn.Sequential(*hidden_layers(obs_dim, hidden_sizes, activation))
        self.critic_gru = _gru(width, rnn_hidden_size)
        self.critic = _layer(rnn_hidden_size, 1, 1.0)
        self.actor_encoder = nn.Sequential(*hidden_layers(obs_dim, hidden_sizes, activation))
        self.actor_gru = _gru(width, rnn_hidden_size)
        self.actor_mean = _layer(rnn_hidden_size, act_dim, 0.01)
        self.actor_logstd = nn.Parameter(torch.full((act_dim,), float(log_std_init)))
        names = [name for name, _ in self.named_parameters()]
        self._at = {
            part: [i for i, name in enumerate(names) if name.startswith(f"{part}.") or name == part]
            for part in (
                "critic_encoder", "critic_gru", "critic", "actor_encoder", "actor_gru", "actor_mean", "actor_logstd"
            )
        }  # fmt: skip

    def _part(self, params: Sequence[torch.Tensor], part: str) -> list[torch.Tensor]:
        return [params[i] for i in self._at[part]]

    def forward_chunks(
        self, obs: torch.Tensor, h0: torch.Tensor, starts: torch.Tensor, params: Optional[Sequence[torch.Tensor]] = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Chunks first: obs [C, T, D], h0 [C, 2, H] (the state entering each chunk's first step), starts [C, T].
        Returns (action mean [C, T, A], value [C, T], the state after each chunk's last step [C, 2, H])."""
        params = list(self.parameters()) if params is None else params
        obs_t = obs.transpose(0, 1)  # time first for the unroll
        projections, w_hh, b_hh = [], [], []
        for core in CORES:
            x = self.activation(_mlp_forward(obs_t, self._part(params, f"{core}_encoder"), self.activation))
            w_ih, w, b_ih, b = self._part(params, f"{core}_gru")  # nn.GRU's order
            projections.append(input_projection(x, w_ih, b_ih))
            w_hh.append(w)
            b_hh.append(b)
        x_proj, w_hh, b_hh = torch.stack(projections, 1), torch.stack(w_hh), torch.stack(b_hh)
        states, last = unroll(x_proj, h0.transpose(0, 1), starts.transpose(0, 1), w_hh, b_hh)
        mean = nn.functional.linear(states[:, 0], *self._part(params, "actor_mean")).transpose(0, 1)
        value = nn.functional.linear(states[:, 1], *self._part(params, "critic")).squeeze(-1).transpose(0, 1)
        return mean, value, last.transpose(0, 1)

    def evaluate_chunks(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        h0: torch.Tensor,
        starts: torch.Tensor,
        params: Optional[Sequence[torch.Tensor]] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-prob of actions [C, T], entropy (one number, as ActorCritic.evaluate's), value [C, T])."""
        params = list(self.parameters()) if params is None else params
        mean, value, _ = self.forward_chunks(obs, h0, starts, params)
        (log_std,) = self._part(params, "actor_logstd")
        return gaussian_log_prob(mean, log_std, actions), gaussian_entropy(log_std), value

    def evaluate_minibatch(self, mb, params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """evaluate_chunks() on a PPO mini-batch of chunks (its hidden and episode_start): the loss's one call."""
        return self.evaluate_chunks(mb.obs, mb.actions, mb.hidden, mb.episode_start, params)

    def initial_state(self, n: int) -> torch.Tensor:
        """The state of n envs at their episodes' start: zeros [n, 2, H]."""
        return torch.zeros(n, len(CORES), self.rnn_hidden_size)

    def act(
        self, obs: torch.Tensor, state: torch.Tensor, deterministic: bool, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, next state) for one step of a batch of envs from their entering state, for evaluation."""
        mean, _, state = self.forward_chunks(obs.unsqueeze(1), state, torch.zeros(obs.shape[0], 1))
        mean = mean[:, 0]
        if deterministic:
            return mean, state
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        return mean + noise * torch.exp(self.actor_logstd), state


class RecurrentKernel:
    """RecurrentActorCritic's step in numpy, for the actors: `step(obs [N, D], h [N, 2, H])` with the entering
    state (resets applied) returns (action mean [N, A], value [N], the new state [N, 2, H]), float32."""

    def __init__(self, model: RecurrentActorCritic, activation: str) -> None:
        self.activation = PolicyKernel._ACTIVATIONS[activation]
        self.load(model)

    def load(self, model: RecurrentActorCritic, value_rms: Optional[Moments] = None) -> None:
        """The round's weights; value_rms as PolicyKernel.load's."""
        self.value_scale = value_scale(value_rms)

        self.cores = []
        for encoder, gru, head in (
            (model.actor_encoder, model.actor_gru, model.actor_mean),
            (model.critic_encoder, model.critic_gru, model.critic),
        ):
            layers = [numpy_linear(m.weight, m.bias) for m in encoder if isinstance(m, nn.Linear)]
            cell = NumpyGRU()
            cell.load(gru.weight_ih_l0, gru.bias_ih_l0, gru.weight_hh_l0, gru.bias_hh_l0)
            self.cores.append((layers, cell, numpy_linear(head.weight, head.bias)))

    def step(self, obs: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        outputs, states = [], []
        for c, (layers, cell, (w, b)) in enumerate(self.cores):
            x = obs
            for lw, lb in layers:
                x = x @ lw
                x += lb
                self.activation(x)
            state = cell.step(x, h[:, c])
            states.append(state)
            outputs.append(state @ w + b)
        value = outputs[1][:, 0]
        if self.value_scale is not None:
            mean, std = self.value_scale
            value = value * np.float32(std) + np.float32(mean)
        return outputs[0], value, np.stack(states, axis=1)


def make_model(cfg: Config, obs_dim: int, act_dim: int) -> ActorCritic | RecurrentActorCritic:
    """The network a config describes (policy, hidden_sizes, activation, log_std_init, rnn_hidden_size), on the
    CPU: every process that builds one (learner, actors, evaluator, evaluate) builds it here."""
    if cfg.policy == "gru":
        return RecurrentActorCritic(
            obs_dim, act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init, cfg.rnn_hidden_size
        )
    return ActorCritic(obs_dim, act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init)


def make_kernel(model: ActorCritic | RecurrentActorCritic, activation: str) -> PolicyKernel | RecurrentKernel:
    """The numpy forward the actors step with, for either network."""
    if isinstance(model, RecurrentActorCritic):
        return RecurrentKernel(model, activation)
    return PolicyKernel(model, activation)
