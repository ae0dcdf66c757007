"""Learning benchmark: train env × seed × world size with the presets, evaluate each final policy.

    python scripts/benchmark_returns.py --envs hopper walker2d --seeds 1 2 3 --total-timesteps 1000000
    python scripts/benchmark_returns.py --envs halfcheetah hopper --seeds 1 --world-sizes 2

Each run is `python train.py --config configs/<env>.yaml` (or `torchrun --standalone --nproc_per_node=W`
for world size W > 1) with the total steps unchanged. Its final checkpoint is evaluated through
ppo_ddp.evaluate: deterministic, 10 episodes. Rows go to docs/benchmarks/returns.csv (a row per run,
replacing an earlier row of the same env/seed/world size, so a matrix can be run in pieces); the table
docs/benchmarks/returns.md and the learning curves docs/benchmarks/returns.png are rebuilt from all rows.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from plot_runs import load_curve, plot_curves  # noqa: E402

from ppo_ddp.evaluate import evaluate_policy, load_policy  # noqa: E402

PRESETS = {
    "halfcheetah": ("HalfCheetah-v5", "configs/halfcheetah.yaml"),
    "hopper": ("Hopper-v5", "configs/hopper.yaml"),
    "walker2d": ("Walker2d-v5", "configs/walker2d.yaml"),
    "ant": ("Ant-v5", "configs/ant.yaml"),
    "humanoid": ("Humanoid-v5", "configs/humanoid.yaml"),
}

# Published PPO numbers at 1M env steps (see issue 5 / docs/tuning.md for what each column measures).
REFERENCE = {
    "HalfCheetah-v5": ("1442 ± 46", "5819 ± 664", "5784 ± 1244", ">= 3000"),
    "Hopper-v5": ("2383 ± 272", "2410 ± 10", "2609 ± 701", ">= 2500"),
    "Walker2d-v5": ("2288 ± 572", "3479 ± 822", "3589 ± 757", ">= 3500"),
    "Ant-v5": ("—", "1327 ± 452", "3258 ± 1079", ">= 2000"),
    "Humanoid-v5": ("716 ± 49", "—", "787 ± 194", "report"),
}

FIELDS = [
    "env",
    "seed",
    "world_size",
    "total_steps",
    "wall_seconds",
    "eval_mean",
    "eval_std",
    "eval_episodes",
    "train_return_last10pct",
    "curve",
    "config",
    "extra_args",
    "commit",
]


def run_name(env: str, seed: int, world_size: int) -> str:
    return f"bench_{env}_s{seed}_w{world_size}"


def train(env_key: str, seed: int, world_size: int, total: int, runs_dir: Path, extra: list[str]) -> tuple[Path, float]:
    env_id, preset = PRESETS[env_key]
    name = run_name(env_key, seed, world_size)
    args = [
        "train.py",
        "--config",
        preset,
        "--seed",
        str(seed),
        "--total-timesteps",
        str(total),
        "--runs-dir",
        str(runs_dir),
        "--run-name",
        name,
        *extra,
    ]
    launcher = (
        [sys.executable]
        if world_size == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}"]
    )
    cmd = [*launcher, *args]
    print(f"[{time.strftime('%H:%M:%S')}] {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    log = runs_dir / f"{name}.log"
    runs_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    wall = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"training failed (exit {proc.returncode}); log: {log}\n{log.read_text()[-2000:]}")
    return runs_dir / name, wall


def last_fraction_return(metrics_csv: Path, fraction: float = 0.1) -> float:
    """Episode-weighted mean training return over the last `fraction` of env steps."""
    steps, returns, episodes = load_curve(metrics_csv, with_episodes=True)
    if len(steps) == 0:
        return math.nan
    keep = steps >= steps.max() * (1 - fraction)
    weights = episodes[keep]
    return float(np.average(returns[keep], weights=weights)) if weights.sum() > 0 else math.nan


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted(rows, key=lambda r: (r["env"], int(r["world_size"]), int(r["seed"])))
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # replaced in one step: a concurrent reader sees old or new
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def mean_std(values: list[float]) -> str:
    """Mean ± std over seeds; one seed has no spread to show."""
    if not values:
        return "—"
    return f"{values[0]:.0f}" if len(values) == 1 else f"{np.mean(values):.0f} ± {np.std(values):.0f}"


def write_table(path: Path, rows: list[dict[str, str]]) -> None:
    lines = [
        "# PPO returns at 1M env steps",
        "",
        "Ours: deterministic evaluation (10 episodes) of the final policy, mean ± std over seeds; "
        "rows from `returns.csv`, written by `scripts/benchmark_returns.py`.",
        "",
        "| env | CleanRL ppo_continuous_action (v4, last training episodes) | SB3 rl-zoo tuned PPO (v3, deterministic eval) "  # noqa: E501
        "| Tianshou PPO (v3, 10 seeds, max average return) | target | ppo_ddp, 1 learner (seeds) | ppo_ddp, 2 learners (seeds) |",  # noqa: E501
        "|---|---|---|---|---|---|---|",
    ]
    for env_id, refs in REFERENCE.items():
        ours = []
        for world in (1, 2):
            vals = [float(r["eval_mean"]) for r in rows if r["env"] == env_id and int(r["world_size"]) == world]
            steps = {int(r["total_steps"]) for r in rows if r["env"] == env_id and int(r["world_size"]) == world}
            note = f" ({len(vals)})" if vals else ""
            if steps and max(steps) < 1_000_000:
                note += f" at {max(steps):,} steps"
            ours.append(mean_std(vals) + note)
        lines.append(f"| {env_id} | {' | '.join(refs)} | {' | '.join(ours)} |")
    lines += ["", "![learning curves](returns.png)", ""]
    path.write_text("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["halfcheetah", "hopper", "walker2d"], choices=sorted(PRESETS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--world-sizes", nargs="+", type=int, default=[1])
    p.add_argument("--total-timesteps", type=int, default=1_000_000)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "benchmark")
    p.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    p.add_argument("--train-args", default="", help="extra flags for train.py, e.g. '--envs-per-actor 4'")
    p.add_argument("--skip-existing", action="store_true", help="skip runs that already have a row in the CSV")
    args = p.parse_args()

    csv_path = args.out_dir / "returns.csv"
    rows = read_rows(csv_path)
    # the code that produced a row (same seed and config reproduce it exactly on the same code)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    extra = shlex.split(args.train_args)
    for env_key in args.envs:
        env_id, preset = PRESETS[env_key]
        for world in args.world_sizes:
            for seed in args.seeds:
                key = (env_id, str(seed), str(world))
                if args.skip_existing and any((r["env"], r["seed"], r["world_size"]) == key for r in rows):
                    continue
                run_dir, wall = train(env_key, seed, world, args.total_timesteps, args.runs_dir, extra)
                model, obs_rms, cfg = load_policy(run_dir / f"model_{run_dir.name}.pt")
                returns = evaluate_policy(model, obs_rms, cfg, args.eval_episodes, deterministic=True)
                # the curve travels with the results (runs/ is not committed), so the plot can be rebuilt
                metrics_csv = args.out_dir / "curves" / f"{run_dir.name}.csv"
                metrics_csv.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run_dir / "metrics.csv", metrics_csv)
                with open(metrics_csv, newline="") as f:
                    total_steps = max(int(r["global_step"]) for r in csv.DictReader(f))
                row = {
                    "env": env_id,
                    "seed": seed,
                    "world_size": world,
                    "total_steps": total_steps,
                    "wall_seconds": round(wall, 1),
                    "eval_mean": round(float(np.mean(returns)), 1),
                    "eval_std": round(float(np.std(returns)), 1),
                    "eval_episodes": len(returns),
                    "train_return_last10pct": round(last_fraction_return(metrics_csv), 1),
                    "curve": os.path.relpath(metrics_csv, ROOT),
                    "config": preset,
                    "extra_args": args.train_args,
                    "commit": commit,
                }
                print(
                    f"  {env_id} seed {seed} world {world}: eval {row['eval_mean']} ± {row['eval_std']}, "
                    f"train(last 10%) {row['train_return_last10pct']}, {wall / 60:.1f} min",
                    flush=True,
                )
                # re-read: another benchmark_returns.py may have added rows to the same CSV meanwhile
                rows = [r for r in read_rows(csv_path) if (r["env"], str(r["seed"]), str(r["world_size"])) != key] + [
                    row
                ]
                write_rows(csv_path, rows)
                write_table(args.out_dir / "returns.md", rows)
    rows = read_rows(csv_path)
    write_table(args.out_dir / "returns.md", rows)
    runs = [(r["env"], ROOT / r["curve"]) for r in rows if int(r["world_size"]) == 1]
    plot_curves([(env, path) for env, path in runs if path.exists()], args.out_dir / "returns.png")
    print(f"wrote {csv_path}, {args.out_dir / 'returns.md'}, {args.out_dir / 'returns.png'}")


if __name__ == "__main__":
    main()
