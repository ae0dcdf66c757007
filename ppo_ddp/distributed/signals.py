"""SIGINT / SIGTERM on a learner: ask for a stop at the next safe point; a second one quits at once.

The handler only records the request. The training loop passes it through a collective once per round
(`distributed.agree`), so every rank stops after the same round, rank 0 writes the checkpoint, and no rank
is left waiting in a collective. A second signal raises `ForcedStop` out of whatever the learner is doing
(files stay whole: checkpoints are written to a temp file and renamed); a third one calls os._exit.

The same signal can reach a learner twice for one request: Slurm signals every process of a job step and
torchrun forwards what it got to its workers as well. Copies within DUPLICATE_WINDOW seconds of the first
count as one request.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType
from typing import Any, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DUPLICATE_WINDOW = 1.0
"""Seconds after the first signal during which the same signal again is taken for a duplicate delivery."""


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class ForcedStop(BaseException):
    """A second stop signal: leave now, without the checkpoint (a BaseException so `except Exception` lets it by)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


class StopRequests:
    """Installs the handlers on enter, restores the previous ones on exit (main thread only; elsewhere a no-op).

    `signum` is 0 until a stop is requested, then the number of the first signal.
    """

    def __init__(self, announce: bool = True) -> None:
        self.signum = 0
        self.announce = announce
        self._first_at = 0.0
        self._forced = False
        self._finished = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._finished:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
        self._previous.clear()

    def finish(self) -> None:
        """The stop is done (checkpoint written): ignore stop signals while the process winds down.

        torchrun sends SIGTERM to the learners still running once the first one exits; taken for a second
        request it would turn a clean stop into a forced one, and the default action would kill the learner.
        """
        self._finished = True
        for sig in self._previous:
            signal.signal(sig, signal.SIG_IGN)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        now = time.monotonic()
        if not self.signum:
            self.signum, self._first_at = signum, now
            if self.announce:
                # os.write, not print: the handler may interrupt a print, and a buffered stream is not reentrant.
                _say(
                    f"{signal_name(signum)}: stopping after this round and saving a checkpoint "
                    f"(again to quit at once, without saving)\n"
                )
            return
        if signum == self.signum and now - self._first_at < DUPLICATE_WINDOW:
            return
        if self._forced:  # the cleanup after the second signal is taking too long for the user
            os._exit(exit_code(signum))
        self._forced = True
        raise ForcedStop(signum)


def _say(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:
        pass
