"""When a learner's actors collect: the schedule of its rounds, sync or overlapped (docs/design.md, "overlapped
rounds").

The trainer asks for the same two steps whatever the schedule: `take(k)`, round k's rollout, and `start_next(k)`,
once round k's statistics are merged. Only when a round starts differs:

- sync (the default): round k starts in take(k), with what the learner holds then (the weights of round k-1's
  update, the statistics merged after round k-1), and take waits for it; the actors then idle while the learner
  updates. start_next does nothing.
- overlapped (cfg.overlap): round k+1 starts in start_next(k), before round k's update, with the weights of round
  k-1 and the statistics merged after round k, into the other rollout slot; the learner updates on round k while
  the actors collect k+1, and take(k+1) waits only for what the update did not hide.

Either way each rollout is collected with one published state (flat weights, frozen statistics) whose weights are
kept with it (`Rollout.weights`), and `run.behaviour_weights` holds those of the round in flight, which a checkpoint
keeps so that a resumed overlapped run collects its next round with them again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Optional

import torch

from ppo_ddp.configuration.config import Config
from ppo_ddp.models.normalization import Moments
from ppo_ddp.records.run_state import RunState
from ppo_ddp.sampling.pool import ActorPool, Rollout
from ppo_ddp.storage.batch import RolloutBatch

Publication = tuple[torch.Tensor, Optional[Moments], Optional[Moments], Optional[Moments], Optional[Moments]]
"""(flat weights, obs_rms, ret_rms, value_rms, critic_rms): what a round's actors act with; the statistics None
where unused."""


class Rounds:
    """The rounds of one learner's actor pool, sync or overlapped (cfg.overlap)."""

    def __init__(
        self,
        cfg: Config,
        pool: ActorPool,
        device: torch.device,
        last_round: int,
        publish: Callable[[], Publication],
        run: RunState,
    ) -> None:
        """publish: the learner's current state, read when a round starts. run: the RunState whose
        behaviour_weights this keeps (a resumed overlapped run's first round acts with the checkpoint's)."""
        self.cfg, self.pool, self.device, self.last_round = cfg, pool, device, last_round
        self.publish, self.run = publish, run
        self.in_flight: Optional[tuple[int, torch.Tensor]] = None  # (round, its weights) the actors are on
        self.resumed_weights = run.behaviour_weights if cfg.overlap else None

    def take(self, k: int) -> Rollout:
        """Round k's rollout: started now unless it is already in flight, then waited for."""
        start = time.time()
        if self.in_flight is None:
            self._start(k)
        round_k, weights = self.in_flight
        if round_k != k:
            raise RuntimeError(f"round {round_k} is in flight, round {k} was asked for")
        reports, buffers = self.pool.finish()
        self.in_flight = None
        batch = RolloutBatch.from_buffers(buffers, self.device, self.cfg.reward_clip)
        return Rollout(reports, batch, time.time() - start, buffers, weights)

    def start_next(self, k: int) -> None:
        """Round k's statistics are merged: overlapped, round k+1 starts now (unless k is the last round)."""
        if self.cfg.overlap and k < self.last_round:
            self._start(k + 1)

    def _start(self, k: int) -> None:
        weights, *statistics = self.publish()
        if self.resumed_weights is not None:  # the round a stopped overlapped run had in flight, as it was
            weights, self.resumed_weights = self.resumed_weights.to(weights.device), None
        weights = weights.detach().clone()
        self.pool.start(weights, *statistics)
        self.in_flight = (k, weights)
        if self.cfg.overlap:
            self.run.behaviour_weights = weights
