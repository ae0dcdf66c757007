"""What belongs to an env of a round, not to the actor that steps it.

A learner's round has N = actors_per_gpu * envs_per_actor envs; env n is stepped by actor n // envs_per_actor as its
env n % envs_per_actor. Everything random or stateful about an env is keyed by n, so any split of the same N envs over
actors (2x8, 4x4, 1x16, 16x1) makes the same round, bit for bit (docs/design.md, "Splits"):

- its seed (`ppo_ddp.envs.make.env_seed(seed, rank, n)`) and its action noise, a generator of its own each round
  (`noise_rng(seed, rank, n, round_k)`): nothing to carry across rounds, nothing in a checkpoint;
- its state between rounds (the env's, its observation, episode counters, a GRU's memory, reward scaling's running
  return): a checkpoint keeps it per env (`join`), and a run resumed with another split deals it out again (`deal`);
- its statistics (the moments of its observations and returns, merged over envs in index order by the learner) and
  its place in the learner's batch (ppo_ddp/storage/batch.py: rows env by env);
- the policy's forward pass on it: ppo_ddp/models/kernels.py's FixedRows, calls of one row count whatever the split.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

_NOISE_SEED_KEY = 0x6E6F697365  # spawn key that separates the action-noise seeds from env_seed's


def noise_rng(seed: int, rank: int, env: int, round_k: int) -> np.random.Generator:
    """The generator of env `env`'s action noise in round `round_k` (a round's draws start from its key alone, so a
    resumed run needs no generator state), distinct from every env seed."""
    return np.random.default_rng(np.random.SeedSequence([seed, rank, env, round_k], spawn_key=(_NOISE_SEED_KEY,)))


def join(carried: list[dict[str, Any]]) -> dict[str, Any]:
    """The actors' `Actor.carried` (in actor order) as one state of the rank's envs: per-env arrays concatenated in
    env order, the envs' own states one list. `started` is the round's (every actor starts on the first round)."""
    joined: dict[str, Any] = {"started": all(c["started"] for c in carried)}
    for key in carried[0]:
        if key == "started":
            continue
        parts = [c[key] for c in carried]
        if parts[0] is None:
            joined[key] = None
        elif key == "envs":
            joined[key] = [state for part in parts for state in part]
        else:
            joined[key] = np.concatenate([np.asarray(p) for p in parts])
    return joined


def deal(joined: dict[str, Any], actors: int, envs_per_actor: int) -> Optional[list[dict[str, Any]]]:
    """`join`'s state dealt to `actors` actors of `envs_per_actor` envs each; None when it holds another number of
    envs than actors * envs_per_actor."""
    if len(joined["observations"]) != actors * envs_per_actor:
        return None
    dealt = []
    for a in range(actors):
        envs = slice(a * envs_per_actor, (a + 1) * envs_per_actor)
        dealt.append(
            {key: value if key == "started" or value is None else value[envs] for key, value in joined.items()}
        )
    return dealt
