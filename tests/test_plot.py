"""`python -m ppo_ddp.plot`: a user's runs as learning curves, a panel per env; bad input is one line, exit 2."""

from __future__ import annotations

import csv

import pytest
import yaml

from ppo_ddp import plot


def fake_run(folder, env_id: str, returns: list[float]) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"config": {"env_id": env_id}}))
    with open(folder / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["iteration", "global_step", "charts/episodic_return", "charts/episodes"])
        writer.writerows([i, 2048 * i, r, 4] for i, r in enumerate(returns, 1))


def test_runs_become_one_panel_per_env(tmp_path, capsys):
    for seed in (1, 2):
        fake_run(tmp_path / f"hopper-s{seed}", "Hopper-v5", [10.0 * seed * i for i in range(30)])
    fake_run(tmp_path / "ant-s1", "Ant-v5", [float(i) for i in range(30)])
    out = tmp_path / "curves.png"
    plot.main(
        [str(tmp_path / "hopper-s1"), str(tmp_path / "hopper-s2"), f"mine={tmp_path / 'ant-s1'}", "--out", str(out)]
    )
    assert out.stat().st_size > 10_000 and capsys.readouterr().out == f"wrote {out}\n"
    steps, returns = plot.load_curve(tmp_path / "ant-s1" / "metrics.csv")
    assert steps[0] == 2048 and returns[-1] == 29.0


def test_a_folder_without_metrics_or_no_matplotlib_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as stop:
        plot.main([str(tmp_path / "nothing"), "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "no metrics.csv there" in err
    monkeypatch.setattr(plot, "missing_extra", lambda module: f"needs {module}: pip install {module}")
    with pytest.raises(SystemExit) as stop:
        plot.main([str(tmp_path), "--out", str(tmp_path / "x.png")])
    assert (
        stop.value.code == 2
        and capsys.readouterr().err == "python -m ppo_ddp.plot: error: needs matplotlib: pip install matplotlib\n"
    )
