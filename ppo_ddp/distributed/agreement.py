"""Agreement between ranks on stops and failures, so that no rank is left waiting in a collective.

A round alternates a rank's own work (its rollout, its update, rank 0's logging and saving), which may fail,
with collectives, which every rank must reach. `Agreement.own_work` runs a piece of own work: a failure is
said on this rank's stderr (with its traceback where that helps) and remembered, and the rank's own work is
skipped until the next `settle`. Every rank calls `settle` at the same points of a round: one all_reduce of
[stop signal, failed] (docs/design.md, "collectives of a round"). When any rank failed, every rank gathers the
one-line reports, rank 0 of each node prints them as one line, and every rank raises `RunFailed` with the
highest exit status; otherwise settle returns the agreed stop signal.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

from ppo_ddp.distributed import collectives as C
from ppo_ddp.distributed import process_group as D
from ppo_ddp.distributed.signals import StopRequests, signal_name
from ppo_ddp.errors import ActorError, CheckpointError, ConfigError, NonFiniteError

T = TypeVar("T")


class RunFailed(RuntimeError):
    """A failure all ranks agreed on: every rank raises it and exits with exit_code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Stopped(Exception):
    """All ranks stopped on a signal after the checkpoint was written; what the stop line tells the user."""

    def __init__(
        self,
        signum: int,
        completed: int,
        num_iterations: int,
        global_step: int,
        checkpoint: Optional[Path],
        run_name: str,
    ) -> None:
        super().__init__(signal_name(signum))
        self.signum, self.completed, self.num_iterations = signum, completed, num_iterations
        self.global_step, self.checkpoint, self.run_name = global_step, checkpoint, run_name


BAD_INPUT = (ConfigError, CheckpointError)
"""Failures that are the user's input: one line, exit status 2."""


class Agreement:
    """This rank's side of the agreement: its own work's failure, and the collective that shares it.

    kept: says which checkpoint a failed run keeps (appended to the failure line), or None when there is none.
    """

    def __init__(self, ctx: D.DistContext, stop: StopRequests, kept: Callable[[], Optional[str]]) -> None:
        self.ctx, self.stop, self.kept = ctx, stop, kept
        self.error: Optional[BaseException] = None

    def own_work(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Optional[T]:
        """fn(*args, **kwargs), or None when it fails or an earlier piece of this round's own work failed."""
        if self.error is not None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            self.fail(e)
            return None

    def fail(self, e: BaseException) -> None:
        """This rank's own work failed: say everything here; the others learn it at the next settle."""
        if isinstance(e, ActorError):
            print(f"train.py: rank {self.ctx.rank}: {e}", file=sys.stderr, flush=True)  # with the actor's traceback
        elif not isinstance(e, (*BAD_INPUT, NonFiniteError)):
            text = "".join(traceback.format_exception(e))
            print(
                f"train.py: rank {self.ctx.rank}: {type(e).__name__} during training:\n{text}",
                file=sys.stderr,
                flush=True,
            )
        self.error = e

    def settle(self, with_stop: bool = False) -> int:
        """Collective: RunFailed on every rank if any rank failed; else the agreed stop signal (0: go on).

        with_stop: this point may end the run on a stop request (the round has changed no state yet).
        """
        signum, failed = C.agree(self.ctx, self.stop.signum if with_stop else 0, self.error is not None)
        if failed:
            mine = _failure_report(self.ctx.rank, self.error) if self.error is not None else None
            reports = [r for r in C.gather_objects(self.ctx, mine) if r]
            message = "; ".join(dict.fromkeys(text for text, _ in reports))  # ranks that found the same say it once
            kept = self.kept()
            if kept is not None:
                message += f" (kept the last good checkpoint {kept})"
            # Said before the clean-up, which torchrun may cut short; its SIGTERM to the ranks still running
            # once one has exited is no stop request any more.
            self.stop.finish()
            if D.is_local_main():
                print(f"train.py: error: {message}", file=sys.stderr, flush=True)
            raise RunFailed(message, max(code for _, code in reports))
        return signum


def _failure_report(rank: int, e: BaseException) -> tuple[str, int]:
    """(one line for the user, exit status) of a rank's failure, small enough to gather."""
    if isinstance(e, BAD_INPUT):
        return str(e), 2
    if isinstance(e, ActorError):
        return e.message, 1
    if isinstance(e, NonFiniteError):
        return str(e), 1
    text = str(e).strip().splitlines()
    return f"rank {rank}: {type(e).__name__}: {text[0] if text else ''}".rstrip(": "), 1
