"""Same numbers, bit for bit: the reference runs on a git revision and on this checkout, compared.

    python scripts/same_numbers.py --base REV             # REV's code (a git worktree) against the working tree
    python scripts/same_numbers.py --base REV --only solo
    python scripts/same_numbers.py --base REV --flags=--no-compile   # this checkout's runs with extra flags

For a change that must not change what the program computes (a refactoring): each tree runs

- solo:       python train.py, HalfCheetah-v5, seed 3, 20 training rounds
- solo_stop:  the same, stopped by SIGTERM after round 5 and resumed with the command it printed
- ddp:        torchrun --standalone --nproc_per_node=2 train.py, the same with --param-sync-interval 2
- ddp_stop:   the same, SIGTERM to torchrun after round 5, resumed

and the script compares, run by run, metrics.csv (every column but the timings) and every tensor and value of
the latest and the best checkpoint (but how long its evaluation took), bit for bit. It prints one line per run
and exits 1 on any difference.
A stop lands after round 5 when the signal comes during round 6's rollout; when it lands later, that run is
tried again (up to 3 times). Each tree's runs go to its own runs/same_numbers/ (the same relative path, so the
configs saved in the checkpoints compare equal).
"""

from __future__ import annotations

import argparse
import csv
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from worktree import base_worktree  # scripts/, on sys.path when a script runs

ROOT = Path(__file__).resolve().parent.parent
RUNS = "runs/same_numbers"
ROUNDS, STOP_AFTER = 20, 5
STEPS_PER_ROUND = 2048  # a learner's round of the HalfCheetah preset: 2 actors x 8 envs x 128 steps
TIMING_COLUMNS = {"charts/SPS", "charts/elapsed_seconds", "charts/rollout_seconds", "charts/train_seconds"}
TIMING_KEYS = {"eval/seconds"}  # in a checkpoint's record of its evaluation: how long it took, not what it computed
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def train_flags(name: str, world: int, extra: tuple[str, ...] = ()) -> list[str]:
    total = (ROUNDS + 1) * STEPS_PER_ROUND * world  # round 0 seeds the statistics, then ROUNDS rounds train
    return [
        "train.py",
        "--env-id",
        "HalfCheetah-v5",
        "--seed",
        "3",
        "--total-timesteps",
        str(total),
        "--save-interval",
        "4",
        "--runs-dir",
        RUNS,
        "--run-name",
        name,
        *extra,
    ]


RUNS_OF = {"solo": ([sys.executable], 1, ()), "ddp": (TORCHRUN, 2, ("--param-sync-interval", "2"))}


def run_to_end(tree: Path, command: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} in {tree} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def stop_and_resume(tree: Path, command: list[str], name: str) -> None:
    """Start, SIGTERM once round STOP_AFTER is logged, then run the printed resume command to the end."""
    for attempt in range(3):
        shutil.rmtree(tree / RUNS / name, ignore_errors=True)
        proc = subprocess.Popen(command, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        metrics = tree / RUNS / name / "metrics.csv"
        while proc.poll() is None and _rows(metrics) < STOP_AFTER:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
        out, err = proc.communicate(timeout=600)
        line = next((text for text in out.splitlines() if text.startswith("stopped by SIGTERM")), None)
        if line is None:
            raise SystemExit(f"{name} in {tree}: no stop line\n{out[-2000:]}\n{err[-3000:]}")
        if f"after round {STOP_AFTER} of" in line:
            resume = shlex.split(line.split("Resume with: ", 1)[1])
            launcher = TORCHRUN if resume[0] == "torchrun" else [sys.executable]
            script = resume.index("train.py")
            run_to_end(tree, [*launcher, *resume[script:]])
            return
        print(f"  {name}: {line.split(';')[0]}, not after round {STOP_AFTER}: again ({attempt + 1}/3)", flush=True)
    raise SystemExit(f"{name} in {tree}: the stop never landed after round {STOP_AFTER}")


def _rows(path: Path) -> int:
    try:
        with open(path) as f:
            return max(0, sum(1 for _ in f) - 1)
    except OSError:
        return 0


def run_all(tree: Path, only: list[str], flags: tuple[str, ...] = ()) -> None:
    for base, (launcher, world, extra) in RUNS_OF.items():
        extra = (*extra, *flags)
        if base in only:
            print(f"  {tree}: {base}", flush=True)
            shutil.rmtree(tree / RUNS / base, ignore_errors=True)
            run_to_end(tree, [*launcher, *train_flags(base, world, extra)])
        if f"{base}_stop" in only:
            print(f"  {tree}: {base}_stop", flush=True)
            stop_and_resume(tree, [*launcher, *train_flags(f"{base}_stop", world, extra)], f"{base}_stop")


def differences(a: Any, b: Any, where: str, added: list[str]) -> list[str]:
    """Where two nested checkpoint values differ: tensors bit for bit (dtype and shape too), the rest by ==.

    A key only this checkout's checkpoint has (a new config field, a new state at its default) goes into
    `added`, not into the differences: a feature that is off computes the same numbers; a key that is gone is
    a difference."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in the base" for k in sorted(set(a) - set(b), key=str)]
        added += [f"{where}.{k}" for k in sorted(set(b) - set(a), key=str)]
        for k in sorted(set(a) & set(b) - TIMING_KEYS, key=str):
            out += differences(a[k], b[k], f"{where}.{k}", added)
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]", added)]
    return [] if a == b or (a != a and b != b) else [where]  # a != a: NaN equals NaN here


def compare(base: Path, mine: Path, name: str) -> tuple[list[str], list[str]]:
    """(differences, keys only this checkout's checkpoints have)."""
    problems: list[str] = []
    summary: list[str] = []  # how far apart, when they differ
    added: list[str] = []
    rows = []
    for tree in (base, mine):
        with open(tree / RUNS / name / "metrics.csv", newline="") as f:
            rows.append([{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in csv.DictReader(f)])
    if rows[0] != rows[1]:
        diff = next((i for i, (x, y) in enumerate(zip(*rows)) if x != y), min(map(len, rows)))
        problems.append(f"metrics.csv differs from row {diff + 1} ({len(rows[0])} and {len(rows[1])} rows)")
    for suffix in ("", "_best"):
        files = [tree / RUNS / name / f"model_{name}{suffix}.pt" for tree in (base, mine)]
        a, b = (torch.load(f, map_location="cpu", weights_only=True) for f in files)
        problems += [f"{files[1].name}: {d}" for d in differences(a, b, "checkpoint", added)]
        if suffix == "" and problems:  # how far apart: the policies' largest difference and the final returns
            gap = max((x - y).abs().max().item() for x, y in zip(a["actor"].values(), b["actor"].values()))
            summary.append(f"largest parameter difference {gap:.3g}")
    last = [r[-1].get("charts/episodic_return_avg100") for r in rows]
    if problems:
        problems += [*summary, f"last return_avg100 {last[0]} and {last[1]}"]
    return problems, sorted(set(added))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the git revision whose numbers are the reference")
    parser.add_argument(
        "--only",
        nargs="+",
        default=["solo", "solo_stop", "ddp", "ddp_stop"],
        choices=["solo", "solo_stop", "ddp", "ddp_stop"],
    )
    parser.add_argument("--flags", default="", help="extra train.py flags for this checkout's runs, e.g. --no-compile")
    args = parser.parse_args()
    with base_worktree(args.base, "same_numbers_") as (base, _):
        revision = subprocess.run(
            ["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        print(f"base {revision} in {base}; this checkout {ROOT}", flush=True)
        run_all(base, args.only)
        run_all(ROOT, args.only, tuple(shlex.split(args.flags)))
        failed = False
        for name in args.only:
            problems, added = compare(base, ROOT, name)
            failed = failed or bool(problems)
            print(
                f"{name}: "
                + (
                    "the same, bit for bit (metrics.csv without timings; latest and best checkpoints)"
                    if not problems
                    else "DIFFERENT: " + "; ".join(problems[:10] + problems[-2:])
                )
                + (f" (new keys in this checkout's checkpoints: {', '.join(added)})" if added else ""),
                flush=True,
            )
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
