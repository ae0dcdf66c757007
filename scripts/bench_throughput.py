"""End-to-end training throughput of ppo_ddp against Stable-Baselines3 PPO, side by side in one run.

    pip install -e ".[bench]"   # stable-baselines3, matplotlib
    python scripts/bench_throughput.py                 # the comparison; last line `ratio <best ppo_ddp / SB3>`
    python scripts/bench_throughput.py --sweep         # plus the scaling table (actors x envs, world 1 and 2)
    python scripts/bench_throughput.py --memory-rounds 200   # the learner-RSS growth check only

Every trainer does the same algorithmic work on HalfCheetah-v5: 2048 env steps per update in total, 10
epochs of mini-batches of 64, a 64-64 tanh actor and critic, observation and reward normalisation. Each
trainer is its own process tree, run one after the other:

- SB3 PPO (n_steps 256 x 8 envs, batch_size 64, n_epochs 10, VecNormalize) with DummyVecEnv and with
  SubprocVecEnv, at torch's default thread count, and DummyVecEnv once more with torch.set_num_threads(1)
  (on a small MLP the second thread can cost more than it gives); the fastest of these is the baseline.
- `python train.py` (one learner) for each actors_per_gpu x envs_per_actor shape in --one-learner-shapes, and
  with `--overlap` (the actors collect the next round during the update) for each shape in --overlap-shapes.
- `torchrun --standalone --nproc_per_node=2 train.py`, 1024 samples per rank per round, for each shape in
  --two-learner-shapes.

SPS is env steps over wall seconds of the timed window: the first --warmup-rounds updates (process and
env start-up, first allocations) are excluded, then --steps steps are timed, update included. ppo_ddp's
window is read from its metrics.csv (charts/elapsed_seconds at the end of each round); SB3's from a
callback at the start of each rollout and at the end of training. Peak RSS (VmHWM) of every process of
each tree is sampled from /proc while it runs; the table shows the largest per role.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import proc_tree  # scripts/, on sys.path when a script runs
import train_runs

ROOT = Path(__file__).resolve().parent.parent
ENV_ID = "HalfCheetah-v5"
SAMPLES_PER_UPDATE = 2048
MINIBATCH = 64
EPOCHS = 10


# ---------------------------------------------------------------------------------------------- the trainers


@dataclass
class Result:
    name: str
    sps: float
    seconds: float  # of the timed window
    total_wall: float  # of the whole process tree, start-up included
    peaks: dict[str, float]


def sb3_worker(vec: str, threads: int, total: int, warmup_rounds: int, seed: int) -> None:
    """Runs inside its own process: train SB3 PPO and print {"steps", "seconds"} of the timed window as JSON."""
    import torch  # noqa: F401  (the version for the header; the trainers run in their own processes)
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    if threads:
        torch.set_num_threads(threads)

    class Marks(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.marks: list[tuple[int, float]] = []

        def _on_rollout_start(self) -> None:
            self.marks.append((self.num_timesteps, time.perf_counter()))

        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            self.marks.append((self.num_timesteps, time.perf_counter()))

    n_envs = 8
    env = make_vec_env(ENV_ID, n_envs=n_envs, seed=seed, vec_env_cls=DummyVecEnv if vec == "dummy" else SubprocVecEnv)
    env = VecNormalize(env, norm_obs=True, norm_reward=True, gamma=0.99)
    # SB3's MlpPolicy for PPO is a 64-64 tanh actor and a separate 64-64 tanh critic, as ours.
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=SAMPLES_PER_UPDATE // n_envs,
        batch_size=MINIBATCH,
        n_epochs=EPOCHS,
        learning_rate=3e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        device="cpu",
        seed=seed,
        verbose=0,
    )
    marks = Marks()
    model.learn(total_timesteps=total, callback=marks)
    env.close()
    (s0, t0), (s1, t1) = marks.marks[warmup_rounds], marks.marks[-1]
    print(json.dumps({"steps": s1 - s0, "seconds": t1 - t0, "threads": torch.get_num_threads()}))


def run_sb3(vec: str, threads: int, args: argparse.Namespace, work: Path) -> Result:
    total = (args.warmup_rounds + args.steps // SAMPLES_PER_UPDATE) * SAMPLES_PER_UPDATE
    log = work / f"sb3_{vec}_{threads}.log"
    worker = ["--sb3-worker", vec, str(threads), str(total), str(args.warmup_rounds), str(args.seed)]
    peaks, wall = proc_tree.run_tree([sys.executable, __file__, *worker], log=log, cwd=ROOT)
    out = json.loads(log.read_text().strip().splitlines()[-1])
    name = f"SB3 PPO, {'DummyVecEnv' if vec == 'dummy' else 'SubprocVecEnv'} x 8, torch threads {out['threads']}"
    return Result(name, out["steps"] / out["seconds"], out["seconds"], wall, peaks)


def run_ppo_ddp(
    world: int, actors: int, envs: int, args: argparse.Namespace, work: Path, overlap: bool = False
) -> Result:
    per_rank = SAMPLES_PER_UPDATE // world
    rollout_length = per_rank // (actors * envs)
    if rollout_length * actors * envs != per_rank:
        raise SystemExit(f"bench_throughput.py: shape {actors}x{envs} does not divide {per_rank} samples per rank")
    rounds = args.warmup_rounds + args.steps // SAMPLES_PER_UPDATE
    name = f"w{world}_a{actors}_e{envs}" + ("_overlap" if overlap else "")
    flags = [
        "--env-id",
        ENV_ID,
        "--seed",
        str(args.seed),
        "--total-timesteps",
        str(rounds * SAMPLES_PER_UPDATE),
        "--eval-interval",  # training alone, as the SB3 baseline
        "0",
        "--actors-per-gpu",
        str(actors),
        "--envs-per-actor",
        str(envs),
        "--rollout-length",
        str(rollout_length),
        "--num-minibatches",
        str(per_rank // MINIBATCH),
        "--update-epochs",
        str(EPOCHS),
        "--hidden-sizes",
        "64",
        "64",
        "--activation",
        "tanh",
        "--normalize-obs",
        "--normalize-reward",
        "--runs-dir",
        str(work),
        "--run-name",
        name,
        "--overlap" if overlap else "--no-overlap",  # the preset's own rounds may be either
        *args.flags,
    ]
    launcher = (
        [sys.executable]
        if world == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
    )
    peaks, wall = proc_tree.run_tree([*launcher, "train.py", *flags], log=work / f"{name}.log", cwd=args.trainer_root)
    timed = train_runs.timing(train_runs.read_metrics(work / name), args.warmup_rounds)
    if world == 1:
        rounds = "--overlap" if overlap else "--no-overlap"
        title = f"ppo_ddp, python train.py {rounds}, {actors} actors x {envs} envs x {rollout_length} steps"
    else:
        title = f"ppo_ddp, torchrun {world} ranks, each {actors} actors x {envs} envs x {rollout_length} steps"
    return Result(title, timed.sps, timed.seconds, wall, peaks)


def learner_rss_growth(args: argparse.Namespace, work: Path) -> None:
    """A --memory-rounds run of one learner; its RSS (sampled each round from /proc) after round 20 vs the end."""
    rounds = args.memory_rounds
    name = "memory"
    flags = [
        "--env-id",
        ENV_ID,
        "--seed",
        str(args.seed),
        "--total-timesteps",
        str(rounds * SAMPLES_PER_UPDATE),
        "--runs-dir",
        str(work),
        "--run-name",
        name,
        *args.flags,
    ]
    log = work / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "train.py", *flags], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        metrics = work / name / "metrics.csv"
        samples: dict[int, float] = {}  # round -> learner RSS in MB, read when the round's row appears
        while proc.poll() is None:
            rss = proc_tree.status_mb(proc.pid, "VmRSS")
            try:
                with open(metrics) as f:
                    done = sum(1 for _ in f) - 1
            except OSError:
                done = 0
            if rss is None or done <= 0:
                time.sleep(0.05)
                continue
            if done not in samples:
                samples[done] = rss
            time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"bench_throughput.py: the memory run exited {proc.returncode}; see {log}")
    at20 = samples[min(r for r in samples if r >= 20)]
    end = samples[max(samples)]
    peak_after = max(v for r, v in samples.items() if r >= 20)
    print(
        f"learner RSS over {rounds} rounds ({len(samples)} samples): round 20 {at20:.1f} MB, last round "
        f"{end:.1f} MB, largest after round 20 {peak_after:.1f} MB; growth after round 20 "
        f"{100 * (peak_after - at20) / at20:+.2f}% (limit +5%)"
    )


# ---------------------------------------------------------------------------------------------- main


def parse_shape(text: str) -> tuple[int, int]:
    actors, envs = text.lower().split("x")
    return int(actors), int(envs)


def parse_sb3(text: str) -> tuple[str, int]:
    vec, threads = text.split(":")
    if vec not in ("dummy", "subproc"):
        raise argparse.ArgumentTypeError(f"{text!r}: VEC must be dummy or subproc")
    return vec, int(threads)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=65536, help="env steps in the timed window of each trainer")
    parser.add_argument("--warmup-rounds", type=int, default=3, help="updates before the timed window")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--one-learner-shapes",
        type=parse_shape,
        nargs="+",
        default=[(2, 8), (2, 16), (1, 16)],
        help="actors_per_gpu x envs_per_actor for python train.py, e.g. 2x8",
    )
    parser.add_argument(
        "--overlap-shapes",
        type=parse_shape,
        nargs="*",
        default=[(2, 8), (1, 16)],
        help="actors_per_gpu x envs_per_actor for python train.py --overlap",
    )
    parser.add_argument(
        "--two-learner-shapes",
        type=parse_shape,
        nargs="+",
        default=[(1, 16), (1, 8), (2, 8)],
        help="actors_per_gpu x envs_per_actor per rank for torchrun with 2 ranks",
    )
    parser.add_argument(
        "--sb3",
        type=parse_sb3,
        nargs="+",
        default=[("dummy", 0), ("subproc", 0), ("dummy", 1)],
        help="SB3 variants VEC:THREADS, VEC dummy or subproc, THREADS 0 for torch's default",
    )
    parser.add_argument("--skip-sb3", action="store_true", help="ppo_ddp only (no ratio)")
    parser.add_argument("--sweep", action="store_true", help="also the scaling table: more shapes, world 1 and 2")
    parser.add_argument(
        "--memory-rounds",
        type=int,
        default=0,
        help="only the memory check: one learner for this many rounds, RSS growth after round 20",
    )
    parser.add_argument(
        "--trainer-root",
        type=Path,
        default=ROOT,
        help="the checkout whose train.py runs (e.g. an older commit's worktree, for before/after)",
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="run folders and logs (default: a temporary one)")
    parser.add_argument(
        "--flags", type=shlex.split, default=[], help="train.py flags for every ppo_ddp run, e.g. '--no-compile'"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--sb3-worker"]:
        vec, threads, total, warmup, seed = argv[1:6]
        sb3_worker(vec, int(threads), int(total), int(warmup), int(seed))
        return
    args = parse_args(argv)

    import torch

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_throughput_"))
    work.mkdir(parents=True, exist_ok=True)
    head = f"# {ENV_ID}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}; "
    if args.memory_rounds:
        print(f"{head}python train.py with its defaults for {args.memory_rounds} rounds; logs in {work}", flush=True)
        learner_rss_growth(args, work)
        return
    print(
        f"{head}{SAMPLES_PER_UPDATE} samples an update, mini-batches of {MINIBATCH}, {EPOCHS} epochs; "
        f"timed window {args.steps:,} steps after {args.warmup_rounds} warm-up updates; logs in {work}",
        flush=True,
    )

    def show(r: Result) -> None:
        rss = ", ".join(f"{role} {mb:.0f}" for role, mb in sorted(r.peaks.items()))
        print(f"{r.name:<70} {r.sps:>8,.0f} {r.seconds:>8.1f} {r.total_wall:>8.1f}   {rss}", flush=True)

    print(f"{'trainer':<70} {'SPS':>8} {'timed s':>8} {'wall s':>8}   peak RSS MB by process role", flush=True)
    sb3: list[Result] = []
    if not args.skip_sb3:
        for vec, threads in args.sb3:
            sb3.append(run_sb3(vec, threads, args, work))
            show(sb3[-1])
    ones, twos = list(args.one_learner_shapes), list(args.two_learner_shapes)
    if args.sweep:
        ones += [s for s in [(1, 8), (1, 16), (2, 4), (2, 8), (2, 16), (4, 4), (4, 8)] if s not in ones]
        twos += [s for s in [(1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (4, 4)] if s not in twos]
    one = [run_ppo_ddp(1, a, e, args, work) for a, e in ones]
    one += [run_ppo_ddp(1, a, e, args, work, overlap=True) for a, e in args.overlap_shapes]
    for r in one:
        show(r)
    two = []
    for a, e in twos:
        two.append(run_ppo_ddp(2, a, e, args, work))
        show(two[-1])

    best1, best2 = max(one, key=lambda r: r.sps), max(two, key=lambda r: r.sps) if two else None
    print(f"best one learner: {best1.name}: {best1.sps:,.0f} SPS")
    if best2:
        print(f"best two learners: {best2.name}: {best2.sps:,.0f} SPS")
    print(f"load average {os.getloadavg()[0]:.2f}")
    if sb3:
        base = max(sb3, key=lambda r: r.sps)
        print(f"baseline: {base.name}: {base.sps:,.0f} SPS")
        print(
            f"ratio one learner {best1.sps / base.sps:.2f}"
            + (f", two learners {best2.sps / base.sps:.2f}" if best2 else "")
        )
        best = max([best1] + ([best2] if best2 else []), key=lambda r: r.sps)
        print(f"ratio {best.sps / base.sps:.2f}")


if __name__ == "__main__":
    main()
