"""Plot runs: `python -m ppo_ddp.plot runs/hopper-s1 runs/hopper-s2 --out curves.png`.

Learning curves from runs' metrics.csv: episodic return against env steps, the mean and the spread over seeds, a
panel per env. A run folder (or its metrics.csv) is grouped by the env_id of its config.yaml (or by the label given
as LABEL=PATH): `python -m ppo_ddp.plot runs/* --out all.png`, `python -m ppo_ddp.plot mine=runs/a theirs=runs/b`.
Seeds are aligned on a common step grid; the line is their mean and the band their min..max. It needs matplotlib
(`pip install matplotlib`); training does not.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from ppo_ddp.configuration.validation import missing_extra


def load_curve(metrics_csv: Path, with_episodes: bool = False):
    """(steps, episodic return[, episodes]) of the rounds that finished episodes."""
    steps, returns, episodes = [], [], []
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            value = row.get("charts/episodic_return", "")
            if value in ("", "nan"):
                continue
            steps.append(float(row["global_step"]))
            returns.append(float(value))
            episodes.append(float(row.get("charts/episodes") or 1.0))
    out = (np.asarray(steps), np.asarray(returns))
    return (*out, np.asarray(episodes)) if with_episodes else out


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average, so each point is the recent mean a user would read in TensorBoard."""
    if len(values) == 0:
        return values
    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def plot_curves(runs: Sequence[tuple[str, Path]], out: Path, window: int = 10) -> None:
    """One panel per env label; runs of the same label are seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs: dict[str, list[Path]] = {}
    for env, path in runs:
        envs.setdefault(env, []).append(Path(path))
    n = max(len(envs), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (env, paths) in zip(axes.flat, sorted(envs.items())):
        curves = [load_curve(p) for p in paths]
        curves = [(s, smooth(r, window)) for s, r in curves if len(s)]
        if not curves:
            ax.set_title(f"{env} (no episodes)")
            continue
        grid = np.linspace(max(s.min() for s, _ in curves), min(s.max() for s, _ in curves), 200)
        aligned = np.stack([np.interp(grid, s, r) for s, r in curves])
        ax.plot(grid, aligned.mean(0), label=f"mean of {len(curves)} seed(s)")
        if len(curves) > 1:
            ax.fill_between(grid, aligned.min(0), aligned.max(0), alpha=0.25, label="min..max")
        ax.set_title(env, fontsize=9)
        ax.set_xlabel("env steps")
        ax.set_ylabel("episodic return")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    for ax in list(axes.flat)[len(envs) :]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _label(path: Path) -> str:
    import yaml

    config = path.parent / "config.yaml"
    if config.exists():
        return yaml.safe_load(config.read_text())["config"]["env_id"]
    return path.parent.name


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m ppo_ddp.plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("runs", nargs="+", help="run folders or metrics.csv files, optionally as LABEL=PATH")
    p.add_argument("--out", type=Path, default=Path("curves.png"))
    p.add_argument("--window", type=int, default=10, help="rounds in the moving average")
    args = p.parse_args(argv)
    if problem := missing_extra("matplotlib"):
        p.exit(2, f"{p.prog}: error: {problem}\n")
    runs = []
    for spec in args.runs:
        label, _, path = spec.rpartition("=")
        path = Path(path)
        csv_path = path / "metrics.csv" if path.is_dir() else path
        if not csv_path.is_file():
            p.exit(2, f"{p.prog}: error: {spec}: no metrics.csv there\n")
        runs.append((label or _label(csv_path), csv_path))
    plot_curves(runs, args.out, args.window)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
