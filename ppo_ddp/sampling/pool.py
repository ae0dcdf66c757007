"""The learner's side of its actors: an `ActorPool` starts them, runs rounds on them and supervises them.

The pool owns one `SharedBuffers` block (layout in ppo_ddp/storage/shared.py) and `num_actors` processes
(ppo_ddp/sampling/actor.py) started with a spawn or forkserver context (ppo_ddp/sampling/children.py). A round is
`start` then `finish`: start publishes the weights and the frozen statistics into shared memory and sends each actor a
tiny ("round", k, slot) message, and returns; the actor writes rollout[a] of that slot in place and answers with a small
`ActorReport`, which finish waits for. Between the two the learner is free: overlapped rounds update on the other slot
then (ppo_ddp/runner/rounds.py).

Supervision: the pool waits on the actor pipes and the process sentinels together, with a bound of
`cfg.actor_timeout + ROUND_TIME_FACTOR * (slowest round so far)`. An exception in an actor comes back as
an `ActorError` carrying the actor's traceback; a dead actor is noticed at once through its sentinel; a
stuck one after the bound. Every error path closes the pool: actors are killed and joined, and the shared
memory is unlinked. Actors (and the forkserver) start with SIGINT and SIGTERM ignored: torchrun and Slurm
signal a learner's whole process group, and an actor dying of that signal would turn a graceful stop into
an actor failure.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ppo_ddp.configuration.config import Config
from ppo_ddp.errors import ActorError
from ppo_ddp.models.factory import make_model
from ppo_ddp.models.flat import num_parameters, write_flat_parameters
from ppo_ddp.models.normalization import Moments
from ppo_ddp.sampling.actor import ActorReport
from ppo_ddp.sampling.children import CLOSE_TIMEOUT, actor_error, child_start_state, gone_error, mp_context, stuck_error
from ppo_ddp.sampling.process import ActorArgs, actor_main
from ppo_ddp.sampling.split import deal
from ppo_ddp.storage.batch import RolloutBatch
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers

ROUND_TIME_FACTOR = 2.0
"""A round may take this many times the slowest round so far, plus cfg.actor_timeout, before an actor is stuck."""
MIN_STARTUP_TIMEOUT = 60.0
"""Actors get max(cfg.actor_timeout, this) seconds from the pool's start to import, build envs and report ready."""


@dataclass
class Rollout:
    """This rank's round of experience: the actors' reports and the batch that views (CPU) or copies it."""

    reports: list[ActorReport]
    batch: RolloutBatch
    seconds: float
    """What the learner waited for it: the whole round in sync, what the update did not hide when overlapped."""
    buffers: SharedBuffers
    """The rollout slot the actors wrote it into."""
    weights: torch.Tensor
    """The flat parameters the actors acted with (the behaviour policy)."""


class ActorPool:
    """`num_actors` actor processes of one learner (rank) and the shared memory they write into.

    Use as a context manager (or call close()); `collect` runs one round and returns the actors' reports,
    sorted by actor id; the rollout is then in `buffers` ([A, T, E, ...] tensors, see ppo_ddp/storage/shared.py).
    """

    def __init__(
        self,
        cfg: Config,
        rank: int,
        num_actors: int,
        obs_dim: int,
        act_dim: int,
        pin_memory: bool,
        first_round: int = 1,
        carried: Optional[dict[str, Any]] = None,
        critic_dim: int = 0,
    ) -> None:
        """carried: what the rank's envs carried into the next round (ppo_ddp/sampling/split.py's `join` of the
        actors' `Actor.carried`, whatever split they had) to continue from, dealt to these actors; or None.
        critic_dim: the width of the critic's own observation (cfg.critic_obs; 0: none).
        first_round: the number of the first `collect` in the trainer's count (messages name rounds by it)."""
        self.cfg, self.rank, self.num_actors = cfg, rank, num_actors
        dealt = deal(carried, num_actors, cfg.envs_per_actor) if carried is not None else None
        if carried is not None and dealt is None:
            raise ValueError(f"the carried state holds {len(carried['observations'])} envs, not {num_actors} actors' ")
        self.buffers: Optional[SharedBuffers] = None
        self._procs: list[mp.process.BaseProcess] = []
        self._conns: list[mp.connection.Connection] = []
        self._ready = [False] * num_actors
        self._round = first_round - 1
        self._in_flight: Optional[tuple[float, int]] = None  # (start time, slot) of the round the actors are on
        self._slowest_round = 0.0
        self._closed = False
        self._started_at = time.monotonic()
        try:
            with torch.random.fork_rng(devices=[]):  # the parameter count must not consume the learner's RNG
                probe = make_model(cfg, obs_dim, act_dim, critic_dim)
            spec = BufferSpec.for_config(cfg, num_actors, obs_dim, act_dim, num_parameters(probe), critic_dim)
            self.buffers = SharedBuffers.create(spec)
            if pin_memory:
                self.buffers.pin()
            ctx = mp_context(cfg.mp_start_method)
            with child_start_state():
                for a in range(num_actors):
                    parent_conn, child_conn = ctx.Pipe(duplex=True)
                    self._conns.append(parent_conn)
                    proc = ctx.Process(
                        target=actor_main,
                        args=(
                            child_conn,
                            ActorArgs(cfg, rank, a, spec, self.buffers.name, dealt[a] if dealt is not None else None),
                        ),
                        name=f"ppo-actor-r{rank}-a{a}",
                        daemon=True,
                    )
                    proc.start()
                    self._procs.append(proc)
                    child_conn.close()
        except BaseException:
            self._shutdown(graceful=False)
            raise

    # ---- context manager ------------------------------------------------------------------------------
    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self._shutdown(graceful=False)

    @property
    def pids(self) -> list[Optional[int]]:
        return [p.pid for p in self._procs]

    # ---- one round ------------------------------------------------------------------------------------
    def collect(
        self,
        model: torch.nn.Module,
        obs_rms: Optional[Moments],
        ret_rms: Optional[Moments],
        value_rms: Optional[Moments] = None,
        critic_rms: Optional[Moments] = None,
    ) -> list[ActorReport]:
        """One round of a model's policy (any device), start to finish; the rollout is in `buffers` (slot 0 unless
        rounds overlap)."""
        weights = torch.empty(num_parameters(model))
        write_flat_parameters(model, weights)
        self.start(weights, obs_rms, ret_rms, value_rms, critic_rms)
        return self.finish()[0]

    def start(
        self,
        weights: torch.Tensor,
        obs_rms: Optional[Moments],
        ret_rms: Optional[Moments],
        value_rms: Optional[Moments] = None,
        critic_rms: Optional[Moments] = None,
    ) -> None:
        """Publish the flat weights (any device) and frozen statistics, and start the next round on every actor,
        into rollout slot round % slots; returns at once. Any failure (also Ctrl-C here) closes the pool."""
        if self._closed or self._in_flight is not None:
            raise RuntimeError("ActorPool.start on a closed pool or with a round in flight")
        try:
            buffers = self.buffers
            if weights.numel() != buffers.spec.num_params:
                raise ValueError(f"{weights.numel()} parameters, the pool was built for {buffers.spec.num_params}")
            if buffers.pinned:
                torch.cuda.synchronize()  # no asynchronous copy out of the slot may still be reading it
            buffers.weights.copy_(weights.detach().reshape(-1))
            buffers.write_stats(obs_rms, ret_rms, value_rms, critic_rms)
            slot = (self._round + 1) % buffers.spec.slots
            buffers.slot(slot).fill_sentinel()
            if not all(self._ready):
                bound = max(self.cfg.actor_timeout, MIN_STARTUP_TIMEOUT)
                self._await("ready", self._started_at + bound, f"start within {bound:.0f} s")
            self._round += 1
            for a in range(self.num_actors):
                self._send(a, ("round", self._round, slot))
            self._in_flight = (time.monotonic(), slot)
        except BaseException:
            self._shutdown(graceful=False)
            raise

    def finish(self) -> tuple[list[ActorReport], SharedBuffers]:
        """Wait for the round in flight: the actors' reports, sorted by actor id, and the slot that holds it.

        The bound runs from the round's start; reports already in when it has passed are taken (an overlapped round
        is waited for only after the update). Any failure (an actor's exception, death, timeout; also Ctrl-C here)
        closes the pool and raises."""
        if self._closed or self._in_flight is None:
            raise RuntimeError("ActorPool.finish on a closed pool or without a round in flight")
        round_start, slot = self._in_flight
        try:
            bound = self.cfg.actor_timeout + ROUND_TIME_FACTOR * self._slowest_round
            reports = self._await(
                "done",
                round_start + bound,
                f"finish round {self._round} within {bound:.1f} s (actor_timeout {self.cfg.actor_timeout:g} s "
                f"+ {ROUND_TIME_FACTOR:g} x slowest round so far {self._slowest_round:.2f} s)",
            )
            self._slowest_round = max(self._slowest_round, time.monotonic() - round_start)
        except BaseException:
            self._shutdown(graceful=False)
            raise
        self._in_flight = None
        return [reports[a] for a in range(self.num_actors)], self.buffers.slot(slot)

    def _send(self, a: int, msg: Any) -> None:
        try:
            self._conns[a].send(msg)
        except OSError:
            raise gone_error(self.rank, a, self._conns[a], self._procs[a]) from None

    def _await(self, kind: str, deadline: float, what: str) -> dict[int, Any]:
        """Wait for a `kind` message from every actor; raise ActorError on an error, a death or the deadline."""
        pending = (
            set(range(self.num_actors)) if kind == "done" else {a for a in range(self.num_actors) if not self._ready[a]}
        )
        results: dict[int, Any] = {}
        while pending:
            remaining = deadline - time.monotonic()
            conn_of = {self._conns[a]: a for a in pending}
            sentinel_of = {self._procs[a].sentinel: a for a in pending}
            ready = mp.connection.wait(list(conn_of) + list(sentinel_of), timeout=max(remaining, 0.0))
            if not ready:
                raise stuck_error(self.rank, self._procs, sorted(pending), what)
            # messages first: an actor that raised sends its traceback and then exits
            for obj in ready:
                if obj in conn_of:
                    a = conn_of[obj]
                    results[a] = self._receive(a, kind)
                    pending.discard(a)
            for obj in ready:
                if obj in sentinel_of and sentinel_of[obj] in pending:
                    raise gone_error(
                        self.rank, sentinel_of[obj], self._conns[sentinel_of[obj]], self._procs[sentinel_of[obj]]
                    )
        return results

    def _receive(self, a: int, kind: str) -> Any:
        try:
            msg = self._conns[a].recv()
        except (EOFError, OSError):
            raise gone_error(self.rank, a, self._conns[a], self._procs[a]) from None
        if msg[0] == "error":
            raise actor_error(self.rank, a, msg[1])
        if msg[0] != kind or (kind == "done" and msg[1] != self._round):
            raise ActorError(
                f"rank {self.rank} actor {a}: unexpected message {msg[0]!r} while waiting for {kind!r}",
                rank=self.rank,
                actor_id=a,
            )
        if kind == "ready":
            self._ready[a] = True
            return None
        return msg[2]

    # ---- shutdown -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the actors (politely, then kill), join them and unlink the shared memory. Idempotent."""
        self._shutdown(graceful=True)

    def _shutdown(self, graceful: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if graceful:
                for conn in self._conns:
                    with contextlib.suppress(Exception):
                        conn.send(("close",))
                deadline = time.monotonic() + CLOSE_TIMEOUT
                for proc in self._procs:
                    proc.join(timeout=max(0.0, deadline - time.monotonic()))
            # SIGKILL, not SIGTERM: actors ignore SIGTERM, and hold nothing that needs a clean exit (the learner
            # owns the shared memory).
            for proc in self._procs:
                if proc.is_alive():
                    proc.kill()
            for proc in self._procs:
                proc.join(timeout=5.0)
        finally:
            for conn in self._conns:
                with contextlib.suppress(Exception):
                    conn.close()
            if self.buffers is not None:
                self.buffers.close()
