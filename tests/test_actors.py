"""Actor pool and shared buffers: rollout contents, GAE, statistics, seeding, supervision, clean shutdown.

The scripted env (tests/scripted_env.py) has known rewards, episode ends and a marker in its final
observation, and reuses its observation array in place. MuJoCo rollouts are checked by replaying every
env in this process with the stored (clipped) actions. Every pool is checked to leave no process and no
shared-memory segment behind, after errors too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # actors inherit sys.path, so they can import scripted_env too
    sys.path.insert(0, str(TESTS_DIR))

import scripted_env  # noqa: E402
from pools import (  # noqa: E402
    SCRIPTED,
    assert_fully_written,
    assert_released,
    check_policy_outputs,
    make_cfg,
    make_model,
    snapshot,
    value_of,
)

from ppo_ddp.algorithm.gae import compute_gae  # noqa: E402
from ppo_ddp.algorithm.learner import recompute_advantages  # noqa: E402
from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.envs.make import env_seed, make_env  # noqa: E402
from ppo_ddp.models.kernels import PolicyKernel  # noqa: E402
from ppo_ddp.models.mlp import ActorCritic  # noqa: E402
from ppo_ddp.models.normalization import (  # noqa: E402
    DiscountedReturn,
    Moments,
    compute_batch_moments,
    merge_rms_states,
    normalize_obs,
    scale_reward,
)
from ppo_ddp.sampling.pool import ActorPool  # noqa: E402
from ppo_ddp.storage.batch import RolloutBatch  # noqa: E402
from ppo_ddp.storage.shared import FLAG_SENTINEL, ROLLOUT_FIELDS, BufferSpec, SharedBuffers  # noqa: E402


# ------------------------------------------------------------------------------------- buffers (no processes)
def test_buffer_layout_sentinel_and_stats():
    spec = BufferSpec(num_actors=2, rollout_length=5, envs_per_actor=3, obs_dim=7, act_dim=2, num_params=101)
    offsets, rollout_start, rollout_size, total = spec.layout()
    spans = sorted((offsets[n], offsets[n] + d.itemsize * int(np.prod(s))) for n, (d, s) in spec.fields().items())
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), "fields overlap"
    assert all(off % 64 == 0 for off in offsets.values())
    assert rollout_start % os.sysconf("SC_PAGE_SIZE") == 0 and rollout_size % os.sysconf("SC_PAGE_SIZE") == 0
    assert all(offsets[n] >= rollout_start for n in ROLLOUT_FIELDS) and spans[-1][1] <= total

    owner = SharedBuffers.create(spec)
    try:
        assert np.isnan(owner.arrays["advantages"]).all() and (owner.arrays["truncated"] == FLAG_SENTINEL).all()
        assert owner.obs.shape == (2, 5, 3, 7) and owner.actions.shape == (2, 5, 3, 2) and owner.weights.shape == (101,)
        assert owner.read_stats() == (None, None, None, None)
        obs_rms = Moments(np.arange(7.0), np.full(7, 2.0), 10.0)
        owner.write_stats(
            obs_rms, Moments(np.array(1.5), np.array(4.0), 3.0), Moments(np.array(-2.0), np.array(9.0), 5.0)
        )
        attached = SharedBuffers.attach(spec, owner.name)  # what an actor sees
        try:
            got_obs, got_ret, got_value, _ = attached.read_stats()
            np.testing.assert_array_equal(got_obs.mean, obs_rms.mean)
            np.testing.assert_array_equal(got_obs.var, obs_rms.var)
            assert (
                got_obs.count == 10.0
                and float(got_ret.mean) == 1.5
                and float(got_ret.var) == 4.0
                and got_ret.count == 3.0
            )
            assert (float(got_value.mean), float(got_value.var), got_value.count) == (-2.0, 9.0, 5.0)
            attached.values[1, 4, 2] = 42.0
            assert owner.values[1, 4, 2] == 42.0
        finally:
            attached.close()
        owner.write_stats(None, None)
        assert owner.read_stats() == (None, None, None, None)
    finally:
        owner.close()
    assert not os.path.exists(f"/dev/shm/{owner.name}")


@pytest.mark.parametrize("critic", ["separate", "shared_trunk", "critic_obs"])
@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
def test_policy_kernel_matches_model(activation, critic):
    critic_dim = 5 if critic == "critic_obs" else 0  # the critic reads observations of its own
    model = ActorCritic(9, 3, (32, 16), activation, -0.5, shared_trunk=critic == "shared_trunk", critic_dim=critic_dim)
    kernel = PolicyKernel(model, activation)
    obs = torch.randn(13, 9) * 3
    critic_obs = torch.randn(13, critic_dim) * 3 if critic_dim else None
    mean, value = kernel(obs.numpy(), None if critic_obs is None else critic_obs.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(mean, model.action_mean(obs).numpy(), rtol=1e-5, atol=1e-6)
        valued = obs if critic_obs is None else critic_obs
        np.testing.assert_allclose(value, model.value(valued).numpy(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------- scripted rollouts
SCRIPTED_ROUND_STATS = [  # the frozen (obs, return) statistics of each scripted round: the first has none yet
    (None, None),
    (
        Moments(np.array([100.0, 2.0, 3.0]), np.array([9.0, 4.0, 300.0]), 50.0),
        Moments(np.array(0.5), np.array(2.5), 40.0),
    ),
]


def scripts_of(cfg: Config) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    """What each scripted env (actor a, env e) does over the scripted rounds and the first step after them."""
    steps = (len(SCRIPTED_ROUND_STATS) + 1) * cfg.rollout_length
    return {
        (a, e): scripted_env.expected_script(float(env_seed(cfg.seed, 0, a * cfg.envs_per_actor + e) % 1000), steps)
        for a in range(cfg.actors_per_gpu)
        for e in range(cfg.envs_per_actor)
    }


def test_scripted_rollout_contents_bootstrap_and_gae():
    """Exact obs/rewards/flags, V(final obs) bootstrap on truncation, no bootstrap on termination, GAE."""
    cfg = make_cfg(SCRIPTED, normalize_obs=True, normalize_reward=True, gamma=0.9, gae_lambda=0.8)
    T, E, A = cfg.rollout_length, cfg.envs_per_actor, cfg.actors_per_gpu
    scripts = scripts_of(cfg)
    tags = {scripts[k]["obs"][0, 0] for k in scripts}
    assert len(tags) == A * E, "every env gets its own seed"
    returns_tracker = {a: DiscountedReturn(E, cfg.gamma) for a in range(A)}
    with ActorPool(cfg, rank=0, num_actors=A, obs_dim=3, act_dim=2, pin_memory=False) as pool:
        for r, (obs_rms, ret_rms) in enumerate(SCRIPTED_ROUND_STATS):
            model = make_model(cfg, 3, 2, seed=r)
            reports = pool.collect(model, obs_rms, ret_rms)
            data = snapshot(pool)
            assert_fully_written(data)
            assert [rep.actor_id for rep in reports] == list(range(A))
            window = slice(r * T, (r + 1) * T)
            for a in range(A):
                check_policy_outputs(model, data, a)
                exp = {k: np.stack([scripts[a, e][k][window] for e in range(E)], axis=1) for k in scripts[a, 0]}
                raw_next = np.stack([scripts[a, e]["obs"][r * T + 1 : (r + 1) * T + 1] for e in range(E)], axis=1)
                ended = exp["terminated"] | exp["truncated"]
                # what the buffer holds: obs as normalised for the policy, raw rewards, flags
                np.testing.assert_array_equal(data["obs"][a], normalize_obs(exp["obs"], obs_rms, cfg.obs_clip))
                np.testing.assert_array_equal(data["rewards"][a], exp["rewards"].astype(np.float32))
                np.testing.assert_array_equal(data["terminated"][a], exp["terminated"])
                np.testing.assert_array_equal(data["truncated"][a], exp["truncated"])
                if r == 0:  # the script, spelled out: episodes of 3 (term), 4 (trunc), 2 (both) steps
                    assert np.flatnonzero(data["terminated"][a][:, 0]).tolist() == [2, 8, 11]
                    assert np.flatnonzero(data["truncated"][a][:, 0]).tolist() == [6, 8]
                # next values: V(final obs) where an episode ended (the marker obs, not the reset one)
                assert (exp["final"][ended][:, 2] > scripted_env.FINAL_MARKER).all()
                next_obs = np.where(ended[..., None], exp["final"], raw_next)
                expected_next = value_of(model, normalize_obs(next_obs, obs_rms, cfg.obs_clip))
                np.testing.assert_allclose(data["next_values"][a], expected_next, rtol=1e-5, atol=1e-5)
                reset_values = value_of(model, normalize_obs(raw_next, obs_rms, cfg.obs_clip))
                assert not np.isclose(
                    data["next_values"][a][exp["truncated"]], reset_values[exp["truncated"]], atol=1e-4
                ).any()
                # GAE on the recorded data, rewards scaled with the frozen return statistics
                scaled = scale_reward(data["rewards"][a], ret_rms, cfg.reward_clip)
                adv, ret = compute_gae(
                    torch.from_numpy(scaled),
                    torch.from_numpy(data["values"][a]),
                    torch.from_numpy(expected_next),
                    torch.from_numpy(exp["terminated"]),
                    torch.from_numpy(exp["truncated"]),
                    cfg.gamma,
                    cfg.gae_lambda,
                )
                np.testing.assert_allclose(data["advantages"][a], adv.numpy(), rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(data["returns"][a], ret.numpy(), rtol=1e-5, atol=1e-5)
                term = exp["terminated"]  # no bootstrap and no leak from the next episode
                np.testing.assert_allclose(
                    data["advantages"][a][term], (scaled - data["values"][a])[term], rtol=1e-5, atol=1e-5
                )
                trunc_only = exp["truncated"] & ~term
                np.testing.assert_allclose(
                    data["advantages"][a][trunc_only],
                    (scaled + cfg.gamma * expected_next - data["values"][a])[trunc_only],
                    rtol=1e-5,
                    atol=1e-5,
                )
                # the report: this round's episodes and increments only
                rep = reports[a]
                assert merge_rms_states(rep.obs_moments).count == T * E  # every step of every env, once
                ep_returns, ep_lengths = [], []
                for t, e in zip(*np.nonzero(ended)):
                    g = r * T + t
                    starts = np.flatnonzero(scripts[a, e]["terminated"][:g] | scripts[a, e]["truncated"][:g])
                    start = starts[-1] + 1 if starts.size else 0
                    ep_returns.append(scripts[a, e]["rewards"][start : g + 1].sum())
                    ep_lengths.append(g + 1 - start)
                assert len(rep.episode_returns) == len(ep_returns) == int(ended.sum())
                np.testing.assert_allclose(rep.episode_returns, ep_returns, rtol=1e-12)
                assert rep.episode_lengths == ep_lengths
                assert sum(rep.episode_returns) == pytest.approx(sum(ep_returns))
                want = compute_batch_moments(exp["obs"].reshape(T * E, 3))
                np.testing.assert_allclose(merge_rms_states(rep.obs_moments).mean, want.mean, rtol=1e-12)
                np.testing.assert_allclose(merge_rms_states(rep.obs_moments).var, want.var, rtol=1e-12)
                assert merge_rms_states(rep.obs_moments).count == T * E
                discounted = np.stack([returns_tracker[a].update(exp["rewards"][t], ended[t]) for t in range(T)])
                want = compute_batch_moments(discounted.reshape(-1))
                np.testing.assert_allclose(
                    [merge_rms_states(rep.return_moments).mean, merge_rms_states(rep.return_moments).var],
                    [want.mean, want.var],
                    rtol=1e-12,
                )
                assert merge_rms_states(rep.return_moments).count == T * E
    assert_released(pool)


# ------------------------------------------------------------------------------------------- MuJoCo rollouts
@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5"])
def test_mujoco_rollout_matches_replay(env_id):
    """Replaying each env with the clipped stored actions reproduces the stored obs, rewards and flags: the
    env saw exactly clip(policy_action); logp/values match the model; obs increments are the raw obs moments."""
    probe = make_env(env_id)
    obs_dim, act_dim = probe.observation_space.shape[0], probe.action_space.shape[0]
    low, high = probe.action_space.low, probe.action_space.high
    probe.close()
    cfg = make_cfg(env_id, rollout_length=48, normalize_obs=True, normalize_reward=True)
    T, E, A = cfg.rollout_length, cfg.envs_per_actor, cfg.actors_per_gpu
    replays = {}
    for a in range(A):
        for e in range(E):
            env = make_env(env_id)
            obs, _ = env.reset(seed=env_seed(cfg.seed, 0, a * cfg.envs_per_actor + e))
            replays[a, e] = [env, obs.copy()]
    obs_rms = ret_rms = None
    outside = 0
    with ActorPool(cfg, rank=0, num_actors=A, obs_dim=obs_dim, act_dim=act_dim, pin_memory=False) as pool:
        for r in range(2):
            model = make_model(cfg, obs_dim, act_dim, seed=10 + r)
            reports = pool.collect(model, obs_rms, ret_rms)
            data = snapshot(pool)
            assert_fully_written(data)
            for a in range(A):
                check_policy_outputs(model, data, a)
                raw = np.zeros((T, E, obs_dim))
                for e in range(E):
                    env, obs = replays[a, e]
                    for t in range(T):
                        raw[t, e] = obs
                        np.testing.assert_array_equal(
                            data["obs"][a, t, e],
                            normalize_obs(obs, obs_rms, cfg.obs_clip),
                            err_msg=f"round {r} actor {a} env {e} step {t}: obs",
                        )
                        action = data["actions"][a, t, e]
                        outside += int(((action < low) | (action > high)).any())
                        obs, reward, term, trunc, _ = env.step(np.clip(action, low, high))
                        assert np.float32(reward) == data["rewards"][a, t, e], (
                            f"round {r} actor {a} env {e} step {t}: reward"
                        )
                        assert (term, trunc) == (bool(data["terminated"][a, t, e]), bool(data["truncated"][a, t, e]))
                        if term or trunc:
                            obs, _ = env.reset()
                        obs = obs.copy()
                    replays[a, e][1] = obs
                want = compute_batch_moments(raw.reshape(T * E, obs_dim))
                np.testing.assert_allclose(
                    merge_rms_states(reports[a].obs_moments).mean, want.mean, rtol=1e-9, atol=1e-12
                )
                np.testing.assert_allclose(
                    merge_rms_states(reports[a].obs_moments).var, want.var, rtol=1e-9, atol=1e-12
                )
                assert merge_rms_states(reports[a].obs_moments).count == T * E
            obs_rms = merge_rms_states([obs_rms] + [m for rep in reports for m in rep.obs_moments])
            ret_rms = merge_rms_states([ret_rms] + [m for rep in reports for m in rep.return_moments])
    assert outside > 0, "no sampled action left the bounds: the clipping check proved nothing"
    if env_id == "Hopper-v5":
        assert any(rep.episode_returns for rep in reports), "no episode ended: resets untested"
    for env, _ in replays.values():
        env.close()
    assert_released(pool)


def test_next_observations_let_the_learner_recompute_the_actors_advantages():
    """cfg.recompute_advantages: the actors keep each step's next observation (the final one where an episode
    ended, the next round's first after the last step), and the learner's GAE with the same critic, rewards
    scaled with the round's frozen statistics, is the actors' own, row for row."""
    cfg = make_cfg(SCRIPTED, recompute_advantages=True, gamma=0.9, gae_lambda=0.8)
    T, E, A = cfg.rollout_length, cfg.envs_per_actor, cfg.actors_per_gpu
    scripts = scripts_of(cfg)
    with ActorPool(cfg, rank=0, num_actors=A, obs_dim=3, act_dim=2, pin_memory=False) as pool:
        for r, (obs_rms, ret_rms) in enumerate(SCRIPTED_ROUND_STATS):
            model = make_model(cfg, 3, 2, seed=r)
            pool.collect(model, obs_rms, ret_rms)
            next_obs = pool.buffers.arrays["next_obs"]
            assert np.isfinite(next_obs).all()
            window = slice(r * T, (r + 1) * T)
            for a in range(A):
                exp = {
                    k: np.stack([scripts[a, e][k][window] for e in range(E)], axis=1)
                    for k in ("final", "terminated", "truncated")
                }
                raw_next = np.stack([scripts[a, e]["obs"][r * T + 1 : (r + 1) * T + 1] for e in range(E)], axis=1)
                ended = (exp["terminated"] | exp["truncated"])[..., None]
                assert ended.any()
                want = normalize_obs(np.where(ended, exp["final"], raw_next), obs_rms, cfg.obs_clip)
                np.testing.assert_array_equal(next_obs[a], want)
            batch = RolloutBatch.from_buffers(pool.buffers, torch.device("cpu"), cfg.reward_clip)
            advantages, returns = recompute_advantages(model, batch, cfg, None)
            torch.testing.assert_close(advantages, batch.advantages, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(returns, batch.returns, rtol=1e-5, atol=1e-5)
    assert_released(pool)


def test_reproducible_across_pools_and_start_methods():
    """Same seed and weights → bit-identical rollouts (forkserver vs spawn); another seed → other data."""
    results = []
    for seed, method in ((5, "forkserver"), (5, "spawn"), (6, "forkserver")):
        cfg = make_cfg("HalfCheetah-v5", seed=seed, mp_start_method=method, rollout_length=16)
        model = make_model(cfg, 17, 6, seed=0)
        with ActorPool(cfg, rank=1, num_actors=2, obs_dim=17, act_dim=6, pin_memory=False) as pool:
            first = pool.collect(model, None, None)
            stats = merge_rms_states(m for rep in first for m in rep.obs_moments)
            reports = pool.collect(model, stats, merge_rms_states(m for rep in first for m in rep.return_moments))
            results.append((snapshot(pool), reports))
        assert_released(pool)
    (a, rep_a), (b, rep_b), (c, _) = results
    for name in ROLLOUT_FIELDS:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    for x, y in zip(rep_a, rep_b):
        np.testing.assert_array_equal(merge_rms_states(x.obs_moments).mean, merge_rms_states(y.obs_moments).mean)
        np.testing.assert_array_equal(merge_rms_states(x.obs_moments).var, merge_rms_states(y.obs_moments).var)
        assert (merge_rms_states(x.return_moments).mean, merge_rms_states(x.return_moments).var) == (
            merge_rms_states(y.return_moments).mean,
            merge_rms_states(y.return_moments).var,
        )
        assert (x.episode_returns, x.episode_lengths) == (y.episode_returns, y.episode_lengths)
    assert not np.array_equal(a["obs"], c["obs"]) and not np.array_equal(a["actions"], c["actions"])
    assert not np.array_equal(a["actions"][0], a["actions"][1]), "actors must draw different noise"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_rollout_with_cuda_model():
    cfg = make_cfg(SCRIPTED)
    model = make_model(cfg, 3, 2, seed=0).cuda()
    with ActorPool(cfg, rank=0, num_actors=2, obs_dim=3, act_dim=2, pin_memory=True) as pool:
        assert pool.buffers.obs.is_pinned() and pool.buffers.advantages.is_pinned()
        pool.collect(model, None, None)
        on_gpu = pool.buffers.advantages.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(on_gpu.cpu(), pool.buffers.advantages)
        check_policy_outputs(model.cpu(), snapshot(pool), 0)
    assert_released(pool)
