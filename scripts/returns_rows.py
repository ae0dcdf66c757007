"""What a row of docs/benchmarks/returns.csv is a run of, and its cell in a table: the helpers every table of
returns.md shares (scripts/returns_tables.py, scripts/distribution_table.py)."""

from __future__ import annotations

import functools
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


SETTINGS = ("overlap", "distribution")
"""The Config fields a preset switches on a ten-seed decision (issues 59 and 61). A row records what its run had, in
the columns of the same names, so its meaning stays when the preset's line changes: `--overlap` is redundant on
a preset that overlaps, and a run without flags on an older commit may be what `--no-overlap` runs today."""


def settings(row: dict[str, str]) -> tuple[str, str]:
    """(overlap, distribution) as the row's run had them: "true"/"false" and the distribution's name. Rows written
    before the columns ran presets that all had sync rounds and the Gaussian, so their flags say."""
    if row.get("overlap") and row.get("distribution"):
        return row["overlap"], row["distribution"]
    given = split_settings(row["extra_args"])[0]
    return given.get("overlap", "false"), given.get("distribution", "gaussian")


def split_settings(extra_args: str) -> tuple[dict[str, str], list[str]]:
    """The extra flags in two: the SETTINGS they give ({"overlap": "true", "distribution": "beta"}, from --overlap,
    --no-overlap and --distribution NAME) and the other flags (an --actor-timeout stays, as in a row's key)."""
    given: dict[str, str] = {}
    rest: list[str] = []
    flags = iter(shlex.split(extra_args))
    for flag in flags:
        if flag in ("--overlap", "--no-overlap"):
            given["overlap"] = "true" if flag == "--overlap" else "false"
        elif flag == "--distribution":
            given["distribution"] = next(flags, "")
        else:
            rest.append(flag)
    return given, rest


@functools.cache
def preset_settings(config: str) -> tuple[str, str]:
    """(overlap, distribution) as the preset at `config` runs them today: its file's lines, else Config's defaults."""
    from ppo_ddp.configuration.config import Config
    from ppo_ddp.configuration.loading import load_yaml_defaults

    path = ROOT / config
    values = load_yaml_defaults(path) if path.exists() else {}
    return str(values.get("overlap", Config.overlap)).lower(), values.get("distribution", Config.distribution)


def other_flags(row: dict[str, str]) -> list[str]:
    """The row's extra flags but those of SETTINGS."""
    return split_settings(row["extra_args"])[1]


def flags_today(row: dict[str, str]) -> list[str]:
    """The flags that run the row's computation on today's preset: its other flags, then the settings in which it
    differs from the preset (`--no-overlap` for a sync row of a preset that now overlaps)."""
    (overlap, distribution), (preset_overlap, preset_distribution) = settings(row), preset_settings(row["config"])
    flags = other_flags(row)
    if overlap != preset_overlap:
        flags.append("--overlap" if overlap == "true" else "--no-overlap")
    if distribution != preset_distribution:
        flags += ["--distribution", distribution]
    return flags


def own_shape(row: dict[str, str]) -> bool:
    """A run of the preset as it is today (no flags that change what it computes, whichever it was run with)."""
    return not shape_flags(shlex.join(flags_today(row)))


def is_scale(row: dict[str, str]) -> bool:
    return row["config"].startswith("ppo_ddp/configs/scale/")


def is_dmc(row: dict[str, str]) -> bool:
    """A run on a DeepMind Control Suite task (dm_control/<domain>-<task>-v0, MuJoCo 3.17.0)."""
    return row["env"].startswith(DMC_PREFIX)


def is_partial(row: dict[str, str]) -> bool:
    """A run on a partly observed env (its velocities hidden: ppo_ddp/envs/partial.py)."""
    return row["env"].startswith(PARTIAL_PREFIX)


def eval_curve(curve: str | Path) -> Path:
    """Where a row's periodic evaluations (the run's eval.csv) sit: beside its training curve, `<curve>_eval.csv`."""
    curve = Path(curve)
    return curve.with_name(f"{curve.stem}_eval.csv")


def gym_1m_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows of the 1M tables: gymnasium's fully observed MuJoCo envs, not the 10M presets."""
    return [r for r in rows if not is_scale(r) and not is_partial(r) and not is_dmc(r)]


def runs_of(
    rows: list[dict[str, str]], env_id: str, overlap: str, distribution: str = "", other: tuple[str, ...] = ()
) -> list[dict[str, str]]:
    """One learner's rows (params, the env's 1M preset) of `env_id` that ran with overlapped rounds or not (`overlap`:
    "true"/"false"), `distribution` (the preset's where empty) and no other shape flags than `other`."""
    return [
        r
        for r in gym_1m_rows(rows)
        if r["env"] == env_id
        and r["world_size"] == "1"
        and (r.get("sync_mode") or "params") == "params"
        and settings(r) == (overlap, distribution or preset_settings(r["config"])[1])
        and tuple(other_flags(r)) == other
    ]


def cell(rows: list[dict[str, str]], full_steps: int) -> str:
    vals = [float(r["eval_mean"]) for r in rows]
    steps = {int(r["total_steps"]) for r in rows}
    note = f" ({len(vals)})" if vals else ""
    if steps and max(steps) < full_steps:
        note += f" at {max(steps):,} steps"
    inexact = sum(r.get("resumed") == "yes" and r.get("resume_exact") != "yes" for r in rows)
    return mean_std(vals) + note + (f" †{inexact}" if inexact else "")
