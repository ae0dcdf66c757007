"""What a run has done (`RunState`, the same on every rank) and what only one rank knows (`rank_state`): the two
parts of a checkpoint, which ppo_ddp/records/checkpointer.py decides when to save and how to restore.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from ppo_ddp.algorithm.learner import Learner
from ppo_ddp.distributed import process_group as D
from ppo_ddp.models.normalization import Moments
from ppo_ddp.sampling.split import join
from ppo_ddp.storage.checkpoint import as_tensors

RETURN_WINDOW = 100
"""Episodes in the rolling mean that decides the best checkpoint (per-round means are too noisy)."""


@dataclass
class RunState:
    """What the run has done so far: the same on every rank, and what a checkpoint restores exactly."""

    iteration: int = 0
    """The last round that finished (0 before the first)."""
    global_step: int = 0
    """Env steps over all ranks, round 0 (the statistics' seeding) included."""
    obs_rms: Optional[Moments] = None
    ret_rms: Optional[Moments] = None
    """Discounted-return statistics: the rewards' scale (normalize_reward)."""
    value_rms: Optional[Moments] = None
    """Statistics of the returns the critic learns (normalize_value)."""
    critic_rms: Optional[Moments] = None
    """Statistics of the critic's own observations (critic_obs with normalize_obs)."""
    learning_rate: Optional[float] = None
    """The adapted learning rate of the next round (adaptive_lr; None: the configured schedule's)."""
    best_return: float = -math.inf
    best_eval_return: float = -math.inf
    """The best mean return of an evaluation so far (eval_interval)."""
    recent_returns: deque[float] = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))
    envs_carried: Optional[dict[str, Any]] = None
    """What this rank's envs carry into the next round (ppo_ddp/sampling/split.py's `join` of the actors'
    `Actor.carried`), or None where it cannot be captured: a resumed run's actors continue their episodes from it,
    exactly, however it splits its envs."""
    behaviour_weights: Optional[torch.Tensor] = None
    """Overlapped rounds: the flat weights the round in flight acts with (this rank's; ppo_ddp/runner/rounds.py)."""

    def add_episodes(self, returns: list[float]) -> bool:
        """Count the round's episodes; True when the mean of the last RETURN_WINDOW returns is a new best."""
        self.recent_returns.extend(returns)
        mean = self.mean_recent_return()
        if not self.recent_returns or not mean > self.best_return:
            return False
        self.best_return = mean
        return True

    def take_actor_states(self, reports: list[Any]) -> None:
        """The states the actors' reports of the last round carry, kept for the next checkpoint."""
        carried = [r.carried for r in reports]
        self.envs_carried = join(carried) if all(c is not None for c in carried) else None

    def mean_recent_return(self) -> float:
        return float(np.mean(self.recent_returns)) if self.recent_returns else math.nan

    def state_dict(self, normalize_obs: bool) -> dict[str, Any]:
        return {
            "obs_rms_state": self.obs_rms.to_state() if (normalize_obs and self.obs_rms) else None,
            "return_rms_state": self.ret_rms.to_state() if self.ret_rms else None,
            "value_rms_state": self.value_rms.to_state() if self.value_rms else None,
            "critic_obs_rms_state": self.critic_rms.to_state() if self.critic_rms else None,
            "learning_rate": self.learning_rate,
            "iteration": self.iteration,
            "global_step": self.global_step,
            "best_return": self.best_return,
            "best_eval_return": self.best_eval_return,
            "recent_returns": list(self.recent_returns),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # The statistics exactly as saved: the next round merges its own increment into them once.
        self.obs_rms = Moments.from_state(state["obs_rms_state"]) if state["obs_rms_state"] else None
        self.ret_rms = Moments.from_state(state["return_rms_state"]) if state.get("return_rms_state") else None
        self.value_rms = Moments.from_state(state["value_rms_state"]) if state.get("value_rms_state") else None
        critic = state.get("critic_obs_rms_state")
        self.critic_rms = Moments.from_state(critic) if critic else None
        self.learning_rate = state.get("learning_rate")
        self.iteration, self.global_step = int(state["iteration"]), int(state["global_step"])
        self.best_return = float(state["best_return"])
        self.best_eval_return = float(state.get("best_eval_return", -math.inf))
        self.recent_returns.extend(float(r) for r in state.get("recent_returns", []))


def rank_state(ctx: D.DistContext, learner: Learner, run: RunState) -> dict[str, Any]:
    """What only this rank knows (its own Adam moments, RNG, its envs' state; parameters between syncs)."""
    own = {
        "actor": {k: v.detach().cpu() for k, v in learner.model.state_dict().items()},
        "optimizer": _to_cpu(learner.optimizer.state_dict()),
        "generator": learner.generator.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state(ctx.device) if ctx.device.type == "cuda" else None,
        "envs_carried": as_tensors(run.envs_carried),
    }
    if run.behaviour_weights is not None:  # overlapped rounds: the weights of the round in flight
        own["behaviour_weights"] = run.behaviour_weights.detach().cpu()
    return own


def _to_cpu(obj: Any) -> Any:
    """Tensors of a nested state (e.g. an optimizer's) moved to the CPU, for pickling to another rank."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
