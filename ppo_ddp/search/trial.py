"""One trial of python -m ppo_ddp.tune: a training run per env in a process of its own, its evaluations as they arrive.

Each env's config is written as a preset into the trial's folder and trained by `python -m ppo_ddp.train --config` in a
session of its own (stdout and stderr to <env>.log). Its eval.csv is read every --poll seconds; each new row is
reported to optuna, and when the pruner says so the trainer is sent SIGTERM (it saves after its round and exits;
it is killed if it has not within STOP_GRACE_S) and the trial ends as pruned. A non-zero exit or a non-finite
evaluation ends the trial as failed (TrialFailed), with the reason in its user attribute fail_reason.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from ppo_ddp.runner.programs import TRAIN_MODULE, package_env
from ppo_ddp.search.space import Space, env_file_name, normalised, write_preset

STOP_GRACE_S = 120.0  # a trainer told to stop finishes its round and its evaluations, then saves


class TrialFailed(Exception):
    """The trial's training failed: the reason goes into the trial's user attribute fail_reason."""


class Objective:
    """One trial: train on each env of the space in turn, report the evaluations, return the mean score."""

    def __init__(self, space: Space, study_dir: Path, poll: float, tag: str) -> None:
        self.space, self.study_dir, self.poll, self.tag = space, study_dir, poll, tag

    def __call__(self, trial: Any) -> tuple[Any, Optional[float]]:
        """The trial's end for optuna: (COMPLETE, its score), (PRUNED, None) or (FAIL, None). KeyboardInterrupt
        (Ctrl-C, SIGTERM) passes, as does optuna's UpdateFinishedTrialError when the study ended the trial meanwhile;
        the trainer is stopped either way."""
        import optuna
        from optuna.trial import TrialState

        params = {d.name: d.suggest(trial) for d in self.space.params}
        trial_dir = self.study_dir / f"trial_{trial.number:04d}"
        # Left by a deleted study of the same name: train.py would append to its eval.csv.
        shutil.rmtree(trial_dir, ignore_errors=True)
        start = time.monotonic()
        self.say(f"trial {trial.number} started: {params}")
        scores: list[float] = []
        try:
            for k, env_id in enumerate(self.space.envs):
                scores.append(self.train_env(trial, params, trial_dir, k, env_id, scores))
        except TrialFailed as e:
            self.say(f"trial {trial.number} failed after {time.monotonic() - start:.0f} s: {e}")
            trial.set_user_attr("fail_reason", str(e))
            return TrialState.FAIL, None
        except optuna.TrialPruned as e:
            self.say(f"trial {trial.number} pruned after {time.monotonic() - start:.0f} s: {e}")
            return TrialState.PRUNED, None
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            self.say(f"trial {trial.number} interrupted; it does not count towards --n-trials")
            raise
        value = sum(scores) / len(scores)
        self.say(f"trial {trial.number} complete after {time.monotonic() - start:.0f} s: score {value:.4g}")
        return TrialState.COMPLETE, value

    def train_env(self, trial: Any, params: dict, trial_dir: Path, k: int, env_id: str, done: list[float]) -> float:
        values = self.space.trial_values(params, env_id)
        name = env_file_name(env_id)
        preset = trial_dir / f"{name}.yaml"
        header = [
            f"trial {trial.number} of study {trial.study.study_name} (python -m ppo_ddp.tune), {self.space.source}"
        ]
        write_preset(preset, values, header)
        cmd = [sys.executable, "-m", TRAIN_MODULE, "--config", str(preset), "--run-name", name]
        cmd += ["--runs-dir", str(trial_dir)]
        monitor = Monitor(trial, self.space, k, env_id, done)
        log = trial_dir / f"{name}.log"
        start = time.monotonic()
        code = run_training(cmd, log, trial_dir / name / "eval.csv", monitor.on_row, self.poll)
        if code != 0:
            raise TrialFailed(f"{env_id}: train.py exited with status {code}: {last_line(log)} (log: {log})")
        score = monitor.final_score()
        trial.set_user_attr(f"return/{env_id}", monitor.final_return())
        trial.set_user_attr(f"seconds/{env_id}", round(time.monotonic() - start, 1))
        return score

    def say(self, text: str) -> None:
        print(f"{self.tag}{text}", flush=True)


class Monitor:
    """The evaluations of one env's training as they arrive: reported to optuna, checked by its pruner."""

    def __init__(self, trial: Any, space: Space, k: int, env_id: str, done: list[float]) -> None:
        self.trial, self.space, self.k, self.env_id, self.done = trial, space, k, env_id, done
        self.target = space.envs[env_id]
        self.returns: list[float] = []
        self.reported: set[int] = set()

    def on_row(self, row: dict[str, str], ended: bool) -> None:
        """Report the running score: the mean over the envs trained so far, this one at its latest evaluation; ask
        the pruner while the trainer runs (once it has ended, stopping it saves nothing)."""
        import optuna

        try:
            ret, global_step = float(row["eval/episodic_return"]), int(row["global_step"])
        except (KeyError, TypeError, ValueError):
            raise TrialFailed(f"{self.env_id}: unreadable eval.csv row {row}") from None
        if not math.isfinite(ret):
            raise TrialFailed(f"{self.env_id}: evaluation return {ret} at step {global_step}")
        self.returns.append(ret)
        value = (sum(self.done) + normalised(ret, self.target)) / (len(self.done) + 1)
        step = self.space.report_step(self.k, global_step)
        if step in self.reported:  # two evaluations nearest the same grid point: optuna keeps the first
            return
        self.reported.add(step)
        self.trial.report(value, step)
        if not ended and self.trial.should_prune():
            raise optuna.TrialPruned(f"{self.env_id} at step {global_step:,}: score {value:.4g} below the median")

    def final_return(self) -> float:
        last = self.returns[-self.space.final_evals :]
        return sum(last) / len(last)

    def final_score(self) -> float:
        if not self.returns:
            raise TrialFailed(f"{self.env_id}: train.py ended without an evaluation")
        return normalised(self.final_return(), self.target)


def read_rows(path: Path) -> list[dict[str, str]]:
    """eval.csv's complete rows (the last line may be half written)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    return list(csv.DictReader(lines))


def run_training(
    cmd: list[str],
    log: Path,
    eval_csv: Path,
    on_row: Callable[[dict[str, str], bool], None],
    poll: float,
    grace: float = STOP_GRACE_S,
) -> int:
    """Run cmd (a train.py) in a session of its own and hand on_row each new row of eval.csv, with whether the
    trainer has ended; its exit status. When on_row raises (a pruned or failed trial) or this worker is
    interrupted, the trainer is stopped."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:  # its own session: the worker decides when it stops, and can kill all of it
        proc = subprocess.Popen(
            cmd,
            env=package_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        seen = 0
        while True:
            ended = proc.poll() is not None  # before the read, so that no row written before the end is missed
            rows = read_rows(eval_csv)
            for row in rows[seen:]:
                seen += 1
                on_row(row, ended)
            if ended:
                return proc.returncode
            time.sleep(poll)
    finally:
        stop_training(proc, grace)


def stop_training(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM: train.py saves after its round and exits; if it has not within grace, kill its whole session."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "(empty log)"
