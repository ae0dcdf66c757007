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
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from ppo_ddp.models.mlp import ACTIVATION_FUNCTIONS, ActionHead, _layer, _mlp, _mlp_forward, hidden_layers


def input_projection(x: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor) -> torch.Tensor:
    """W_ih x + b_ih for every step at once: [..., in] -> [..., 3H]."""
    return torch.nn.functional.linear(x, w_ih, b_ih)


def gru_gates(
    x_proj: torch.Tensor, h: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gates of one step from the input's projection [N, 3H] and the entering state [N, H]: (r, z, n, and
    W_hn h + b_hn, which n's gradient needs), each [N, H]."""
    h_proj = torch.nn.functional.linear(h, w_hh, b_hh)
    x_r, x_z, x_n = x_proj.chunk(3, dim=-1)
    h_r, h_z, h_n = h_proj.chunk(3, dim=-1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return r, z, n, h_n


def gru_cell(x_proj: torch.Tensor, h: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
    """One step: the new state [N, H]."""
    _, z, n, _ = gru_gates(x_proj, h, w_hh, b_hh)
    return n + z * (h - n)  # (1 - z) * n + z * h


class _Unroll(torch.autograd.Function):
    """The loop over a chunk's steps with its backward written out. Autograd's own backward of the loop takes two
    small matrix products a step, one of them for W_hh's gradient; here that gradient is one product over all
    the chunk's steps at the end, as cuDNN's RNNs do (~12% off the update: docs/benchmarks/throughput.md). The
    math is gru_gates' (tests/test_recurrent.py checks the gradients against autograd through gru_cell)."""

    @staticmethod
    def forward(
        ctx: Any, x_proj: torch.Tensor, h0: torch.Tensor, keep: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor
    ) -> torch.Tensor:
        """The states after each step [T, N, H]; keep [T, N, 1] is 0 where a step starts an episode."""
        h, entering, gates, out = h0, [], [], []
        for t in range(x_proj.shape[0]):
            h = h * keep[t]
            r, z, n, h_n = gru_gates(x_proj[t], h, w_hh, b_hh)
            entering.append(h)
            gates.append(torch.stack([r, z, n, h_n]))
            h = n + z * (h - n)
            out.append(h)
        ctx.save_for_backward(torch.stack(entering), torch.stack(gates), keep, w_hh)
        return torch.stack(out)

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        entering, gates, keep, w_hh = ctx.saved_tensors
        dh, d_x, d_h_proj = torch.zeros_like(d_out[0]), [], []
        for t in reversed(range(d_out.shape[0])):
            r, z, n, h_n = gates[t]
            dh = dh + d_out[t]
            d_n = dh * (1 - z) * (1 - n * n)  # through tanh: the pre-activation x_n + r * h_n
            d_z = dh * (entering[t] - n) * z * (1 - z)
            d_r = d_n * h_n * r * (1 - r)
            d_x.append(torch.cat([d_r, d_z, d_n], -1))
            d_h_proj.append(torch.cat([d_r, d_z, d_n * r], -1))
            dh = (dh * z + d_h_proj[-1] @ w_hh) * keep[t]  # to the state entering step t, then through the reset
        d_x, d_h_proj = torch.stack(d_x[::-1]), torch.stack(d_h_proj[::-1])
        flat = d_h_proj.reshape(-1, d_h_proj.shape[-1])
        d_w = flat.t() @ entering.reshape(-1, entering.shape[-1])
        return d_x, dh, None, d_w, flat.sum(0)


def unroll(
    x_proj: torch.Tensor, h0: torch.Tensor, episode_start: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The states of a chunk, time first: x_proj [T, N, 3H], h0 [N, H] (the state entering step 0), episode_start
    [T, N] (1.0 where step t starts an episode). Returns (the state after each step [T, N, H], the last one).

    A loop over T (seq_length, fixed for a run), the sequential part of the update: dynamo unrolls it into the
    compiled step's one graph, and inductor's C++ wrapper calls its few kernels a step (ppo_ddp/algorithm/compiled.py).

    With nothing to differentiate (acting, evaluation, an exported policy) it is plain_unroll: the same states to
    the bit, and ordinary ops that torch.jit.trace and the ONNX exporters record, which a custom autograd Function
    is not (it would be an opaque Python call in the graph)."""
    keep = 1.0 - episode_start.unsqueeze(-1)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x_proj, h0, w_hh, b_hh)):
        states = _Unroll.apply(x_proj, h0, keep, w_hh, b_hh)
    else:
        states = plain_unroll(x_proj, h0, keep, w_hh, b_hh)
    return states, states[-1]


def plain_unroll(
    x_proj: torch.Tensor, h0: torch.Tensor, keep: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor
) -> torch.Tensor:
    """The loop of gru_cell over a chunk, keep [T, N, 1] 0 where a step starts an episode: the states after each
    step [T, N, H]. Autograd differentiates it step by step (the reference _Unroll's backward is tested against)."""
    h, out = h0, []
    for t in range(x_proj.shape[0]):
        h = gru_cell(x_proj[t], h * keep[t], w_hh, b_hh)
        out.append(h)
    return torch.stack(out)


def _gru(n_in: int, hidden: int) -> nn.GRU:
    gru = nn.GRU(n_in, hidden)
    for name, p in gru.named_parameters():  # orthogonal weights, zero biases, as the MLP layers (CleanRL's LSTM)
        nn.init.orthogonal_(p) if name.startswith("weight") else nn.init.zeros_(p)
    return gru


class RecurrentActorCritic(ActionHead):
    """A Gaussian policy and a value function on one recurrent core: an MLP encoder (hidden_sizes) → GRU
    (rnn_hidden_size), read by a linear action-mean head and a linear value head; the log-std is
    state-independent. The state of one env is [H]. With head_sizes (cfg.rnn_head_sizes) an MLP on the state sits
    between the GRU and the linear heads, so the action is no longer linear in the memory.

    One core for both (rl_games' default; sb3-contrib's default is a core each): measured on HopperNoVel-v5 the
    update took 0.175 s a round against 0.25 s with two, and learned no worse (docs/design.md, docs/tuning.md).
    With critic_dim the value is instead an MLP of hidden_sizes on the critic's own observation (cfg.critic_obs:
    privileged, whole, so it needs no memory), and the GRU serves the policy alone.
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
        critic_dim: int = 0,
        head_sizes: Sequence[int] = (),
        distribution: str = "gaussian",
        bounds: Optional[tuple[np.ndarray, np.ndarray]] = None,
    ) -> None:
        super().__init__()
        self.obs_dim, self.act_dim, self.rnn_hidden_size = obs_dim, act_dim, rnn_hidden_size
        self.critic_dim = critic_dim
        self.activation = ACTIVATION_FUNCTIONS[activation]
        width = hidden_sizes[-1] if hidden_sizes else obs_dim
        # the encoder: every layer followed by the activation (the GRU reads its output)
        self.encoder = nn.Sequential(*hidden_layers(obs_dim, hidden_sizes, activation))
        self.gru = _gru(width, rnn_hidden_size)
        # the head (rnn_head_sizes): on the state, every layer followed by the activation; empty, it has no
        # parameters and the linear heads read the state (the checkpoints' keys are then unchanged)
        self.head = nn.Sequential(*hidden_layers(rnn_hidden_size, head_sizes, activation))
        core_out = head_sizes[-1] if head_sizes else rnn_hidden_size
        if critic_dim:
            self.critic = _mlp(critic_dim, hidden_sizes, 1, activation, out_gain=1.0)
        else:
            self.critic = _layer(core_out, 1, 1.0)
        self.actor_mean = _layer(core_out, act_dim, 0.01)
        self._init_actions(act_dim, distribution, log_std_init, bounds)
        names = [name for name, _ in self.named_parameters()]
        self._at = {
            part: [i for i, name in enumerate(names) if name.startswith(f"{part}.") or name == part]
            for part in ("encoder", "gru", "head", "critic", "actor_mean", "actor_logstd")
        }

    def _part(self, params: Sequence[torch.Tensor], part: str) -> list[torch.Tensor]:
        return [params[i] for i in self._at[part]]

    def forward_chunks(
        self,
        obs: torch.Tensor,
        h0: torch.Tensor,
        starts: torch.Tensor,
        params: Optional[Sequence[torch.Tensor]] = None,
        critic_obs: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """Chunks first: obs [C, T, D], h0 [C, H] (the state entering each chunk's first step), starts [C, T],
        the critic's own observations [C, T, Dc] (critic_dim; without them no value). Returns (action mean
        [C, T, A], value [C, T] or None, the state after each chunk's last step [C, H])."""
        params = list(self.parameters()) if params is None else params
        obs_t = obs.transpose(0, 1)  # time first for the unroll
        x = self.activation(_mlp_forward(obs_t, self._part(params, "encoder"), self.activation))
        w_ih, w_hh, b_ih, b_hh = self._part(params, "gru")  # nn.GRU's order
        states, last = unroll(input_projection(x, w_ih, b_ih), h0, starts.transpose(0, 1), w_hh, b_hh)
        head = self._part(params, "head")  # none: the linear heads read the states themselves
        core = _mlp_forward(states, head, self.activation, last=True)
        mean = nn.functional.linear(core, *self._part(params, "actor_mean")).transpose(0, 1)
        critic = self._part(params, "critic")
        if not self.critic_dim:
            value = nn.functional.linear(core, *critic).squeeze(-1).transpose(0, 1)
        else:
            value = None if critic_obs is None else _mlp_forward(critic_obs, critic, self.activation).squeeze(-1)
        return mean, value, last

    def evaluate_chunks(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        h0: torch.Tensor,
        starts: torch.Tensor,
        params: Optional[Sequence[torch.Tensor]] = None,
        critic_obs: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-prob of actions [C, T], entropy (one number, as ActorCritic.evaluate's), value [C, T])."""
        params = list(self.parameters()) if params is None else params
        return self._evaluate(obs, actions, h0, starts, params, critic_obs)[:3]

    def _evaluate(self, obs, actions, h0, starts, params: Sequence[torch.Tensor], critic_obs=None) -> tuple:
        """(log-prob, entropy, value, action mean)."""
        out, value, _ = self.forward_chunks(obs, h0, starts, params, critic_obs)
        (spread,) = self._part(params, "actor_logstd")
        dist = self.dist
        return dist.log_prob(out, spread, actions), dist.entropy(out, spread, actions), value, out

    def evaluate_minibatch(self, mb, params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """evaluate_chunks() on a PPO mini-batch of chunks (its hidden and episode_start), and the action mean
        [C, T, A] as its fourth value (for bounds_loss_coef): the loss's one call."""
        return self._evaluate(mb.obs, mb.actions, mb.hidden, mb.episode_start, params, mb.critic_obs)

    def initial_state(self, n: int) -> torch.Tensor:
        """The state of n envs at their episodes' start: zeros [n, H]."""
        return torch.zeros(n, self.rnn_hidden_size)

    def act(
        self, obs: torch.Tensor, state: torch.Tensor, deterministic: bool, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, next state) for one step of a batch of envs from their entering state, for evaluation."""
        mean, _, state = self.forward_chunks(obs.unsqueeze(1), state, torch.zeros(obs.shape[0], 1))
        out = mean[:, 0]
        if deterministic:
            return self.dist.mode(out, self.actor_logstd), state
        return self.dist.sample(out, self.actor_logstd, generator), state
