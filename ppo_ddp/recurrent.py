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

import numpy as np
import torch


def input_projection(x: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor) -> torch.Tensor:
    """W_ih x + b_ih for every step at once: [..., in] -> [..., 3H]."""
    return torch.nn.functional.linear(x, w_ih, b_ih)


def gru_cell(x_proj: torch.Tensor, h: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
    """One step from the input's projection [N, 3H] and the entering state [N, H]: the new state [N, H]."""
    h_proj = torch.nn.functional.linear(h, w_hh, b_hh)
    x_r, x_z, x_n = x_proj.chunk(3, dim=-1)
    h_r, h_z, h_n = h_proj.chunk(3, dim=-1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return n + z * (h - n)  # (1 - z) * n + z * h


def unroll(
    x_proj: torch.Tensor, h0: torch.Tensor, episode_start: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The states of a chunk, time first: x_proj [T, N, 3H], h0 [N, H] (the state entering step 0), episode_start
    [T, N] (1.0 where step t starts an episode). Returns (the state after each step [T, N, H], the last one).

    A loop over T (seq_length, fixed for a run): compiled, dynamo unrolls it into the step's one graph."""
    keep = 1.0 - episode_start.unsqueeze(-1)
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
        def arr(t: torch.Tensor) -> np.ndarray:
            return t.detach().cpu().numpy().astype(np.float32)

        self.w_ih_t, self.b_ih = np.ascontiguousarray(arr(w_ih).T), arr(b_ih)
        self.w_hh_t, self.b_hh = np.ascontiguousarray(arr(w_hh).T), arr(b_hh)
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
