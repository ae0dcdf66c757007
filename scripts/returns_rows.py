"""What a row of docs/benchmarks/returns.csv is a run of, and its cell in a table: the helpers every table of
returns.md shares (scripts/returns_tables.py, scripts/distribution_table.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PARTIAL_PREFIX = "ppo_ddp/"  # the partly observed envs' gymnasium namespace
DMC_PREFIX = "dm_control/"  # the DeepMind Control Suite through shimmy (the dmc extra)

BENCHMARK_SEEDS = ("1", "2", "3")  # the 1M table's seeds: other seeds of older rows stay in returns.csv


def row_key(row: dict) -> tuple[str, str, str, str, str, str]:
    """What a row is a run of: env, seed, world size, preset, sync mode (rows written before sync modes existed are
    of "params") and the extra train.py flags."""
    sync = row.get("sync_mode") or "params"
    return (row["env"], str(row["seed"]), str(row["world_size"]), row["config"], sync, row["extra_args"])


def shape_flags(extra_args: str) -> list[str]:
    """The extra flags that change what a run computes: all but --actor-timeout, which only bounds a wait."""
    out: list[str] = []
    skip = False
    for flag in shlex.split(extra_args):
        if skip:
            skip = False
        elif flag == "--actor-timeout":
            skip = True
        elif not flag.startswith("--actor-timeout="):
            out.append(flag)
    return out


def mean_std(values: list[float]) -> str:
    """Mean ± std over seeds; one seed has no spread to show."""
    if not values:
        return "—"
    digits = 1 if max(abs(v) for v in values) < 100 else 0  # Reacher's -4.5 and Pusher's -28.2, not -4 and -28
    one = f"{values[0]:.{digits}f}"
    return one if len(values) == 1 else f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def own_shape(row: dict[str, str]) -> bool:
    """A run of the preset as it is (no flags that change what it computes)."""
    return not shape_flags(row["extra_args"])


def is_scale(row: dict[str, str]) -> bool:
    return row["config"].startswith("ppo_ddp/configs/scale/")


def is_dmc(row: dict[str, str]) -> bool:
    """A run on a DeepMind Control Suite task (dm_control/<domain>-<task>-v0, MuJoCo 3.17.0)."""
    return row["env"].startswith(DMC_PREFIX)


def is_partial(row: dict[str, str]) -> bool:
    """A run on a partly observed env (its velocities hidden: ppo_ddp/envs/partial.py)."""
    return row["env"].startswith(PARTIAL_PREFIX)


OVERLAP_FLAGS = ("--overlap", "--overlap --lag-objective decoupled")
"""The extra flags of the overlapped-rounds A/B (issue 44): each against the preset's own sync rows."""


def is_overlap(row: dict[str, str]) -> bool:
    return " ".join(shape_flags(row["extra_args"])) in OVERLAP_FLAGS


def gym_1m_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows of the 1M tables: gymnasium's fully observed MuJoCo envs, not the 10M presets."""
    return [r for r in rows if not is_scale(r) and not is_partial(r) and not is_dmc(r)]


DISTRIBUTION_FLAG = "--distribution"
"""The flag of the bounded action distributions' A/B (issue 61): each against the preset's Gaussian."""


def is_distribution(row: dict[str, str]) -> bool:
    """A run with another action distribution than its preset's (its flag among the extra args)."""
    return DISTRIBUTION_FLAG in shape_flags(row["extra_args"])


def cell(rows: list[dict[str, str]], full_steps: int) -> str:
    vals = [float(r["eval_mean"]) for r in rows]
    steps = {int(r["total_steps"]) for r in rows}
    note = f" ({len(vals)})" if vals else ""
    if steps and max(steps) < full_steps:
        note += f" at {max(steps):,} steps"
    inexact = sum(r.get("resumed") == "yes" and r.get("resume_exact") != "yes" for r in rows)
    return mean_std(vals) + note + (f" †{inexact}" if inexact else "")
