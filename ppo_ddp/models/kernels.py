"""The policy an actor steps: the actor-critic's forward pass in numpy (the MLP's and the GRU's), loaded from the
weights the learner publishes each round, bit for bit what the torch model computes in float32."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch
from torch import nn

from ppo_ddp.models.gru import RecurrentActorCritic
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import Moments, unscale_value, value_scale


def numpy_linear(weight: torch.Tensor, bias: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A layer's (weight transposed, bias) as C-contiguous float32 numpy, so that x @ w + b is F.linear(x, weight,
    bias): how the actors' numpy kernels hold every layer."""
    w = weight.detach().cpu().numpy().T.astype(np.float32, order="C")
    return w, bias.detach().cpu().numpy().astype(np.float32)


def _elu_(h: np.ndarray) -> None:
    """ELU in place as max(h, exp(min(h, 0)) - 1): h where h > 0, exp(h) - 1 elsewhere (exp(h) - 1 >= h everywhere).
    numpy's exp is vectorised and its expm1 is not: 4-5x faster on the actors' [32, 512] activations, within an ulp
    of torch's ELU."""
    neg = np.minimum(h, 0.0)
    np.exp(neg, out=neg)
    neg -= 1.0
    np.maximum(h, neg, out=h)


class PolicyKernel:
    """The actor-critic's forward pass in numpy, for the actor's per-step inference on a few observations.

    A 64x64 MLP on 1-16 rows costs far less in numpy than torch's per-op dispatch (about 3x on the 2-core
    benchmark machine), and this runs once per env step. The math is the model's own: `load(model)` takes
    the weights of the round from the CPU ActorCritic (filled by read_flat_parameters), the layers and
    activation are the model's, and tests check values and log-probs against model.value / model.evaluate.
    The first layers of the policy and the value MLP share one matmul (their inputs are the same); with a shared
    trunk, its layers run first and the two linear heads are that one matmul.
    """

    _ACTIVATIONS = {
        "tanh": lambda h: np.tanh(h, out=h),
        "relu": lambda h: np.maximum(h, 0.0, out=h),
        "elu": lambda h: _elu_(h),
    }

    def __init__(self, model: ActorCritic, activation: str) -> None:
        self.activation = self._ACTIVATIONS[activation]
        self.load(model)

    def load(self, model: ActorCritic, value_rms: Optional[Moments] = None) -> None:
        """The round's weights; value_rms: the frozen return statistics a normalised critic's output is scaled back
        with (None: the output is the value)."""
        self.value_scale = value_scale(value_rms)

        def linears(seq: torch.nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
            return [numpy_linear(m.weight, m.bias) for m in seq if isinstance(m, torch.nn.Linear)]

        self.trunk = linears(model.trunk)
        actor, critic = linears(model.actor_mean), linears(model.critic)
        self.own_critic = critic if model.critic_dim else None  # a critic of its own observation: apart
        if self.own_critic is not None:
            self.actor = actor
            return
        self.width = actor[0][0].shape[1]
        self.first = (np.concatenate([actor[0][0], critic[0][0]], axis=1), np.concatenate([actor[0][1], critic[0][1]]))
        self.actor_rest, self.critic_rest = actor[1:], critic[1:]

    def step(
        self, obs: np.ndarray, state: None, critic_obs: Optional[np.ndarray] = None
    ) -> tuple[np.ndarray, np.ndarray, None]:
        """(action mean, value, next state): the interface the actor steps either network's kernel with (an MLP
        has no state; ppo_ddp/models/gru.py's RecurrentKernel has)."""
        return (*self(obs, critic_obs), None)

    def __call__(self, obs: np.ndarray, critic_obs: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
        """(action mean [N, act_dim], value [N]) for normalised float32 observations [N, obs_dim] (and the
        critic's own [N, critic_dim], when it has them)."""
        obs = numpy_mlp(obs, self.trunk, self.activation, last=True)  # a shared trunk's layers
        if self.own_critic is not None:
            value = numpy_mlp(critic_obs, self.own_critic, self.activation)[:, 0]
            return numpy_mlp(obs, self.actor, self.activation), unscale_value(value, self.value_scale)
        h = obs @ self.first[0]
        h += self.first[1]
        if not self.actor_rest:  # the heads were linear: h is [mean | value]
            return h[:, : self.width], unscale_value(h[:, self.width], self.value_scale)
        self.activation(h)
        mean = numpy_mlp(h[:, : self.width], self.actor_rest, self.activation)
        value = numpy_mlp(h[:, self.width :], self.critic_rest, self.activation)
        return mean, unscale_value(value[:, 0], self.value_scale)


def numpy_mlp(x: np.ndarray, layers: Sequence[tuple[np.ndarray, np.ndarray]], activation, last: bool = False):
    """_mlp_forward in numpy on numpy_linear's layers: the activation (in place) between layers, and after the
    last too when `last`. x itself is never written; no layers: x."""
    for i, (w, b) in enumerate(layers):
        x = x @ w
        x += b
        if last or i < len(layers) - 1:
            activation(x)
    return x


def _sigmoid_(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in place, as 0.5 * tanh(x / 2) + 0.5 (no overflow for large -x)."""
    x *= 0.5
    np.tanh(x, out=x)
    x *= 0.5
    x += 0.5
    return x


class NumpyGRU:
    """The GRU step in numpy for an actor's few rows a step (as ppo_ddp/models/mlp.py's PolicyKernel is the MLP's):
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


class RecurrentKernel:
    """RecurrentActorCritic's step in numpy, for the actors: `step(obs [N, D], h [N, H])` with the entering state
    (resets applied) returns (action mean [N, A], value [N], the new state [N, H]), float32."""

    def __init__(self, model: RecurrentActorCritic, activation: str) -> None:
        self.activation = PolicyKernel._ACTIVATIONS[activation]
        self.cell = NumpyGRU()
        self.load(model)

    def load(self, model: RecurrentActorCritic, value_rms: Optional[Moments] = None) -> None:
        """The round's weights; value_rms as PolicyKernel.load's."""
        self.value_scale = value_scale(value_rms)
        self.layers = [numpy_linear(m.weight, m.bias) for m in model.encoder if isinstance(m, nn.Linear)]
        self.head = [numpy_linear(m.weight, m.bias) for m in model.head if isinstance(m, nn.Linear)]
        gru = model.gru
        self.cell.load(gru.weight_ih_l0, gru.bias_ih_l0, gru.weight_hh_l0, gru.bias_hh_l0)
        w_mean, b_mean = numpy_linear(model.actor_mean.weight, model.actor_mean.bias)
        if model.critic_dim:  # the value is an MLP of the critic's own observation
            self.own_critic = [numpy_linear(m.weight, m.bias) for m in model.critic if isinstance(m, nn.Linear)]
            self.heads = (w_mean, b_mean)
            return
        # both heads as one product: [H, A + 1]
        self.own_critic = None
        w_value, b_value = numpy_linear(model.critic.weight, model.critic.bias)
        self.heads = (np.concatenate([w_mean, w_value], axis=1), np.concatenate([b_mean, b_value]))

    def step(
        self, obs: np.ndarray, h: np.ndarray, critic_obs: Optional[np.ndarray] = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = numpy_mlp(obs, self.layers, self.activation, last=True)
        state = self.cell.step(x, h)
        core = numpy_mlp(state, self.head, self.activation, last=True)
        out = core @ self.heads[0]
        out += self.heads[1]
        if self.own_critic is not None:
            value = numpy_mlp(critic_obs, self.own_critic, self.activation)[:, 0]
            return out, unscale_value(value, self.value_scale), state
        return out[:, :-1], unscale_value(out[:, -1], self.value_scale), state


def kernel_rows(envs: int) -> int:
    """The rows of every forward call of the actors of a rank with `envs` envs in all: the largest power of two up to
    8 and up to `envs`. How a BLAS product rounds a row depends on how many rows the call has (OpenBLAS, measured:
    a row of a 3-, 5-, 6- or 7-row call differs from the same row in a 4- or 8-row call) but not on where in a call of
    2, 4, 8, 16 or 32 rows it sits nor on the other rows; so an env gets the same actions from whichever actor steps
    it when every call has this many rows. At most 8: an actor of few envs pads them to it."""
    return min(8, 1 << (max(envs, 1).bit_length() - 1))


class FixedRows:
    """A kernel whose every call has `rows` rows (kernel_rows says why): fewer rows are stepped in a buffer of `rows`
    whose other rows are left as they are (a row's outputs do not depend on them), more a block of `rows` at a
    time; the outputs are the input's rows only."""

    def __init__(self, kernel: PolicyKernel | RecurrentKernel, rows: int) -> None:
        self.kernel, self.rows = kernel, rows
        self._buffers: dict[int, np.ndarray] = {}  # per input (obs, state, critic_obs): `rows` rows, kept

    def load(self, model: ActorCritic | RecurrentActorCritic, value_rms: Optional[Moments] = None) -> None:
        self.kernel.load(model, value_rms)

    def step(
        self, obs: np.ndarray, state: Optional[np.ndarray], critic_obs: Optional[np.ndarray] = None
    ) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
        n, rows = len(obs), self.rows
        if n == rows:
            return self.kernel.step(obs, state, critic_obs)
        if n < rows:
            out = self.kernel.step(*(self._in_buffer(i, x) for i, x in enumerate((obs, state, critic_obs))))
            return tuple(None if y is None else y[:n] for y in out)  # type: ignore[return-value]
        blocks = [self.step(*(None if x is None else x[i : i + rows] for x in (obs, state, critic_obs)))
                  for i in range(0, n, rows)]  # fmt: skip
        return tuple(None if parts[0] is None else np.concatenate(parts) for parts in zip(*blocks))  # type: ignore

    def _in_buffer(self, i: int, x: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """x in the first rows of input i's buffer of `rows` rows (made, zeroed, on first use)."""
        if x is None:
            return None
        buffer = self._buffers.get(i)
        if buffer is None or buffer.shape[1:] != x.shape[1:] or buffer.dtype != x.dtype:
            buffer = self._buffers[i] = np.zeros((self.rows, *x.shape[1:]), dtype=x.dtype)
        buffer[: len(x)] = x
        return buffer


def make_kernel(model: ActorCritic | RecurrentActorCritic, activation: str) -> PolicyKernel | RecurrentKernel:
    """The numpy forward the actors step with, for either network."""
    if isinstance(model, RecurrentActorCritic):
        return RecurrentKernel(model, activation)
    return PolicyKernel(model, activation)
