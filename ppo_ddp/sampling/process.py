"""The actor process: the entry point an `ActorPool` (ppo_ddp/sampling/pool.py) starts, and its messages.

Started with a spawn or forkserver context (ppo_ddp/sampling/children.py), an actor process attaches to the shared block
(layout in ppo_ddp/storage/shared.py), builds its `Actor` (ppo_ddp/sampling/actor.py), then serves rounds: on a small
("round", k, slot) message it samples round k into that rollout slot and answers with a small `ActorReport` (rollout
data never goes through a pipe). It ignores SIGINT and SIGTERM (stopping is the learner's decision), exits quietly on
EOF from its learner, and sends an exception back with its traceback.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import multiprocessing.connection
import signal
import traceback
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ppo_ddp.configuration.config import Config
from ppo_ddp.sampling.actor import Actor
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers

IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The learner's to handle (ppo_ddp/distributed/signals.py); actors and the forkserver ignore them from their start."""


@dataclass(frozen=True)
class ActorArgs:
    """What an actor process is started with (pickled once, at its start)."""

    cfg: Config
    rank: int
    actor_id: int
    buffer_spec: BufferSpec
    shm_name: str
    carried: Optional[dict[str, Any]] = None
    """What the actor carried into its next round when the run stopped (Actor.carried), or None: new episodes."""


def _send(conn: mp.connection.Connection, msg: Any) -> bool:
    try:
        conn.send(msg)
        return True
    except (OSError, EOFError):  # the learner is gone
        return False


def _error_message(exc: BaseException, round_k: Optional[int]) -> tuple:
    return (
        "error",
        {
            "summary": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc)),
            "env_index": getattr(exc, "env_index", None),
            "step": getattr(exc, "step", None),
            "round": round_k,
        },
    )


def actor_main(conn: mp.connection.Connection, args: ActorArgs) -> None:
    """Entry point of an actor process: build, report ready, then serve rounds until "close" or EOF."""
    for sig in IGNORED_SIGNALS:  # Ctrl-C and SIGTERM are the learner's; it closes the pool
        signal.signal(sig, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the learner asks for a stack dump of a stuck actor
    torch.set_num_threads(1)
    buffers: Optional[SharedBuffers] = None
    actor: Optional[Actor] = None
    try:
        try:
            buffers = SharedBuffers.attach(args.buffer_spec, args.shm_name)
            actor = Actor(args.cfg, args.rank, args.actor_id, buffers)
            if args.carried is not None:  # a resumed run: its episodes continue where they stopped
                actor.restore(args.carried)
        except BaseException as exc:
            _send(conn, _error_message(exc, None))
            return
        if not _send(conn, ("ready",)):
            return
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the learner died: exit quietly
                return
            if msg[0] != "round":
                return
            try:
                report = actor.sample(msg[1], msg[2])
            except BaseException as exc:
                _send(conn, _error_message(exc, msg[1]))
                return
            if not _send(conn, ("done", msg[1], report)):
                return
    finally:
        if actor is not None:
            actor.close()
        if buffers is not None:
            buffers.close()
        conn.close()
