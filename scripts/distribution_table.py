"""returns.md's table of the bounded action distributions (issue 61): each against the preset's Gaussian.

One learner, sync rounds, 1M env steps, the five robots people compare on; for each distribution the mean ± std
over seeds 1-3 (`--train-args "--distribution beta"` rows), the Gaussian's over the same seeds and the ratio of the
means, and the mean over every seed 1-10 each has. A preset switches only where the new distribution's ten-seed
mean is above the Gaussian's (the Gaussian's ten seeds are issue 59's rows). Rows are chosen by the distribution
their runs had (returns_rows.settings), whichever the preset has now.
"""

from __future__ import annotations

import numpy as np
from returns_rows import BENCHMARK_SEEDS, cell, preset_settings
from seed_intervals import COMPARED, seed_rows

BOUNDED = ("beta", "tanh_gaussian")
KINDS = ("gaussian", *BOUNDED)


def distribution_table(rows: list[dict[str, str]]) -> list[str]:
    """The section, or nothing before the first bounded row."""
    runs = {(env, d): seed_rows(rows, env, "false", d) for env in COMPARED for d in KINDS}
    envs = [env for env in COMPARED if any(runs[env, d] for d in BOUNDED)]
    if not envs:
        return []
    lines = [
        "## Bounded action distributions (`--distribution`), 1M env steps, 1 learner",
        "",
        "Each preset with sync rounds and the Gaussian (whose samples the env clips), `--distribution beta` or "
        '`--distribution tanh_gaussian` (docs/design.md, "Action distributions"), seeds 1-3; the ratio is the '
        "mean's over the Gaussian's on the same seeds; the ten-seed means are over every seed 1-10 run so far (their "
        "number in brackets). A preset switches only where a bounded distribution's ten-seed mean is above the "
        "Gaussian's; the `preset` column says which it has now.",
        "",
        "| env | Gaussian (seeds) | beta (seeds) | ratio | tanh_gaussian (seeds) | ratio | ten-seed means: Gaussian, "
        "beta, tanh_gaussian | preset | commits |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for env_id in envs:
        first = {d: [r for r in runs[env_id, d] if r["seed"] in BENCHMARK_SEEDS] for d in KINDS}
        base = np.mean([float(r["eval_mean"]) for r in first["gaussian"]]) if first["gaussian"] else np.nan
        cells = [cell(first["gaussian"], 10**6)]
        for d in BOUNDED:
            mean = np.mean([float(r["eval_mean"]) for r in first[d]]) if first[d] else np.nan
            cells += [cell(first[d], 10**6), f"{mean / base:.2f}" if first[d] and first["gaussian"] else "—"]
        ten = []
        for d in KINDS:
            values = [float(r["eval_mean"]) for r in runs[env_id, d]]
            ten.append(f"{np.mean(values):.0f} ({len(values)})" if values else "—")
        commits = ", ".join(sorted({r["commit"] for d in BOUNDED for r in first[d]}))
        preset = preset_settings(next(r for d in KINDS for r in runs[env_id, d])["config"])[1]
        lines.append(f"| {env_id} | {' | '.join(cells)} | {', '.join(ten)} | {preset} | {commits} |")
    return lines + [""]
