"""The GRU core (ppo_ddp/models/gru.py) against torch.nn.GRU, and its resets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ppo_ddp.models.gru import RecurrentActorCritic, gru_cell, input_projection, plain_unroll, unroll
from ppo_ddp.models.kernels import NumpyGRU, RecurrentKernel

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


@pytest.mark.parametrize("head_sizes", [(), (12, 10)], ids=["linear-heads", "head-mlp"])
def test_the_actor_s_numpy_steps_are_the_learner_s_unroll(head_sizes):
    """What an actor computes step by step (numpy, resetting the state where an episode starts) is what the learner
    computes over the whole chunk from the state entering it: the same means and values, the same state after;
    with the heads on the state alone, and behind a head MLP on the state and the step's features."""
    D, A, C = 6, 3, 5
    torch.manual_seed(4)
    model = RecurrentActorCritic(D, A, (16, 16), "elu", -0.5, rnn_hidden_size=8, head_sizes=head_sizes)
    kernel = RecurrentKernel(model, "elu")
    obs = torch.randn(C, T, D)
    starts = (torch.rand(C, T) < 0.2).float()
    h0 = torch.randn(C, 8)
    h = h0.numpy().copy()
    means, values = [], []
    for t in range(T):
        h[starts[:, t].numpy() == 1] = 0.0
        mean, value, h = kernel.step(obs[:, t].numpy(), h)
        means.append(mean)
        values.append(value)
    with torch.no_grad():
        mean, value, last = model.forward_chunks(obs, h0, starts)
    np.testing.assert_allclose(np.stack(means, 1), mean.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.stack(values, 1), value.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h, last.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("head_sizes", [(), (12,)], ids=["linear-heads", "head-mlp"])
def test_evaluate_chunks_on_a_flat_parameter_is_the_model_s(head_sizes):
    """The PPO step's path (views of one flat tensor) and the module's own parameters give the same numbers."""
    torch.manual_seed(5)
    model = RecurrentActorCritic(4, 2, (8,), "tanh", 0.0, rnn_hidden_size=6, head_sizes=head_sizes)
    obs, actions, h0 = torch.randn(3, T, 4), torch.randn(3, T, 2), torch.zeros(3, 6)
    starts = torch.zeros(3, T)
    starts[:, 0] = 1.0
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    views = [v.view_as(p) for p, v in zip(model.parameters(), flat.split([p.numel() for p in model.parameters()]))]
    with torch.no_grad():
        own = model.evaluate_chunks(obs, actions, h0, starts)
        viewed = model.evaluate_chunks(obs, actions, h0, starts, views)
    for a, b in zip(own, viewed):
        torch.testing.assert_close(a, b)
    assert own[0].shape == (3, T) and own[1].dim() == 0 and own[2].shape == (3, T)


def test_the_unroll_s_written_out_backward_is_autograd_s():
    """unroll()'s hand-written backward (one product for W_hh's gradient) against autograd through the plain loop
    of gru_cell, in float64, with resets inside the chunk and every input differentiated."""
    torch.manual_seed(7)
    x = torch.randn(T, N, 3 * H, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(N, H, dtype=torch.float64, requires_grad=True)
    w_hh = torch.randn(3 * H, H, dtype=torch.float64, requires_grad=True)
    b_hh = torch.randn(3 * H, dtype=torch.float64, requires_grad=True)
    starts = (torch.rand(T, N) < 0.25).to(torch.float64)
    weight = torch.randn(T, N, H, dtype=torch.float64)  # a loss that reads every step's state

    plain = plain_unroll(x, h0, 1 - starts[..., None], w_hh, b_hh)  # autograd's own backward of the loop
    expected = torch.autograd.grad((plain * weight).sum(), (x, h0, w_hh, b_hh))
    states, last = unroll(x, h0, starts, w_hh, b_hh)
    got = torch.autograd.grad((states * weight).sum(), (x, h0, w_hh, b_hh))
    torch.testing.assert_close(last, states[-1])
    for name, a, b in zip(("x_proj", "h0", "w_hh", "b_hh"), got, expected):
        torch.testing.assert_close(a, b, msg=name)
    # and against finite differences, every input's whole Jacobian, over the first 6 steps of 2 envs (a fifth of the
    # whole chunk's cost), resets inside them
    few, two = slice(0, 6), slice(0, 2)
    assert starts[few, two][1:].sum() >= 2
    x_few, h0_few = x[few, two].detach().clone().requires_grad_(), h0[two].detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: unroll(*a[:2], starts[few, two], *a[2:])[0], (x_few, h0_few, w_hh, b_hh))


def test_without_gradients_the_unroll_is_the_plain_loop_to_the_bit():
    """Acting and exported policies take plain_unroll (no custom autograd Function to trace): the states must be
    the training unroll's exactly, resets included."""
    torch.manual_seed(8)
    x, h0 = torch.randn(T, N, 3 * H), torch.randn(N, H)
    w_hh, b_hh = torch.randn(3 * H, H, requires_grad=True), torch.randn(3 * H, requires_grad=True)
    starts = (torch.rand(T, N) < 0.25).float()
    trained, _ = unroll(x, h0, starts, w_hh, b_hh)
    assert trained.grad_fn is not None and "Unroll" in type(trained.grad_fn).__name__  # the written-out backward
    with torch.no_grad():
        plain, last = unroll(x, h0, starts, w_hh, b_hh)
    assert torch.equal(plain, trained.detach()) and torch.equal(last, plain[-1])
