"""The figures of the learning benchmark (scripts/returns_tables.py's plot_all, scripts/returns_figures.py): each
figure plots the rows behind its table, and a band is the mean over seeds with a bootstrap interval."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def test_the_1m_figure_plots_the_rows_behind_the_table(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import returns_tables

    def row(seed, extra=""):
        curve = tmp_path / f"swimmer_s{seed}_{len(extra)}.csv"
        curve.write_text("global_step,charts/episodic_return\n")
        return {"env": "Swimmer-v5", "seed": str(seed), "world_size": "1", "config": "ppo_ddp/configs/swimmer.yaml",
                "extra_args": extra, "sync_mode": "params", "curve": str(curve)}  # fmt: skip

    plotted = {}
    monkeypatch.setattr(returns_tables, "plot_curves", lambda curves, out: plotted.update({out.name: curves}))
    rows = [row(1), row(2), row(3), row(4), row(1, "--actor-timeout 9")]  # seed 4 and the flagged run are not in it
    returns_tables.plot_all(rows, tmp_path)
    assert [path.name for _, path in plotted["returns_all.png"]] == [f"swimmer_s{s}_0.csv" for s in (1, 2, 3)]


def test_the_ten_seed_figure_plots_each_presets_own_rounds_and_the_10m_rows(tmp_path, monkeypatch):
    """returns.png: a compared robot's seeds 1-10 with its preset's rounds (Hopper's overlap), not its sync rows nor
    seed 11; returns_10m.png: every 10M row by env."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import returns_tables

    def row(env, seed, config, extra="", overlap="true"):
        curve = tmp_path / f"{env}_{seed}_{overlap}.csv"
        curve.write_text("global_step,charts/episodic_return\n")
        return {"env": env, "seed": str(seed), "world_size": "1", "config": config, "extra_args": extra,
                "sync_mode": "params", "curve": str(curve), "overlap": overlap, "distribution": "gaussian"}  # fmt: skip

    hopper = "ppo_ddp/configs/hopper.yaml"
    rows = [row("Hopper-v5", s, hopper) for s in range(1, 12)]
    rows += [row("Hopper-v5", s, hopper, "--no-overlap", "false") for s in range(1, 11)]
    rows += [row("Ant-v5", s, "ppo_ddp/configs/scale/ant.yaml", overlap="false") for s in (1, 2)]
    plotted = {}
    monkeypatch.setattr(returns_tables, "plot_curves", lambda curves, out: None)
    monkeypatch.setattr(returns_tables, "plot_seeds", lambda groups, out, *a: plotted.update({out.name: groups}))
    returns_tables.plot_all(rows, tmp_path)
    assert list(plotted["returns.png"]) == ["Hopper-v5"]
    shown = [(r["seed"], r["overlap"]) for r in plotted["returns.png"]["Hopper-v5"]]
    assert shown == [(str(s), "true") for s in range(1, 11)]
    assert [r["seed"] for r in plotted["returns_10m.png"]["Ant-v5"]] == ["1", "2"]


def test_a_figure_band_is_the_mean_and_a_bootstrap_interval_over_seeds(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from returns_figures import mean_band

    curves = np.array([[0.0, 10.0], [2.0, 10.0], [4.0, 10.0]])
    mean, low, high = mean_band(curves)
    assert mean.tolist() == [2.0, 10.0]
    assert 0.0 <= low[0] < 2.0 < high[0] <= 4.0 and low[1] == high[1] == 10.0  # no spread, no band
    assert np.array_equal(mean_band(curves)[1], low)  # a fixed random state: the same rows draw the same figure


def test_the_tables_and_figures_rebuild_from_the_rows_alone(tmp_path):
    """`benchmark_returns.py --tables` runs nothing: returns.md and the ten-seed figure from a returns.csv (here
    Hopper's ten overlapped rows of the repository's)."""
    with open(ROOT / "docs" / "benchmarks" / "returns.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["env"] == "Hopper-v5" and r["config"].endswith("/hopper.yaml")
                and r["extra_args"] == "" and r["world_size"] == "1"]  # fmt: skip
    assert len(rows) == 10
    with open(tmp_path / "returns.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    cmd = [sys.executable, "scripts/benchmark_returns.py", "--tables", "--out-dir", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "returns.md").read_text()
    cell = next(line for line in table.splitlines() if line.startswith("| Hopper-v5 | "))  # the 1M table: seeds 1-3
    assert " (3) |" in cell
    assert (tmp_path / "returns.png").read_bytes().startswith(b"\x89PNG")
    assert not list(tmp_path.glob("runs*"))  # nothing trained
