"""Rollout throughput of the actor pool against the raw speed of the same env, side by side in one run.

    python scripts/bench_rollout.py --env-id HalfCheetah-v5 --seconds 10

1. The limit: one plain `make_env` env stepped in a loop with uniform random actions (drawn in advance, so
   the loop times the env alone), in env steps per second, times os.cpu_count().
2. The pool: `ActorPool.collect` only (no learning, fixed weights, frozen non-trivial statistics so the
   normalisation path runs) for actors_per_gpu in {1, 2} x envs_per_actor in {1, 4, 8, 16}; the rate is the
   env steps of the timed rounds over their wall time (start-up and one warm-up round excluded). `--batch-envs on
   off` runs each shape with MuJoCo's batch stepping (Config.batch_envs, the default) and with gymnasium's step;
   `--distributions gaussian beta tanh_gaussian` each shape with each action distribution (Config.distribution),
   its rate also over the Gaussian's of the same shape (`/gaussian`): what a bounded distribution costs the actors.

Prints a table and, as its last line, `ratio <best pool rate / limit>`. The limit is measured before and
after the pool runs and the larger value is used, so drift of a shared machine cannot flatter the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ppo_ddp.configuration.config import Config
from ppo_ddp.envs.make import make_env
from ppo_ddp.models.factory import make_model
from ppo_ddp.models.normalization import Moments, merge_rms_states
from ppo_ddp.sampling.children import SINGLE_THREAD_ENV
from ppo_ddp.sampling.pool import ActorPool
from ppo_ddp.storage.checkpoint import load_checkpoint


def raw_env_rate(env_id: str, seconds: float, envs: int = 1, actions: str = "uniform", seed: int = 0) -> float:
    """Env steps per second of `envs` plain envs stepped in turn with pre-drawn actions (resets included): the raw
    rate a pool's actors are measured against. actions: "uniform" over the bounds, or "policy", a fresh Gaussian
    policy's (mean ~0, std 1, clipped to the bounds as the actor clips them)."""
    pool = [make_env(env_id) for _ in range(envs)]
    try:
        for e, env in enumerate(pool):
            env.reset(seed=seed * 1000 + e)
        space = pool[0].action_space
        rng = np.random.default_rng(seed)
        if actions == "uniform":
            drawn = rng.uniform(space.low, space.high, size=(256, envs, *space.shape))
        else:
            drawn = np.clip(rng.standard_normal((256, envs, *space.shape)), space.low, space.high)
        drawn = drawn.astype(space.dtype)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() < start + seconds:
            for row in drawn:
                for env, action in zip(pool, row):
                    _, _, terminated, truncated, _ = env.step(action)
                    if terminated or truncated:
                        env.reset()
            steps += drawn.shape[0] * envs
        return steps / (time.perf_counter() - start)
    finally:
        for env in pool:
            env.close()


def side_by_side(processes: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """fn(*args, seed) in `processes` spawned processes at once (seeds 0, 1, ...), started as the pool starts its
    actors, with one thread for the math libraries (numpy's OpenBLAS threads would otherwise compete for the cores):
    their results. The limit of a node is the sum of raw_env_rate's side by side."""
    saved = dict(os.environ)
    os.environ.update(SINGLE_THREAD_ENV)  # inherited by the spawned processes
    try:
        with mp.get_context("spawn").Pool(processes) as pool:
            return pool.starmap(fn, [(*args, seed) for seed in range(processes)])
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def warm_pool(cfg: Config) -> Iterator[tuple[ActorPool, torch.nn.Module, tuple]]:
    """cfg's ActorPool (its actors_per_gpu actors) with a fresh policy for cfg's env, past its start-up and a first
    round: (pool, model, the statistics of that round), which the measurements then keep frozen."""
    probe = make_env(cfg.env_id, **cfg.env_kwargs)
    space = probe.action_space
    obs_dim, act_dim = probe.observation_space.shape[0], space.shape[0]
    probe.close()
    torch.manual_seed(cfg.seed)
    model = make_model(cfg, obs_dim, act_dim, 0, (space.low, space.high))
    with ActorPool(
        cfg, rank=0, num_actors=cfg.actors_per_gpu, obs_dim=obs_dim, act_dim=act_dim, pin_memory=False
    ) as pool:
        reports = pool.collect(model, None, None)
        stats = (  # every env's moments, as the learner merges them
            merge_rms_states(m for r in reports for m in r.obs_moments),
            merge_rms_states(m for r in reports for m in r.return_moments or []),
        )
        yield pool, model, stats


def pool_rate(cfg: Config, seconds: float, checkpoint: Path | None = None) -> tuple[float, int, float]:
    """(env steps per second, rounds, mean round seconds) of collect() alone. The policy is a fresh one with the
    statistics of its warm-up round, or a checkpoint's policy with its statistics (the states a trained policy
    visits, which may cost the env more or less per step)."""
    with warm_pool(cfg) as (pool, model, stats):
        if checkpoint is not None:
            state = load_checkpoint(checkpoint)
            model.load_state_dict(state["actor"])
            stats = tuple(
                Moments.from_state(state[k]) if state.get(k) and getattr(cfg, flag) else None
                for k, flag in (
                    ("obs_rms_state", "normalize_obs"),
                    ("return_rms_state", "normalize_reward"),
                    ("value_rms_state", "normalize_value"),
                )
            )
            pool.collect(model, *stats)  # the envs leave the fresh policy's states
        steps, rounds, elapsed = 0, 0, 0.0
        while elapsed < seconds:
            start = time.perf_counter()
            pool.collect(model, *stats)
            elapsed += time.perf_counter() - start
            steps += cfg.actors_per_gpu * cfg.envs_per_actor * cfg.rollout_length
            rounds += 1
    return steps / elapsed, rounds, elapsed / rounds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per measurement")
    parser.add_argument("--rollout-length", type=int, default=Config.rollout_length)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="actors_per_gpu values")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 4, 8, 16], help="envs_per_actor values")
    parser.add_argument(
        "--batch-envs", nargs="+", choices=["on", "off"], default=["on"], help="Config.batch_envs values, each a row"
    )
    parser.add_argument(
        "--distributions", nargs="+", choices=["gaussian", "beta", "tanh_gaussian"], default=["gaussian"],
        help="Config.distribution values, each a row",
    )  # fmt: skip
    parser.add_argument("--mp-start-method", default=Config.mp_start_method, choices=["forkserver", "spawn"])
    args = parser.parse_args(argv)

    cpus = os.cpu_count() or 1
    probe = make_env(args.env_id)
    obs_dim, act_dim = probe.observation_space.shape[0], probe.action_space.shape[0]
    probe.close()
    print(
        f"# {args.env_id}: obs_dim {obs_dim}, act_dim {act_dim}; {cpus} CPUs; load average {os.getloadavg()[0]:.2f}; "
        f"torch {torch.__version__}; rollout_length {args.rollout_length}; {args.mp_start_method}",
        flush=True,
    )

    before = raw_env_rate(args.env_id, args.seconds)
    print(f"raw env rate (1 env, 1 process): {before:,.0f} steps/s; limit = x{cpus} = {before * cpus:,.0f}", flush=True)

    rows = []
    head = f"{'actors':>6} {'envs':>4} {'batch':>5} {'distribution':>13} {'rounds':>6} {'round s':>8} {'steps/s':>10}"
    print(f"{head} {'/limit':>7} {'/gaussian':>9}")
    for actors in args.actors:
        for envs in args.envs:
            for batch in args.batch_envs:
                gaussian = None
                for distribution in args.distributions:
                    cfg = Config(
                        env_id=args.env_id,
                        actors_per_gpu=actors,
                        envs_per_actor=envs,
                        rollout_length=args.rollout_length,
                        mp_start_method=args.mp_start_method,
                        batch_envs=batch == "on",
                        distribution=distribution,
                    )
                    rate, rounds, round_s = pool_rate(cfg, args.seconds)
                    gaussian = rate if distribution == "gaussian" else gaussian
                    rows.append((actors, envs, batch, rate))
                    versus = f"{rate / gaussian:>9.3f}" if gaussian else f"{'—':>9}"
                    print(
                        f"{actors:>6} {envs:>4} {batch:>5} {distribution:>13} {rounds:>6} {round_s:>8.4f} "
                        f"{rate:>10,.0f} {rate / (before * cpus):>7.3f} {versus}",
                        flush=True,
                    )

    after = raw_env_rate(args.env_id, args.seconds)
    limit = max(before, after) * cpus
    best = max(rows, key=lambda r: r[3])
    print(f"raw env rate again: {after:,.0f} steps/s; limit used = {cpus} x max(before, after) = {limit:,.0f}")
    print(
        f"best: actors_per_gpu {best[0]}, envs_per_actor {best[1]}, batch_envs {best[2]}: {best[3]:,.0f} steps/s; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(f"ratio {best[3] / limit:.3f}")


if __name__ == "__main__":
    main()
