"""Launching the trainer from a test: a background launch with its output in files, the tiny run's arguments,
and the checks of a rank's dump of a round (tests/test_reliability.py, test_exact_resume.py, test_overlap.py, ...).

End to end on CPU like tests/test_train.py: real torchrun (gloo), real actor processes, tiny rounds
(1 actor x 2 envs x 32 steps per rank). Every launch has a timeout, so a hang fails the test instead
of CI. Ranks dump their view of each round (PPO_DDP_DEBUG_DIR), which holds their pids for the signals.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
import torch
from test_train import SMALL

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
TIMEOUT = 180  # seconds for any one launch; a hang fails the test
STEPS_PER_ROUND = 128  # 2 ranks x 1 actor x 2 envs x 32 steps
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# What a rank's dump holds that must repeat exactly across a stop and its resume.
DETERMINISTIC = (
    "losses/policy_loss",
    "losses/value_loss",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/entropy",
    "charts/learning_rate",
    "charts/episodic_return",
    "charts/episodes",
)


class Launch:
    """A background launch (train.py or torchrun) with its output in files, so nothing blocks on a pipe."""

    def __init__(
        self, args: list[str], out_dir: Path, name: str, debug: Optional[Path] = None, new_session: bool = False
    ):
        env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
        # this checkout's package, and tests/ for the scripted envs (`scripted_env:...` ids)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(TESTS), env.get("PYTHONPATH")) if p)
        if debug is not None:
            env["PPO_DDP_DEBUG_DIR"] = str(debug)
        self.debug = debug
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = out_dir / f"{name}.out", out_dir / f"{name}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=new_session
            )
        self.started = time.monotonic()
        self.ended: Optional[float] = None

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in process_tree(self.proc.pid):  # torchrun's workers sit in sessions of their own
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.proc.wait()
            pytest.fail(f"launch did not end within {timeout} s\n{self.output()}")
        self.ended = self.ended or time.monotonic()
        return rc

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def output(self) -> str:
        return f"stdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-6000:]}"

    def wait_for_dump(self, rank: int, iteration: int, timeout: float = TIMEOUT) -> dict:
        """This rank's dump of that round, once written; fails if the launch ends first."""
        path = self.debug / f"rank{rank}_iter{iteration}.pt"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                for _ in range(50):  # torch.save may still be writing it
                    try:
                        return torch.load(path, weights_only=True)
                    except Exception:
                        time.sleep(0.02)
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended (exit {self.proc.returncode}) before round {iteration}\n{self.output()}")
            time.sleep(0.01)
        pytest.fail(f"no dump of round {iteration} within {timeout} s\n{self.output()}")


def train_args(tmp_path: Path, run_name: Optional[str], rounds: int, *extra: str) -> list[str]:
    args = ["train.py", *SMALL, "--total-timesteps", str(steps_after(rounds)), "--runs-dir", str(tmp_path / "runs")]
    return args + (["--run-name", run_name] if run_name else []) + list(extra)


def steps_after(rounds: int) -> int:
    """global_step after that many training rounds of 2 ranks: round 0 (seeding the statistics) counts too."""
    return (rounds + 1) * STEPS_PER_ROUND


def torchrun(
    tmp_path: Path, run_name: Optional[str], rounds: int, *extra: str, launcher: tuple[str, ...] = ()
) -> list[str]:
    return [*TORCHRUN, "--standalone", "--nproc_per_node=2", *launcher, *train_args(tmp_path, run_name, rounds, *extra)]


def worker_exit_codes(text: str) -> list[int]:
    """The exit codes of the workers in torchrun's failure report."""
    return [int(c) for c in re.findall(r"^\s*exitcode\s+:\s*(-?\d+)", text, re.M)]


def dump(debug: Path, rank: int, iteration: int) -> dict:
    return torch.load(debug / f"rank{rank}_iter{iteration}.pt", weights_only=True)


def assert_same_state(a, b, what: str) -> None:
    """Nested dicts/lists of tensors and numbers, equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), what
    elif isinstance(a, dict):
        assert set(a) == set(b), what
        for k in a:
            assert_same_state(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{what}[{i}]")
    else:
        assert a == b, what


def tensorboard_steps(run_dir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def shm_blocks_of(pid: int) -> list[str]:
    """The shared-memory blocks in /dev/shm that process pid made: ppo_ddp names a block for its owner,
    ppo_ddp_<pid>_<hex> (storage/shared.py, block_name)."""
    return glob.glob(f"/dev/shm/ppo_ddp_{pid}_*")


def process_tree(root: int) -> set[int]:
    """The pid and every descendant's, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    return tree
