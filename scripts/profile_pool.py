"""Where a large-batch preset's actor pool loses env throughput: the raw env limit taken apart, side by side in one run.

    python scripts/profile_pool.py                                  # ppo_ddp/configs/scale/humanoid.yaml
    python scripts/profile_pool.py --config ppo_ddp/configs/scale/ant.yaml --seconds 8

scripts/bench_scale.py compares training with its limit: one plain env per core stepped with uniform random
actions. A training actor differs from that loop in four ways, and each row here adds one of them, every row
measured with one process per core at once (as the limit is), so that their ratios to the first row say what
each costs:

1. `1 env, uniform actions`: the limit of bench_scale.py.
2. `E envs, uniform actions`: the preset's envs_per_actor envs stepped in turn in each process (working set).
3. `E envs, policy actions`: the same with the actions a fresh policy takes, N(0, 1) clipped to the bounds (the
   state the bodies go through, their contacts, how often they fall and reset).
4. `actor`: ppo_ddp's Actor itself, `Actor.sample` round after round with the preset's config and frozen
   statistics (the policy's forward, normalisation, GAE, the rollout's writes), no learner. Its time is split into
   the env calls (step and reset), the policy's forward, and the rest. Then the actions it took are replayed in
   plain envs seeded as its own: the same states, so the env's own work on them (a policy's states can cost MuJoCo
   more or less per step than uniform actions'), and the actor's rate over that replay is what the actor adds.
5. `pool`: the preset's ActorPool (its actors_per_gpu actors in their own processes) collecting rounds with fixed
   weights, no learner (scripts/bench_rollout.py's measurement): adds the round's start and end, where every
   actor waits for the slowest.

With --train it also runs bench_scale.py's training measurement after the rows (its rollout and its round), then the
pool row again with the policy and statistics that training ended with: the states a learning policy visits cost
the env another amount per step than a fresh policy's, and that row separates it from what the learner adds. With
--cprofile N, one actor then samples rounds in this process under cProfile, and the N functions of most own time are
printed (what of the actor's time is MuJoCo, gymnasium's Python, the policy, the actor's own code). Run it alone on
the machine.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np  # noqa: E402
from bench_rollout import pool_rate, raw_env_rate, side_by_side  # noqa: E402

from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.configuration.loading import parse_config  # noqa: E402
from ppo_ddp.envs.make import make_env  # noqa: E402
from ppo_ddp.runner.launch import learner_config  # noqa: E402
from ppo_ddp.sampling.children import SINGLE_THREAD_ENV  # noqa: E402


class _Timed:
    """The actor's env group's step and reset, or the policy kernel's step, timed and added up under `key`: the
    actor's phases without a profiler's overhead."""

    def __init__(self, target, totals: dict[str, float], key: str) -> None:
        self._target, self._totals, self._key = target, totals, key

    def step(self, *args):
        start = time.perf_counter()
        try:
            return self._target.step(*args)
        finally:
            self._totals[self._key] += time.perf_counter() - start

    def reset(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._target.reset(*args, **kwargs)
        finally:
            self._totals[self._key] += time.perf_counter() - start

    def __len__(self) -> int:
        return len(self._target)

    def __getattr__(self, name: str):  # the rest untimed: close, the kernel's load, the group's capture
        return getattr(self._target, name)


def actor_rate(cfg: Config, seconds: float, seed: int, top: int = 0) -> tuple[float, dict[str, float]]:
    """Env steps per second of one ppo_ddp Actor sampling rounds on its own shared block, and its time split. top > 0:
    then as many rounds again under cProfile, whose `top` functions of most own time are printed."""
    import torch

    from ppo_ddp.models.factory import make_model
    from ppo_ddp.models.flat import num_parameters, write_flat_parameters
    from ppo_ddp.models.normalization import merge_rms_states, value_scale  # noqa: F401  (value_scale: the actor's)
    from ppo_ddp.sampling.actor import Actor
    from ppo_ddp.storage.shared import BufferSpec, SharedBuffers

    torch.set_num_threads(1)  # as actor_main
    probe = make_env(cfg.env_id, **cfg.env_kwargs)
    obs_dim, act_dim = probe.observation_space.shape[0], probe.action_space.shape[0]
    probe.close()
    torch.manual_seed(cfg.seed)
    model = make_model(cfg, obs_dim, act_dim)
    spec = BufferSpec.for_config(cfg, 1, obs_dim, act_dim, num_parameters(model))
    buffers = SharedBuffers.create(spec)
    actor = None
    try:
        write_flat_parameters(model, buffers.weights)
        buffers.write_stats(None, None, None)
        actor = Actor(cfg, seed, 0, buffers)  # rank = seed: each process its own env seeds
        first = actor.sample(0)  # the first reset, and statistics to freeze, as round 0 of a run
        acted = [env_actions(actor)]
        returns = merge_rms_states(first.return_moments) if first.return_moments is not None else None
        buffers.write_stats(merge_rms_states(first.obs_moments), returns, None)
        totals = {"env": 0.0, "policy": 0.0}
        actor.envs = _Timed(actor.envs, totals, "env")
        actor.kernel = _Timed(actor.kernel, totals, "policy")
        steps, rounds, elapsed = 0, 0, 0.0
        while elapsed < seconds:
            start = time.perf_counter()
            actor.sample(rounds + 1)
            elapsed += time.perf_counter() - start
            acted.append(env_actions(actor))
            steps += cfg.rollout_length * cfg.envs_per_actor
            rounds += 1
        split = {k: v / elapsed for k, v in totals.items()}
        split["rest"] = 1.0 - sum(split.values())
        if top:
            profile(actor, rounds, top)
        split[REPLAY] = replay_rate(cfg, seed, acted)
        return steps / elapsed, split
    finally:
        if actor is not None:
            actor.close()
        buffers.close()


REPLAY = "replay"
"""actor_rate's key for the rate of its own actions replayed in plain envs (not a share of its time)."""


def env_actions(actor) -> np.ndarray:
    """The actions the actor's envs got in its last round, [T, E, act_dim] (the stored samples, clipped)."""
    return np.clip(actor.out["actions"], actor.action_low, actor.action_high)


def replay_rate(cfg: Config, rank: int, acted: list[np.ndarray]) -> float:
    """Env steps per second of plain envs seeded as the actor's, stepped with the actions it took: the same states,
    so the same MuJoCo work, without the actor (its first round replayed untimed, as the actor's was)."""
    from ppo_ddp.envs.make import env_seed

    envs = [make_env(cfg.env_id, **cfg.env_kwargs) for _ in range(cfg.envs_per_actor)]
    try:
        for e, env in enumerate(envs):
            env.reset(seed=env_seed(cfg.seed, rank, e))  # actor 0: the envs 0 .. E-1 of its rank
        elapsed = 0.0
        for k, actions in enumerate(acted):
            start = time.perf_counter()
            for row in actions:
                for env, action in zip(envs, row):
                    _, _, terminated, truncated, _ = env.step(action)
                    if terminated or truncated:
                        env.reset()
            elapsed += (time.perf_counter() - start) if k else 0.0
        return sum(a.shape[0] * a.shape[1] for a in acted[1:]) / elapsed
    finally:
        for env in envs:
            env.close()


def profile(actor, rounds: int, top: int) -> None:
    """cProfile of `rounds` more rounds of actor.sample: the functions of most own time (the profiler's own cost per
    Python call inflates them against the env's C code)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for k in range(rounds):
        actor.sample(rounds + 1 + k)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def side_by_side_split(processes: int, fn, *args) -> tuple[float, dict[str, float]]:
    """bench_rollout's side_by_side of fn, which returns a rate or (rate, time split): the summed rate and the mean
    split."""
    results = [r if isinstance(r, tuple) else (r, {}) for r in side_by_side(processes, fn, *args)]
    split: dict[str, float] = {}
    for _, s in results:
        for k, v in s.items():
            split[k] = split.get(k, 0.0) + v / len(results)
    return sum(rate for rate, _ in results), split


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", default="ppo_ddp/configs/scale/humanoid.yaml", help="the preset whose pool is profiled"
    )
    parser.add_argument("--flags", default="", help="train.py flags on top of the preset")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="processes side by side")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds of each row")
    parser.add_argument("--train", action="store_true", help="also bench_scale.py's training rate, as the last row")
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="then one actor in this process under cProfile: its N "
        "functions of most own time (the env's time split from its wrappers', the policy's, the actor's own)",
    )
    args = parser.parse_args(argv)

    flags = shlex.split(args.flags)
    cfg = learner_config(parse_config(["--config", args.config, *flags]))  # the split auto makes here
    E, n = cfg.envs_per_actor, args.cores
    print(f"# {cfg.env_id}, {args.config} {args.flags}; {n} processes side by side, {args.seconds:g} s a row; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    limit, _ = side_by_side_split(n, raw_env_rate, cfg.env_id, args.seconds, 1, "uniform")

    def show(name: str, rate: float, split: dict[str, float]) -> None:
        parts = ", ".join(f"{k} {v:.0%}" for k, v in split.items())
        print(f"{name:<40} {rate:>9,.0f} steps/s  {rate / limit:>6.3f}" + (f"  ({parts})" if parts else ""), flush=True)

    show("1 env, uniform actions (the limit)", limit, {})
    for name, fn, fn_args in (
        (f"{E} envs, uniform actions", raw_env_rate, (cfg.env_id, args.seconds, E, "uniform")),
        (f"{E} envs, policy actions", raw_env_rate, (cfg.env_id, args.seconds, E, "policy")),
        (f"actor ({E} envs, no learner)", actor_rate, (cfg, args.seconds)),
    ):
        rate, split = side_by_side_split(n, fn, *fn_args)
        replayed = split.pop(REPLAY, None)
        show(name, rate, split)
        if replayed is not None:  # the env's work on the actor's own states: what the actor adds is the rest
            show("  its actions replayed in plain envs", replayed * n, {})
            print(f"  the actor at {rate / (replayed * n):.3f} of its replay", flush=True)
    rate, _, _ = pool_rate(cfg, args.seconds)
    show(f"pool ({cfg.actors_per_gpu} actors, no learner)", rate, {})
    if args.train:
        from bench_scale import training_rate

        with tempfile.TemporaryDirectory() as tmp:
            rate, rollout, update, steps = training_rate(args.config, flags, 3, 15, Path(tmp))
            show(f"training ({rollout:.3f} s rollout + {update:.3f} s update)", rate, {})
            show(f"  its rollout alone ({steps} steps in {rollout:.3f} s)", steps / rollout, {})
            trained, _, _ = pool_rate(cfg, args.seconds, Path(tmp) / "bench" / "model_bench.pt")
            show("pool, no learner, the trained policy", trained, {})
    if args.cprofile:
        os.environ.update(SINGLE_THREAD_ENV)  # as in an actor
        print(f"# one actor in this process, alone, under cProfile ({E} envs):", flush=True)
        actor_rate(cfg, args.seconds, 0, args.cprofile)
    again, _ = side_by_side_split(n, raw_env_rate, cfg.env_id, args.seconds, 1, "uniform")
    print(f"the limit again: {again:,.0f} steps/s ({again / limit:.3f} of the first); "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
