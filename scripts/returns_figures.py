"""The figures that show what the tables quote: each robot's seeds as evaluation returns above and training returns
below, the line their mean and the band a 95% bootstrap interval of that mean over seeds.

returns.png holds the five compared robots' ten seeds at 1M steps, the rows behind the README's 1M cells
(seed_intervals.seed_rows: the preset's own rounds and distribution); returns_10m.png the 10M presets' seeds. The
top panel is the runs' periodic deterministic evaluations (their eval.csv, copied beside each row's curve by
scripts/benchmark_returns.py: rows written before that copy have none) and, at the last step, the final
policies' evaluations that the table quotes, with the table's interval (seed_intervals.intervals). The bottom
panel is the training return (the episodes each round finished, smoothed over 10 rounds). Both are rebuilt with
the tables by `python scripts/benchmark_returns.py --tables`.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from returns_rows import ROOT, eval_curve
from seed_intervals import intervals

from ppo_ddp.plot import load_curve, smooth

RESAMPLES = 2000  # per point of a band: its ends move by ~1% of the spread from one random state to another
GRID_POINTS = 200


def mean_band(curves: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """curves (seeds, points): the mean over seeds and its 95% percentile-bootstrap interval at each point (seeds
    resampled with replacement, a fixed random state: the same rows draw the same figure)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(curves), size=(RESAMPLES, len(curves)))
    means = curves[picks].mean(axis=1)  # (resamples, points)
    low, high = np.percentile(means, [2.5, 97.5], axis=0)
    return curves.mean(axis=0), low, high


def load_evaluations(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(steps, mean deterministic return) of a run's periodic evaluations (eval.csv)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return np.array([float(r["global_step"]) for r in rows]), np.array([float(r["eval/episodic_return"]) for r in rows])


def aligned(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The curves on the steps all of them cover: (grid, values (curves, points))."""
    grid = np.linspace(max(s.min() for s, _ in curves), min(s.max() for s, _ in curves), GRID_POINTS)
    return grid, np.stack([np.interp(grid, s, v) for s, v in curves])


def draw_band(ax, curves: list[tuple[np.ndarray, np.ndarray]], label: str) -> None:
    grid, values = aligned(curves)
    mean, low, high = mean_band(values)
    ax.plot(grid, mean, label=f"{label}, mean of {len(curves)}")
    if len(curves) > 1:
        ax.fill_between(grid, low, high, alpha=0.25, label="95% CI of the mean")


def plot_seeds(
    groups: dict[str, list[dict[str, str]]], out: Path, anchors: dict[str, float] | None = None, anchor_label: str = ""
) -> None:
    """A column per env (its rows are its seeds): evaluations above, training returns below; anchors, a dashed line
    at the best published PPO's mean where given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(groups), figsize=(3.6 * len(groups), 5.6), squeeze=False, sharex="col")
    for col, (env_id, rows) in enumerate(groups.items()):
        top, bottom = axes[0, col], axes[1, col]
        files = [ROOT / eval_curve(r["curve"]) for r in rows]
        evaluations = [load_evaluations(f) for f in files if f.exists()]  # rows written before the copy have none
        evaluations = [e for e in evaluations if len(e[0]) > 1]
        if evaluations:
            draw_band(top, evaluations, "periodic evaluation")
        final = intervals([float(r["eval_mean"]) for r in rows])["mean"]
        last = max(int(r["total_steps"]) for r in rows)
        top.errorbar([last], [final[0]], yerr=[[final[0] - final[1]], [final[2] - final[0]]], fmt="o", color="black",
                     capsize=3, label=f"final: {final[0]:.0f} [{final[1]:.0f}, {final[2]:.0f}]")  # fmt: skip
        if anchors and env_id in anchors:
            top.axhline(anchors[env_id], color="gray", linestyle="--", linewidth=1, label=anchor_label)
        top.set_title(f"{env_id}, {len(rows)} seeds", fontsize=9)
        training = [load_curve(ROOT / r["curve"]) for r in rows]
        draw_band(bottom, [(s, smooth(v, 10)) for s, v in training if len(s)], "training")
        bottom.set_xlabel("env steps")
        for ax, what in ((top, "evaluation return"), (bottom, "training return")):
            ax.grid(alpha=0.3)
            ax.legend(loc="lower right", fontsize=7)
            if col == 0:
                ax.set_ylabel(what)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
