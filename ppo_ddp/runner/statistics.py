"""The run's normalisation statistics between rounds: what a round's actors act with (`published`), the merge of
a round's increments over every actor of every rank into the history (`merge_round`), and whether a run has yet
to seed them (`unseeded`). The math of a merge is ppo_ddp/models/normalization.py's; the one collective is
ppo_ddp/distributed/process_group.py's.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ppo_ddp.configuration.config import Config
from ppo_ddp.distributed import collectives as C
from ppo_ddp.distributed import process_group as D
from ppo_ddp.models.normalization import merge_rms_states, tensor_moments
from ppo_ddp.records.run_state import RunState
from ppo_ddp.runner.rounds import Publication
from ppo_ddp.sampling.pool import Rollout


def published(cfg: Config, run: RunState, weights: torch.Tensor) -> Publication:
    """What a round starting now acts with: the weights and the statistics merged so far (None where unused)."""
    return (
        weights,
        run.obs_rms if cfg.normalize_obs else None,
        run.ret_rms if cfg.normalize_reward else None,
        run.value_rms if cfg.normalize_value else None,
        run.critic_rms if cfg.normalize_obs and cfg.critic_obs is not None else None,
    )


def unseeded(cfg: Config, run: RunState) -> bool:
    """Whether a statistic the run normalises with has no data yet (a fresh start: round 0 seeds them)."""
    return (
        (cfg.normalize_obs and run.obs_rms is None)
        or (cfg.normalize_obs and cfg.critic_obs is not None and run.critic_rms is None)
        or (cfg.normalize_reward and run.ret_rms is None)
        or (cfg.normalize_value and run.value_rms is None)
    )


def merge_round(
    ctx: D.DistContext, cfg: Config, run: RunState, rollout: Rollout, shapes: tuple[tuple[int, ...], ...]
) -> Optional[tuple[float, float]]:
    """Merge this round's increments over all actors of all ranks into the run's history, once (one
    collective); returns the (mean, unbiased std) of all ranks' advantages for their normalisation, or None.
    shapes: those of the policy's and the critic's observations."""
    reports, critic = rollout.reports, cfg.normalize_obs and cfg.critic_obs is not None
    # non-finite advantages are not checked here: the update that follows reports them, with round and rank
    obs_inc, ret_inc, value_inc, critic_inc, adv_moments = C.merge_moments_across_ranks(
        ctx,
        [
            # each env's moments in index order (actors report theirs in order): the same whatever the split
            merge_rms_states(m for r in reports for m in r.obs_moments) if cfg.normalize_obs else None,
            merge_rms_states(m for r in reports for m in r.return_moments) if cfg.normalize_reward else None,
            tensor_moments(rollout.batch.returns) if cfg.normalize_value else None,
            merge_rms_states(m for r in reports for m in r.critic_moments) if critic else None,
            # recomputed advantages are normalised by each rank at each epoch (Learner._targets)
            tensor_moments(rollout.batch.advantages) if cfg.norm_adv and not cfg.recompute_advantages else None,
        ],
        [shapes[0], (), (), shapes[1], ()],
    )
    if cfg.normalize_obs:
        run.obs_rms = merge_rms_states([run.obs_rms, obs_inc])
    if critic:
        run.critic_rms = merge_rms_states([run.critic_rms, critic_inc])
    if cfg.normalize_reward:
        run.ret_rms = merge_rms_states([run.ret_rms, ret_inc])
    if cfg.normalize_value:  # the critic of this round's update learns returns standardised with these
        run.value_rms = merge_rms_states([run.value_rms, value_inc])
    if adv_moments is None:
        return None
    n = adv_moments.count
    return float(adv_moments.mean), math.sqrt(float(adv_moments.var) * n / max(n - 1, 1))
