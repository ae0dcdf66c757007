"""How a learner starts its child processes (actors, the evaluator), and how their failures read.

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
from collections.abc import Iterator
from typing import Optional

from ppo_ddp.actor_process import IGNORED_SIGNALS

CLOSE_TIMEOUT = 5.0
"""Seconds idle actors get to exit on a "close" message before they are killed."""
FORKSERVER_PRELOAD = ["ppo_ddp.actor_process", "mujoco"]
"""Imported once in the forkserver, so each actor starts without re-importing torch, gymnasium and MuJoCo."""


class ActorError(RuntimeError):
    """An actor failed, died or got stuck; the message names rank and actor and carries the actor's traceback."""

    def __init__(
        self,
        message: str,
        rank: int,
        actor_id: int,
        traceback_text: str = "",
        exitcode: Optional[int] = None,
        env_index: Optional[int] = None,
        step: Optional[int] = None,
    ) -> None:
        full = message
        if traceback_text:
            full += f"\n\n--- traceback in actor process (rank {rank} actor {actor_id}) ---\n{traceback_text.rstrip()}"
        super().__init__(full)
        self.message = message
        self.rank = rank
        self.actor_id = actor_id
        self.traceback_text = traceback_text
        self.exitcode = exitcode
        self.env_index = env_index
        self.step = step

    def __reduce__(self):  # picklable (e.g. to be gathered from another rank) despite the extra fields
        return type(self), (
            self.message,
            self.rank,
            self.actor_id,
            self.traceback_text,
            self.exitcode,
            self.env_index,
            self.step,
        )


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
