"""The training loop: one learner per rank, its actor pool, and the collectives that keep ranks in step.

Read top to bottom, one round (DESIGN.md "One iteration") is: publish weights and frozen statistics →
actors sample → merge statistics over actors and ranks → PPO update → average weights every
param_sync_interval rounds → metrics averaged over ranks → rank 0 logs and saves.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ppo_ddp import distributed as D
from ppo_ddp.actors import ActorPool, ActorReport
from ppo_ddp.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ppo_ddp.config import Config, ConfigError, actors_per_learner, config_to_dict
from ppo_ddp.envs import make_env
from ppo_ddp.learner import Learner, RolloutBatch
from ppo_ddp.model import ActorCritic
from ppo_ddp.normalization import Moments, merge_rms_states
from ppo_ddp.run_log import RunLogger, write_run_config
from ppo_ddp.topology import resolve_training_topology

RETURN_WINDOW = 100
"""Episodes in the rolling mean that decides the best checkpoint (per-round means are too noisy)."""

DEBUG_DIR_ENV = "PPO_DDP_DEBUG_DIR"
"""When set, every rank writes its local parameters, metrics and statistics of each round there (tests use it)."""


def main(cfg: Config) -> None:
    """Entry of train.py: launch the learners (torchrun, or our own elastic launch), then train."""
    if not D.under_torchrun():
        topology = resolve_training_topology(cfg.num_actors, cfg.num_gpus, cfg.actors_per_gpu,
                                             torch.cuda.device_count(), D._mps_available())
        if topology.num_learners > 1:
            launch_learners(topology.num_learners, sys.argv)
            return
        device = "cuda:0" if topology.device == "cuda" else topology.device
    else:
        device = None
    try:
        with D.process_group(device) as ctx:
            train(cfg, ctx)
    except (ConfigError, CheckpointError) as e:  # e.g. a torchrun topology that does not fit this machine, or a checkpoint of another env
        if os.environ.get("LOCAL_RANK", "0") == "0":  # every rank finds the same; one line is enough
            print(f"train.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def launch_learners(num_learners: int, argv: list[str]) -> None:
    """`python train.py` with several learners: start them through torch's elastic launcher, like torchrun.

    argv is train.py's command line (script first); every learner re-runs it under torchrun's environment.
    """
    from torch.distributed.run import main as torchrun

    args = ["--standalone", f"--nproc_per_node={num_learners}", *argv]
    print(f"starting {num_learners} learners: torchrun {' '.join(args)}", flush=True)
    torchrun(args)


def _default_run_name(cfg: Config) -> str:
    return f"{cfg.env_id}__{cfg.seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def checkpoint_paths(run_dir: Path, run_name: str) -> tuple[Path, Path]:
    return run_dir / f"model_{run_name}.pt", run_dir / f"model_{run_name}_best.pt"


def _merge_reports(ctx: D.DistContext, reports: list[ActorReport], field: str, shape: tuple[int, ...]) -> Optional[Moments]:
    """This round's increment over all actors of all ranks: actors → rank → world, each data set once."""
    local = merge_rms_states(getattr(r, field) for r in reports)
    return D.merge_moments_across_ranks(ctx, local, shape)


def train(cfg: Config, ctx: D.DistContext) -> None:
    # Under torchrun the world size is the number of learners asked for; otherwise num_gpus is (and the
    # topology may have granted fewer, each with the same actors).
    requested_learners = ctx.world_size if D.under_torchrun() else cfg.num_gpus
    actors = actors_per_learner(cfg, requested_learners)
    samples_per_rank = actors * cfg.envs_per_actor * cfg.rollout_length
    steps_per_round = ctx.world_size * samples_per_rank
    num_iterations = math.ceil(cfg.total_timesteps / steps_per_round)

    probe = make_env(cfg.env_id)
    obs_shape = probe.observation_space.shape
    obs_dim, act_dim = int(np.prod(obs_shape)), int(np.prod(probe.action_space.shape))
    probe.close()

    if ctx.device.type == "cpu":
        # Mini-batches of a small MLP are too small to split across cores: OpenMP's hand-offs cost more than
        # they save, and badly so when actors or other ranks hold the other cores (measured: 0.9 s with one
        # thread against 4-13 s with two for a default round's update on a busy 2-core machine). torchrun
        # sets OMP_NUM_THREADS=1 for the same reason; `python train.py` gets the same.
        torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    model = ActorCritic(obs_dim, act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init).to(ctx.device)
    D.broadcast_parameters(ctx, model)
    learner = Learner(cfg, model, ctx.device)

    run_name = D.broadcast_object(ctx, cfg.run_name or _default_run_name(cfg))
    run_dir = Path(cfg.runs_dir) / run_name
    latest_path, best_path = checkpoint_paths(run_dir, run_name)
    metrics_path = Path(cfg.metrics_path) if cfg.metrics_path else run_dir / "metrics.csv"

    obs_rms: Optional[Moments] = None
    ret_rms: Optional[Moments] = None
    start_iteration, global_step, best_return = 0, 0, -math.inf
    resume_path = _resume_path(cfg, latest_path)
    if resume_path is not None:
        state = load_checkpoint(resume_path)
        _check_compatible(state, cfg, obs_dim, act_dim, resume_path)
        model.load_state_dict(state["actor"])
        learner.optimizer.load_state_dict(state["optimizer"])
        learner.generator.set_state(state["generator"])
        obs_rms = Moments.from_state(state["obs_rms_state"]) if state["obs_rms_state"] else None
        ret_rms = Moments.from_state(state["return_rms_state"]) if state.get("return_rms_state") else None
        start_iteration, global_step = int(state["iteration"]), int(state["global_step"])
        best_return = float(state["best_return"])

    logger = None
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_run_config(run_dir / "config.yaml", cfg, {
            "run_name": run_name, "world_size": ctx.world_size, "actors_per_learner": actors,
            "steps_per_round": steps_per_round, "num_iterations": num_iterations,
            "resumed_from": str(resume_path) if resume_path else None})
        logger = RunLogger(run_dir, metrics_path, num_iterations * steps_per_round, resume_path is not None, global_step)
        where = f"{ctx.world_size} learner(s) on {ctx.device.type}, {actors} actor(s) x {cfg.envs_per_actor} envs each"
        logger.message(f"{cfg.env_id}: {num_iterations} rounds of {steps_per_round} steps, {where}; outputs in {run_dir}")
        if resume_path is not None:
            logger.message(f"resumed from {resume_path} at round {start_iteration}, step {global_step:,}")

    debug_dir = os.environ.get(DEBUG_DIR_ENV)
    recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
    start_time, start_step = time.time(), global_step

    def checkpoint(iteration: int) -> dict[str, Any]:
        return {
            "actor": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "obs_rms_state": obs_rms.to_state() if (cfg.normalize_obs and obs_rms) else None,
            "return_rms_state": ret_rms.to_state() if ret_rms else None,
            "optimizer": learner.optimizer.state_dict(),
            "generator": learner.generator.get_state(),
            "iteration": iteration, "global_step": global_step, "best_return": best_return,
            "config": config_to_dict(cfg), "env_id": cfg.env_id, "obs_dim": obs_dim, "act_dim": act_dim,
            "world_size": ctx.world_size, "run_name": run_name,
        }

    pin = ctx.device.type == "cuda"
    try:
        with ActorPool(cfg, rank=ctx.rank, num_actors=actors, obs_dim=obs_dim, act_dim=act_dim, pin_memory=pin) as pool:
            for iteration in range(start_iteration + 1, num_iterations + 1):
                if cfg.anneal_lr:
                    learner.set_learning_rate(cfg.learning_rate * (1.0 - (iteration - 1) / num_iterations))

                # 1-3: actors sample with this rank's weights and the statistics frozen for the round.
                t0 = time.time()
                reports = pool.collect(model, obs_rms if cfg.normalize_obs else None,
                                       ret_rms if cfg.normalize_reward else None)
                rollout_seconds = time.time() - t0

                frozen_obs_rms = obs_rms
                # 4: this round's increments over all actors of all ranks, merged into the history once.
                if cfg.normalize_obs:
                    obs_rms = merge_rms_states([obs_rms, _merge_reports(ctx, reports, "obs_moments", obs_shape)])
                if cfg.normalize_reward:
                    ret_rms = merge_rms_states([ret_rms, _merge_reports(ctx, reports, "return_moments", ())])

                # 5: PPO on this rank's rollout, advantages normalised over all ranks.
                t0 = time.time()
                batch = RolloutBatch.from_buffers(pool.buffers, ctx.device)
                local_metrics = learner.train_step(batch, lambda adv: D.global_mean_std(ctx, adv))
                del batch  # on CPU it views the shared buffers that the next round overwrites
                train_seconds = time.time() - t0

                # 6: weight averaging; between sync rounds each rank keeps its own parameters.
                if iteration % cfg.param_sync_interval == 0:
                    D.average_parameters(ctx, model)

                # 7: metrics averaged over ranks; episodes of all actors of all ranks.
                local_metrics.update({"charts/rollout_seconds": rollout_seconds, "charts/train_seconds": train_seconds})
                if debug_dir:
                    _debug_dump(Path(debug_dir), ctx, iteration, model, local_metrics, obs_rms, frozen_obs_rms, pool, reports)
                metrics = D.average_metrics(ctx, local_metrics)
                episodes = [ep for rank_eps in D.gather_objects(ctx, [(ret, length) for r in reports
                            for ret, length in zip(r.episode_returns, r.episode_lengths)]) for ep in rank_eps]
                recent_returns.extend(ret for ret, _ in episodes)
                global_step += steps_per_round
                metrics.update({
                    "charts/episodes": float(len(episodes)),
                    "charts/episodic_return": float(np.mean([e[0] for e in episodes])) if episodes else math.nan,
                    "charts/episodic_length": float(np.mean([e[1] for e in episodes])) if episodes else math.nan,
                    "charts/episodic_return_avg100": float(np.mean(recent_returns)) if recent_returns else math.nan,
                    "charts/SPS": (global_step - start_step) / (time.time() - start_time),
                })
                improved = bool(recent_returns) and metrics["charts/episodic_return_avg100"] > best_return
                if improved:
                    best_return = metrics["charts/episodic_return_avg100"]

                if ctx.is_main:
                    logger.log(iteration, global_step, metrics)
                    if improved:
                        save_checkpoint(best_path, checkpoint(iteration))
                    if iteration % cfg.save_interval == 0 or iteration == num_iterations:
                        save_checkpoint(latest_path, checkpoint(iteration))
        if ctx.is_main:
            logger.message(f"done: {global_step:,} steps in {_elapsed(start_time)}; best mean return "
                           f"{best_return:.1f}; latest checkpoint {latest_path}")
    finally:
        if logger is not None:
            logger.close()


def _elapsed(start: float) -> str:
    seconds = int(time.time() - start)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def _resume_path(cfg: Config, latest_path: Path) -> Optional[Path]:
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":  # validate() made sure run_name is set
        return latest_path if latest_path.is_file() else None
    return Path(cfg.resume)


def _check_compatible(state: dict[str, Any], cfg: Config, obs_dim: int, act_dim: int, path: Path) -> None:
    if state.get("env_id") != cfg.env_id or state.get("obs_dim") != obs_dim or state.get("act_dim") != act_dim:
        raise ConfigError(f"resume={str(path)!r}: checkpoint is for {state.get('env_id')} (obs {state.get('obs_dim')}, "
                         f"act {state.get('act_dim')}), this run is {cfg.env_id} (obs {obs_dim}, act {act_dim})")
    for key in ("optimizer", "generator", "iteration", "global_step", "best_return"):
        if key not in state:
            raise ConfigError(f"resume={str(path)!r}: checkpoint has no {key!r} (a policy-only file cannot resume training)")


def _debug_dump(out: Path, ctx: D.DistContext, iteration: int, model: torch.nn.Module, metrics: dict[str, float],
                obs_rms: Optional[Moments], frozen_obs_rms: Optional[Moments], pool: ActorPool,
                reports: list[ActorReport]) -> None:
    """This rank's view of the round, for tests that compare ranks and recompute statistics from the data."""
    out.mkdir(parents=True, exist_ok=True)
    torch.save({
        "params": torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()]),
        "metrics": metrics,
        "obs_rms": obs_rms.to_state() if obs_rms else None,
        "frozen_obs_rms": frozen_obs_rms.to_state() if frozen_obs_rms else None,
        "obs": pool.buffers.obs.clone(),
        "obs_increments": [r.obs_moments.to_state() for r in reports],
    }, out / f"rank{ctx.rank}_iter{iteration}.pt")
