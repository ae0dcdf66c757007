"""GAE and action preparation: the rollout math every actor runs (ppo_ddp.algorithm.gae, ppo_ddp.models.actions).

The hand-computed cases use gamma = lambda = 0.5 so every number is a short binary fraction and the
expected advantages can be checked on paper: gamma * lambda = 0.25.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ppo_ddp.algorithm.gae import compute_gae
from ppo_ddp.models.actions import prepare_action

G, L = 0.5, 0.5


def t(rows: list) -> torch.Tensor:
    """A [T, N] float64 tensor from a list of time steps (one row per step, one column per env)."""
    return torch.tensor(rows, dtype=torch.float64)


def flags(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def column(values: list) -> torch.Tensor:
    """A single-env rollout [T, 1] from a list over time."""
    return t([[v] for v in values])


# A three-step, single-env rollout shared by the hand-computed cases below:
#   rewards 1, values [1, 2, 3], next_values [2, X, 8] where X = next_values[1] is varied per case.
# Without any episode end, deltas are r + 0.5 * V' - V.
REWARDS = [1.0, 1.0, 1.0]
VALUES = [1.0, 2.0, 3.0]


def gae_3(next_value_1: float, terminated: list, truncated: list):
    adv, ret = compute_gae(
        column(REWARDS),
        column(VALUES),
        column([2.0, next_value_1, 8.0]),
        flags([[x] for x in terminated]),
        flags([[x] for x in truncated]),
        G,
        L,
    )
    return adv[:, 0].tolist(), ret[:, 0].tolist()


def test_no_episode_end_is_plain_gae():
    # deltas: 1 + 1 - 1 = 1, 1 + 1.5 - 2 = 0.5, 1 + 4 - 3 = 2
    # A2 = 2, A1 = 0.5 + 0.25 * 2 = 1, A0 = 1 + 0.25 * 1 = 1.25
    adv, ret = gae_3(3.0, [False] * 3, [False] * 3)
    assert adv == [1.25, 1.0, 2.0]
    assert ret == [2.25, 3.0, 5.0]  # returns = advantages + values


def test_termination_does_not_bootstrap_and_cuts_the_recursion():
    # next_values[1] = 100 is V of the terminal observation: it must be ignored.
    # delta1 = 1 - 2 = -1; A1 must not see A2 = 2 (that is the next episode); A0 = 1 + 0.25 * -1.
    adv, _ = gae_3(100.0, [False, True, False], [False] * 3)
    assert adv == [0.75, -1.0, 2.0]


def test_truncation_bootstraps_from_the_final_observation_and_cuts_the_recursion():
    # next_values[1] = 10 is V of the pre-reset final observation: delta1 = 1 + 5 - 2 = 4.
    # A1 = 4 exactly (not 4 + 0.25 * A2: the next episode must not leak in); A0 = 1 + 0.25 * 4.
    adv, _ = gae_3(10.0, [False] * 3, [False, True, False])
    assert adv == [2.0, 4.0, 2.0]


def test_terminated_and_truncated_on_the_same_step_means_termination():
    # A time limit that coincides with a real terminal state: no bootstrap, same as plain termination.
    both, _ = gae_3(10.0, [False, True, False], [False, True, False])
    terminated_only, _ = gae_3(10.0, [False, True, False], [False] * 3)
    assert both == terminated_only == [0.75, -1.0, 2.0]


def test_truncation_at_the_last_step_bootstraps():
    # rewards [1, 1], values [1, 2], next_values [2, 6]: the final step was cut by the time limit, so
    # delta1 = 1 + 0.5 * 6 - 2 = 2 and A0 = (1 + 1 - 1) + 0.25 * 2 = 1.5.
    args = (column([1.0, 1.0]), column([1.0, 2.0]), column([2.0, 6.0]))
    no_end = flags([[False], [False]])
    last = flags([[False], [True]])
    truncated, _ = compute_gae(*args, no_end, last, G, L)
    assert truncated[:, 0].tolist() == [1.5, 2.0]
    # Had it been a termination instead, the final value would be dropped: delta1 = -1, A0 = 0.75.
    terminated, _ = compute_gae(*args, last, no_end, G, L)
    assert terminated[:, 0].tolist() == [0.75, -1.0]


def test_terminated_and_truncated_in_one_rollout_and_in_different_envs():
    # Five steps, two envs, rewards 1 and values 0 everywhere (so delta = 1 + 0.5 * V' unless terminated),
    # next_values 2 except 4 on each env's truncated step.
    #   env 0: terminated at t=1, truncated at t=3
    #     deltas [2, 1, 2, 3, 2] -> A4 = 2, A3 = 3, A2 = 2 + 0.75, A1 = 1, A0 = 2 + 0.25
    #   env 1: truncated at t=1, terminated at t=3
    #     deltas [2, 3, 2, 1, 2] -> A4 = 2, A3 = 1, A2 = 2 + 0.25, A1 = 3, A0 = 2 + 0.75
    rewards = torch.ones(5, 2, dtype=torch.float64)
    values = torch.zeros(5, 2, dtype=torch.float64)
    next_values = t([[2, 2], [2, 4], [2, 2], [4, 2], [2, 2]])
    terminated = flags([[0, 0], [1, 0], [0, 0], [0, 1], [0, 0]])
    truncated = flags([[0, 0], [0, 1], [0, 0], [1, 0], [0, 0]])
    adv, ret = compute_gae(rewards, values, next_values, terminated, truncated, G, L)
    assert adv[:, 0].tolist() == [2.25, 1.0, 2.75, 3.0, 2.0]
    assert adv[:, 1].tolist() == [2.75, 3.0, 2.25, 1.0, 2.0]
    assert torch.equal(ret, adv)  # values are 0

    # Envs are independent columns: each equals its own single-env GAE.
    for n in range(2):
        alone, _ = compute_gae(*(x[:, n : n + 1] for x in (rewards, values, next_values, terminated, truncated)), G, L)
        assert torch.equal(alone[:, 0], adv[:, n])


def reference_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Per-env, per-step Python loop, written branch by branch from the definition of GAE with truncation bootstrap."""
    T, N = len(rewards), len(rewards[0])
    adv = [[0.0] * N for _ in range(T)]
    for n in range(N):
        following = 0.0  # advantage of the step after t within the same episode
        for step in reversed(range(T)):
            r, v, nv = rewards[step][n], values[step][n], next_values[step][n]
            if terminated[step][n]:
                adv[step][n] = r - v  # no bootstrap, episode over
            elif truncated[step][n]:
                adv[step][n] = r + gamma * nv - v  # bootstrap from the final obs, episode over
            else:
                adv[step][n] = r + gamma * nv - v + gamma * lam * following
            following = adv[step][n]
    return adv


@pytest.mark.parametrize("gamma, lam", [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0), (0.8, 0.5)])
def test_matches_a_plain_reference_loop_on_random_data(gamma, lam):
    rng = np.random.default_rng(0)
    T, N = 64, 7
    rewards, values, next_values = (rng.normal(size=(T, N)) for _ in range(3))
    # ~10% of steps end by each cause, so some steps are both and some envs see several episodes.
    terminated, truncated = rng.random((T, N)) < 0.1, rng.random((T, N)) < 0.1
    assert (terminated & truncated).any() and (terminated ^ truncated).any()

    adv, ret = compute_gae(
        *(torch.from_numpy(x) for x in (rewards, values, next_values, terminated, truncated)), gamma, lam
    )
    expected = torch.tensor(
        reference_gae(
            rewards.tolist(), values.tolist(), next_values.tolist(), terminated.tolist(), truncated.tolist(), gamma, lam
        ),
        dtype=torch.float64,
    )
    assert adv.dtype == torch.float64
    torch.testing.assert_close(adv, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, expected + torch.from_numpy(values), rtol=1e-12, atol=1e-12)


def test_float_flags_and_float32_inputs():
    # Shared-memory buffers may hold done flags as float32 0/1: same answer as bools, in float32.
    rewards = column([1.0, 1.0, 1.0]).float()
    values = column(VALUES).float()
    next_values = column([2.0, 10.0, 8.0]).float()
    adv, _ = compute_gae(rewards, values, next_values, torch.zeros(3, 1), column([0.0, 1.0, 0.0]).float(), G, L)
    assert adv.dtype == torch.float32
    assert adv[:, 0].tolist() == [2.0, 4.0, 2.0]


def test_inputs_are_not_modified():
    rng = np.random.default_rng(1)
    inputs = [torch.from_numpy(rng.normal(size=(8, 3))) for _ in range(3)] + [
        torch.from_numpy(rng.random((8, 3)) < 0.3) for _ in range(2)
    ]
    before = [x.clone() for x in inputs]
    compute_gae(*inputs, 0.99, 0.95)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before))


def test_mismatched_shapes_are_an_error():
    ok = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="next_values"):
        compute_gae(ok, ok, torch.zeros(4, 3), ok.bool(), ok.bool(), 0.99, 0.95)
    with pytest.raises(ValueError, match=r"\[T, N\]"):
        flat = torch.zeros(4)
        compute_gae(flat, flat, flat, flat.bool(), flat.bool(), 0.99, 0.95)


# ---- prepare_action ----------------------------------------------------------------------------------

LOW = [-1.0, -1.0, -0.5]
HIGH = [1.0, 1.0, 2.0]
SAMPLE = [[-2.0, 0.5, 3.0], [0.9, 1.5, -0.7]]
CLIPPED = [[-1.0, 0.5, 2.0], [0.9, 1.0, -0.5]]


def test_prepare_action_torch_keeps_the_sample_and_clips_only_the_env_action():
    sampled = torch.tensor(SAMPLE)
    policy_action, env_action = prepare_action(sampled, torch.tensor(LOW), torch.tensor(HIGH))
    # The buffer stores the raw sample and PPO's log-prob is of the raw sample: it must be untouched.
    assert torch.equal(policy_action, torch.tensor(SAMPLE))
    assert torch.equal(env_action, torch.tensor(CLIPPED))
    assert torch.equal(sampled, torch.tensor(SAMPLE))  # clipping did not write into the sample


def test_prepare_action_torch_sample_with_gymnasium_box_bounds():
    # What an actor does: a torch sample, the env's float32 numpy Box bounds, broadcast over [E, act_dim].
    sampled = torch.tensor(SAMPLE, dtype=torch.float32)
    policy_action, env_action = prepare_action(sampled, np.array(LOW, np.float32), np.array(HIGH, np.float32))
    assert torch.equal(policy_action, torch.tensor(SAMPLE))
    assert isinstance(env_action, torch.Tensor) and env_action.dtype == torch.float32
    assert torch.equal(env_action, torch.tensor(CLIPPED))


def test_prepare_action_numpy():
    sampled = np.array(SAMPLE, dtype=np.float32)
    policy_action, env_action = prepare_action(sampled, np.array(LOW, np.float32), np.array(HIGH, np.float32))
    np.testing.assert_array_equal(policy_action, np.array(SAMPLE, np.float32))
    np.testing.assert_array_equal(env_action, np.array(CLIPPED, np.float32))
    np.testing.assert_array_equal(sampled, np.array(SAMPLE, np.float32))
    # Stepping the env with an action must not be able to change the stored one.
    assert not np.shares_memory(policy_action, env_action)
