"""A running process tree read from /proc (Linux), for the scripts that watch a training run's processes:
bench_throughput's peak RSS per role (`run_tree`), soak's RSS, open fds and threads over time.

Every reader returns nothing (None, [] or {}) for a process that is gone: a tree changes while it is read.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional


def read(path: str) -> Optional[str]:
    """A /proc file's text, or None when it cannot be read (the process is gone, or not ours)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """The pid's children, over all its threads: a child started from another thread (a launcher's worker
    thread) is listed under that thread's task only."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [int(c) for task in tasks for c in (read(f"/proc/{pid}/task/{task}/children") or "").split()]


def tree(root: int) -> list[tuple[int, int]]:
    """(pid, parent pid) of root (parent 0) and all its descendants, each parent before its children."""
    out, todo = [], [(root, 0)]
    while todo:
        pid, parent = todo.pop()
        out.append((pid, parent))
        todo.extend((c, pid) for c in children(pid))
    return out


def status(pid: int) -> dict[str, str]:
    """The fields of /proc/PID/status ("VmRSS": "1234 kB", "Threads": "5", ...)."""
    text = read(f"/proc/{pid}/status") or ""
    return dict((k, v.strip()) for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line))


def mb(field: Optional[str]) -> Optional[float]:
    """A memory field of status ("1234 kB") in MB; None for a missing field."""
    return int(field.split()[0]) / 1024 if field else None


def status_mb(pid: int, key: str = "VmHWM") -> Optional[float]:
    """A memory field of /proc/PID/status in MB (VmHWM: peak RSS, VmRSS: current); None once the process is gone."""
    return mb(status(pid).get(key))


def cmdline(pid: int) -> str:
    """The command line, arguments separated by spaces; "" once the process is gone."""
    return (read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()


class PeakMonitor:
    """Samples VmHWM (peak RSS) of every process under root_pid, in a thread, until stopped; `role(pid)` names
    what a process is (learner, actor, ...), and stop() gives the largest peak of each role."""

    def __init__(self, root_pid: int, role: Callable[[int], str], period: float = 0.25) -> None:
        self.root_pid, self.role, self.period = root_pid, role, period
        self.peaks: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, _ in tree(self.root_pid):
                rss = status_mb(pid)
                if rss is not None:
                    # The role is read each time: a child's first sample may predate its exec, when it was
                    # still a copy of its parent; a new role (after the exec) starts a new peak.
                    role, peak = self.role(pid), self.peaks.get(pid, ("", 0.0))
                    self.peaks[pid] = (role, max(rss, peak[1]) if role == peak[0] else rss)
            self._stop.wait(self.period)

    def stop(self) -> dict[str, float]:
        """Largest peak RSS in MB per role."""
        self._stop.set()
        self._thread.join()
        by_role: dict[str, float] = {}
        for role, rss in self.peaks.values():
            by_role[role] = max(rss, by_role.get(role, 0.0))
        return by_role


def role(pid: int) -> str:
    """What a process of a training run is, by its command line: the peak RSS is reported per role."""
    cmd = cmdline(pid)
    if not cmd:
        return "?"
    if "resource_tracker" in cmd:
        return "resource tracker"
    if "forkserver" in cmd or "spawn_main" in cmd or "multiprocessing" in cmd:
        return "worker"  # ppo_ddp actors, SB3 SubprocVecEnv workers (and the forkserver itself)
    if "torchrun" in cmd or "torch.distributed.run" in cmd:
        return "torchrun agent"
    return "main"  # a learner, or SB3's trainer


def run_tree(cmd: list[str], log: Path, cwd: Path) -> tuple[dict[str, float], float]:
    """Run cmd to completion, sampling peak RSS of its process tree; (peaks by role, wall seconds)."""
    out = open(log, "w")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    monitor = PeakMonitor(proc.pid, role)
    rc = proc.wait()
    peaks = monitor.stop()
    out.close()
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... exited {rc}\n{log.read_text()[-2000:]}")
    return peaks, time.perf_counter() - start
