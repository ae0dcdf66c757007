"""What python -m ppo_ddp.tune writes about a study: the best trial as presets, a table of all trials, the history plot.

Everything comes from the study's database and the space it stored, so any machine that reaches the storage
can write the report (`python -m ppo_ddp.tune --study NAME --storage URL --report`).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Optional

from ppo_ddp.search.space import Space, env_file_name, write_preset


def write_report(study: Any, space: Space, study_dir: Path) -> list[str]:
    """Write trials.csv, trials.md, history.png and best_<env>.yaml into study_dir; the lines to print."""
    trials = study.get_trials(deepcopy=False)
    rows = [trial_row(t, space) for t in trials]
    lines = [summary(study.study_name, rows)]
    csv_path, md_path = study_dir / "trials.csv", study_dir / "trials.md"
    write_csv(csv_path, rows)
    best = best_trial(study)
    md_path.write_text(markdown(study.study_name, space, rows, best))
    lines += [f"table: {csv_path}", f"table: {md_path}"]
    png = plot_history(study_dir / "history.png", study.study_name, trials)
    lines.append(f"plot: {png}" if png else "plot: not drawn (pip install matplotlib)")
    if best is None:
        lines.append("best: no complete trial yet")
        return lines
    for path in write_best_presets(study.study_name, space, best, study_dir):
        lines.append(f"best preset (trial {best.number}, score {best.value:.4g}): {path}")
    return lines


def best_trial(study: Any) -> Optional[Any]:
    try:
        return study.best_trial
    except ValueError:  # no complete trial
        return None


def trial_row(t: Any, space: Space) -> dict[str, Any]:
    ended, started = t.datetime_complete, t.datetime_start
    seconds = round((ended - started).total_seconds(), 1) if ended and started else None
    note = t.user_attrs.get("fail_reason", "")
    if t.state.name == "PRUNED" and t.intermediate_values:
        note = f"pruned at step {t.last_step:,}"
    elif t.state.name == "FAIL" and not note:
        note = "interrupted" if t.user_attrs.get("interrupted") else "its worker stopped (no heartbeat)"
    row = {"number": t.number, "state": t.state.name, "value": t.value, "seconds": seconds}
    row.update({d.name: t.params.get(d.name) for d in space.params})
    row.update({f"return/{env}": t.user_attrs.get(f"return/{env}") for env in space.envs})
    row["note"] = note
    return row


def summary(name: str, rows: list[dict[str, Any]]) -> str:
    states: dict[str, int] = {}
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + 1
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items()))
    return f"study {name}: {len(rows)} trials ({counts or 'none'})"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        path.write_text("")
        return
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value).replace("|", "\\|")


def markdown(name: str, space: Space, rows: list[dict[str, Any]], best: Any) -> str:
    """All trials, the complete ones best first, then the pruned (by their last reported score), then the rest."""
    rank = {"COMPLETE": 0, "PRUNED": 1}
    ordered = sorted(rows, key=lambda r: (rank.get(r["state"], 2), math.inf if r["value"] is None else -r["value"]))
    targets = ", ".join(f"{env} / {target:g}" for env, target in space.envs.items())
    head = [
        f"# Study {name}",
        "",
        f"{summary(name, rows)}; search space {space.source}; score: evaluation return / target ({targets}), "
        "the mean over envs; a pruned trial's value is its last reported score; seconds: the trial's wall time.",
        "",
    ]
    if best is not None:
        head += [f"Best: trial {best.number}, score {best.value:.4g}.", ""]
    if not rows:
        return "\n".join(head)
    columns = list(rows[0])
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    table += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in ordered]
    return "\n".join(head + table) + "\n"


def write_best_presets(name: str, space: Space, best: Any, study_dir: Path) -> list[Path]:
    """The best trial's config on each env, as a preset `python -m ppo_ddp.train --config` runs."""
    params = {d.name: d.decode(best.params[d.name]) for d in space.params}
    paths = []
    for env_id, target in space.envs.items():
        ret = best.user_attrs.get(f"return/{env_id}")
        path = study_dir / f"best_{env_file_name(env_id)}.yaml"
        header = [
            f"Best trial {best.number} of study {name} (python -m ppo_ddp.tune --report): score {best.value:.4g} over "
            f"{len(space.envs)} env(s); {env_id} evaluated {ret:.1f} (target {target:g}).",
            f"Search space {space.source} over the base preset {space.doc.get('base', 'of each env')}; searched: "
            + ", ".join(params)
            + ".",
            f"Train it: python -m ppo_ddp.train --config {path}",
        ]
        write_preset(path, space.trial_values(params, env_id), header)
        paths.append(path)
    return paths


def plot_history(path: Path, name: str, trials: list[Any]) -> Optional[Path]:
    """Optimisation history: each complete trial's score, each pruned trial's last reported score, failed trials
    as ticks at the bottom, and the best score so far."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return None
    done = [t for t in trials if t.state.name == "COMPLETE"]
    pruned = [t for t in trials if t.state.name == "PRUNED" and t.value is not None]
    failed = [t for t in trials if t.state.name == "FAIL"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter([t.number for t in done], [t.value for t in done], label="complete", zorder=3)
    ax.scatter([t.number for t in pruned], [t.value for t in pruned], marker="x", color="grey", label="pruned")
    if done:
        best, xs, ys = -math.inf, [], []
        for t in sorted(done, key=lambda t: t.number):
            best = max(best, t.value)
            xs.append(t.number)
            ys.append(best)
        ax.step(xs, ys, where="post", color="tab:red", label="best so far")
    if failed:
        ax.plot(
            [t.number for t in failed],
            [0.0] * len(failed),
            "|",
            color="black",
            markersize=12,
            transform=ax.get_xaxis_transform(),
            label="failed",
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("score (evaluation return / target)")
    ax.set_title(f"study {name}: optimisation history")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
