"""The GRU core (ppo_ddp/recurrent.py) against torch.nn.GRU, and its resets."""

from __future__ import annotations

import numpy as np
import torch

from ppo_ddp.recurrent import NumpyGRU, gru_cell, input_projection, unroll

IN, H, T, N = 5, 8, 12, 4


def reference_gru(seed: int = 0) -> torch.nn.GRU:
    torch.manual_seed(seed)
    return torch.nn.GRU(IN, H)  # time first, torch's own cell and weight layout


def weights(gru: torch.nn.GRU) -> tuple[torch.Tensor, ...]:
    return gru.weight_ih_l0, gru.bias_ih_l0, gru.weight_hh_l0, gru.bias_hh_l0


def run_unroll(gru: torch.nn.GRU, x: torch.Tensor, h0: torch.Tensor, starts: torch.Tensor):
    w_ih, b_ih, w_hh, b_hh = weights(gru)
    return unroll(input_projection(x, w_ih, b_ih), h0, starts, w_hh, b_hh)


def test_the_unroll_without_resets_is_torch_s_gru():
    gru = reference_gru()
    x, h0 = torch.randn(T, N, IN), torch.randn(N, H)
    with torch.no_grad():
        out, last = run_unroll(gru, x, h0, torch.zeros(T, N))
        expected, expected_last = gru(x, h0.unsqueeze(0))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(last, expected_last[0])


def test_an_episode_that_starts_inside_a_chunk_starts_from_zero():
    """Each env's chunk, cut at its episode starts, is torch's GRU over each piece: the first piece from the
    entering state (unless step 0 starts an episode), every later piece from zeros."""
    gru = reference_gru(1)
    x, h0 = torch.randn(T, N, IN), torch.randn(N, H)
    starts = torch.zeros(T, N)
    cuts = {0: [3, 7], 1: [0, 5], 2: [11], 3: []}  # env 1 starts an episode at step 0, env 2 at the last step
    for env, steps in cuts.items():
        starts[steps, env] = 1.0
    with torch.no_grad():
        out, _ = run_unroll(gru, x, h0, starts)
        for env, steps in cuts.items():
            bounds = sorted({0, *steps, T})
            for a, b in zip(bounds, bounds[1:]):
                entering = torch.zeros(1, 1, H) if a in steps else h0[env].view(1, 1, H)
                piece, _ = gru(x[a:b, env : env + 1], entering)
                torch.testing.assert_close(out[a:b, env], piece[:, 0], msg=f"env {env}, steps {a}-{b}")


def test_the_reset_also_cuts_the_gradient_to_earlier_steps():
    gru = reference_gru(2)
    x = torch.randn(T, 1, IN, requires_grad=True)
    starts = torch.zeros(T, 1)
    starts[6, 0] = 1.0
    out, _ = run_unroll(gru, x, torch.zeros(1, H), starts)
    out[6:].sum().backward()
    assert torch.count_nonzero(x.grad[:6]) == 0 and torch.count_nonzero(x.grad[6:]) > 0


def test_the_numpy_step_is_the_torch_step():
    gru = reference_gru(3)
    w_ih, b_ih, w_hh, b_hh = weights(gru)
    kernel = NumpyGRU()
    kernel.load(w_ih, b_ih, w_hh, b_hh)
    x, h = torch.randn(N, IN) * 3, torch.randn(N, H)
    with torch.no_grad():
        expected = gru_cell(input_projection(x, w_ih, b_ih), h, w_hh, b_hh)
    got = kernel.step(x.numpy(), h.numpy())
    assert got.dtype == np.float32 and got.shape == (N, H)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-6)
