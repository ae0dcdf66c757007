"""Learning benchmark: train env × seed × world size × sync mode with the presets, evaluate each final policy.

    python scripts/benchmark_returns.py --envs hopper walker2d --seeds 1 2 3
    python scripts/benchmark_returns.py --envs Swimmer-v5 Reacher-v5 --seeds 1 2 3    # an env id: its preset
    python scripts/benchmark_returns.py --envs halfcheetah hopper --world-sizes 2 4 --sync-modes params gradients
    python scripts/benchmark_returns.py --scale --envs humanoid ant --seeds 1 2      # 10M steps, ppo_ddp/configs/scale/
    python scripts/benchmark_returns.py --envs hopper --seeds 1 2 3 4 5 6 7 8 9 10 --skip-done-here   # continue a batch
    python scripts/benchmark_returns.py --tables        # run nothing: returns.md and the figures from returns.csv

Each run is `python train.py --config ppo_ddp/configs/<env>.yaml` (ppo_ddp/configs/scale/<env>.yaml with --scale; or
`torchrun --standalone --nproc_per_node=W` for world size W > 1) with the preset's total steps, at most 1M without
--scale (the 1M tables: a recipe with a longer budget, Humanoid's, is its run stopped at 1M), unless
--total-timesteps says otherwise, and `--resume auto`: a run stopped by SIGTERM (kill the script's process
group: `kill -TERM -PGID`) continues where it stopped when the same command is run again. Its final checkpoint
is evaluated through ppo_ddp.evaluate: deterministic, over the preset's eval_episodes (Config's 10 unless the
preset says otherwise). Rows go to docs/benchmarks/returns.csv (a row per run, replacing an earlier row of the
same env/seed/world size/preset/sync mode, so a matrix can be run in pieces); wall_seconds is the training time
summed over the run's sessions (start-up excluded); mujoco is the MuJoCo version the run's venv had (the dmc extra
puts 3.17.0 in place of 4.0.0; empty in rows written before the column); resumed says whether the run was resumed
(its log has a "resumed from" line) and resume_exact whether every resume continued the envs' episodes exactly
(issue 47; a resumed run then equals a fresh one), both empty in rows written before them; first_5000_steps and
first_5000_seconds are the env steps and the training time (summed as wall_seconds) at which the run's periodic
deterministic evaluation (eval.csv) first reached a mean of 5000: the time to score of a 10M preset (empty when it
never did, or in rows written before them); cpu is the CPU's model name (a seed repeats bit for bit on one kind of
CPU, not across makers; empty in rows written before the column); overlap and distribution are what the run had
(Config's fields: "true"/"false" and the distribution's name), so a row keeps its meaning when its preset's line
changes (rows written before these columns ran presets that all had sync rounds and the Gaussian, so their flags
say, and the next write fills them in). The tables in
docs/benchmarks/returns.md and the curves (returns.png: 1M presets; returns_10m.png: the scale presets;
world_sizes.png: world sizes and sync modes; returns_partial.png: the partly observed envs; returns_dmc.png: the
DeepMind Control Suite) are rebuilt from all rows, by scripts/returns_tables.py.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import hashlib
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from returns_rows import SETTINGS, eval_curve, row_key, settings, shape_flags  # noqa: E402
from returns_tables import plot_all, write_table  # noqa: E402

from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.configuration.loading import load_yaml_defaults  # noqa: E402
from ppo_ddp.configuration.presets import find_preset, presets  # noqa: E402
from ppo_ddp.evaluation.playback import evaluate_policy, load_policy  # noqa: E402
from ppo_ddp.plot import load_curve  # noqa: E402
from ppo_ddp.records.run_log import code_version  # noqa: E402

# Every preset by its name (hopper: ppo_ddp/configs/hopper.yaml), with its env (ppo_ddp/configuration/presets.py)
PRESETS = {path.stem: (env_id, f"ppo_ddp/configs/{path.name}") for (env_id, _), path in presets().items()}


def preset_name(name: str) -> str:
    """--envs takes a preset's name (hopper, hopper_novel_gru) or an env id (Hopper-v5: its MLP preset)."""
    if name in PRESETS:
        return name
    path = find_preset(name)
    if path is None:
        raise argparse.ArgumentTypeError(f"{name!r} is neither a preset nor an env with one (presets: "
                                         f"{', '.join(sorted(PRESETS))})")  # fmt: skip
    return path.stem


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
    "sync_mode",
    "mujoco",
    "resumed",
    "resume_exact",
    "first_5000_steps",
    "first_5000_seconds",
    "cpu",
    "overlap",
    "distribution",
]
SCORE_TO_REACH = 5000.0
"""The score whose first time a row records (issue 45: Humanoid and Ant at 10M steps; reached by no 1M preset but
HalfCheetah's and InvertedDoublePendulum's, where it is recorded all the same)."""


def mujoco_version() -> str:
    try:
        import mujoco
    except ImportError:
        return ""
    return mujoco.__version__


def cpu_model() -> str:
    """The CPU the run ran on (/proc/cpuinfo's model name): a seed repeats bit for bit on one kind of CPU and gives
    other numbers on another maker's (tests/rollout_digests.py), so a row says which it ran on."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def preset_path(env_key: str, scale: bool) -> str:
    return f"ppo_ddp/configs/scale/{env_key}.yaml" if scale else PRESETS[env_key][1]


TABLE_STEPS = 1_000_000
"""The 1M tables' budget: a 1M preset whose recipe runs longer (Humanoid's, to its score) is stopped there."""


def table_steps(preset: str, scale: bool) -> int | None:
    """The run's --total-timesteps: TABLE_STEPS where a 1M table's preset asks for more, else None (its own)."""
    budget = load_yaml_defaults(ROOT / preset).get("total_timesteps", Config.total_timesteps)
    return TABLE_STEPS if not scale and budget > TABLE_STEPS else None


def run_name(env: str, seed: int, world_size: int, scale: bool, sync_mode: str, extra_args: str) -> str:
    """The run folder of one row: runs that compute different things never share one (--resume auto continues a
    folder's run). Flags that change the computation add a short hash of themselves."""
    name = f"bench_{env}{'_scale' if scale else ''}_s{seed}_w{world_size}{'_grad' if sync_mode == 'gradients' else ''}"
    flags = shape_flags(extra_args)
    return name + (f"_f{hashlib.sha1(' '.join(flags).encode()).hexdigest()[:6]}" if flags else "")


def training_seconds(metrics_csv: Path, until_iteration: float = math.inf) -> float:
    """Training time over every session of a run, to the end of round until_iteration: charts/elapsed_seconds
    restarts at each resume."""
    with open(metrics_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["iteration"]) <= until_iteration]
    elapsed = [float(r["charts/elapsed_seconds"]) for r in rows]
    ends = [a for a, b in zip(elapsed, elapsed[1:]) if b < a] + elapsed[-1:]
    return sum(ends)


def time_to_score(eval_csv: Path, metrics_csv: Path, score: float = SCORE_TO_REACH) -> tuple[str, str]:
    """(env steps, training seconds) when the run's periodic evaluation first reached `score`; ("", "") if never."""
    rows = read_rows(eval_csv)
    first = next((r for r in rows if float(r["eval/episodic_return"]) >= score), None)
    if first is None:
        return "", ""
    return first["global_step"], f"{training_seconds(metrics_csv, int(first['iteration'])):.1f}"


def train(
    env_key: str, seed: int, world_size: int, total: int | None, runs_dir: Path, extra: str, scale: bool, sync: str
) -> Path:
    name = run_name(env_key, seed, world_size, scale, sync, extra)
    args = ["train.py", "--config", preset_path(env_key, scale), "--seed", str(seed), "--runs-dir", str(runs_dir)]
    args += ["--run-name", name, "--resume", "auto", "--sync-mode", sync, *shlex.split(extra)]
    if total is not None:
        args += ["--total-timesteps", str(total)]
    launcher = (
        [sys.executable]
        if world_size == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}"]
    )
    cmd = [*launcher, *args]
    print(f"[{time.strftime('%H:%M:%S')}] {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    log = runs_dir / f"{name}.log"
    runs_dir.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"training failed (exit {proc.returncode}); log: {log}\n{log.read_text()[-2000:]}")
    return runs_dir / name


def resume_record(log: Path) -> tuple[str, str]:
    """Whether the run's sessions (its log, appended by each) resumed it, and whether every resume was exact (the
    envs continued their episodes: no "the envs start new episodes" line); ("no", "") for a run of one session."""
    text = log.read_text() if log.exists() else ""
    if "resumed from " not in text:
        return "no", ""
    return "yes", "no" if "the envs start new episodes" in text else "yes"


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
    rows = sorted(rows, key=lambda r: (r["env"], r["config"], int(r["world_size"]), row_key(r)[4:], int(r["seed"])))
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # replaced in one step: a concurrent reader sees old or new
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({**r, "sync_mode": row_key(r)[4], **dict(zip(SETTINGS, settings(r)))} for r in rows)
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["halfcheetah", "hopper", "walker2d"], type=preset_name,
                   help="presets (hopper, hopper_novel_gru) or env ids (Hopper-v5: its preset)")  # fmt: skip
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--world-sizes", nargs="+", type=int, default=[1])
    p.add_argument("--sync-modes", nargs="+", default=["params"], choices=["params", "gradients"])
    p.add_argument("--scale", action="store_true", help="the large-batch presets of ppo_ddp/configs/scale/")
    p.add_argument("--total-timesteps", type=int, default=None, help="default: the preset's, 1M at most unless --scale")
    p.add_argument("--eval-episodes", type=int, default=None, help="default: the preset's eval_episodes (Config: 10)")
    p.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "benchmark")
    p.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    p.add_argument("--train-args", default="", help="extra flags for train.py, e.g. '--envs-per-actor 4'")
    p.add_argument("--skip-existing", action="store_true", help="skip runs that already have a row in the CSV")
    p.add_argument("--skip-done-here", action="store_true",
                   help="skip runs that have a row from a CPU of this machine's model (a batch continued)")  # fmt: skip
    p.add_argument("--tables", action="store_true",
                   help="run nothing: returns.md and the figures of --out-dir from its returns.csv")  # fmt: skip
    args = p.parse_args()
    if args.tables:
        refresh_tables(args.out_dir / "returns.csv", args.out_dir)
        print(f"wrote {args.out_dir / 'returns.md'} and the figures in {args.out_dir}")
        return
    missing = [e for e in args.envs if args.scale and not (ROOT / preset_path(e, True)).exists()]
    if missing:
        p.error(f"--scale: no ppo_ddp/configs/scale/ preset for {', '.join(missing)}")

    csv_path = args.out_dir / "returns.csv"
    # the code that produced a row (same seed and config reproduce it exactly on the same code); "-dirty" when
    # uncommitted changes to the code or presets ran, which that commit alone would not reproduce (this script's
    # own rows and figures, changed as it goes, do not count)
    commit = code_version(("ppo_ddp", "train.py"), short=True)
    here = cpu_model()
    for env_key in args.envs:
        env_id, preset = PRESETS[env_key][0], preset_path(env_key, args.scale)
        total = args.total_timesteps or table_steps(preset, args.scale)
        for world in args.world_sizes:
            for sync in args.sync_modes:
                if world == 1 and sync == "gradients":  # one rank: the two modes are the same computation
                    continue
                for seed in args.seeds:
                    key = (env_id, str(seed), str(world), preset, sync, args.train_args)
                    done = [r for r in read_rows(csv_path) if row_key(r) == key]
                    if (args.skip_existing and done) or (args.skip_done_here and any(
                        r.get("cpu") == here for r in done
                    )):  # fmt: skip
                        continue
                    run_dir = train(env_key, seed, world, total, args.runs_dir, args.train_args, args.scale, sync)
                    record(run_dir, key, args, commit, csv_path)
    refresh_tables(csv_path, args.out_dir)
    print(f"wrote {csv_path}, {args.out_dir / 'returns.md'} and the figures in {args.out_dir}")


def record(run_dir: Path, key: tuple[str, ...], args: argparse.Namespace, commit: str, csv_path: Path) -> None:
    """Evaluate the run's final policy and put its row in the CSV (replacing the run's earlier row), the table
    and the figures."""
    env_id, seed, world, preset, sync, _ = key
    model, obs_rms, cfg = load_policy(run_dir / f"model_{run_dir.name}.pt")
    episodes = args.eval_episodes if args.eval_episodes is not None else cfg.eval_episodes
    returns = evaluate_policy(model, obs_rms, cfg, episodes, deterministic=True)
    # the curve travels with the results (runs/ is not committed), so the plot can be rebuilt; named by the commit
    # too, since a run folder's name is the same on every commit and an older row of other flags keeps its curve
    metrics_csv = args.out_dir / "curves" / f"{run_dir.name}_{commit}.csv"
    metrics_csv.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "metrics.csv", metrics_csv)
    if (run_dir / "eval.csv").exists():  # the evaluations' curve beside it (scripts/returns_figures.py)
        shutil.copyfile(run_dir / "eval.csv", eval_curve(metrics_csv))
    with open(metrics_csv, newline="") as f:
        total_steps = max(int(r["global_step"]) for r in csv.DictReader(f))
    wall = training_seconds(metrics_csv)
    resumed, exact = resume_record(args.runs_dir / f"{run_dir.name}.log")
    first_steps, first_seconds = time_to_score(run_dir / "eval.csv", metrics_csv)
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
        "sync_mode": sync,
        # the dmc extra swaps MuJoCo 4.0.0 for 3.17.0: rows say which physics they ran on (the training ran
        # in this script's venv)
        "mujoco": mujoco_version(),
        # a resumed run equals the uninterrupted one when its resumes were exact (issue 47): rows written before
        # these columns say neither
        "resumed": resumed,
        "resume_exact": exact,
        "first_5000_steps": first_steps,
        "first_5000_seconds": first_seconds,
        "cpu": cpu_model(),
        # what the run computed whichever flags said it: a preset's line may change later (returns_rows.SETTINGS)
        "overlap": str(cfg.overlap).lower(),
        "distribution": cfg.distribution,
    }
    print(
        f"  {env_id} seed {seed} world {world} {sync}: eval {row['eval_mean']} ± {row['eval_std']}, "
        f"train(last 10%) {row['train_return_last10pct']}, {wall / 60:.1f} min",
        flush=True,
    )
    put_row(csv_path, key, row)
    refresh_tables(
        csv_path, args.out_dir
    )  # after every row: a long benchmark stopped midway leaves its figures current


@contextlib.contextmanager
def rows_locked(csv_path: Path) -> Iterator[None]:
    """One benchmark_returns.py at a time between here and the end of the block. Several run at once (a seed each),
    and each re-reads, rewrites and plots every row: unlocked, one lost a row another had just written, or plotted
    a curve another had just deleted."""
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path.parent / f".{csv_path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def put_row(csv_path: Path, key: tuple[str, ...], row: dict) -> None:
    """The run's row into the CSV, replacing its earlier one, whose curve goes unless another row uses it."""
    with rows_locked(csv_path):
        rows = read_rows(csv_path)
        replaced = {r["curve"] for r in rows if row_key(r) == key} - {row["curve"]}
        rows = [r for r in rows if row_key(r) != key] + [row]
        write_rows(csv_path, rows)
        for curve in replaced - {r["curve"] for r in rows}:
            (ROOT / curve).unlink(missing_ok=True)
            (ROOT / eval_curve(curve)).unlink(missing_ok=True)


def refresh_tables(csv_path: Path, out_dir: Path) -> None:
    """returns.md and the figures, from every row of the CSV."""
    with rows_locked(csv_path):
        rows = read_rows(csv_path)
        write_table(out_dir / "returns.md", rows)
        plot_all(rows, out_dir)


if __name__ == "__main__":
    main()
