"""The run's checkpoints: where a run resumes from, when it saves, and what a checkpoint holds.

`RunState` is what the run has done (round, global step, statistics, best return, recent returns), the same on
every rank; `rank_state` is what only one rank knows (its parameters between weight averages, Adam moments,
generators, its actors' noise). A checkpoint holds the run state, every rank's state, and at its top level the
ranks' mean policy with the observation statistics, which is what `evaluate` reads (format in
docs/design.md, "the checkpoint").

The `Checkpointer` decides: the latest checkpoint every save_interval rounds and at the end, the best one
when the mean return of the last RETURN_WINDOW episodes improves, and a latest one at a stop unless the
round was just saved. Writing is rank 0's own work; gathering the ranks' states is a collective that every
rank joins on the same decision.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

from ppo_ddp.algorithm.learner import Learner
from ppo_ddp.configuration.config import Config, config_to_dict
from ppo_ddp.distributed import collectives as C
from ppo_ddp.distributed import process_group as D
from ppo_ddp.distributed.agreement import Agreement
from ppo_ddp.envs.make import make_env
from ppo_ddp.envs.state import capturable
from ppo_ddp.errors import CheckpointError
from ppo_ddp.records.run_state import RunState, rank_state
from ppo_ddp.sampling.split import join
from ppo_ddp.storage.checkpoint import as_arrays, check_compatible, load_checkpoint, mean_policy, save_checkpoint

UNCAPTURABLE = "its envs' state cannot be captured (not a MuJoCo env, or in a wrapper ppo_ddp does not know)"
"""Why such a run's resume starts new episodes (ppo_ddp/envs/state.py)."""


class Checkpointer:
    """The checkpoints of one run: `model_NAME.pt` (latest) and `model_NAME_best.pt` in its folder."""

    def __init__(
        self, cfg: Config, ctx: D.DistContext, run_dir: Path, run_name: str, shapes: tuple[int, int, int]
    ) -> None:
        """shapes: (obs_dim, act_dim, critic_dim) of the run's network."""
        self.cfg, self.ctx, self.run_name = cfg, ctx, run_name
        self.obs_dim, self.act_dim, self.critic_dim = shapes
        self.latest, self.best = checkpoint_paths(run_dir, run_name)
        self.last_good: Optional[int] = None
        """The round of the latest checkpoint of this run known to be on disk (rank 0's knowledge)."""
        self.saved_round = 0
        """The round the latest checkpoint holds; the same number on every rank."""
        self._gathered: Optional[tuple[int, Any]] = None  # (round, rank states) of the round's gather

    def kept(self) -> Optional[str]:
        """The checkpoint a failed run leaves, for its error line."""
        return None if self.last_good is None else f"{self.latest}, round {self.last_good}"

    # ---- resume ---------------------------------------------------------------------------------------------
    def resume_path(self, restarted: bool) -> Optional[Path]:
        """The checkpoint to continue from: the run's latest after a torchelastic restart, else --resume."""
        if restarted and self.latest.is_file():
            return self.latest
        if self.cfg.resume is None:
            return None
        if self.cfg.resume == "auto":  # validate() made sure run_name is set
            return self.latest if self.latest.is_file() else None
        return Path(self.cfg.resume)

    def load(self, path: Path, model: torch.nn.Module) -> dict[str, Any]:
        """Read and check a checkpoint to resume (rank 0, which then broadcasts it). Evaluations finish after the
        round they evaluate was saved, so the best evaluation so far is the larger of the checkpoint's and the one
        this run's best checkpoint records."""
        state = load_checkpoint(path)
        check_compatible(state, self.cfg, model, self.obs_dim, self.act_dim, path)
        if self.best.is_file() and Path(path) != self.best:
            try:
                best = load_checkpoint(self.best).get("best_eval_return", -math.inf)
            except CheckpointError:  # a damaged best file must not stop a resume from the latest
                best = -math.inf
            state["best_eval_return"] = max(float(state.get("best_eval_return", -math.inf)), float(best))
        return state

    @functools.cached_property
    def envs_capturable(self) -> bool:
        """Whether the run's envs' state can be captured (ppo_ddp/envs/state.py), checked once on a probe env."""
        probe = make_env(self.cfg.env_id, **self.cfg.env_kwargs)
        try:
            return capturable(probe)
        finally:
            probe.close()

    def resume(
        self, agreement: Agreement, run: RunState, learner: Learner, actors: int, restarted: bool
    ) -> tuple[Optional[Path], list[str]]:
        """Every rank: restore the checkpoint to continue from, if any; rank 0 reads it and hands it to the others
        (one read; nodes need not share a disk). Returns its path (None: a fresh start) and notes for the user."""
        ctx = self.ctx
        state, path = None, None
        if ctx.is_main:
            path = agreement.own_work(self.resume_path, restarted)
            if path is not None:
                state = agreement.own_work(self.load, path, learner.model)
        agreement.settle()
        if ctx.world_size > 1:
            state, path = C.broadcast_object(ctx, (state, path))
        notes: list[str] = []
        if ctx.is_main and not self.envs_capturable and state is None:
            notes.append(f"{self.cfg.env_id}: {UNCAPTURABLE}, so a resume of this run will start new episodes")
        if state is not None:
            try:
                self.restore(state, path, run, learner, actors, notes)
            except Exception as e:
                agreement.fail(CheckpointError(f"checkpoint {path}: cannot be restored: {type(e).__name__}: {e}"))
            if Path(path) == self.latest:
                self.last_good = run.iteration
        return path, notes

    def restore(
        self, state: dict[str, Any], path: Path, run: RunState, learner: Learner, actors: int, notes: list[str]
    ) -> None:
        """The run state and this rank's own state from a checkpoint; notes collects what the user should read."""
        mine = _restore_rank(state, self.ctx, learner, notes)
        envs = actors * self.cfg.envs_per_actor
        run.envs_carried = _carried(mine, envs, self.envs_capturable, notes if self.ctx.is_main else [])
        run.behaviour_weights = mine.get("behaviour_weights") if mine is not None else None
        run.load_state_dict(state)
        if not self.cfg.adaptive_lr:
            run.learning_rate = None  # a later resume with adaptive_lr starts from learning_rate, not a stale rate
        elif run.learning_rate is not None and self.ctx.is_main:
            notes.append(f"adaptive learning rate: continuing at the checkpoint's {run.learning_rate:g}")
        self.saved_round = run.iteration

    # ---- saving ---------------------------------------------------------------------------------------------
    def after_round(
        self, learner: Learner, run: RunState, num_iterations: int, improved: bool, own_work: Callable[..., Any]
    ) -> None:
        """Every rank, after each round: the latest checkpoint every save_interval rounds and at the end, the best
        one when the mean recent return improved (unless evaluations choose it: cfg.eval_interval). own_work runs rank
        0's writes (agreement.own_work)."""
        improved = improved and not self.cfg.eval_interval
        latest = run.iteration % self.cfg.save_interval == 0 or run.iteration == num_iterations
        rank_states = self.gather(latest or improved, learner, run)  # a collective, on every rank alike
        if latest:
            self.saved_round = run.iteration
        if self.ctx.is_main:
            if improved:
                own_work(self.write, self.best, run, rank_states)
            if latest:
                own_work(self.write, self.latest, run, rank_states)

    def gather(self, needed: bool, learner: Learner, run: RunState) -> Optional[list[dict[str, Any]]]:
        """Collective when needed (the same decision on every rank): every rank's state, on rank 0. Once a round:
        the states do not change after the round's update, so a round that saves and evaluates (or a stop after a
        saved round's evaluation) gathers them once; a round that needs none frees the last one's."""
        if not needed:
            self._gathered = None
            return None
        if self._gathered is None or self._gathered[0] != run.iteration:
            self._gathered = (run.iteration, C.gather_to_main(self.ctx, rank_state(self.ctx, learner, run)))
        return self._gathered[1]

    def write(
        self, path: Path, run: RunState, rank_states: list[dict[str, Any]], evaluation: Optional[dict] = None
    ) -> None:
        """Rank 0: the checkpoint of the round run.iteration, atomically; `evaluation`: what its policy scored when
        the best checkpoint is chosen by evaluation."""
        own = rank_states[0]  # the top level: the ranks' mean policy, rank 0's optimizer and generators
        save_checkpoint(
            path,
            {
                "actor": mean_policy([r["actor"] for r in rank_states]),
                **run.state_dict(self.cfg.normalize_obs),
                "optimizer": own["optimizer"],
                "generator": own["generator"],
                "torch_rng_state": own["torch_rng_state"],
                "rank_states": rank_states,
                "config": config_to_dict(self.cfg),
                "env_id": self.cfg.env_id,
                "obs_dim": self.obs_dim,
                "act_dim": self.act_dim,
                "critic_dim": self.critic_dim,
                "world_size": self.ctx.world_size,
                "run_name": self.run_name,
                "evaluation": evaluation,
            },
        )
        if path == self.latest:
            self.last_good = run.iteration

    def save_at_stop(self, learner: Learner, run: RunState) -> None:
        """A stop keeps every finished round: the latest checkpoint, unless that round is saved already."""
        if run.iteration > self.saved_round:  # the same decision on every rank: all join the gather
            states = self.gather(True, learner, run)
            if self.ctx.is_main:
                self.write(self.latest, run, states)


def checkpoint_paths(run_dir: Path, run_name: str) -> tuple[Path, Path]:
    return run_dir / f"model_{run_name}.pt", run_dir / f"model_{run_name}_best.pt"


def find_elastic_run(runs_dir: Path, run_id: str) -> Optional[str]:
    """The run that an earlier attempt of this torchelastic group started (config.yaml records the id)."""
    found: list[tuple[float, str]] = []
    for path in runs_dir.glob("*/config.yaml"):
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and doc.get("torchelastic_run_id") == run_id and doc.get("run_name"):
            found.append((path.stat().st_mtime, str(doc["run_name"])))
    return max(found)[1] if found else None


def run_name(cfg: Config, is_main: bool, restart_count: int, elastic_id: Optional[str]) -> Optional[str]:
    """The run's name when it has one already: the configured one, or, for a group that torchelastic restarted
    (--max-restarts), the run its first attempt started, which it continues from its latest checkpoint (rank 0
    looks it up by the rendezvous id the first attempt recorded in config.yaml). None: a new run, named by rank 0."""
    if cfg.run_name is None and is_main and restart_count > 0 and elastic_id:
        return find_elastic_run(Path(cfg.runs_dir), elastic_id)
    return cfg.run_name


def elastic_restart() -> tuple[int, Optional[str]]:
    """(restart count, rendezvous id) of a torchelastic group; (0, None) outside torchrun."""
    if not D.under_torchrun():
        return 0, None
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), os.environ.get("TORCHELASTIC_RUN_ID")


def _carried(mine: Optional[dict[str, Any]], envs: int, envs_capturable: bool, notes: list[str]) -> Optional[dict]:
    """This rank's envs' carried state (ppo_ddp/sampling/split.py) from a checkpoint where it holds the run's number
    of envs, however they were split over actors; otherwise None, and the note that the envs start new episodes (the
    run goes on, no longer the run it would have been). A checkpoint from before splits mattered not holds its
    actors' states one by one, in actor order: joined, they are its envs'."""
    if mine is None:  # another world size: _restore_rank's note says so
        return None
    carried = mine.get("envs_carried")
    if carried is None and mine.get("actors_carried") is not None:
        carried = join(as_arrays(mine["actors_carried"]))
    if carried is not None and len(carried["observations"]) == envs:
        return as_arrays(carried)
    if not envs_capturable:
        why = UNCAPTURABLE
    elif carried is None:
        why = "the checkpoint holds no env state (it was written before exact resume)"
    else:
        why = f"the checkpoint holds {len(carried['observations'])} envs a rank, this run {envs}"
    notes.append(f"the envs start new episodes: {why}")
    return None


def _restore_rank(
    state: dict[str, Any], ctx: D.DistContext, learner: Learner, notes: list[str]
) -> Optional[dict[str, Any]]:
    """Load the model, optimizer and RNG of this rank from a checkpoint; returns this rank's own state in it (its
    actors' noise, the weights of its round in flight), None when the checkpoint has none for it.

    A checkpoint of the same world size holds every rank's own state (rank_states); another world size
    gives every rank rank 0's optimizer and generator, and fresh actor noise. With sync_mode "gradients" every rank
    loads the checkpoint's top-level policy and optimizer.
    """
    cfg = learner.cfg
    ranks = state.get("rank_states")
    mine = ranks[ctx.rank] if ranks and len(ranks) == ctx.world_size else None
    if mine is None and ctx.is_main and state.get("world_size") != ctx.world_size:
        notes.append(
            f"the checkpoint was written by {state.get('world_size')} rank(s), this run has {ctx.world_size}: "
            f"every rank starts from rank 0's parameters and Adam moments, the actors from fresh noise and new episodes"
        )
    source = mine or state
    # Ranks that step together (sync_mode "gradients") must start identical, whatever mode wrote the checkpoint:
    # its policy and rank 0's Adam moments on every rank (of a gradients run they are every rank's own anyway).
    # Generators and actor noise stay each rank's own.
    weights = state if cfg.sync_mode == "gradients" else source
    learner.model.load_state_dict(weights["actor"])
    learner.optimizer.load_state_dict(weights["optimizer"])
    # The optimizer state carries the rate it last used; the command line's wins (with anneal_lr or adaptive_lr
    # the next round sets the schedule's: the adapted rate is in the run state).
    saved_lr = learner.learning_rate
    learner.set_learning_rate(cfg.learning_rate)
    if not (cfg.anneal_lr or cfg.adaptive_lr) and saved_lr != cfg.learning_rate and ctx.is_main:
        notes.append(f"learning_rate {cfg.learning_rate:g} (this run's) replaces the checkpoint's {saved_lr:g}")
    try:
        learner.generator.set_state(source["generator"])
        if mine is not None:
            torch.set_rng_state(mine["torch_rng_state"])
            if ctx.device.type == "cuda" and mine.get("cuda_rng_state") is not None:
                torch.cuda.set_rng_state(mine["cuda_rng_state"], ctx.device)
        elif state.get("torch_rng_state") is not None:
            torch.set_rng_state(state["torch_rng_state"])
    except RuntimeError:  # a CUDA generator's state on a CPU learner or the reverse: shapes differ
        if ctx.is_main:
            notes.append("the checkpoint's random generator states are of another device: reseeded from --seed")
    return mine
