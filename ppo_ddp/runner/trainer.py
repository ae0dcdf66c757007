"""One learner (a rank): its actors, its PPO update, and the collectives that keep the ranks in step.

`Trainer.train` runs the rounds; each reads top to bottom in `_rounds` (docs/design.md, "a round"):

    take the rollout → agree → merge statistics → start the next → update → agree → average parameters
    → gather metrics → log and save

When the actors collect is the schedule's (ppo_ddp/runner/rounds.py): sync, or overlapped with the update (cfg.overlap).

Each step is a call into the part that owns it: the actor pool (ppo_ddp/sampling/pool.py), the agreement between ranks
on stops and failures (ppo_ddp/distributed/agreement.py), the collectives (ppo_ddp/distributed/process_group.py), the
PPO update (ppo_ddp/algorithm/learner.py), the checkpoints (ppo_ddp/records/checkpointer.py) and the outputs
(ppo_ddp/records/run_log.py). A rank's own work runs through `agreement.own_work`, which keeps its failure for the next
`agreement.settle`: every rank meets the others there, so all stop, or fail, after the same round and none waits in a
collective.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from ppo_ddp.algorithm import compiled
from ppo_ddp.algorithm.learner import Learner, adapted_learning_rate, annealed_learning_rate, check_finite
from ppo_ddp.configuration.config import Config
from ppo_ddp.configuration.presets import describe
from ppo_ddp.configuration.topology import TrainingTopology, cpu_learner_threads
from ppo_ddp.configuration.validation import minibatch_rows
from ppo_ddp.distributed import collectives as C
from ppo_ddp.distributed import process_group as D
from ppo_ddp.distributed.agreement import Agreement, RunFailed, Stopped
from ppo_ddp.distributed.signals import ForcedStop, StopRequests, signal_name
from ppo_ddp.envs.make import critic_obs_dim, make_env
from ppo_ddp.evaluation.evaluator import EVAL_FINISH_TIMEOUT, Evaluation, Evaluator
from ppo_ddp.models.factory import make_model
from ppo_ddp.models.flat import num_parameters
from ppo_ddp.models.normalization import value_scale
from ppo_ddp.records.checkpointer import Checkpointer, elastic_restart, run_name
from ppo_ddp.records.run_log import RunLogger, default_run_name, format_duration, open_run_folder
from ppo_ddp.records.run_state import RunState
from ppo_ddp.runner import statistics
from ppo_ddp.runner.debug import RoundRecorder
from ppo_ddp.runner.rounds import Rounds
from ppo_ddp.sampling.capacity import available_memory, check_round_fits, free_shared_memory
from ppo_ddp.sampling.pool import ActorPool, Rollout
from ppo_ddp.storage.checkpoint import mean_policy
from ppo_ddp.storage.shared import BufferSpec


class Trainer:
    """The learner of one rank with the actors its topology decided (cfg holds the split as numbers:
    launch.split_config); `train()` runs the whole run."""

    def __init__(self, cfg: Config, ctx: D.DistContext, stop: StopRequests, topology: TrainingTopology) -> None:
        self.cfg, self.ctx, self.stop, self.topology = cfg, ctx, stop, topology
        self.actors = actors = topology.actors_per_learner
        probe = make_env(cfg.env_id, **cfg.env_kwargs)
        obs_shape = probe.observation_space.shape
        obs_dim, act_dim = int(np.prod(obs_shape)), int(np.prod(probe.action_space.shape))
        critic_dim = critic_obs_dim(probe, cfg.critic_obs) if cfg.critic_obs is not None else 0
        bounds = (probe.action_space.low, probe.action_space.high)
        probe.close()
        self.obs_shapes = (obs_shape, (critic_dim,))  # the policy's and the critic's own (none: 0 entries)
        if ctx.device.type == "cpu":
            threads = cpu_learner_threads(cfg.learner_threads, ctx.local_world_size, actors if cfg.overlap else 0)
            torch.set_num_threads(threads)
        torch.manual_seed(cfg.seed)
        self.model = make_model(cfg, obs_dim, act_dim, critic_dim, bounds).to(ctx.device)
        C.broadcast_parameters(ctx, self.model)
        self.learner = Learner(cfg, self.model, ctx.device, functools.partial(C.average_, ctx))
        self.restart_count, self.elastic_id = elastic_restart()
        name = run_name(cfg, ctx.is_main, self.restart_count, self.elastic_id)
        self.run_name = C.broadcast_object(ctx, name or default_run_name(cfg.env_id, cfg.seed, time.time()))
        self.run_dir = Path(cfg.runs_dir) / self.run_name
        self.checkpointer = Checkpointer(cfg, ctx, self.run_dir, self.run_name, (obs_dim, act_dim, critic_dim))
        self.agreement = Agreement(ctx, stop, self.checkpointer.kept)
        self.run = RunState()
        self.steps_per_round = ctx.world_size * actors * cfg.envs_per_actor * cfg.rollout_length
        self.spec = BufferSpec.for_config(cfg, actors, obs_dim, act_dim, num_parameters(self.model), critic_dim)
        self.recorder = RoundRecorder.from_env()  # the tests' view of each round, or None
        self.logger: Optional[RunLogger] = None
        self.pool: Optional[ActorPool] = None
        self.evaluator: Optional[Evaluator] = None

    # ---- the run --------------------------------------------------------------------------------------------
    def train(self) -> None:
        ckpt, run = self.checkpointer, self.run
        try:
            with contextlib.ExitStack() as stack:
                notes = self._resume()
                self._plan()
                compiling = self._start_compile()
                self.start_time = time.time()  # charts/elapsed_seconds and the done line count from here
                if self.ctx.is_main:
                    self.logger = self.agreement.own_work(self._open_outputs, stack)
                self.pool = self.agreement.own_work(lambda: stack.enter_context(self._actor_pool()))
                if self.ctx.is_main and self.cfg.eval_interval:
                    videos = self.run_dir / "videos" if self.cfg.capture_video else None
                    dims = (self.spec.obs_dim, self.spec.act_dim, self.spec.critic_dim)
                    evaluator = functools.partial(Evaluator, self.cfg, dims, videos)
                    self.evaluator = self.agreement.own_work(lambda: stack.enter_context(evaluator()))
                self.agreement.settle()
                self._say_start(notes)
                self._finish_compile(compiling)
                publish = functools.partial(statistics.published, self.cfg, run, self.learner.flat_params)
                self.rounds = Rounds(self.cfg, self.pool, self.ctx.device, self.num_iterations, publish, run)
                stopped = self._rounds()
                if stopped:
                    ckpt.save_at_stop(self.learner, self.run)
                    self.stop.finish()
                    raise Stopped(
                        stopped,
                        self.run.iteration,
                        self.num_iterations,
                        self.run.global_step,
                        ckpt.latest if ckpt.last_good is not None else None,
                        self.run_name,
                    )
                self._finish_evaluations()
                self.agreement.settle()  # rank 0's last save, agreed before anyone reports success
            if self.ctx.is_main:
                best = f"{self.run.best_return:.1f}" if math.isfinite(self.run.best_return) else "n/a (no episode)"
                if math.isfinite(self.run.best_eval_return):
                    best += f"; best evaluation {self.run.best_eval_return:.1f} ({ckpt.best})"
                took = format_duration(time.time() - self.start_time)
                print(f"done: {self.run.global_step:,} steps in {took}; best mean return {best}; latest checkpoint "
                      f"{ckpt.latest}", flush=True)  # fmt: skip
        except ForcedStop as e:
            if self.ctx.is_main:
                kept = f"the latest is {ckpt.latest} (round {ckpt.last_good})" if ckpt.last_good is not None else ""
                kept = kept or "there is none"
                print(f"\ntrain.py: quit on a second {signal_name(e.signum)} without saving; {kept}", file=sys.stderr)
            raise
        except dist.DistError as e:
            # A peer died without a word (killed, out of memory): its connection broke under a collective.
            # Under torchrun the launcher has seen it too and stops (or restarts) the group.
            self.stop.finish()
            if D.is_local_main():
                print(f"train.py: error: rank {self.ctx.rank}: {D.lost_contact(e)}", file=sys.stderr, flush=True)
            raise RunFailed(str(e), 1) from None

    def _rounds(self) -> int:
        """Train round after round; returns the signal that stopped the run, or 0 when every round ran."""
        run, agree = self.run, self.agreement
        first = run.iteration + (0 if self.seeding else 1)
        self.rate_start = time.time(), run.global_step  # SPS and the ETA: the trained rounds', not the start-up's
        for iteration in range(first, self.num_iterations + 1):
            rollout = agree.own_work(self.rounds.take, iteration)  # 1-3: this rank's actors sample
            stopped = agree.settle(with_stop=True)  # a stop drops the fresh rollout: it changed nothing yet
            if stopped:
                return stopped
            frozen_obs_rms = run.obs_rms  # the statistics the actors used this round
            adv_stats = statistics.merge_round(self.ctx, self.cfg, run, rollout, self.obs_shapes)  # 4: all ranks
            agree.own_work(self.rounds.start_next, iteration)  # overlapped: the next round collects from here on
            if self.seeding and iteration == first:
                run.global_step += self.steps_per_round  # round 0 seeds the statistics and trains nothing
                self._record(iteration, {}, None, None, rollout)
                self.rate_start = time.time(), run.global_step  # the rate starts with the first trained round
                continue
            metrics = agree.own_work(self._update, rollout, adv_stats, iteration)  # 5: PPO on this rank's data
            agree.settle()  # a failed or non-finite update stops every rank before weights are averaged
            if self._averages_parameters(iteration):
                C.average_(self.ctx, self.learner.flat_params.detach())  # 6
            self._record(iteration, metrics, frozen_obs_rms, adv_stats, rollout)
            metrics, improved = self._gather_metrics(iteration, metrics, rollout)  # 7: averaged over ranks
            self._log_and_save(metrics, improved)  # 8: rank 0 logs; the checkpointer decides what to save
            self._evaluate(iteration)  # 9: every eval_interval rounds, in the evaluator process; not waited for
        return 0

    # ---- the steps of a round -------------------------------------------------------------------------------
    def _averages_parameters(self, iteration: int) -> bool:
        """Weight averaging after this round's update: every param_sync_interval rounds and the last one; never
        when the ranks average gradients instead (their parameters are already identical)."""
        if self.cfg.sync_mode == "gradients":
            return False
        return iteration % self.cfg.param_sync_interval == 0 or iteration == self.num_iterations

    def _update(self, rollout: Rollout, adv_stats: Optional[tuple[float, float]], iteration: int) -> dict[str, float]:
        """PPO on this rank's rollout, the advantages (and value targets) normalised with the statistics of all
        ranks, at the rate of the schedule."""
        cfg, run = self.cfg, self.run
        if cfg.anneal_lr:
            self.learner.set_learning_rate(
                annealed_learning_rate(cfg.learning_rate, run.global_step, cfg.total_timesteps)
            )
        elif cfg.adaptive_lr and run.learning_rate is not None:
            self.learner.set_learning_rate(run.learning_rate)
        start = time.time()
        value_stats = value_scale(run.value_rms) if cfg.normalize_value else None
        metrics = self.learner.train_step(rollout.batch, lambda adv: adv_stats, value_stats)
        check_finite(self.model, metrics, self.ctx.rank, iteration)
        metrics.update({"charts/rollout_seconds": rollout.seconds, "charts/train_seconds": time.time() - start})
        return metrics

    def _gather_metrics(
        self, iteration: int, local: dict[str, float], rollout: Rollout
    ) -> tuple[dict[str, float], bool]:
        """Metrics averaged over ranks and the episodes of every actor of every rank; the round goes into the
        run state. Returns the metrics and whether the mean recent return is a new best."""
        run = self.run
        ended = sorted(  # by step, then env index: the same order whichever actor stepped which env
            (end, ret, length)
            for r in rollout.reports
            for end, ret, length in zip(r.episode_ends, r.episode_returns, r.episode_lengths)
        )
        metrics, episodes = C.average_metrics(self.ctx, local, [(ret, length) for _, ret, length in ended])
        improved = run.add_episodes([ret for ret, _ in episodes])
        run.iteration, run.global_step = iteration, run.global_step + self.steps_per_round
        if self.cfg.adaptive_lr:  # the next round's rate, from the KL averaged over ranks: the same on every rank
            rate = self.learner.learning_rate
            run.learning_rate = adapted_learning_rate(rate, metrics["losses/approx_kl"], self.cfg.lr_kl_target)
        run.take_actor_states(rollout.reports)
        elapsed = time.time() - self.start_time  # since this process started training; benchmarks read it
        metrics.update(
            {
                "charts/episodes": float(len(episodes)),
                "charts/episodic_return": float(np.mean([e[0] for e in episodes])) if episodes else math.nan,
                "charts/episodic_length": float(np.mean([e[1] for e in episodes])) if episodes else math.nan,
                "charts/episodic_return_avg100": run.mean_recent_return(),
                "charts/SPS": (run.global_step - self.rate_start[1]) / (time.time() - self.rate_start[0]),
                "charts/elapsed_seconds": elapsed,
            }
        )
        return metrics, improved

    def _log_and_save(self, metrics: dict[str, float], improved: bool) -> None:
        if self.ctx.is_main:  # rank 0's own work; a failure is told to the others at the next settle
            self.agreement.own_work(self.logger.log, self.run.iteration, self.run.global_step, metrics)
        self.checkpointer.after_round(self.learner, self.run, self.num_iterations, improved, self.agreement.own_work)

    def _evaluate(self, iteration: int) -> None:
        """Hand the round's policy to the evaluator (with what a best checkpoint of it would hold), and log the
        evaluations that finished. The gather is a collective: every rank joins it on the same rounds."""
        cfg, run = self.cfg, self.run
        if cfg.eval_interval and (iteration % cfg.eval_interval == 0 or iteration == self.num_iterations):
            states = self.checkpointer.gather(True, self.learner, run)
            if self.evaluator is not None:
                request = Evaluation(iteration, run.global_step, keep=(copy.deepcopy(run), states))
                policy = mean_policy([r["actor"] for r in states])  # exactly the best checkpoint's "actor"
                self.agreement.own_work(self.evaluator.submit, request, policy, run.obs_rms)
        if self.evaluator is not None:
            for done in self.agreement.own_work(self.evaluator.poll) or []:
                self._record_evaluation(done)

    def _finish_evaluations(self) -> None:
        """Rank 0, after the last round: wait for the evaluations still running (the last round's included)."""
        if self.evaluator is not None:
            for done in self.agreement.own_work(self.evaluator.finish, EVAL_FINISH_TIMEOUT) or []:
                self._record_evaluation(done)

    def _record_evaluation(self, done: Evaluation) -> None:
        """Rank 0: log an evaluation at the global step of its round; a new best writes the best checkpoint of
        that round's state (the policy evaluated, the statistics it was evaluated with)."""
        self.agreement.own_work(self.logger.log_evaluation, done, self.evaluator.replaced)
        score = done.metrics()["eval/episodic_return"]
        if score > self.run.best_eval_return:
            self.run.best_eval_return = score
            then, states = done.keep
            then.best_eval_return = score
            evaluation = {"iteration": done.iteration, "global_step": done.global_step, **done.metrics()}
            self.agreement.own_work(self.checkpointer.write, self.checkpointer.best, then, states, evaluation)

    def _record(self, iteration: int, metrics: dict[str, float], frozen_obs_rms, adv_stats, rollout: Rollout) -> None:
        if self.recorder is not None:
            self.recorder.record(self, iteration, metrics, frozen_obs_rms, adv_stats, rollout)

    # ---- before the first round -----------------------------------------------------------------------------
    def _resume(self) -> list[str]:
        """Refuse a round that cannot fit this node; restore the checkpoint to continue from, if any. Returns notes
        for the user."""
        ctx = self.ctx
        self.agreement.own_work(
            check_round_fits, self.spec, ctx.local_world_size, free_shared_memory(), available_memory()
        )
        self.resume_path, notes = self.checkpointer.resume(
            self.agreement, self.run, self.learner, self.actors, self.restart_count > 0
        )
        return notes

    def _plan(self) -> None:
        """The rounds left to reach total_timesteps (on another world size a round holds another number of
        steps), and round 0: a run without statistics yet (a fresh start) steps one round with the initial
        policy to seed them, so that every update, the first included, sees normalised observations and scaled
        rewards. Its steps count in global_step; nothing is trained on it (re-normalising round 1's data
        instead is impossible: its bootstrap values came from unnormalised final observations)."""
        cfg, run = self.cfg, self.run
        seeding = statistics.unseeded(cfg, run)
        left = cfg.total_timesteps - run.global_step - (self.steps_per_round if seeding else 0)
        self.num_iterations = run.iteration + max(0, math.ceil(left / self.steps_per_round))
        self.seeding = seeding and self.num_iterations > run.iteration

    def _start_compile(self) -> Optional[compiled.Background]:
        """Every rank compiles its own PPO step, on a thread, while its actors start; after the resume, whose state
        the compile's trial step puts back. A rank whose step cannot compile trains eagerly."""
        cfg = self.cfg
        if not cfg.compile:
            return None
        return compiled.Background(self.learner.compile, minibatch_rows(cfg), self.ctx.device)

    def _finish_compile(self, compiling: Optional[compiled.Background]) -> None:
        if compiling is not None:  # rank 0 says how it went on every rank
            compiling.finish(functools.partial(C.gather_to_main, self.ctx), self.logger and self.logger.message)

    def _open_outputs(self, stack: contextlib.ExitStack) -> RunLogger:
        """Rank 0: the run folder, config.yaml, TensorBoard and metrics.csv."""
        run, facts = (
            self.run,
            {
                "run_name": self.run_name,
                "world_size": self.ctx.world_size,
                "actors_per_learner": self.actors,
                "split": self.topology.describe(self.cfg.envs_per_actor),
                "steps_per_round": self.steps_per_round,
                "num_iterations": self.num_iterations,
                "resumed_from": str(self.resume_path) if self.resume_path else None,
                "torchelastic_run_id": self.elastic_id,
                "torchelastic_restart_count": self.restart_count,
            },
        )
        total = run.global_step + (self.num_iterations - run.iteration + self.seeding) * self.steps_per_round
        logger = open_run_folder(self.run_dir, self.cfg, facts, total, self.resume_path is not None, run.global_step)
        stack.callback(logger.close)
        return logger

    def _actor_pool(self) -> ActorPool:
        return ActorPool(
            self.cfg,
            rank=self.ctx.rank,
            num_actors=self.actors,
            obs_dim=self.spec.obs_dim,
            act_dim=self.spec.act_dim,
            pin_memory=self.ctx.device.type == "cuda",
            carried=self.run.envs_carried,
            first_round=self.run.iteration + (0 if self.seeding else 1),
            critic_dim=self.spec.critic_dim,
        )

    def _say_start(self, notes: list[str]) -> None:
        if self.logger is None:
            return
        cfg, say = self.cfg, self.logger.message
        where = (
            f"{self.ctx.world_size} learner(s) on {self.ctx.device.type}, {self.topology.describe(cfg.envs_per_actor)}"
        )
        rounds = f"{self.num_iterations} rounds of {self.steps_per_round} steps"
        source = describe(cfg.env_id, cfg.policy, cfg.config)  # the preset, another config, or the defaults
        say(f"{cfg.env_id}, {source}: {rounds}, {where}; outputs in {self.run_dir}")
        if self.resume_path is not None:
            say(
                f"resumed from {self.resume_path} at round {self.run.iteration}, step {self.run.global_step:,}"
                + (f" (restart {self.restart_count} of the torchelastic group)" if self.restart_count else "")
            )
        elif cfg.resume == "auto":
            say(f"no checkpoint of run {self.run_name} yet: starting it fresh")
        for note in notes:
            say(note)
        if self.seeding:
            whose = "this run adds" if self.resume_path is not None else "of the initial policy"
            say(f"round 0: {self.steps_per_round} steps seed the statistics {whose} (not trained on)")
