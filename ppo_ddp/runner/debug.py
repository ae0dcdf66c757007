"""The tests' view of a run: every rank writes what it saw in each round, when PPO_DDP_DEBUG_DIR names a folder.

The trainer calls `RoundRecorder.record` in one line after each round's weight averaging (and after round 0,
which seeds the statistics); tests compare ranks, recompute statistics from the data the actors wrote, and
find the processes to signal (`pid`, `actor_pids`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol

import torch

from ppo_ddp.models.normalization import Moments
from ppo_ddp.records.run_state import rank_state

if TYPE_CHECKING:
    from ppo_ddp.algorithm.learner import Learner
    from ppo_ddp.distributed.process_group import DistContext
    from ppo_ddp.records.run_state import RunState
    from ppo_ddp.sampling.pool import ActorPool, Rollout

DEBUG_DIR_ENV = "PPO_DDP_DEBUG_DIR"


class RecordedRank(Protocol):
    """What the recorder reads of a rank: the trainer is one (and imports this module, so it is named by what it
    has, not by its class)."""

    ctx: DistContext
    pool: ActorPool
    run: RunState
    learner: Learner
    model: torch.nn.Module


class RoundRecorder:
    def __init__(self, out: Path) -> None:
        self.out = out

    @staticmethod
    def from_env() -> Optional[RoundRecorder]:
        folder = os.environ.get(DEBUG_DIR_ENV)
        return RoundRecorder(Path(folder)) if folder else None

    def record(
        self,
        trainer: RecordedRank,
        iteration: int,
        metrics: dict[str, float],
        frozen_obs_rms: Optional[Moments],
        adv_stats: Optional[tuple[float, float]],
        rollout: Rollout,
    ) -> None:
        """This rank's view of the round (`rank{R}_iter{K}.pt`)."""
        ctx, pool, run, buffers, reports = trainer.ctx, trainer.pool, trainer.run, rollout.buffers, rollout.reports
        own = rank_state(ctx, trainer.learner, run)
        self.out.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "params": torch.cat([p.detach().cpu().reshape(-1) for p in trainer.model.parameters()]),
                "metrics": metrics,
                "obs_rms": run.obs_rms.to_state() if run.obs_rms else None,
                "frozen_obs_rms": frozen_obs_rms.to_state() if frozen_obs_rms else None,
                "behaviour_params": rollout.weights.detach().cpu(),  # the weights the actors acted with
                "obs": buffers.obs.clone(),
                "actions": buffers.actions.clone(),
                "logp": buffers.logp.clone(),
                "advantages": buffers.advantages.clone(),
                "returns": buffers.returns.clone(),
                "values": buffers.values.clone(),
                "value_rms": run.value_rms.to_state() if run.value_rms else None,
                "critic_rms": run.critic_rms.to_state() if run.critic_rms else None,
                "critic_obs": buffers.critic_obs.clone() if buffers.spec.critic_dim else None,
                "learning_rate": trainer.learner.learning_rate,
                "adv_stats": adv_stats,
                "obs_increments": [m.to_state() for r in reports for m in r.obs_moments],
                "rank": ctx.rank,
                "local_rank": ctx.local_rank,
                "world_size": ctx.world_size,
                "node_rank": int(os.environ.get("GROUP_RANK", "0")),
                "pid": os.getpid(),
                "actor_pids": [p for p in pool.pids if p is not None],
                # what a checkpoint of this round must hold for this rank (resume tests compare them)
                "optimizer": own["optimizer"],
                "generator": own["generator"],
            },
            self.out / f"rank{ctx.rank}_iter{iteration}.pt",
        )
