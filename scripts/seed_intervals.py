"""Ten seeds with intervals: the 1M cells of the five robots people compare on, as the field reports them.

For each env, the final deterministic evaluations of seeds 1-10 (returns.csv's eval_mean, one learner, the preset's
action distribution), with sync rounds and with overlapped ones, give the mean and the interquartile mean, each
with a 95% stratified-bootstrap interval (rliable's get_interval_estimates, percentile method, 50,000 resamples, a
fixed random state: the same rows give the same table). The preset's own rounds are "above" the best published PPO
only where their mean's interval lies at or above the published mean, "below" where it lies under it, and "level"
otherwise; the overlap column also says whether it keeps 0.97 of sync's mean (the overlap decision's learning
side; its speed side is measured alone by scripts/bench_overlap.py). Rows are chosen by what their runs had
(returns_rows.settings), so a preset that switched keeps its rows of either kind. rliable comes with the bench
extra (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
from returns_rows import preset_settings, runs_of

CACHE = Path(__file__).resolve().parent.parent / "runs" / "seed_intervals.json"
"""Intervals already computed, by their values (git-ignored): a bootstrap of 50,000 resamples takes rliable ~10 s,
and the tables are rebuilt after every benchmark row. The fixed random state makes a cached one the same."""
MIN_SEEDS = 5  # fewer runs give no interval worth printing
TEN_SEEDS = tuple(str(s) for s in range(1, 11))
COMPARED = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")
OVERLAP_KEEPS = 0.97  # overlapped rounds may cost at most 3% of sync's mean (issue 59)


def intervals(values: list[float], reps: int = 50_000) -> dict[str, tuple[float, float, float]]:
    """{"mean", "iqm"}: (point, low, high), the 95% stratified-bootstrap interval over runs (one task)."""
    key = f"{reps}:{sorted(values)}"
    cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    if key not in cache:
        cache[key] = _bootstrap(values, reps)
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        tmp = CACHE.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(CACHE)
    return {name: tuple(estimate) for name, estimate in cache[key].items()}


def _bootstrap(values: list[float], reps: int) -> dict[str, list[float]]:
    from rliable import library as rly
    from rliable import metrics

    scores = {"run": np.asarray(values, dtype=np.float64).reshape(-1, 1)}  # runs x tasks
    aggregate = lambda x: np.array([metrics.aggregate_mean(x), metrics.aggregate_iqm(x)])  # noqa: E731
    with warnings.catch_warnings():  # arch's notice that random_state will go: rliable 1.2.0 still passes it
        warnings.simplefilter("ignore", FutureWarning)
        points, cis = rly.get_interval_estimates(scores, aggregate, reps=reps, random_state=np.random.RandomState(0))
    (mean, iqm), (low, high) = points["run"], cis["run"]
    return {"mean": [float(mean), float(low[0]), float(high[0])], "iqm": [float(iqm), float(low[1]), float(high[1])]}


def verdict(mean_interval: tuple[float, float, float], published: float) -> str:
    _, low, high = mean_interval
    return "above" if low >= published else "below" if high < published else "level"


def show(estimate: tuple[float, float, float]) -> str:
    point, low, high = estimate
    return f"{point:.0f} [{low:.0f}, {high:.0f}]"


def seed_rows(rows: list[dict[str, str]], env_id: str, overlap: str, distribution: str = "") -> list[dict[str, str]]:
    """The env's rows of seeds 1-10, one learner, sync (`overlap` "false") or overlapped ("true"), with
    `distribution` (the preset's where empty) and no other flags."""
    return [r for r in runs_of(rows, env_id, overlap, distribution) if r["seed"] in TEN_SEEDS]


def ten_seed_table(rows: list[dict[str, str]], published: dict[str, float]) -> list[str]:
    """returns.md's section: sync and overlapped rounds, mean and IQM with intervals; the preset's against the best
    published PPO."""
    lines = [
        "## Ten seeds, with intervals (1M env steps, 1 learner)",
        "",
        "Seeds 1-10 of each preset with sync and with overlapped rounds (`--no-overlap`, `--overlap`), each with the "
        "preset's action distribution: the mean and the interquartile mean (IQM) of the final policies' "
        "deterministic evaluations, each with its 95% stratified-bootstrap interval (rliable, 50,000 resamples; "
        "scripts/seed_intervals.py). The preset's own rounds (the `preset` column) against the best published "
        "PPO's mean: *above* where the mean's interval lies at or above it, *below* where it lies under it, *level* "
        "otherwise. A seed repeats bit for bit on one kind of CPU and gives other numbers on another maker's: the "
        "rows' `cpu` column says where each ran. Overlap keeps 0.97 of sync's mean or not (`keeps`); whether it is "
        "also faster is timed alone (throughput.md). A preset overlaps where both hold. Envs with fewer than 5 seeds "
        "so far are left out.",
        "",
        "| env | preset | seeds | sync: mean [95% CI] | sync: IQM [95% CI] | overlap: mean [95% CI] "
        "| overlap: IQM [95% CI] | overlap / sync | keeps 0.97 | published | preset vs published | cpu |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for env_id in COMPARED:
        got = {o: seed_rows(rows, env_id, o) for o in ("false", "true")}
        if len(got["false"]) < MIN_SEEDS:
            continue
        estimates = {o: intervals([float(r["eval_mean"]) for r in got[o]]) for o in got if len(got[o]) >= MIN_SEEDS}
        overlap, distribution = preset_settings(got["false"][0]["config"])
        cells = [f"{'overlap' if overlap == 'true' else 'sync'}, {distribution}", f"{len(got['false'])} / "
                 f"{len(got['true'])}", show(estimates["false"]["mean"]), show(estimates["false"]["iqm"])]  # fmt: skip
        if "true" in estimates:
            ratio = estimates["true"]["mean"][0] / estimates["false"]["mean"][0]
            keeps = "yes" if ratio >= OVERLAP_KEEPS else "no"
            cells += [show(estimates["true"]["mean"]), show(estimates["true"]["iqm"]), f"{ratio:.3f}", keeps]
        else:
            cells += ["—"] * 4
        mine = estimates.get(overlap)
        cells += [f"{published[env_id]:.0f}", verdict(mine["mean"], published[env_id]) if mine else "—"]
        cpus = ", ".join(sorted({r.get("cpu") or "not recorded" for r in got["false"] + got["true"]}))
        lines.append(f"| {env_id} | {' | '.join(cells)} | {cpus} |")
    return lines + [""]
