"""Time to score against the peers, on one machine, each trainer alone and on its own stock settings: ppo_ddp's
default command (`python train.py --env-id ENV`, the env's preset and nothing else: one row per env), rl_games with
EnvPool (its stock `<env>_envpool.yaml` on the CPU) and SB3's PPO with the rl-baselines3-zoo's hyperparameters. A
variant of ppo_ddp is a trainer of its own, named on the command line: "ppo_ddp --no-overlap" (the preset and a
flag), "ppo_ddp scale/ant" (another preset). "rl_games" is its PyPI release, "rl_games main" its repository's newest.

    python scripts/bench_peers.py                                    # 5 envs, seeds 1-3 (SB3: seed 1), 20 min cap
    python scripts/bench_peers.py --envs Hopper-v5 --trainers ppo_ddp rl_games --seeds 1 --cap-minutes 5
    python scripts/bench_peers.py --skip-done-here                   # continue: only runs without a row of this CPU
    python scripts/bench_peers.py --table                            # the table of the rows so far, no runs
    python scripts/bench_peers.py --envs Ant-v5 --trainers ppo_ddp "ppo_ddp scale/ant" --seeds 1   # and a variant

Each run starts from a new process and is timed from there (imports, env creation and compilation included); it
ends when its training return, the mean over the last 100 finished episodes (SB3's and rl_games' default window;
ppo_ddp's `charts/episodic_return_avg100`), first reaches the env's score (SCORES), when the cap passes, or when the
trainer's own budget ends. Its row (docs/benchmarks/peers.csv, replacing an earlier row of the same env, trainer
and seed) has the steps and seconds at the score, or none, and the steps, seconds and return at its end, with the
CPU and the trainer's version. The table: the median over seeds of the time to score ("> cap" where fewer than half
the seeds reached it), and the speed-up of ppo_ddp's default command over each peer whose rows ran on its CPU (a
variant's rows are shown, not compared).

The peers run where they install, a venv of their own beside the project's (registry packages only; rl-games 1.6.5
from PyPI runs EnvPool's v5 MuJoCo envs, its packaged configs name v4 and are read with v5, as its repository's main
has them; CUDA's mixed precision, which Humanoid's config asks for, is off on the CPU):

    python3 -m venv .venv-peers
    .venv-peers/bin/pip install torch==2.13.0
    .venv-peers/bin/pip install rl-games==1.6.5 envpool==1.2.5

and "rl_games main" in a venv of its own, from a clone of github.com/Denys88/rl_games (2.0.0 on 2026-12-07, commit
262cf20; its stock configs name v5 and run unchanged):

    python3 -m venv .venv-peers-main
    .venv-peers-main/bin/pip install torch==2.13.0
    .venv-peers-main/bin/pip install ./rl_games envpool==1.2.5

The peers' runs are scripts/peer_workers.py's. SB3 runs in the project's venv (`pip install -e ".[bench]"`:
stable-baselines3 2.9.2). Nothing else may run on the machine meanwhile: every figure here is a wall-clock time.
SIGTERM or SIGINT (Ctrl-C) stops the run in progress and ends the batch (exit 143 or 130), without its row.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # ppo_ddp and benchmark_returns, for the parent (the workers import neither)
SCORES = {"HalfCheetah-v5": 5000, "Hopper-v5": 3000, "Walker2d-v5": 3000, "Ant-v5": 3000, "Humanoid-v5": 5000}
STOP_GRACE = 60.0  # seconds a stopped run may take to end its round and exit
STOPPED = (0, -signal.SIGTERM, -signal.SIGKILL, 143)  # ended by its budget or by stop(); 143: ppo_ddp's SIGTERM exit
PEERS_PYTHON = {
    "rl_games": ROOT / ".venv-peers" / "bin" / "python",
    "rl_games main": ROOT / ".venv-peers-main" / "bin" / "python",
}
PEER_WORKERS = Path(__file__).resolve().parent / "peer_workers.py"  # the peers' runs: `peer_workers.py sb3 ENV SEED`
CSV = ROOT / "docs" / "benchmarks" / "peers.csv"
FIELDS = ["env", "trainer", "seed", "score", "reached_steps", "reached_seconds", "end_steps", "end_seconds",
          "end_return", "cap_seconds", "cpu", "version", "date"]  # fmt: skip


class Run:
    """One trainer's process and the (seconds, steps, return) points it has reported, each stamped on arrival."""

    def __init__(self, cmd: list[str], cwd: Path, metrics_csv: Path | None) -> None:
        self.points: list[tuple[float, int, float]] = []
        self.log = open(cwd / "log.txt", "w")
        self.start = time.monotonic()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
        out = subprocess.PIPE if metrics_csv is None else self.log
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)  # fmt: skip
        source = self._read_lines if metrics_csv is None else lambda: self._read_csv(metrics_csv)
        threading.Thread(target=source, daemon=True).start()

    def _stamp(self, steps: int, ret: float) -> None:
        self.points.append((time.monotonic() - self.start, steps, ret))

    def _read_lines(self) -> None:
        for line in self.proc.stdout:
            self.log.write(line)
            if line.startswith('{"steps"'):
                point = json.loads(line)
                self._stamp(point["steps"], point["return"])

    def _read_csv(self, path: Path) -> None:
        """ppo_ddp's metrics.csv, a row a round, flushed as written: read as it grows."""
        while not path.exists():
            if self.proc.poll() is not None:
                return
            time.sleep(0.1)
        header, pending = None, b""
        with open(path, "rb") as f:
            while True:
                finished = self.proc.poll() is not None
                chunk = f.read()
                if not chunk:
                    if finished:
                        return
                    time.sleep(0.1)
                    continue
                *lines, pending = (pending + chunk).split(b"\n")
                for values in csv.reader(line.decode() for line in lines):
                    if header is None:
                        header = values
                        continue
                    row = dict(zip(header, values))
                    self._stamp(int(row["global_step"]), float(row["charts/episodic_return_avg100"] or "nan"))

    def stop(self) -> None:
        """SIGTERM to the run's process group, SIGKILL after a grace period. The peers die at once; ppo_ddp ends its
        round and unlinks its shared memory (a SIGKILL would leave the block in /dev/shm), after the timing."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


class StopRequest:
    """SIGTERM or SIGINT to the batch, once received: measure() stops the run in progress and the batch ends. The
    run sits in a session of its own (a terminal's Ctrl-C reaches only the batch), so without this it would outlive
    a SIGTERM, or a SIGINT to a batch started in the background, where SIGINT is ignored. The handler only records
    the signal, never raises: an exception from it could land while the run is being started, leaving it untracked."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._record)

    def _record(self, signum: int, frame: object) -> None:
        self.signum = signum

    def __bool__(self) -> bool:
        return self.signum is not None


STOP = StopRequest()


def trainer_name(value: str) -> str:
    """argparse's check of a --trainers value: a peer's name, or ppo_ddp with a variant after it."""
    name, *variant = value.split()
    if value not in (*PEERS_PYTHON, "sb3") and name != "ppo_ddp":
        raise argparse.ArgumentTypeError(f'{value!r}: use ppo_ddp, rl_games, "rl_games main", sb3 or "ppo_ddp VARIANT"')
    return " ".join([name, *variant])


def trainer_command(trainer: str, env_id: str, seed: int, work: Path) -> tuple[list[str], Path | None]:
    """The command of a run and, for ppo_ddp, the metrics.csv it writes (the peers report on stdout). ppo_ddp's
    trainers: "ppo_ddp" (the env's preset), "ppo_ddp --FLAG" (the preset and a flag), "ppo_ddp NAME" (preset NAME)."""
    if trainer.startswith("ppo_ddp"):
        variant = trainer.split()[1:]
        preset = (
            ["--config", *variant] if variant and not variant[0].startswith("--") else ["--env-id", env_id, *variant]
        )
        cmd = [sys.executable, str(ROOT / "train.py"), *preset, "--seed", str(seed), "--runs-dir", str(work),
               "--run-name", "run"]  # fmt: skip
        return cmd, work / "run" / "metrics.csv"
    python = PEERS_PYTHON.get(trainer, Path(sys.executable))
    return [str(python), str(PEER_WORKERS), trainer.split()[0], env_id, str(seed)], None


def measure(trainer: str, env_id: str, seed: int, cap: float, prefix: Sequence[str] = ()) -> dict | None:
    """One run, to the score, the cap or the end of its own budget, whichever comes first; None if STOP came first.
    prefix: what the command runs under (scripts/bench_cores.py pins it with taskset)."""
    score = SCORES[env_id]
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        work = Path(tmp)
        cmd, metrics_csv = trainer_command(trainer, env_id, seed, work)
        run = Run([*prefix, *cmd], work, metrics_csv)
        reached = None
        try:
            while run.proc.poll() is None and time.monotonic() - run.start < cap and not STOP:
                reached = next((p for p in run.points if p[2] >= score), None)
                if reached:
                    break
                time.sleep(0.2)
            end_seconds = time.monotonic() - run.start
        finally:
            run.stop()
        if STOP:
            return None
        time.sleep(0.3)  # the reader's last points
        reached = reached or next((p for p in run.points if p[2] >= score and p[0] <= cap), None)
        if run.proc.returncode not in STOPPED and not reached:
            tail = (work / "log.txt").read_text()[-3000:]
            raise SystemExit(f"{trainer} on {env_id} seed {seed} failed (exit {run.proc.returncode}):\n{tail}")
    last = run.points[-1] if run.points else (end_seconds, 0, float("nan"))
    return {
        "env": env_id,
        "trainer": trainer,
        "seed": seed,
        "score": score,
        "reached_steps": reached[1] if reached else "",
        "reached_seconds": round(reached[0], 1) if reached else "",
        "end_steps": last[1],
        "end_seconds": round(end_seconds, 1),
        "end_return": round(last[2], 1),
        "cap_seconds": round(cap),
    }


def versions() -> dict[str, str]:
    """Each trainer's version as it ran (ppo_ddp's commit, the peers' packages), by trainer: "ppo_ddp" for its
    variants too."""
    from ppo_ddp.records.run_log import code_version

    def packages(python: Path | str, names: str) -> str:
        code = f"from importlib.metadata import version; print(', '.join(n + ' ' + version(n) for n in {names!r}))"
        proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
        return proc.stdout.strip() or f"not installed ({proc.stderr.strip().splitlines()[-1:]})"

    return {
        "ppo_ddp": f"ppo_ddp {code_version(('ppo_ddp', 'train.py'), short=True)}",
        **{
            t: packages(python, ("rl-games", "envpool", "torch"))
            for t, python in PEERS_PYTHON.items()
            if python.exists()
        },
        "sb3": packages(sys.executable, ("stable-baselines3", "torch")),
    }


def put_row(path: Path, row: dict) -> None:
    from benchmark_returns import read_rows  # the parent's only: the workers' venv has no ppo_ddp

    key = (row["env"], row["trainer"], str(row["seed"]))
    rows = [r for r in read_rows(path) if (r["env"], r["trainer"], r["seed"]) != key] + [row]
    rows.sort(key=lambda r: (list(SCORES).index(r["env"]), r["trainer"], int(r["seed"])))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def median_time(rows: list[dict[str, str]], field: str = "reached_seconds") -> float:
    """The median time to score over seeds (or, field "reached_steps", the steps at it); inf where fewer than half
    the seeds reached it: a seed that missed counts as never reaching it."""
    return statistics.median(float(r[field]) if r["reached_seconds"] else float("inf") for r in rows)


def table(rows: list[dict[str, str]]) -> str:
    """Markdown: per env, each trainer's median time to score (steps at it), its return at the end, the speed-up
    of ppo_ddp's default command over each peer, and the CPU its rows ran on: a speed-up compares rows of one CPU
    only (a batch may measure one env on one day's machine and the next env on another's)."""

    def cell(t: float, group: list[dict[str, str]]) -> str:
        if t == float("inf"):
            return unreached(group)
        steps = median_time(group, "reached_steps")  # the steps of the same median
        return f"{t / 60:.1f} min ({steps / 1e6:.2f}M steps)"

    lines = ["| env (score) | trainer | seeds | CPU | time to score, median | return at the end | ppo_ddp faster |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for env_id, score in SCORES.items():
        groups: dict[str, list[dict[str, str]]] = {}  # trainer -> its rows of this env
        for r in rows:
            if r["env"] == env_id:
                groups.setdefault(r["trainer"], []).append(r)
        times = {t: median_time(group) for t, group in groups.items()}
        ours = times.get("ppo_ddp", float("inf"))
        for trainer, group in sorted(groups.items()):
            ends = ", ".join(f"{float(r['end_return']):.0f}" for r in group)
            cap = float(group[0]["cap_seconds"])
            if trainer.startswith("ppo_ddp"):
                faster = ""
            elif "ppo_ddp" in groups and cpus_of(group) != cpus_of(groups["ppo_ddp"]):
                faster = "— (another CPU)"
            else:
                faster = speedup(times[trainer], ours, cap)
            seeds = " ".join(r["seed"] for r in group)
            cpus = ", ".join(sorted(cpus_of(group)))
            lines.append(f"| {env_id} ({score}) | {trainer} | {seeds} | {cpus} | {cell(times[trainer], group)} "
                         f"| {ends} | {faster} |")  # fmt: skip
    return "\n".join(lines)


def cpus_of(group: list[dict[str, str]]) -> set[str]:
    return {(r.get("cpu") or "?").replace("(R)", "") for r in group}


def unreached(group: list[dict[str, str]]) -> str:
    """Why the median run missed the score: the cap came first, or the trainer's own budget ended before the cap
    (ppo_ddp's 1M-step presets end in minutes; their steps and time say how far they went)."""
    missed = [r for r in group if not r["reached_seconds"]]
    capped = [r for r in missed if float(r["end_seconds"]) >= float(r["cap_seconds"])]
    cap = f"> {float(group[0]['cap_seconds']) / 60:.0f} min"
    if len(capped) == len(missed):
        return f"not reached, {cap}"
    if capped:
        return f"not reached (its budget or {cap})"
    steps = statistics.median(int(r["end_steps"]) for r in missed)
    seconds = statistics.median(float(r["end_seconds"]) for r in missed)
    return f"not reached in its budget ({steps / 1e6:.2f}M steps, {seconds / 60:.1f} min)"


def speedup(theirs: float, ours: float, cap: float) -> str:
    """ppo_ddp's speed-up; where the peer's median is capped, at least the cap over ours."""
    if ours == float("inf"):
        return "—"
    return f"> {cap / ours:.1f}x (theirs capped)" if theirs == float("inf") else f"{theirs / ours:.1f}x"


def run_batch(args: argparse.Namespace, known: dict[str, str], cpu: str, done: set[tuple[str, str, str]]) -> None:
    """Every run the arguments ask for, in turn, each row written as it ends."""
    for env_id in args.envs:
        runs = [(t, s) for t in args.trainers for s in (args.seeds[:1] if t == "sb3" else args.seeds)]
        for trainer, seed in runs:
            if args.skip_done_here and (env_id, trainer, str(seed)) in done:
                continue
            row = None if STOP else measure(trainer, env_id, seed, args.cap_minutes * 60)
            if row is None:  # STOP: the run in progress, if any, was stopped
                return
            version = known["ppo_ddp" if trainer.startswith("ppo_ddp") else trainer]
            row.update(cpu=cpu, version=version, date=time.strftime("%Y-%m-%d"))
            put_row(args.csv, row)
            print(f"[{time.strftime('%H:%M:%S')}] {trainer} {env_id} seed {seed}: reached at "
                  f"{row['reached_seconds'] or '-'} s / {row['reached_steps'] or '-'} steps; end "
                  f"{row['end_return']} at {row['end_seconds']} s", flush=True)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=list(SCORES), choices=list(SCORES))
    p.add_argument("--trainers", nargs="+", type=trainer_name, default=["ppo_ddp", "rl_games", "sb3"],
                   help='ppo_ddp, rl_games, "rl_games main", sb3, "ppo_ddp --FLAG ...", "ppo_ddp PRESET"')  # fmt: skip
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="SB3 runs the first only")
    p.add_argument("--cap-minutes", type=float, default=20.0)
    p.add_argument("--csv", type=Path, default=CSV, help="the rows' file (default: docs/benchmarks/peers.csv)")
    p.add_argument("--table", action="store_true", help="print the table of the rows; no runs")
    p.add_argument("--skip-done-here", action="store_true", help="skip runs with a row of this CPU: continue a batch")
    args = p.parse_args()
    if not args.table:
        from benchmark_returns import cpu_model, read_rows

        for peer in set(args.trainers) & set(PEERS_PYTHON):
            if not PEERS_PYTHON[peer].exists():
                p.error(f"{peer} needs its venv at {PEERS_PYTHON[peer].parent.parent}: see this script's docstring")
        STOP.install()
        known, cpu = versions(), cpu_model()
        done = {(r["env"], r["trainer"], r["seed"]) for r in read_rows(args.csv) if r.get("cpu") == cpu}
        run_batch(args, known, cpu, done)
        if STOP:
            name = signal.Signals(STOP.signum).name
            print(f"bench_peers: stopped by {name}; the run in progress was stopped, its row not written",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(128 + STOP.signum)
    from benchmark_returns import read_rows

    print(table(read_rows(args.csv)))


if __name__ == "__main__":
    main()
