"""scripts/bench_peers.py, time to score against the peers: a run is timed from its own reports of the training
return to the first at the score, its row is kept per env, trainer and seed, and the table compares the medians.
(rl_games runs in a venv of its own, which CI does not build: its run is tested where that venv is.)"""

from __future__ import annotations

import argparse
import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from launches import shm_blocks_of

from ppo_ddp.configuration.loading import load_yaml_defaults

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench_peers(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_peers

    return bench_peers


def peers_venv(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not (ROOT / name).is_dir(), reason=f"needs {name} (bench_peers.py's docstring)")


PEERS = [pytest.param("rl_games", marks=peers_venv(".venv-peers")),
         pytest.param("rl_games main", marks=peers_venv(".venv-peers-main"))]  # fmt: skip


@pytest.mark.parametrize("trainer", ["ppo_ddp", "sb3", *PEERS])
def test_a_run_is_timed_to_its_first_reported_return_at_the_score_then_stopped(bench_peers, monkeypatch, trainer):
    # A score any reported return reaches: the run stops at its first report (ppo_ddp's metrics.csv row with a
    # return over the last 100 episodes; the peers' line after their first rollout), long before budget or cap.
    monkeypatch.setitem(bench_peers.SCORES, "Hopper-v5", 1.0)
    rollout = 64  # ppo_ddp's: the preset's rounds (2 actors x 1 env) of 64 steps an env, not 1024
    if trainer == "ppo_ddp":  # the preset's first round, without its compile (~20 s that this test does not need)
        command = bench_peers.trainer_command

        def without_compile(*args):
            cmd, metrics_csv = command(*args)
            return cmd + ["--no-compile", "--rollout-length", str(rollout)], metrics_csv

        monkeypatch.setattr(bench_peers, "trainer_command", without_compile)
    looks = []  # the run's shared-memory blocks just before its stop and just after
    stop = bench_peers.Run.stop

    def stop_and_look(run):
        looks.append(shm_blocks_of(run.proc.pid))
        stop(run)
        looks.append(shm_blocks_of(run.proc.pid))

    monkeypatch.setattr(bench_peers.Run, "stop", stop_and_look)
    row = bench_peers.measure(trainer, "Hopper-v5", 1, cap=600.0)
    assert row["env"] == "Hopper-v5" and row["trainer"] == trainer and row["score"] == 1.0
    assert 0 < row["reached_seconds"] <= row["end_seconds"] < 600 and row["cap_seconds"] == 600
    preset = load_yaml_defaults(ROOT / "ppo_ddp" / "configs" / "hopper.yaml")
    ours = preset["num_envs"] * rollout
    first = {"ppo_ddp": ours, "sb3": 512}.get(trainer, 64 * 64)  # hopper_envpool.yaml: 64 envs, horizon 64
    assert row["reached_steps"] % first == 0 and 0 < row["reached_steps"] <= row["end_steps"]
    assert row["end_return"] >= 1.0
    # Stopped by SIGTERM, ppo_ddp unlinked the block it had while it ran (a SIGKILL would have left it).
    assert [len(look) for look in looks] == ([1, 0] if trainer == "ppo_ddp" else [0, 0]), looks


def test_trainer_names_are_the_peers_or_ppo_ddp_with_a_variant(bench_peers):
    for name in ("ppo_ddp", "ppo_ddp --no-overlap", "ppo_ddp scale/ant", "rl_games", "rl_games main", "sb3"):
        assert bench_peers.trainer_name(name) == name
    for name in ("rl_games 2.0", "sb3 --x", "cleanrl"):
        with pytest.raises(argparse.ArgumentTypeError, match="rl_games main"):
            bench_peers.trainer_name(name)
    # both rl_games run the one worker, each with its own venv's python
    cmds = [bench_peers.trainer_command(t, "Hopper-v5", 1, ROOT)[0] for t in ("rl_games", "rl_games main")]
    assert [c[0] for c in cmds] == [str(bench_peers.PEERS_PYTHON[t]) for t in ("rl_games", "rl_games main")]
    assert cmds[0][2:] == cmds[1][2:] == ["rl_games", "Hopper-v5", "1"]


def test_rows_replace_their_own_and_the_table_takes_medians_and_caps(bench_peers, tmp_path):
    path = tmp_path / "peers.csv"

    def put(trainer, seed, reached_seconds, reached_steps=""):
        row = dict(env="Hopper-v5", trainer=trainer, seed=seed, score=3000, reached_steps=reached_steps,
                   reached_seconds=reached_seconds, end_steps=1_000_000, end_seconds=1200, end_return=3100.0,
                   cap_seconds=1200, cpu="AMD EPYC", version="v", date="2026-12-05")  # fmt: skip
        bench_peers.put_row(path, row)

    put("ppo_ddp", 1, 999.0, 10)  # replaced below
    for seed, seconds in ((1, 60.0), (2, 120.0), (3, 90.0)):
        put("ppo_ddp", seed, seconds, 500_000 + seed)
    for seed, seconds, steps in ((1, 300.0, 700_000), (2, "", ""), (3, 180.0, 400_000)):  # seed 2 capped
        put("rl_games", seed, seconds, steps)  # the median is still seed 1's 300 s, and its steps those of seed 1
    put("sb3", 1, "")  # capped, its only seed
    put("ppo_ddp", 1, 60.0, 500_001)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert [(r["trainer"], r["seed"]) for r in rows] == [("ppo_ddp", "1"), ("ppo_ddp", "2"), ("ppo_ddp", "3"),
                                                         ("rl_games", "1"), ("rl_games", "2"), ("rl_games", "3"),
                                                         ("sb3", "1")]  # fmt: skip
    lines = {line.split(" | ")[1]: line for line in bench_peers.table(rows).splitlines() if "Hopper" in line}
    assert "| 1 2 3 | AMD EPYC | 1.5 min (0.50M steps) |" in lines["ppo_ddp"]  # median of 60, 90, 120 s, its CPU
    assert "| 5.0 min (0.70M steps) |" in lines["rl_games"] and lines["rl_games"].endswith("| 3.3x |")
    assert "not reached, > 20 min" in lines["sb3"] and lines["sb3"].endswith("| > 13.3x (theirs capped) |")


def test_the_table_says_whether_a_miss_was_the_cap_or_the_trainers_own_budget(bench_peers):
    def row(trainer, seed, end_steps, end_seconds):
        return dict(env="Walker2d-v5", trainer=trainer, seed=str(seed), score="3000", reached_steps="",
                    reached_seconds="", end_steps=str(end_steps), end_seconds=str(end_seconds), end_return="2900.0",
                    cap_seconds="1200")  # fmt: skip

    rows = [row("ppo_ddp", s, 1_001_472, t) for s, t in ((1, 131.0), (2, 144.3), (3, 130.4))]
    rows += [row("rl_games", s, 9_000_000, 1200.2) for s in (1, 2, 3)]
    rows += [row("sb3", 1, 800_000, 1200.1), row("sb3", 2, 1_000_000, 900.0)]
    lines = {line.split(" | ")[1]: line for line in bench_peers.table(rows).splitlines() if "Walker" in line}
    assert "| not reached in its budget (1.00M steps, 2.2 min) |" in lines["ppo_ddp"]
    assert "| not reached, > 20 min |" in lines["rl_games"] and lines["rl_games"].endswith("| — |")
    assert "| not reached (its budget or > 20 min) |" in lines["sb3"]


def test_ppo_ddp_s_row_is_the_default_command_and_a_variant_is_a_trainer_named_on_the_command_line(
    bench_peers, tmp_path, monkeypatch
):
    # The batch's ppo_ddp row per env is `train.py --env-id ENV` and nothing else; a variant runs only when named.
    measured = []

    def measure(trainer, env_id, seed, cap):
        measured.append((trainer, env_id, seed))
        return dict(reached_seconds="", reached_steps="", end_return="1.0", end_seconds="1.0")

    monkeypatch.setattr(bench_peers, "measure", measure)
    monkeypatch.setattr(bench_peers, "put_row", lambda *a: None)
    args = SimpleNamespace(envs=["HalfCheetah-v5", "Ant-v5"], trainers=["ppo_ddp", "sb3"], seeds=[1, 2],
                           skip_done_here=False, csv=tmp_path / "rows.csv", cap_minutes=1.0)  # fmt: skip
    bench_peers.run_batch(args, {"ppo_ddp": "v", "sb3": "v"}, "cpu", set())
    assert measured == [("ppo_ddp", "HalfCheetah-v5", 1), ("ppo_ddp", "HalfCheetah-v5", 2),
                        ("sb3", "HalfCheetah-v5", 1), ("ppo_ddp", "Ant-v5", 1), ("ppo_ddp", "Ant-v5", 2),
                        ("sb3", "Ant-v5", 1)]  # fmt: skip

    assert bench_peers.trainer_name("ppo_ddp  --no-overlap") == "ppo_ddp --no-overlap"
    for bad in ("cleanrl", "rl_games --no-overlap"):
        with pytest.raises(
            argparse.ArgumentTypeError, match=re.escape('use ppo_ddp, rl_games, "rl_games main", sb3 or')
        ):
            bench_peers.trainer_name(bad)
    commands = {t: bench_peers.trainer_command(t, "Ant-v5", 2, tmp_path)[0]
                for t in ("ppo_ddp", "ppo_ddp scale/ant", "ppo_ddp --no-overlap")}  # fmt: skip
    tail = ["--seed", "2", "--runs-dir", str(tmp_path), "--run-name", "run"]
    assert commands["ppo_ddp"][2:] == ["--env-id", "Ant-v5", *tail]
    assert commands["ppo_ddp scale/ant"][2:] == ["--config", "scale/ant", *tail]
    assert commands["ppo_ddp --no-overlap"][2:] == ["--env-id", "Ant-v5", "--no-overlap", *tail]


def test_the_speed_up_is_the_default_command_s_against_a_peer_on_its_cpu(bench_peers):
    # A variant's rows are shown but not compared (the default command is what a user runs), and a peer's rows from
    # another CPU are not compared with ours (each machine, each day, steps at its own speed).
    def row(trainer, seed, reached_seconds, cpu="Intel Xeon"):
        return dict(env="HalfCheetah-v5", trainer=trainer, seed=str(seed), score="5000", reached_steps="500000",
                    reached_seconds=str(reached_seconds), end_steps="1001472", end_seconds="200.0",
                    end_return="5100.0", cap_seconds="1200", cpu=cpu)  # fmt: skip

    rows = [row("ppo_ddp", s, 90.0 * s) for s in (1, 2, 3)] + [row("ppo_ddp --no-overlap", s, 60.0) for s in (1, 2, 3)]
    rows += [row("rl_games main", s, 540.0) for s in (1, 2, 3)] + [
        row("rl_games", s, 600.0, "AMD EPYC") for s in (1, 2)
    ]
    lines = {line.split(" | ")[1]: line for line in bench_peers.table(rows).splitlines() if "Cheetah" in line}
    assert "| 1.0 min (0.50M steps) |" in lines["ppo_ddp --no-overlap"] and lines["ppo_ddp --no-overlap"].endswith(
        "|  |"
    )
    assert lines["rl_games main"].endswith("| 3.0x |")  # 540 s over the default's median 180 s
    assert lines["rl_games"].endswith("| — (another CPU) |")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_batch_stops_the_run_in_progress_and_writes_no_row(tmp_path, sig):
    rows = tmp_path / "rows.csv"
    batch = subprocess.Popen(
        [sys.executable, "scripts/bench_peers.py", "--envs", "Hopper-v5", "--trainers", "ppo_ddp", "--seeds", "1",
         "--csv", str(rows)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # as a batch started in the background: no signals but the test's
    )  # fmt: skip
    try:
        run = started_run(batch.pid)  # the trainer, leading a process group of its own
        os.kill(batch.pid, sig)
        _, err = batch.communicate(timeout=90)
    finally:
        batch.kill()
    assert batch.returncode == 128 + sig, err
    assert err.strip().endswith(f"stopped by {sig.name}; the run in progress was stopped, its row not written")
    deadline = time.monotonic() + 10  # the run's own children (forkserver, actors) end with it
    while group(run) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group(run)
    assert not rows.exists()


def started_run(parent: int, timeout: float = 60.0) -> int:
    """The pid of the parent's child once it runs train.py."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
            try:
                if b"train.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
            except OSError:  # gone meanwhile
                continue
        time.sleep(0.05)
    pytest.fail(f"bench_peers started no run within {timeout} s")


def group(pgid: int) -> list[int]:
    """The live processes of a process group (zombies left out: they have ended)."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids
