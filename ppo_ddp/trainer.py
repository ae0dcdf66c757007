"""The training loop: one learner per rank, its actor pool, and the collectives that keep ranks in step.

Read top to bottom, one round (DESIGN.md "One iteration") is: publish weights and frozen statistics →
actors sample → merge statistics over actors and ranks → PPO update → average weights every
param_sync_interval rounds → metrics averaged over ranks → rank 0 logs and saves.

Nothing lost (docs/reliability.md): each round alternates a rank's own work (rollout; update; rank 0's
logging and saving), which may fail, with collectives, which every rank must reach. Every rank meets the
others at `settle` after its own work, carrying a stop request (SIGINT/SIGTERM) and whether its work
failed; the answer is the same everywhere, so all ranks stop, or fail, after the same round and none is
left waiting in a collective. A rank that dies outright is torchrun's to notice (it stops the others).
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import sys
import time
import traceback
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist
import yaml

from ppo_ddp import distributed as D
from ppo_ddp.actors import ActorError, ActorPool, ActorReport
from ppo_ddp.buffers import BufferSpec
from ppo_ddp.capacity import available_memory, check_round_fits, free_shared_memory
from ppo_ddp.checkpoint import CheckpointError, load_checkpoint, mean_policy, save_checkpoint
from ppo_ddp.config import Config, ConfigError, config_to_dict
from ppo_ddp.envs import make_env
from ppo_ddp.learner import Learner, RolloutBatch, annealed_learning_rate
from ppo_ddp.model import ActorCritic, num_parameters
from ppo_ddp.normalization import Moments, merge_rms_states, tensor_moments
from ppo_ddp.run_log import RunLogger, write_run_config
from ppo_ddp.signals import ForcedStop, StopRequests, exit_code, signal_name
from ppo_ddp.topology import TrainingTopology

RETURN_WINDOW = 100
"""Episodes in the rolling mean that decides the best checkpoint (per-round means are too noisy)."""

DEBUG_DIR_ENV = "PPO_DDP_DEBUG_DIR"
"""When set, every rank writes its local parameters, metrics and statistics of each round there (tests use it)."""

class RunFailed(RuntimeError):
    """A failure all ranks agreed on (settle): every rank raises it and exits with exit_code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Stopped(Exception):
    """All ranks stopped on a signal after the checkpoint was written."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


class NonFiniteError(FloatingPointError):
    """The update produced NaN/inf parameters or losses."""


def _is_local_main() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0"


def main(cfg: Config) -> None:
    """Entry of train.py: launch the learners (torchrun, or our own elastic launch), then train.

    Exit status: 0 done; 1 a failure during training (the message names rank, actor, env and step); 2 bad
    input (config, checkpoint, topology); 128 + signal number (130 Ctrl-C, 143 SIGTERM) stopped by a signal.
    """
    try:
        # Decided once, before any learner starts; our own launch hands its decision to every worker.
        topology = D.training_topology(cfg)
        device = None
        if not D.under_torchrun():
            if topology.num_learners > 1:
                launch_learners(topology, sys.argv)
                return
            device = "cuda:0" if topology.device == "cuda" else topology.device
        # Installed once the process group is up: a signal while it forms (which can wait on other nodes)
        # ends the learner as usual, with nothing to save; from then on it is a stop at the next round.
        with D.process_group(device) as ctx, StopRequests(announce=_is_local_main()) as stop:
            train(cfg, ctx, stop, topology.actors_per_learner)
    except (ConfigError, CheckpointError) as e:  # found alike by every rank (e.g. a topology that does not fit)
        if _is_local_main():  # one line per node
            print(f"train.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunFailed as e:  # said by train() already
        raise SystemExit(e.exit_code) from None
    except (Stopped, ForcedStop) as e:
        raise SystemExit(exit_code(e.signum)) from None
    except dist.DistError as e:  # a peer lost while the group was still forming (train() handles the rest)
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        print(f"train.py: error: rank {os.environ.get('RANK', '0')}: lost contact with another rank, which died or "
              f"was stopped ({first})", file=sys.stderr)
        raise SystemExit(1) from None


def launch_learners(topology: TrainingTopology, argv: list[str]) -> None:
    """`python train.py` with several learners: start them through torch's elastic launcher, like torchrun.

    argv is train.py's command line (script first); every learner re-runs it under torchrun's environment
    and takes the actors per learner decided here (D.OWN_LAUNCH_ENV), not a count of its own.
    The rendezvous store listens on 127.0.0.1 only (torchrun --standalone's listens on every interface).
    Exits with the first failed learner's status, or 128 + signal when the launcher itself was signalled.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    D.register_loopback_rendezvous()
    args = [f"--rdzv-backend={D.LOOPBACK_RDZV_BACKEND}", "--rdzv-endpoint=127.0.0.1:0", f"--rdzv-id={uuid.uuid4()}",
            "--nnodes=1", f"--nproc_per_node={topology.num_learners}", *argv]
    print(f"starting {topology.num_learners} learners with {topology.actors_per_learner} actor(s) each: "
          f"torchrun {' '.join(args)}", flush=True)
    os.environ[D.OWN_LAUNCH_ENV] = str(topology.actors_per_learner)
    try:
        run(parse_args(args))
    except ChildFailedError as e:  # each learner has said what went wrong; torchrun's report would repeat it
        code = e.get_first_failure()[1].exitcode
        raise SystemExit(code if code > 0 else 128 - code) from None
    except SignalException as e:  # Ctrl-C: the learners got it forwarded, saved and stopped
        raise SystemExit(exit_code(int(e.sigval))) from None


def _default_run_name(cfg: Config) -> str:
    return f"{cfg.env_id}__{cfg.seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def checkpoint_paths(run_dir: Path, run_name: str) -> tuple[Path, Path]:
    return run_dir / f"model_{run_name}.pt", run_dir / f"model_{run_name}_best.pt"


def _to_cpu(obj: Any) -> Any:
    """Tensors of a nested state (e.g. an optimizer's) moved to the CPU, for pickling to another rank."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def train(cfg: Config, ctx: D.DistContext, stop: Optional[StopRequests], actors: int) -> None:
    """Train on this rank with `actors` actor processes (the topology's actors per learner)."""
    stop = stop or StopRequests()  # not entered: never set
    samples_per_rank = actors * cfg.envs_per_actor * cfg.rollout_length
    steps_per_round = ctx.world_size * samples_per_rank

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

    # A group that torchelastic restarted (--max-restarts) continues its run: the same name, resumed from
    # its latest checkpoint. The default name holds rank 0's start time, so a restarted rank 0 looks the name
    # up by the rendezvous id that the first attempt recorded in config.yaml.
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) if D.under_torchrun() else 0
    elastic_id = os.environ.get("TORCHELASTIC_RUN_ID") if D.under_torchrun() else None
    name = cfg.run_name
    if name is None and ctx.is_main and restart_count > 0 and elastic_id:
        name = _find_elastic_run(Path(cfg.runs_dir), elastic_id)
    run_name = D.broadcast_object(ctx, name or _default_run_name(cfg))
    run_dir = Path(cfg.runs_dir) / run_name
    latest_path, best_path = checkpoint_paths(run_dir, run_name)
    metrics_path = Path(cfg.metrics_path) if cfg.metrics_path else run_dir / "metrics.csv"

    def local_failure(e: BaseException) -> BaseException:
        """This rank's own work failed: say everything here, then tell the others at the next settle."""
        if isinstance(e, ActorError):
            print(f"train.py: rank {ctx.rank}: {e}", file=sys.stderr, flush=True)  # with the actor's traceback
        elif not isinstance(e, (ConfigError, CheckpointError, NonFiniteError)):
            print(f"train.py: rank {ctx.rank}: {type(e).__name__} during training:\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
        return e

    last_good: Optional[int] = None  # round of the latest checkpoint of this run known to be on disk

    def settle(error: Optional[BaseException], stop_signal: int = 0) -> int:
        """Every rank calls this at the same points of a round; RunFailed on every rank if any rank failed.

        Returns the agreed stop signal (0: go on).
        """
        signum, failed = D.agree(ctx, stop_signal, error is not None)
        if failed:
            reports = [r for r in D.gather_objects(ctx, _failure_report(ctx, error) if error is not None else None) if r]
            message = "; ".join(dict.fromkeys(text for text, _ in reports))  # ranks that found the same say it once
            if last_good is not None:
                message += f" (kept the last good checkpoint {latest_path}, round {last_good})"
            # Said before the clean-up, which torchrun may cut short; its SIGTERM to the ranks still running
            # once one has exited is no stop request any more.
            stop.finish()
            if _is_local_main():
                print(f"train.py: error: {message}", file=sys.stderr, flush=True)
            raise RunFailed(message, max(code for _, code in reports))
        return signum

    # ---- resume: rank 0 reads the checkpoint and hands it to the others (one read; nodes need not share a disk)
    # Work that cannot fit on this node is refused before any actor starts (every rank checks its node).
    error: Optional[BaseException] = None
    try:
        spec = BufferSpec(actors, cfg.rollout_length, cfg.envs_per_actor, obs_dim, act_dim, num_parameters(model))
        check_round_fits(spec, ctx.local_world_size, free_shared_memory(), available_memory())
    except ConfigError as e:
        error = local_failure(e)
    state, resume_path = None, None
    if ctx.is_main and error is None:
        try:
            resume_path = _resume_path(cfg, latest_path, restart_count > 0)
            if resume_path is not None:
                state = load_checkpoint(resume_path)
                _check_compatible(state, cfg, model, obs_dim, act_dim, resume_path)
        except Exception as e:
            error = local_failure(e)
    settle(error)
    if ctx.world_size > 1:
        state, resume_path = D.broadcast_object(ctx, (state, resume_path))

    obs_rms: Optional[Moments] = None
    ret_rms: Optional[Moments] = None
    start_iteration, global_step, best_return = 0, 0, -math.inf
    recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
    noise_states: Optional[list[torch.Tensor]] = None
    notes: list[str] = []
    if state is not None:
        try:
            noise_states = _restore(state, ctx, model, learner, actors, notes)
            # The statistics exactly as saved: the next round merges its own increment into them once.
            obs_rms = Moments.from_state(state["obs_rms_state"]) if state["obs_rms_state"] else None
            ret_rms = Moments.from_state(state["return_rms_state"]) if state.get("return_rms_state") else None
            start_iteration, global_step = int(state["iteration"]), int(state["global_step"])
            best_return = float(state["best_return"])
            recent_returns.extend(float(r) for r in state.get("recent_returns", []))
        except Exception as e:
            error = local_failure(CheckpointError(f"checkpoint {resume_path}: cannot be restored: {type(e).__name__}: {e}"))
        if Path(resume_path) == latest_path:
            last_good = start_iteration
        del state
    # A run without statistics yet (a fresh start) seeds them before its first update: round 0 (see the loop).
    # The rounds left to reach total_timesteps: the same count as before on the same world size; with another
    # world size a round holds another number of steps.
    seeding = bool((cfg.normalize_obs and obs_rms is None) or (cfg.normalize_reward and ret_rms is None))
    seeding_steps = steps_per_round if seeding else 0
    num_iterations = start_iteration + max(0, math.ceil((cfg.total_timesteps - global_step - seeding_steps) / steps_per_round))
    seeding = seeding and num_iterations > start_iteration

    logger: Optional[RunLogger] = None
    debug_dir = os.environ.get(DEBUG_DIR_ENV)
    start_time, start_step = time.time(), global_step
    saved_iteration = start_iteration  # the round the latest checkpoint holds; the same number on every rank

    def rank_state() -> dict[str, Any]:
        """What only this rank knows (its own Adam moments, RNG, actors' noise; parameters between syncs)."""
        return {
            "actor": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": _to_cpu(learner.optimizer.state_dict()),
            "generator": learner.generator.get_state(),
            "torch_rng_state": torch.get_rng_state(),
            "cuda_rng_state": torch.cuda.get_rng_state(ctx.device) if ctx.device.type == "cuda" else None,
            "actor_noise": noise_states,
        }

    def checkpoint(iteration: int, rank_states: list[dict[str, Any]]) -> dict[str, Any]:
        own = rank_states[0]  # the top level: the ranks' mean policy, rank 0's optimizer and generators
        return {
            "actor": mean_policy([r["actor"] for r in rank_states]),
            "obs_rms_state": obs_rms.to_state() if (cfg.normalize_obs and obs_rms) else None,
            "return_rms_state": ret_rms.to_state() if ret_rms else None,
            "optimizer": own["optimizer"],
            "generator": own["generator"],
            "torch_rng_state": own["torch_rng_state"],
            "rank_states": rank_states,
            "iteration": iteration, "global_step": global_step, "best_return": best_return,
            "recent_returns": list(recent_returns),
            "config": config_to_dict(cfg), "env_id": cfg.env_id, "obs_dim": obs_dim, "act_dim": act_dim,
            "world_size": ctx.world_size, "run_name": run_name,
        }

    pin = ctx.device.type == "cuda"
    completed = start_iteration
    try:
        with contextlib.ExitStack() as stack:
            if ctx.is_main and error is None:
                try:
                    run_dir.mkdir(parents=True, exist_ok=True)
                    for stale in run_dir.glob(".*.tmp"):  # left by a process killed while writing; never the real files
                        stale.unlink(missing_ok=True)
                    write_run_config(run_dir / "config.yaml", cfg, {
                        "run_name": run_name, "world_size": ctx.world_size, "actors_per_learner": actors,
                        "steps_per_round": steps_per_round, "num_iterations": num_iterations,
                        "resumed_from": str(resume_path) if resume_path else None,
                        "torchelastic_run_id": elastic_id, "torchelastic_restart_count": restart_count})
                    logger = RunLogger(run_dir, metrics_path,
                                       global_step + (num_iterations - start_iteration + seeding) * steps_per_round,
                                       resume_path is not None, global_step)
                    stack.callback(logger.close)
                except OSError as e:
                    error = local_failure(ConfigError(f"runs_dir={cfg.runs_dir!r}: cannot write the run folder {run_dir}: "
                                                      f"{e.strerror or e}"))
            pool: Optional[ActorPool] = None
            if error is None:
                try:
                    pool = stack.enter_context(ActorPool(cfg, rank=ctx.rank, num_actors=actors, obs_dim=obs_dim,
                                                         act_dim=act_dim, pin_memory=pin, noise_states=noise_states,
                                                         first_round=start_iteration + (0 if seeding else 1)))
                except Exception as e:
                    error = local_failure(e)
            settle(error)

            if logger is not None:
                where = f"{ctx.world_size} learner(s) on {ctx.device.type}, {actors} actor(s) x {cfg.envs_per_actor} envs each"
                logger.message(f"{cfg.env_id}: {num_iterations} rounds of {steps_per_round} steps, {where}; outputs in {run_dir}")
                if resume_path is not None:
                    logger.message(f"resumed from {resume_path} at round {start_iteration}, step {global_step:,}"
                                   + (f" (restart {restart_count} of the torchelastic group)" if restart_count else ""))
                elif cfg.resume == "auto":
                    logger.message(f"no checkpoint of run {run_name} yet: starting it fresh")
                for note in notes:
                    logger.message(note)
                if seeding:
                    logger.message(f"round 0: {steps_per_round} steps of the initial policy seed the statistics (not trained on)")

            stopped = 0
            # Round 0, in a run without statistics yet: the actors act with the initial policy on raw inputs and
            # the round seeds the observation and return statistics; nothing is trained on it, and its steps
            # count in global_step. So every update, the first included, sees normalised observations and
            # scaled rewards (re-normalising round 1's data instead is impossible: its bootstrap values were
            # computed from unnormalised final observations that the buffers do not keep).
            for iteration in range(start_iteration + (0 if seeding else 1), num_iterations + 1):
                # 1-3 (this rank's own work): actors sample with this rank's weights and the frozen statistics.
                reports, batch = None, None
                if error is None:
                    try:
                        t0 = time.time()
                        reports = pool.collect(model, obs_rms if cfg.normalize_obs else None,
                                               ret_rms if cfg.normalize_reward else None)
                        rollout_seconds = time.time() - t0
                        batch = RolloutBatch.from_buffers(pool.buffers, ctx.device)
                    except Exception as e:
                        error = local_failure(e)
                # Stop requests and failures, agreed before the round changes any state: on a stop the fresh
                # rollout is dropped and the checkpoint holds every completed round.
                stopped = settle(error, stop.signum)
                if stopped:
                    break

                if cfg.anneal_lr:
                    learner.set_learning_rate(annealed_learning_rate(cfg.learning_rate, global_step, cfg.total_timesteps))
                frozen_obs_rms = obs_rms
                # 4: this round's increments over all actors of all ranks, merged into the history once, and the
                # moments of all ranks' advantages (for their normalisation in step 5): one collective.
                obs_inc, ret_inc, adv_moments = D.merge_moments_across_ranks(ctx, [
                    merge_rms_states(r.obs_moments for r in reports) if cfg.normalize_obs else None,
                    merge_rms_states(r.return_moments for r in reports) if cfg.normalize_reward else None,
                    tensor_moments(batch.advantages) if cfg.norm_adv else None,  # non-finite: caught after the update
                ], [obs_shape, (), ()])
                if cfg.normalize_obs:
                    obs_rms = merge_rms_states([obs_rms, obs_inc])
                if cfg.normalize_reward:
                    ret_rms = merge_rms_states([ret_rms, ret_inc])
                if seeding and iteration == start_iteration:  # round 0: the statistics are seeded, nothing else
                    global_step += steps_per_round
                    if debug_dir:
                        _debug_dump(Path(debug_dir), ctx, iteration, model, learner, {}, obs_rms, None, None, pool, reports)
                    continue
                # 5: PPO on this rank's rollout; the advantages normalised with the mean and the (unbiased) std
                # over all ranks, so the update itself is this rank's own work.
                adv_stats = None
                if adv_moments is not None:
                    n = adv_moments.count
                    adv_stats = float(adv_moments.mean), math.sqrt(float(adv_moments.var) * n / max(n - 1, 1))
                t0 = time.time()
                try:
                    local_metrics = learner.train_step(batch, lambda adv: adv_stats)
                    _check_finite(model, local_metrics, ctx.rank, iteration)
                except Exception as e:
                    error = local_failure(e)
                del batch  # on CPU it views the shared buffers that the next round overwrites
                train_seconds = time.time() - t0
                settle(error)  # a failed or non-finite update stops every rank before weights are averaged

                # 6: weight averaging; between sync rounds each rank keeps its own parameters. The last round
                # averages too: a run ends with one policy on every rank.
                if iteration % cfg.param_sync_interval == 0 or iteration == num_iterations:
                    D.average_parameters(ctx, model)

                # 7: metrics averaged over ranks; episodes of all actors of all ranks.
                local_metrics.update({"charts/rollout_seconds": rollout_seconds, "charts/train_seconds": train_seconds})
                if debug_dir:
                    _debug_dump(Path(debug_dir), ctx, iteration, model, learner, local_metrics, obs_rms, frozen_obs_rms,
                                adv_stats, pool, reports)
                metrics, episodes = D.average_metrics(ctx, local_metrics, [
                    (ret, length) for r in reports for ret, length in zip(r.episode_returns, r.episode_lengths)])
                recent_returns.extend(ret for ret, _ in episodes)
                global_step += steps_per_round
                completed = iteration
                elapsed = time.time() - start_time  # since this process started training; benchmarks read it
                noise_states = [torch.from_numpy(r.noise_state) for r in reports]  # tensors: checkpoints are weights_only
                metrics.update({
                    "charts/episodes": float(len(episodes)),
                    "charts/episodic_return": float(np.mean([e[0] for e in episodes])) if episodes else math.nan,
                    "charts/episodic_length": float(np.mean([e[1] for e in episodes])) if episodes else math.nan,
                    "charts/episodic_return_avg100": float(np.mean(recent_returns)) if recent_returns else math.nan,
                    "charts/SPS": (global_step - start_step) / elapsed,
                    "charts/elapsed_seconds": elapsed,
                })
                improved = bool(recent_returns) and metrics["charts/episodic_return_avg100"] > best_return
                if improved:
                    best_return = metrics["charts/episodic_return_avg100"]
                save_latest = iteration % cfg.save_interval == 0 or iteration == num_iterations
                rank_states = D.gather_to_main(ctx, rank_state()) if (save_latest or improved) else None
                if save_latest:
                    saved_iteration = iteration

                if ctx.is_main:  # rank 0's own work; a failure is told to the others at the next settle
                    try:
                        logger.log(iteration, global_step, metrics)
                        if improved:
                            save_checkpoint(best_path, checkpoint(iteration, rank_states))
                        if save_latest:
                            save_checkpoint(latest_path, checkpoint(iteration, rank_states))
                            last_good = iteration
                    except Exception as e:
                        error = local_failure(e)

            if stopped:
                if completed > saved_iteration:  # the same decision on every rank: all join the gather
                    rank_states = D.gather_to_main(ctx, rank_state())
                    if ctx.is_main:
                        save_checkpoint(latest_path, checkpoint(completed, rank_states))
                        last_good = completed
                if logger is not None:
                    logger.message(_stop_message(stopped, completed, num_iterations, global_step,
                                                 latest_path if last_good is not None else None, run_name))
                stop.finish()
                raise Stopped(stopped)
            settle(error)  # rank 0's last save, agreed before anyone reports success
        if ctx.is_main:
            best = f"{best_return:.1f}" if math.isfinite(best_return) else "n/a (no episode finished)"
            print(f"done: {global_step:,} steps in {_elapsed(start_time)}; best mean return {best}; "
                  f"latest checkpoint {latest_path}", flush=True)
    except ForcedStop as e:
        if ctx.is_main:
            kept = f"the latest is {latest_path} (round {last_good})" if last_good is not None else "there is none"
            print(f"\ntrain.py: quit on a second {signal_name(e.signum)} without saving; {kept}", file=sys.stderr, flush=True)
        raise
    except dist.DistError as e:
        # A peer died without a word (killed, out of memory): its connection broke under a collective.
        # Under torchrun the launcher has seen it too and stops (or restarts) the group.
        stop.finish()
        if _is_local_main():
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            print(f"train.py: error: rank {ctx.rank}: lost contact with another rank, which died or was stopped "
                  f"({first})", file=sys.stderr, flush=True)
        raise RunFailed(str(e), 1) from None


def _stop_message(signum: int, completed: int, num_iterations: int, global_step: int, checkpoint: Optional[Path],
                  run_name: str) -> str:
    head = f"stopped by {signal_name(signum)} after round {completed} of {num_iterations} ({global_step:,} steps)"
    if checkpoint is None:
        return f"{head}; no round finished, nothing saved. Start again with: {resume_command(None)}"
    return f"{head}; checkpoint {checkpoint}. Resume with: {resume_command(run_name)}"


def resume_command(run_name: Optional[str], argv: Optional[list[str]] = None) -> str:
    """The command line that continues this run: the same flags plus `--resume auto --run-name NAME`
    (run_name None: the command as it was)."""
    argv = list(sys.argv if argv is None else argv)
    flags, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0].replace("_", "-")
        if run_name is not None and name in ("--resume", "--run-name"):
            skip = "=" not in arg
            continue
        flags.append(arg)
    tail = [argv[0], *flags] + (["--resume", "auto", "--run-name", run_name] if run_name is not None else [])
    if not D.under_torchrun() or D.launched_by_us():
        return shlex.join(["python", *tail])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world == local:
        return shlex.join(["torchrun", "--standalone", f"--nproc_per_node={local}", *tail])
    return f"torchrun <the same launcher options on every node> {shlex.join(tail)}"


def _elapsed(start: float) -> str:
    seconds = int(time.time() - start)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def _resume_path(cfg: Config, latest_path: Path, restarted: bool) -> Optional[Path]:
    if restarted and latest_path.is_file():  # torchelastic restarted the group: continue where it was
        return latest_path
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":  # validate() made sure run_name is set
        return latest_path if latest_path.is_file() else None
    return Path(cfg.resume)


def _find_elastic_run(runs_dir: Path, run_id: str) -> Optional[str]:
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


def _failure_report(ctx: D.DistContext, e: BaseException) -> tuple[str, int]:
    """(one line for the user, exit status) of a rank's failure, small enough to gather."""
    if isinstance(e, (ConfigError, CheckpointError)):
        return str(e), 2
    if isinstance(e, ActorError):
        return e.message, 1
    if isinstance(e, NonFiniteError):
        return str(e), 1
    text = str(e).strip().splitlines()
    return f"rank {ctx.rank}: {type(e).__name__}: {text[0] if text else ''}".rstrip(": "), 1


def _check_finite(model: torch.nn.Module, metrics: dict[str, float], rank: int, iteration: int) -> None:
    """A NaN must not reach the weight average (it would spread to every rank) nor a checkpoint."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if not bool(torch.isfinite(flat).all()):
        bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
        raise NonFiniteError(f"rank {rank}: non-finite parameters ({', '.join(bad)}) after the update of round {iteration}")
    for key in ("losses/policy_loss", "losses/value_loss"):
        if not math.isfinite(metrics[key]):
            raise NonFiniteError(f"rank {rank}: non-finite {key} ({metrics[key]}) in the update of round {iteration}")


def _check_compatible(state: dict[str, Any], cfg: Config, model: torch.nn.Module, obs_dim: int, act_dim: int,
                      path: Path) -> None:
    for key in ("optimizer", "generator", "iteration", "global_step", "best_return", "env_id"):
        if key not in state:
            raise ConfigError(f"resume={str(path)!r}: checkpoint has no {key!r} (a policy-only file cannot resume training)")
    if state.get("env_id") != cfg.env_id or state.get("obs_dim") != obs_dim or state.get("act_dim") != act_dim:
        raise ConfigError(f"resume={str(path)!r}: checkpoint is for {state.get('env_id')} (obs {state.get('obs_dim')}, "
                         f"act {state.get('act_dim')}), this run is {cfg.env_id} (obs {obs_dim}, act {act_dim})")
    saved = state.get("config") or {}
    own = model.state_dict()
    theirs = state["actor"]
    shapes_differ = set(own) != set(theirs) or any(tuple(theirs[k].shape) != tuple(own[k].shape) for k in own)
    if shapes_differ or saved.get("activation", cfg.activation) != cfg.activation:
        raise ConfigError(f"resume={str(path)!r}: checkpoint's network is hidden_sizes {saved.get('hidden_sizes', '?')} "
                         f"activation {saved.get('activation', '?')}, this run's is hidden_sizes {list(cfg.hidden_sizes)} "
                         f"activation {cfg.activation}")
    tensors = [len(group.get("params", ())) for group in state["optimizer"].get("param_groups", [])]
    if tensors != [1]:
        raise ConfigError(f"resume={str(path)!r}: checkpoint's optimizer state has {sum(tensors)} parameter tensors, this "
                          f"learner steps one flat tensor (a checkpoint of an earlier ppo_ddp): it can be evaluated but "
                          f"not resumed")


def _restore(state: dict[str, Any], ctx: D.DistContext, model: torch.nn.Module, learner: Learner, actors: int,
             notes: list[str]) -> Optional[list[torch.Tensor]]:
    """Load the model, optimizer and RNG of this rank from a checkpoint; returns the actors' noise states.

    A checkpoint of the same world size holds every rank's own state (rank_states); another world size
    gives every rank rank 0's optimizer and generator, and fresh actor noise.
    """
    ranks = state.get("rank_states")
    mine = ranks[ctx.rank] if ranks and len(ranks) == ctx.world_size else None
    if mine is None and ctx.is_main and state.get("world_size") != ctx.world_size:
        notes.append(f"the checkpoint was written by {state.get('world_size')} rank(s), this run has {ctx.world_size}: "
                     f"every rank starts from rank 0's parameters and Adam moments, the actors from fresh noise")
    source = mine or state
    model.load_state_dict(source["actor"])
    learner.optimizer.load_state_dict(source["optimizer"])
    # The optimizer state carries the rate it last used; the command line's wins (with anneal_lr the next round
    # sets its own anyway).
    saved_lr = learner.optimizer.param_groups[0]["lr"]
    learner.set_learning_rate(learner.cfg.learning_rate)
    if not learner.cfg.anneal_lr and saved_lr != learner.cfg.learning_rate and ctx.is_main:
        notes.append(f"learning_rate {learner.cfg.learning_rate:g} (this run's) replaces the checkpoint's {saved_lr:g}")
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
    noise = mine.get("actor_noise") if mine is not None else None
    return list(noise) if noise is not None and len(noise) == actors else None


def _debug_dump(out: Path, ctx: D.DistContext, iteration: int, model: torch.nn.Module, learner: Learner,
                metrics: dict[str, float], obs_rms: Optional[Moments], frozen_obs_rms: Optional[Moments],
                adv_stats: Optional[tuple[float, float]], pool: ActorPool, reports: list[ActorReport]) -> None:
    """This rank's view of the round, for tests that compare ranks and recompute statistics from the data."""
    out.mkdir(parents=True, exist_ok=True)
    torch.save({
        "params": torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()]),
        "metrics": metrics,
        "obs_rms": obs_rms.to_state() if obs_rms else None,
        "frozen_obs_rms": frozen_obs_rms.to_state() if frozen_obs_rms else None,
        "obs": pool.buffers.obs.clone(),
        "advantages": pool.buffers.advantages.clone(), "adv_stats": adv_stats,
        "obs_increments": [r.obs_moments.to_state() for r in reports],
        "rank": ctx.rank, "local_rank": ctx.local_rank, "world_size": ctx.world_size,
        "node_rank": int(os.environ.get("GROUP_RANK", "0")), "pid": os.getpid(),
        "actor_pids": [p for p in pool.pids if p is not None],
        # what a checkpoint of this round must hold for this rank (resume tests compare them)
        "optimizer": _to_cpu(learner.optimizer.state_dict()), "generator": learner.generator.get_state(),
        "actor_noise": [torch.from_numpy(r.noise_state) for r in reports],
    }, out / f"rank{ctx.rank}_iter{iteration}.pt")
