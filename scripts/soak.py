"""Soak test: a long training run, with the memory (RSS) and open file descriptors of every process over time.

    python scripts/soak.py --minutes 30                       # 2 learners (torchrun, gloo) x 1 actor x 4 envs
    python scripts/soak.py --minutes 10 --out runs/soak -- --env-id Ant-v5 --envs-per-actor 8

Everything after `--` goes to train.py (after the soak's own defaults, so it wins). Every --interval seconds
it walks the launch's process tree through /proc (Linux) and records, per process, its role (torchrun agent,
learner, forkserver, resource tracker, actor or evaluator: both are the forkserver's children), RSS, open fds
and threads, and the shared-memory blocks in /dev/shm. At the end it stops the run with SIGINT (the graceful
stop: checkpoint, resume line) and prints a table per role: the first sample after the warm-up, the last one,
the peak, and the growth per hour from a least-squares line. `samples.csv` in --out holds every sample.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import proc_tree  # scripts/, on sys.path when a script runs

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_TRAIN_ARGS = [
    "--env-id",
    "Hopper-v5",
    "--actors-per-gpu",
    "1",
    "--envs-per-actor",
    "4",
    "--rollout-length",
    "64",
    "--num-minibatches",
    "4",
    "--update-epochs",
    "4",
    "--save-interval",
    "1",
    "--total-timesteps",
    "1000000000",
]
"""Small rounds, so that a soak runs many of them, and a checkpoint every round: leaks per round show."""


def _environ_rank(pid: int) -> str:
    env = proc_tree.read(f"/proc/{pid}/environ") or ""
    for item in env.split("\0"):
        if item.startswith("RANK="):
            return item[5:]
    return "0"


def label(pid: int, parent_role: str, root: int) -> Optional[str]:
    cmd = proc_tree.cmdline(pid)
    if not cmd:
        return None
    rank = _environ_rank(pid)
    if "resource_tracker" in cmd:
        return f"resource tracker (rank {rank})" if pid != root else "resource tracker"
    if "forkserver" in cmd:
        return "actor or evaluator" if parent_role.startswith("forkserver") else f"forkserver (rank {rank})"
    if "train.py" in cmd and pid != root:
        return f"learner rank {rank}"
    if pid == root:
        return "torchrun agent" if "torch.distributed.run" in cmd else f"learner rank {rank}"
    return f"other: {cmd[:40]}"


def sample(root: int) -> list[dict]:
    rows, roles = [], {0: ""}
    for pid, parent in proc_tree.tree(root):  # parents before their children
        role = label(pid, roles.get(parent, ""), root)
        if role is None:
            continue
        if role == "actor or evaluator":
            role = f"actor or evaluator (rank {_environ_rank(pid)})"
        roles[pid] = role
        fields = proc_tree.status(pid)
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        rows.append(
            {
                "pid": pid,
                "role": role,
                "rss_mb": proc_tree.mb(fields.get("VmRSS")) or 0.0,  # one read of status for both fields
                "fds": fds,
                "threads": int(fields.get("Threads", "0")),
            }
        )
    return rows


def shm_blocks(pids: list[int]) -> set[str]:
    """The shared-memory blocks (/dev/shm/psm_*) these processes have mapped."""
    names = set()
    for pid in pids:
        for line in (proc_tree.read(f"/proc/{pid}/maps") or "").splitlines():
            if "/dev/shm/psm_" in line:
                names.add(line.split("/dev/shm/", 1)[1].split()[0])
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the soak")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the first sample that counts")
    parser.add_argument("--nproc", type=int, default=2, help="learners (torchrun --nproc_per_node); 0: python train.py")
    parser.add_argument("--out", default="runs/soak", help="folder for samples.csv and the run itself")
    parser.add_argument("train_args", nargs="*", help="extra train.py flags (after --)")
    args = parser.parse_args()

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train = ["train.py", *DEFAULT_TRAIN_ARGS, "--runs-dir", str(out / "runs"), "--run-name", "soak", *args.train_args]
    if args.nproc > 0:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={args.nproc}",
            *train,
        ]
    else:
        command = [sys.executable, *train]
    print("soak:", " ".join(command), flush=True)
    seen_shm: set[str] = set()
    log = open(out / "train.log", "w")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    start = time.monotonic()
    samples: list[dict] = []
    try:
        while time.monotonic() - start < args.minutes * 60:
            if proc.poll() is not None:
                raise SystemExit(f"soak: the run ended early with status {proc.returncode}; see {out / 'train.log'}")
            t = time.monotonic() - start
            rows = sample(proc.pid)
            shm = shm_blocks([r["pid"] for r in rows])
            seen_shm |= shm
            for row in rows:
                samples.append({"t": round(t, 1), **row, "shm_blocks": len(shm)})
            time.sleep(args.interval)
    finally:
        # The graceful stop, as a terminal's Ctrl-C would do it: checkpoint, resume line, status 130.
        os.killpg(proc.pid, signal.SIGINT)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        log.close()
    with open(out / "samples.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(samples[0]))
        writer.writeheader()
        writer.writerows(samples)

    text = (out / "train.log").read_text(errors="replace")
    rounds = [line for line in text.splitlines() if line.startswith("iter ")]
    stop = [line for line in text.splitlines() if line.startswith("stopped by")]
    print(
        f"\nsoak: {args.minutes:g} min, {len(rounds)} rounds ({rounds[-1].split('|')[1].strip() if rounds else '?'}); "
        f"exit status {rc}; {stop[0] if stop else 'no stop line'}"
    )
    left = sorted(name for name in seen_shm if os.path.exists(f"/dev/shm/{name}"))
    print(
        f"shared-memory blocks: {len(seen_shm)} used over the run, {len(left)} left in /dev/shm after the stop {left}\n"
    )
    report(samples, args.warmup)


def report(samples: list[dict], warmup: float) -> None:
    """Per role (processes of one role summed per sample): first/last/peak after warm-up and growth per hour."""
    print(
        "| process | count | RSS MB first → last (peak) | RSS growth MB/h | fds first → last (peak) | fds growth /h | threads |"  # noqa: E501
    )
    print("|---|---|---|---|---|---|---|")
    roles = sorted({s["role"] for s in samples})
    for role in roles:
        by_t: dict[float, list[dict]] = {}
        for s in samples:
            if s["role"] == role and s["t"] >= warmup:
                by_t.setdefault(s["t"], []).append(s)
        if len(by_t) < 2:
            continue
        ts = np.array(sorted(by_t))
        count = max(len(v) for v in by_t.values())
        rss = np.array([sum(s["rss_mb"] for s in by_t[t]) / len(by_t[t]) for t in ts])  # per process
        fds = np.array([sum(s["fds"] for s in by_t[t]) / len(by_t[t]) for t in ts])
        threads = max(s["threads"] for t in ts for s in by_t[t])
        hours = (ts - ts[0]) / 3600
        rss_slope = np.polyfit(hours, rss, 1)[0]
        fds_slope = np.polyfit(hours, fds, 1)[0]
        print(
            f"| {role} | {count} | {rss[0]:.0f} → {rss[-1]:.0f} ({rss.max():.0f}) | {rss_slope:+.1f} | "
            f"{fds[0]:.0f} → {fds[-1]:.0f} ({fds.max():.0f}) | {fds_slope:+.1f} | {threads} |"
        )
    shm = [s["shm_blocks"] for s in samples if s["t"] >= warmup]
    if shm:
        print(f"\nshared-memory blocks mapped by the run: {min(shm)} → {max(shm)} over the soak")


if __name__ == "__main__":
    main()
