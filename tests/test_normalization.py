"""Running moments, their exact merge, and the normalisers built on them (ppo_ddp.models.normalization).

The data flow these tests protect: actors report the moments of what they saw this round only; the
learner merges its actors', the ranks merge theirs, and the round's increment goes into the history once.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from ppo_ddp.models.normalization import (
    EPSILON,
    DiscountedReturn,
    Moments,
    ObsNormalizer,
    compute_batch_moments,
    merge_rms_states,
    normalize_obs,
    scale_reward,
)


def assert_moments_close(got: Moments, want: Moments, rtol: float = 1e-10) -> None:
    assert got.count == want.count
    np.testing.assert_allclose(got.mean, want.mean, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(got.var, want.var, rtol=rtol, atol=1e-12)


def observations(rows: int, seed: int = 0, dim: int = 5) -> np.ndarray:
    """Observation-like data: per-dimension offsets and scales far from (0, 1), as MuJoCo's are."""
    rng = np.random.default_rng(seed)
    return rng.normal(loc=np.linspace(-3, 40, dim), scale=np.linspace(0.1, 8, dim), size=(rows, dim))


def chunks(data: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    assert sum(sizes) == len(data)
    return np.split(data, np.cumsum(sizes)[:-1])


# ---- compute_batch_moments ----------------------------------------------------------------------------


def test_batch_moments_are_float64_population_moments():
    x = np.array([[1.0, 10.0], [2.0, 10.0], [6.0, 10.0]], dtype=np.float32)
    m = compute_batch_moments(x)
    assert m.count == 3
    assert m.mean.dtype == np.float64 and m.var.dtype == np.float64
    np.testing.assert_array_equal(m.mean, [3.0, 10.0])
    # Population variance (divide by N), as gymnasium's RunningMeanStd and the Chan merge assume.
    np.testing.assert_allclose(m.var, [14.0 / 3.0, 0.0])


def test_batch_moments_of_a_torch_tensor_match_numpy():
    x = observations(20)
    assert_moments_close(
        compute_batch_moments(torch.from_numpy(x).float()), compute_batch_moments(x.astype(np.float32))
    )


@pytest.mark.parametrize(
    "bad", [np.zeros((0, 3)), np.zeros((0,)), np.float64(1.0)], ids=["no rows", "empty 1-D", "scalar"]
)
def test_empty_input_is_an_error(bad):
    with pytest.raises(ValueError, match="empty"):
        compute_batch_moments(bad)


@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_an_error(bad_value):
    # One NaN from a diverging simulator would poison the statistics of every rank for the rest of the run.
    x = observations(10)
    x[7, 2] = bad_value
    with pytest.raises(ValueError, match=r"non-finite.*\(7, 2\)"):
        compute_batch_moments(x)


# ---- merge_rms_states -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sizes",
    [
        [1, 7, 1, 50, 13, 1, 127],  # unequal sizes, single rows in between
        [1] * 20,  # only single rows: each has variance 0
        [199, 1],  # one row merged into a large batch
    ],
    ids=["mixed", "single rows", "one late row"],
)
def test_merging_chunks_equals_moments_of_the_concatenation(sizes):
    data = observations(sum(sizes))
    merged = merge_rms_states(compute_batch_moments(c) for c in chunks(data, sizes))
    assert_moments_close(merged, compute_batch_moments(data))


def test_merge_order_and_grouping_do_not_matter():
    data = observations(300, seed=1)
    parts = [compute_batch_moments(c) for c in chunks(data, [3, 90, 1, 41, 165])]
    want = compute_batch_moments(data)
    for order in itertools.permutations(parts):
        assert_moments_close(merge_rms_states(order), want)
    # per-actor -> per-rank -> global, as the trainer groups them
    rank0 = merge_rms_states(parts[:2])
    rank1 = merge_rms_states(parts[2:])
    assert_moments_close(merge_rms_states([rank1, rank0]), want)


def test_merging_increments_into_history_once_equals_moments_of_all_data():
    data = observations(1000, seed=2)
    first, rounds = data[:100], chunks(data[100:], [64, 1, 300, 35, 500])
    history = compute_batch_moments(first)
    for new_rows in rounds:
        increment = compute_batch_moments(new_rows)
        before = history.count
        history = merge_rms_states([history, increment])
        assert history.count == before + len(new_rows)  # exactly the new rows, never more
    assert_moments_close(history, compute_batch_moments(data))


def test_merging_the_history_twice_is_detectably_wrong():
    # The classic bug: each actor (or rank) sends history + increment and the learner merges it into the
    # history again. The count doubles every round, new data gets an ever smaller weight and the
    # normaliser freezes. The count is what exposes it, so the test above asserting exact counts matters.
    data = observations(150, seed=3)
    history = compute_batch_moments(data[:100])
    increment = compute_batch_moments(data[100:])
    right = merge_rms_states([history, increment])
    wrong = merge_rms_states([history, history, increment])
    assert right.count == 150
    assert wrong.count == 250
    assert not np.allclose(wrong.mean, compute_batch_moments(data).mean, rtol=1e-6)


def test_large_offsets_keep_float64_precision():
    # MuJoCo positions can sit far from 0 with a small spread; float32 accumulators lose the variance.
    rng = np.random.default_rng(4)
    data = 1e6 + rng.normal(scale=1e-2, size=(4000, 3))
    merged = merge_rms_states(compute_batch_moments(c) for c in chunks(data, [1, 999, 3000]))
    np.testing.assert_allclose(merged.var, data.var(axis=0), rtol=1e-6)


def test_merge_skips_none_and_empty_states_and_returns_none_for_nothing():
    m = compute_batch_moments(observations(10))
    empty = Moments(np.zeros(5), np.zeros(5), 0.0)
    assert_moments_close(merge_rms_states([None, m, empty, None]), m)
    assert merge_rms_states([]) is None
    assert merge_rms_states([None, empty]) is None


def test_merge_does_not_alias_its_inputs():
    # The merged history must not share buffers with an actor's message that is later overwritten.
    m = compute_batch_moments(observations(10))
    merged = merge_rms_states([m])
    merged.mean[...] = 0.0
    assert not np.all(m.mean == 0.0)


def test_merging_different_shapes_is_an_error():
    with pytest.raises(ValueError, match="shapes differ"):
        merge_rms_states([compute_batch_moments(np.ones((3, 2))), compute_batch_moments(np.ones((3, 4)))])


def test_scalar_moments_merge_like_vectors():
    # Discounted returns are one number per env step: 1-D data with scalar moments.
    rng = np.random.default_rng(5)
    returns = rng.normal(3.0, 2.0, size=301)
    merged = merge_rms_states(compute_batch_moments(c) for c in chunks(returns, [1, 100, 200]))
    assert np.shape(merged.mean) == () and np.shape(merged.var) == ()
    assert_moments_close(merged, compute_batch_moments(returns))


# ---- Moments state ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [observations(30), np.arange(7.0)], ids=["vector", "scalar"])
def test_moments_state_round_trip(data):
    m = compute_batch_moments(data)
    state = m.to_state()
    # Tensors and plain floats only: that is what lets a checkpoint load with weights_only=True.
    assert isinstance(state["mean"], torch.Tensor) and state["mean"].dtype == torch.float64
    assert isinstance(state["var"], torch.Tensor) and state["var"].dtype == torch.float64
    assert type(state["count"]) is float
    back = Moments.from_state(state)
    np.testing.assert_array_equal(back.mean, m.mean)
    np.testing.assert_array_equal(back.var, m.var)
    assert back.count == m.count


def test_moments_state_is_a_copy():
    m = compute_batch_moments(observations(30))
    state = m.to_state()
    state["mean"].zero_()
    assert not np.all(m.mean == 0.0)


# ---- normalize_obs / scale_reward ------------------------------------------------------------------------


def test_normalize_obs_standardises_and_clips():
    state = Moments(mean=np.array([1.0, -2.0, 0.0]), var=np.array([4.0, 0.25, 1.0]), count=10.0)
    obs = np.array([[3.0, -2.5, 100.0], [1.0, -1.0, -100.0]], dtype=np.float32)
    out = normalize_obs(obs, state, clip=5.0)
    assert out.dtype == np.float32
    want = (obs - state.mean) / np.sqrt(state.var + EPSILON)
    np.testing.assert_allclose(out[:, :2], want[:, :2], rtol=1e-6)
    np.testing.assert_array_equal(out[:, 2], [5.0, -5.0])


def test_normalize_obs_leaves_obs_and_statistics_untouched():
    # Envs may hand back the same array every step, and the statistics are frozen for the round.
    state = compute_batch_moments(observations(50))
    mean_before, var_before = state.mean.copy(), state.var.copy()
    obs = observations(4, seed=9).astype(np.float32)
    obs_before = obs.copy()
    normalize_obs(obs, state, clip=10.0)
    np.testing.assert_array_equal(obs, obs_before)
    np.testing.assert_array_equal(state.mean, mean_before)
    np.testing.assert_array_equal(state.var, var_before)


def test_the_torch_normaliser_is_the_numpy_one_to_the_bit():
    """ObsNormalizer (evaluation, exported policies) and normalize_obs (the actors) give the same float32, for the
    envs' float64 observations and an exported file's float32 ones, clipped rows included, and without
    statistics."""
    state = compute_batch_moments(observations(50))
    obs = observations(200, seed=4) * 1.5  # wider than the statistics: some entries clip at ±3
    for x in (obs, obs.astype(np.float32)):
        want = normalize_obs(x, state, clip=3.0)
        assert 0 < np.mean(np.abs(want) == 3.0) < 0.5
        got = ObsNormalizer(state, 3.0)(torch.as_tensor(x))
        assert got.dtype == torch.float32 and np.array_equal(got.numpy(), want)
        assert np.array_equal(ObsNormalizer(None, 3.0)(torch.as_tensor(x)).numpy(), normalize_obs(x, None, 3.0))


def test_without_statistics_obs_and_rewards_pass_through_as_float32():
    obs = observations(3)
    out = normalize_obs(obs, None, clip=1.0)  # no clipping either: there is nothing to normalise yet
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, obs, rtol=1e-6)
    r = np.array([1.5, -300.0])
    assert scale_reward(r, None, clip=10.0).tolist() == [1.5, -300.0]


def test_scale_reward_divides_by_return_std_without_centering_and_clips():
    # Like gymnasium's NormalizeReward: r / std(G), never shifted by the mean (that would change the task).
    state = Moments(mean=np.float64(7.0), var=np.float64(4.0), count=100.0)
    out = scale_reward(np.array([2.0, -3.0, 1000.0]), state, clip=10.0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [1.0, -1.5, 10.0], rtol=1e-6)


# ---- DiscountedReturn ------------------------------------------------------------------------------------


def test_discounted_return_accumulates_and_restarts_at_episode_end():
    tracker = DiscountedReturn(num_envs=2, gamma=0.5)
    g = tracker.update(np.array([1.0, 1.0]), np.array([False, False]))
    assert g.tolist() == [1.0, 1.0]
    # env 0 ends on this step: its G still includes the step's reward ...
    g = tracker.update(np.array([1.0, 2.0]), np.array([True, False]))
    assert g.tolist() == [1.5, 2.5]
    # ... and the next episode starts from zero, while env 1 keeps discounting.
    g = tracker.update(np.array([1.0, 1.0]), np.array([False, False]))
    assert g.tolist() == [1.0, 2.25]


def test_discounted_return_output_is_a_copy():
    tracker = DiscountedReturn(num_envs=1, gamma=0.9)
    g = tracker.update(np.array([1.0]), np.array([False]))
    g[:] = 1000.0
    assert tracker.update(np.array([0.0]), np.array([False])).tolist() == [0.9]


def test_reward_scaling_from_discounted_return_increments():
    # End to end as the actors and learner use it: per-round moments of G, merged, scale the rewards.
    rng = np.random.default_rng(6)
    tracker = DiscountedReturn(num_envs=4, gamma=0.99)
    rounds = []
    for _ in range(3):
        rows = [tracker.update(rng.normal(1.0, 1.0, 4), rng.random(4) < 0.05) for _ in range(50)]
        rounds.append(np.concatenate(rows))
    history = merge_rms_states(compute_batch_moments(r) for r in rounds)
    assert history.count == 3 * 50 * 4
    std = np.concatenate(rounds).std()
    np.testing.assert_allclose(scale_reward(np.array([std]), history, clip=1e9), [1.0], rtol=1e-6)
