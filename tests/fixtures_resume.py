"""Group A's helper (the fault and resume tests): train.py's command line run inside the test's process.

A launch of `python train.py` pays ~4.5 s of CPU (its forkserver ~1.5 s more) to start an interpreter and import
torch before its first round, and the tiny runs of these tests train in well under a second. So the one-learner runs
whose process a test does not need to kill or watch from outside (the uninterrupted references, the resumes, the runs
that only make a checkpoint, and the runs stopped by a signal to their learner) train here: `train_here(args)` does
what `python train.py ARGS` does (ppo_ddp/train.py: parse the flags, then ppo_ddp.runner.launch.main with the same
command line and sys.argv), on the CPU as a launch is, with this process's forkserver (started once) starting the
actors. The rounds are bit for bit those of a launch: the learner sets its thread count and seeds itself
(tests/test_exact_resume.py compares the rounds a launched learner logged before it was killed with a run trained
here). Runs on several ranks, and the runs a test kills, stay launches (tests/launches.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

import pytest
import torch
from helpers import signal_handlers_kept

from ppo_ddp.runner.debug import DEBUG_DIR_ENV


@dataclasses.dataclass
class Trained:
    """What `python train.py ARGS` left: its exit status and what it printed."""

    rc: int
    stdout: str
    stderr: str
    running: list[bool] = dataclasses.field(default_factory=list)  # stop_here's: the run went on at each signal

    def output(self) -> str:
        return f"exit {self.rc}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-6000:]}"


def train_here(args: list[str], debug: Optional[Path] = None) -> Trained:
    """`python train.py ARGS` in this process. args as for a launch ([sys.executable, "train.py", *flags], a resume
    command as printed, or the flags alone); PPO_DDP_DEBUG_DIR names debug (or is unset); no GPU is seen, as a launch
    with CUDA_VISIBLE_DEVICES empty sees none. Signal handlers and the environment are put back afterwards."""
    from ppo_ddp.configuration.loading import parse_config
    from ppo_ddp.runner.launch import main

    args = list(args)
    if "train.py" in args:
        args = args[args.index("train.py") + 1 :]
    out, err = io.StringIO(), io.StringIO()
    rc = 0
    with pytest.MonkeyPatch.context() as patch, signal_handlers_kept():
        if debug is None:
            patch.delenv(DEBUG_DIR_ENV, raising=False)
        else:
            patch.setenv(DEBUG_DIR_ENV, str(debug))
        patch.setattr(sys, "argv", ["train.py", *args])  # what a stop's resume command repeats
        patch.setattr(torch.cuda, "device_count", lambda: 0)
        patch.setattr(torch.cuda, "is_available", lambda: False)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main(parse_config(args), ["train.py", *args])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return Trained(rc, out.getvalue(), err.getvalue())


def run_here(args: list[str], debug: Optional[Path] = None) -> Trained:
    """train_here, which must succeed."""
    done = train_here(args, debug)
    assert done.rc == 0, done.output()
    return done


def stop_here(
    args: list[str], debug: Path, after_round: int, signals: tuple[tuple[float, int], ...] = ((0.0, signal.SIGTERM),)
) -> Trained:
    """train_here, with signals sent to this process (the learner's), as `kill` would send them to `python train.py`:
    once the run has dumped round after_round, each (delay, signum) after its delay. Until the run installs its
    handlers, and after it has put them back, a guard takes the signal, and the test fails instead of this process
    ending. The result's `running` says, for each signal sent, whether the run was still going when it was sent."""
    late: list[int] = []
    previous = {n: signal.signal(n, lambda got, _: late.append(got)) for n in {n for _, n in signals}}
    finished = threading.Event()
    running: list[bool] = []

    def send() -> None:
        path = debug / f"rank0_iter{after_round}.pt"
        while not path.exists():
            if finished.wait(0.01):
                return
        for delay, signum in signals:
            if finished.wait(delay):
                return
            running.append(True)
            os.kill(os.getpid(), signum)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        done = train_here(args, debug)
    finally:
        finished.set()
        sender.join()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert not late, f"{[signal.Signals(n).name for n in late]} reached this process outside the run\n{done.output()}"
    done.running = running + [False] * (len(signals) - len(running))
    return done
