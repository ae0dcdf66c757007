"""How a learner starts its child processes (actors, the evaluator), and how their failures read: the diagnosis of
an actor that failed, died or got stuck (`actor_error`, `gone_error`, `stuck_error`).

Children start from a spawn or forkserver context (never fork: the learner may hold CUDA and threads), with SIGINT
and SIGTERM ignored and single-threaded math libraries (`child_start_state`); an actor's failure reaches the
learner as an `ActorError` naming rank and actor and carrying the actor's traceback.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Optional

from ppo_ddp.errors import ActorError
from ppo_ddp.sampling.process import IGNORED_SIGNALS

CLOSE_TIMEOUT = 5.0
"""Seconds idle actors get to exit on a "close" message before they are killed."""
FORKSERVER_PRELOAD = ["ppo_ddp.sampling.process", "mujoco"]
"""Imported once in the forkserver, so each actor starts without re-importing torch, gymnasium and MuJoCo."""


def mp_context(method: str) -> mp.context.BaseContext:
    """The multiprocessing context every child of a learner starts from (actors and the evaluator alike)."""
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""Set for the actor processes at their start: an actor is one core's worth of work, and a math library's
worker threads would compete with the other actors (torch.set_num_threads cannot reach numpy's OpenBLAS)."""


@contextlib.contextmanager
def child_start_state() -> Iterator[None]:
    """Start children (and the forkserver) with SIGINT and SIGTERM ignored and single-threaded math libraries.

    Ignored signals stay ignored across exec, so an actor ignores them from its first instruction, not only
    once actor_main runs; so does the forkserver, whose death would look like the death of every actor.
    The learner's own handlers and environment are restored on exit.
    """
    saved_env = {k: os.environ.get(k) for k in SINGLE_THREAD_ENV}
    os.environ.update(SINGLE_THREAD_ENV)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in IGNORED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def describe_exit(exitcode: Optional[int]) -> str:
    """A child's exit code for a user: the signal's name when a signal killed it."""
    if exitcode is None:
        return "exit code unknown"
    if exitcode < 0:
        try:
            return f"exit code {exitcode} (killed by {signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    return f"exit code {exitcode}"


# ---- how an actor's failure reads: the learner's diagnosis, one ActorError naming rank and actor -------------
def actor_error(rank: int, a: int, info: dict[str, Any]) -> ActorError:
    """The error an actor reported (its "error" message): where it was, what it said, its traceback."""
    where = []
    if info.get("env_index") is not None:
        where.append(f"env {info['env_index']}")
    if info.get("step") is not None:
        where.append(f"step {info['step']}")
    where.append(f"round {info['round']}" if info.get("round") is not None else "during start-up")
    return ActorError(
        f"rank {rank} actor {a} failed ({', '.join(where)}): {info['summary']}",
        rank=rank,
        actor_id=a,
        traceback_text=info["traceback"],
        env_index=info.get("env_index"),
        step=info.get("step"),
    )


def gone_error(rank: int, a: int, conn: Connection, proc: BaseProcess) -> ActorError:
    """The actor's process ended or its pipe broke: its last message if it left one, else how it died."""
    with contextlib.suppress(Exception):
        if conn.poll(0):
            msg = conn.recv()
            if msg[0] == "error":
                return actor_error(rank, a, msg[1])
    proc.join(timeout=1.0)
    return ActorError(
        f"rank {rank} actor {a} (pid {proc.pid}) died unexpectedly, {describe_exit(proc.exitcode)}",
        rank=rank,
        actor_id=a,
        exitcode=proc.exitcode,
    )


def stuck_error(rank: int, procs: Sequence[BaseProcess], actors: list[int], what: str) -> ActorError:
    """Actors that did not answer in time: each dumps its Python stack to stderr (faulthandler, SIGUSR1)."""
    for a in actors:
        with contextlib.suppress(Exception):
            if procs[a].pid is not None:
                os.kill(procs[a].pid, signal.SIGUSR1)
    time.sleep(0.2)
    names = ", ".join(str(a) for a in actors)
    return ActorError(
        f"rank {rank} actor{'s' if len(actors) > 1 else ''} {names} did not {what}; "
        f"stuck or far slower than expected (their Python stacks were dumped to stderr)",
        rank=rank,
        actor_id=actors[0],
    )
