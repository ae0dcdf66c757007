"""`python train.py` run by a benchmark, and what its metrics.csv says about time: the one place for the scripts that
time training (bench_overlap, bench_update, bench_recurrent, bench_scale, bench_throughput).

metrics.csv has a row per trained round (round 0, which only seeds the statistics, has none): the env steps so far
(`global_step`), the wall seconds since the session started training at the round's end (`charts/elapsed_seconds`),
and the round's rollout and update seconds. A timing leaves out the first `warmup` rows, where the first update
compiles and the caches fill: it starts at the end of row `warmup` (1-based), and each script says how many.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def read_metrics(path: Path) -> list[dict[str, str]]:
    """The rows of a metrics.csv (a run folder's, or the file itself)."""
    path = path / "metrics.csv" if path.is_dir() else path
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class Timing:
    """The rounds after the warm-up: their env steps and wall seconds together, and each round's own seconds."""

    steps: int
    seconds: float  # elapsed_seconds at the last row minus at the row that ends the warm-up
    round_seconds: list[float]  # between each timed row and the row before it
    rollout_seconds: list[float]
    update_seconds: list[float]

    @property
    def sps(self) -> float:
        return self.steps / self.seconds


def timing(rows: Sequence[dict[str, str]], warmup: int) -> Timing:
    """The timing of `rows` (one session's metrics.csv) after its first `warmup` rows (warmup >= 1)."""
    if not 1 <= warmup < len(rows):
        raise ValueError(f"warmup={warmup}: a run of {len(rows)} rounds leaves none to time")
    elapsed = [float(r["charts/elapsed_seconds"]) for r in rows]
    timed = rows[warmup:]
    return Timing(
        steps=int(rows[-1]["global_step"]) - int(rows[warmup - 1]["global_step"]),
        seconds=elapsed[-1] - elapsed[warmup - 1],
        round_seconds=[b - a for a, b in zip(elapsed[warmup - 1 :], elapsed[warmup:])],
        rollout_seconds=[float(r["charts/rollout_seconds"]) for r in timed],
        update_seconds=[float(r["charts/train_seconds"]) for r in timed],
    )


@dataclass(frozen=True)
class Finished:
    """A run that ended with status 0: the whole process's wall seconds, what it printed, its metrics rows."""

    wall: float
    stdout: str
    stderr: str
    rows: list[dict[str, str]]


def train(
    tree: Path,
    work: Path,
    name: str,
    flags: Sequence[str],
    launcher: Sequence[str] = (sys.executable,),
    env: dict[str, str] | None = None,
    timeout: float = 7200,
) -> Finished:
    """`train.py` of the checkout `tree` (this one, or a base revision's worktree) to its end, its run in
    work/name; a failed run ends the benchmark with the run's last words."""
    cmd = [*launcher, "train.py", "--runs-dir", str(work), "--run-name", name, *flags]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{Path(sys.argv[0]).name}: {name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return Finished(wall, proc.stdout, proc.stderr, read_metrics(work / name))
