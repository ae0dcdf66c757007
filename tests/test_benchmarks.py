"""The benchmark tooling: every preset is a valid Config; the returns and throughput benchmarks run end to end."""

from __future__ import annotations

import csv
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppo_ddp.configuration.config import Config
from ppo_ddp.configuration.loading import load_yaml_defaults
from ppo_ddp.configuration.validation import validate
from ppo_ddp.envs.make import is_dm_control, missing_dm_control

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted((ROOT / "ppo_ddp" / "configs").glob("*.yaml"))


def test_there_is_a_preset_per_benchmark_env():
    assert {p.stem for p in PRESETS} >= {"halfcheetah", "hopper", "walker2d", "ant", "humanoid"}


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_parses_into_a_valid_config(preset):
    cfg = Config(**load_yaml_defaults(preset))
    # the env exists, the round splits into the mini-batches, every value is in range; a DeepMind Control preset's
    # env only where the dmc extra is installed (tests/test_dmc.py checks it there)
    validate(cfg, check_env=not is_dm_control(cfg.env_id) or missing_dm_control() is None)
    name = preset.stem.removesuffix("_gru")  # hopper_novel_gru: hopper_novel with the GRU policy
    if name.startswith("dmc_"):  # dmc_cheetah_run: dm_control/cheetah-run-v0
        assert cfg.env_id == f"dm_control/{name.removeprefix('dmc_').replace('_', '-')}-v0"
    else:  # hopper: Hopper-v5; hopper_novel: ppo_ddp/HopperNoVel-v5
        assert name.replace("_", "") in cfg.env_id.lower()
    assert cfg.policy == ("gru" if preset.stem.endswith("_gru") else "mlp")
    # 1M steps, the benchmark's budget; Humanoid's and Ant's recipes run until they reach their scores (their 1M rows
    # stop them there)
    budget = {"humanoid": 3_000_000, "ant": 3_000_000}.get(name, 300_000 if name.startswith("pendulum") else 1_000_000)
    assert cfg.total_timesteps == budget


# Two benchmark_returns.py recording at once (a seed each): every row of both ends up in the CSV. Both start
# writing together, once both have imported (seconds), so that their writes interleave. The evaluation's module, which
# the rows do not use, is left out: it would import torch (~3 s of CPU in each process).
PUT_ROWS = """
import sys, time, types
from pathlib import Path
sys.path.insert(0, "scripts")
sys.modules["ppo_ddp.evaluation.playback"] = types.SimpleNamespace(evaluate_policy=None, load_policy=None)
from benchmark_returns import FIELDS, put_row
csv_path, writer = Path(sys.argv[1]), sys.argv[2]
(csv_path.parent / f"ready_{writer}").touch()
while not (csv_path.parent / "go").exists():
    time.sleep(0.001)
for seed in range(ROWS):
    row = {**dict.fromkeys(FIELDS, ""), "env": writer, "seed": seed, "world_size": 1, "config": "c", "curve": "x"}
    put_row(csv_path, (writer, str(seed), "1", "c", "params", ""), row)
""".replace("ROWS", "100")


def test_rows_recorded_at_once_by_two_benchmarks_are_all_kept(tmp_path):
    csv_path, writers = tmp_path / "returns.csv", ("A", "B")
    procs = [subprocess.Popen([sys.executable, "-c", PUT_ROWS, str(csv_path), w], cwd=ROOT) for w in writers]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready_{w}").exists() for w in writers) and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / "go").touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with open(csv_path, newline="") as f:
        rows = {(r["env"], int(r["seed"])) for r in csv.DictReader(f)}
    assert rows == {(w, seed) for w in writers for seed in range(100)}


def test_benchmark_returns_lists_every_preset_with_its_env():
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchmark_returns import PRESETS as LISTED

    assert sorted(LISTED) == [p.stem for p in PRESETS]  # a new preset is one `--envs` key away from its rows
    for key, (env_id, path) in LISTED.items():
        assert (ROOT / path).stem == key and load_yaml_defaults(ROOT / path)["env_id"] == env_id


def test_benchmark_returns_stops_a_1m_preset_with_a_longer_budget_at_1m():
    # Humanoid's recipe runs 3M steps to its score; its row of the 1M table is that run stopped at 1M. The other
    # presets, and the 10M ones with --scale, run their own budgets.
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchmark_returns import PRESETS as LISTED
    from benchmark_returns import table_steps

    assert table_steps(LISTED["humanoid"][1], scale=False) == 1_000_000
    assert table_steps(LISTED["ant"][1], scale=False) == 1_000_000
    assert table_steps(LISTED["halfcheetah"][1], scale=False) is None
    assert table_steps("ppo_ddp/configs/scale/humanoid.yaml", scale=True) is None


def test_benchmark_returns_end_to_end_on_a_tiny_budget(tmp_path):
    # the run's own eval_episodes (2) is also the final evaluation's, as a preset's is without --eval-episodes
    tiny = "--actors-per-gpu 1 --envs-per-actor 2 --rollout-length 32 --num-minibatches 4 --update-epochs 1"
    tiny += " --eval-episodes 2 --no-compile"
    cmd = [
        sys.executable,
        "scripts/benchmark_returns.py",
        "--envs",
        "hopper",
        "--seeds",
        "1",
        "2",
        "--total-timesteps",
        "128",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--out-dir",
        str(tmp_path / "out"),
        "--train-args",
        tiny,
    ]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "out" / "returns.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["env"], r["seed"], r["world_size"]) for r in rows] == [("Hopper-v5", "1", "1"), ("Hopper-v5", "2", "1")]
    for r in rows:
        assert int(r["total_steps"]) == 128 and int(r["eval_episodes"]) == 2
        assert float(r["eval_mean"]) > 0  # Hopper pays a healthy reward every step it stays up
        assert (ROOT / r["curve"]).exists()
        evaluations = (ROOT / r["curve"]).with_name(Path(r["curve"]).stem + "_eval.csv")  # the run's eval.csv
        assert evaluations.read_text().startswith("iteration,global_step,eval/episodic_return")
        assert r["mujoco"] == importlib.metadata.version("mujoco")  # the physics the run had
        assert (r["resumed"], r["resume_exact"]) == ("no", "")  # each run was one session
    table = (tmp_path / "out" / "returns.md").read_text()
    assert "| Hopper-v5 |" in table and "(2) at 128 steps" in table
    png = (tmp_path / "out" / "returns_all.png").read_bytes()  # the flagged rows are in no ten-seed figure
    assert png.startswith(b"\x89PNG") and len(png) > 5000


def test_benchmark_throughput_end_to_end_on_a_tiny_budget(tmp_path):
    # Two timed updates of each trainer: SB3 (one variant), one learner, torchrun with 2 ranks (an --overlap shape
    # is one learner with a flag more: none here, for .ci/run's time); then the memory check on a short run. Checks
    # the plumbing and the numbers' consistency, not the speed.
    cmd = [
        sys.executable,
        "scripts/bench_throughput.py",
        "--steps",
        "4096",
        "--warmup-rounds",
        "1",
        "--sb3",
        "dummy:1",
        "--one-learner-shapes",
        "2x8",
        "--overlap-shapes",
        "--two-learner-shapes",
        "1x8",
        "--work-dir",
        str(tmp_path / "work"),
        "--flags=--no-compile",  # a new shape's compile is ~20 s (before the timed window, which it cannot change)
    ]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    # The timeouts only catch a hang: 1.5 min on an idle 2-core machine, over 5 beside five training runs
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    rows = {line[:70].strip(): line[70:].split() for line in lines if line.startswith(("SB3 PPO", "ppo_ddp,"))}
    assert len(rows) == 3 and not any("--overlap" in name for name in rows), proc.stdout
    for cols in rows.values():
        sps, timed = float(cols[0].replace(",", "")), float(cols[1])
        assert sps > 0 and 0 < timed < float(cols[2])  # the timed window is inside the tree's wall time
        assert "main" in " ".join(cols[3:])  # a peak RSS for the trainer's main process
    torchrun_row = next(cols for name, cols in rows.items() if "torchrun" in name)
    assert "worker" in " ".join(torchrun_row)  # the actors' peak RSS too
    sps = [(name.startswith("ppo_ddp"), float(cols[0].replace(",", ""))) for name, cols in rows.items()]
    ours, theirs = max(v for mine, v in sps if mine), max(v for mine, v in sps if not mine)
    expected = ours / theirs
    # The table shows whole SPS (each off by up to 0.5) and the ratio two decimals (off by up to 0.005): the ratio
    # recomputed from the table may differ by that much, more so when a busy machine makes the SPS small.
    rounding = 0.005 + expected * (0.5 / ours + 0.5 / theirs) + 1e-9
    assert lines[-1].startswith("ratio ") and float(lines[-1].split()[1]) == pytest.approx(expected, abs=rounding)

    mem = subprocess.run(
        [
            sys.executable,
            "scripts/bench_throughput.py",
            "--memory-rounds",
            "22",
            "--work-dir",
            str(tmp_path / "mem"),
            # the check's plumbing on rounds of the defaults' 2048 steps (one actor of 16 envs), with one epoch and no
            # evaluation (the defaults' final one is 10 episodes of 1000 steps, in a process of its own)
            "--flags=--no-compile --actors-per-gpu 1 --envs-per-actor 16 --update-epochs 1 --eval-interval 0",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert mem.returncode == 0, mem.stdout[-3000:] + mem.stderr[-3000:]
    assert "growth after round 20" in mem.stdout and "limit +5%" in mem.stdout


def test_bench_scale_end_to_end_on_a_tiny_budget():
    # One timed round of the Humanoid preset, on rounds of 128 steps (1 actor x 4 envs x 32 steps, the preset's
    # network and update otherwise), against a limit of one process stepping for 0.2 s per measurement: the plumbing
    # and the arithmetic of the printed lines, not the speed.
    cmd = [sys.executable, "scripts/bench_scale.py", "--cores", "1", "--seconds", "0.2"]
    cmd += ["--warmup-rounds", "1", "--rounds", "1"]
    # a new shape's compile is ~20 s, before the timed round
    cmd += ["--flags=--no-compile --actors-per-gpu 1 --envs-per-actor 4 --rollout-length 32"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    rate = float(next(line for line in lines if line.startswith("training: ")).split()[1].replace(",", ""))
    limit = float(
        next(line for line in lines if "limit used" in line).split("limit used ")[1].split(";")[0].replace(",", "")
    )
    assert rate > 0 and limit > 0
    # both printed whole (off by up to 0.5 each), the ratio to 3 decimals
    rounding = 0.0005 + (rate / limit) * (0.5 / rate + 0.5 / limit) + 1e-9
    assert lines[-1].startswith("ratio ") and float(lines[-1].split()[1]) == pytest.approx(rate / limit, abs=rounding)


def test_bench_cores_end_to_end_on_a_tiny_budget():
    # Walker2d's preset (overlapped) on rounds of 4 envs x 16 steps, pinned to one core: sync with auto's split and
    # with 2 actors (the model's fit), then overlapped; one timed round each. The plumbing, the split auto chose
    # under taskset, and the model's arithmetic (the 1-core rows fit it), not the speed.
    cmd = [sys.executable, "scripts/bench_cores.py", "--config", "walker2d", "--cores", "1", "--warmup-rounds", "1"]
    cmd += ["--rounds", "1", "--flags=--no-compile --num-envs 4 --rollout-length 16"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("# Walker2d-v5, walker2d") and "rounds of 4 envs x 16 steps" in lines[0]
    sync = next(line for line in lines if line.startswith("  1 cores, sync:"))
    assert "1 core usable (affinity): 1 actor x 4 envs" in sync and sync.endswith("(1.00)")  # the fit's own row
    assert any(line.startswith("  1 cores, sync, 2 actors: 2 actors x 2 envs") for line in lines)
    assert any(line.startswith("  1 cores, overlapped: 1 core usable") for line in lines)
    table = lines[lines.index("| cores | actors x envs | rollout s | update s | round s | steps/s |") :]
    splits = [row.split(" | ")[1] for row in table[2:9]]
    assert splits == ["1 x 4", "2 x 2", "4 x 1", "4 x 1", "4 x 1", "4 x 1", "4 x 1"]
    assert lines[lines.index("overlapped rounds:") + 1] == table[0]  # Walker2d's preset overlaps: its own table too


def test_bench_cores_alternates_its_passes_and_takes_each_row_s_median(monkeypatch, capsys):
    # A machine whose speed drifts: the measurements run a, b, a, b, ... and each row is the median of its passes.
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_cores

    order, drift = [], iter([1.0, 1.1, 1.3, 1.2, 1.6, 1.5])  # each call a little slower, as the machine drifts

    def run(cores):
        def measure():
            order.append(cores)
            slow = next(drift)
            return bench_cores.Measured(cores, f"{cores} x 1", 1000 / slow, slow / cores, 0.1 * slow)

        return measure

    rows = bench_cores.alternating({1: run(1), 2: run(2)}, passes=3)
    assert order == [1, 2, 1, 2, 1, 2]
    assert rows[1] == bench_cores.Measured(1, "1 x 1", 1000 / 1.3, 1.3, 0.1 * 1.3)
    assert rows[2] == bench_cores.Measured(2, "2 x 1", 1000 / 1.2, 1.2 / 2, 0.1 * 1.2)
    passes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pass ")]
    assert passes[0] == "pass 1: rollout 1 core / 2 cores 1.82x (1.000 / 0.550 s)" and len(passes) == 3


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_bench_cores_pairs_the_rounds_of_a_1_core_pool_and_a_2_core_pool(monkeypatch):
    # Walker2d's preset on rounds of 4 envs x 16 steps: a pool of 1 actor pinned to one core and one of 2 actors on
    # two, their rounds alternating; a ratio a pair. The plumbing, not the speed.
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_cores

    ratios = bench_cores.paired_rollout("walker2d", ["--no-compile", "--num-envs", "4", "--rollout-length", "16"], 2, 3)
    assert len(ratios) == 3 and all(r > 0 for r in ratios)


def test_profile_pool_end_to_end_on_a_tiny_budget():
    # Every row of the pool's profile on a small Hopper shape (a pool of one actor), a fraction of a second each: the
    # plumbing, and each ratio is its row's rate over the first row's, not the speed.
    flags = "--actors-per-gpu 1 --envs-per-actor 2 --rollout-length 16"
    cmd = [sys.executable, "scripts/profile_pool.py", "--config", "ppo_ddp/configs/hopper.yaml", "--flags", flags]
    cmd += ["--cores", "1", "--seconds", "0.3", "--cprofile", "5"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the actor's own profile: Hopper's envs are batch-stepped (ppo_ddp/envs/group.py), in MuJoCo's batch call
    assert "Ordered by: internal time" in proc.stdout and "mujoco._batch.step" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if "steps/s" in line and not line.startswith("the limit")]
    names = [row.split("  ")[0] for row in rows]
    assert names[:4] == ["1 env, uniform actions (the limit)", "2 envs, uniform actions", "2 envs, policy actions",
                         "actor (2 envs, no learner)"], names  # fmt: skip
    assert rows[4].startswith("  its actions replayed in plain envs")  # the actor's own states, without it
    assert names[5].startswith("pool (") and len(rows) == 6
    replay = next(line for line in proc.stdout.splitlines() if line.startswith("  the actor at "))
    assert 0 < float(replay.split()[3]) < 2, replay  # the actor's rate over its replay's
    rates = [float(row.split("steps/s")[0].split()[-1].replace(",", "")) for row in rows]
    ratios = [float(row.split("steps/s")[1].split()[0]) for row in rows]
    for rate, ratio in zip(rates, ratios):
        assert rate > 0 and ratio == pytest.approx(
            rate / rates[0], abs=0.0005 + ratio * (0.5 / rate + 0.5 / rates[0]) + 1e-9
        )
    split = rows[3].split("(")[-1].rstrip(")")
    assert [part.split()[0] for part in split.split(", ")] == ["env", "policy", "rest"]


def test_the_partly_observed_rows_get_their_own_table(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from returns_tables import write_table

    def row(env, seed, mean, config, extra=""):
        return {"env": env, "seed": str(seed), "world_size": "1", "total_steps": "1000000", "eval_mean": str(mean),
                "config": config, "extra_args": extra, "sync_mode": "params", "commit": "abc1234"}  # fmt: skip

    rows = [row("Hopper-v5", s, m, "ppo_ddp/configs/hopper.yaml") for s, m in ((1, 3000), (2, 3200))]
    rows += [row("ppo_ddp/HopperNoVel-v5", s, m, "ppo_ddp/configs/hopper_novel.yaml") for s, m in ((1, 900), (2, 1100))]
    rows += [row("ppo_ddp/HopperNoVel-v5", 1, 2500, "ppo_ddp/configs/hopper_novel.yaml", "--policy gru")]
    # the GRU preset's critic reads the full observation (its file says critic_obs); a flag can say otherwise
    rows += [row("ppo_ddp/HopperNoVel-v5", 1, 3200, "ppo_ddp/configs/hopper_novel_gru.yaml")]
    rows += [row("ppo_ddp/HopperNoVel-v5", 1, 2200, "ppo_ddp/configs/hopper_novel_gru.yaml", "--critic-obs None")]
    write_table(tmp_path / "returns.md", rows)
    text = (tmp_path / "returns.md").read_text()
    partial = text.split("## Partly observed envs")[1]
    for line in (
        "| ppo_ddp/HopperNoVel-v5 | mlp | the policy's | ppo_ddp/configs/hopper_novel.yaml | 1000 ± 100 (2) | "
        "3100 ± 100 |",
        "| ppo_ddp/HopperNoVel-v5 | gru | the policy's | ppo_ddp/configs/hopper_novel.yaml `--policy gru` | 2500 (1) | "
        "3100 ± 100 |",
        "| ppo_ddp/HopperNoVel-v5 | gru | `info['full_obs']` | ppo_ddp/configs/hopper_novel_gru.yaml | 3200 (1) | "
        "3100 ± 100 |",
        "| ppo_ddp/HopperNoVel-v5 | gru | the policy's | ppo_ddp/configs/hopper_novel_gru.yaml `--critic-obs None` | "
        "2200 (1) | 3100 ± 100 |",
    ):
        assert line in partial, partial
    main_table = text.split("## Partly observed envs")[0]
    assert "NoVel" not in main_table and "| Hopper-v5 |" in main_table


def test_the_bounded_distributions_get_their_own_table_and_stay_out_of_the_others(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import seed_intervals
    from returns_tables import write_table

    # The Gaussian's five seeds also make a row of the ten-seed table, whose bootstrap (50,000 resamples, ~10 s of CPU;
    # test_ten_seeds_get_bootstrap_intervals_... tests it) this test does not read: the values' range stands in.
    monkeypatch.setattr(seed_intervals, "CACHE", tmp_path / "cache.json")
    monkeypatch.setattr(seed_intervals, "intervals", lambda v: {"mean": (sum(v) / len(v), min(v), max(v)),
                                                                "iqm": (0.0, 0.0, 0.0)})  # fmt: skip

    def row(seed, mean, extra="", world="1"):
        return {"env": "Hopper-v5", "seed": str(seed), "world_size": world, "total_steps": "1001472",
                "eval_mean": str(mean), "config": "ppo_ddp/configs/hopper.yaml", "extra_args": extra,
                "sync_mode": "params", "commit": "abc1234"}  # fmt: skip

    rows = [row(s, 3000 + 100 * s) for s in range(1, 6)] + [row(1, 2900, world="2")]  # seeds 1-5 of the Gaussian
    rows += [row(s, 2800 + 100 * s, "--distribution beta") for s in (1, 2, 3, 4)]
    write_table(tmp_path / "returns.md", rows)
    text = (tmp_path / "returns.md").read_text()
    section = text.split("## Bounded action distributions")[1].split("## ")[0]
    # seeds 1-3: 3200 against 3000; ten-seed means over the seeds each has; tanh_gaussian has no rows yet
    assert (
        "| Hopper-v5 | 3200 ± 82 (3) | 3000 ± 82 (3) | 0.94 | — | — | 3300 (5), 3050 (4), — | gaussian | abc1234 |"
        in section
    )
    assert "--distribution" not in text.split("## World sizes")[1]  # the world-size table: the preset's own runs


def test_the_1m_table_has_every_mujoco_env_on_its_preset_seeds_1_to_3(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from published import REFERENCE
    from returns_tables import write_table

    def row(seed, mean, extra="", commit="abc1234"):
        return {"env": "Swimmer-v5", "seed": str(seed), "world_size": "1", "total_steps": "1001472",
                "eval_mean": str(mean), "config": "ppo_ddp/configs/swimmer.yaml", "extra_args": extra,
                "sync_mode": "params",
                "commit": commit}  # fmt: skip

    # seeds 1-3 of the preset as `--env-id` runs it; not seed 4, nor a run with flags (an older --actor-timeout)
    rows = [row(1, 300), row(2, 320, commit="def5678"), row(3, 310), row(4, 100), row(1, 50, "--actor-timeout 9")]
    write_table(tmp_path / "returns.md", rows)
    text = (tmp_path / "returns.md").read_text().split("## World sizes")[0]
    assert "| Swimmer-v5 | 310 ± 8 (3) | 281.6 ± 9.7 | rl-baselines3-zoo" in text
    assert "| abc1234, def5678 | — |" in text
    assert len(REFERENCE) == 11 and all(f"| {env} |" in text for env in REFERENCE)


def test_a_row_says_whether_its_run_was_resumed_and_whether_exactly(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from benchmark_returns import resume_record

    log = tmp_path / "run.log"  # a run's log, appended by every session of it
    assert resume_record(log) == ("no", "")
    log.write_text("stopped by SIGTERM after round 3\nresumed from runs/a/model_a.pt at round 3\n")
    assert resume_record(log) == ("yes", "yes")
    log.write_text(log.read_text() + "the envs start new episodes: the checkpoint holds no env state\n")
    assert resume_record(log) == ("yes", "no")


def test_time_to_score_is_the_first_evaluation_at_the_score_with_the_training_time_over_every_session(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchmark_returns import time_to_score

    # rounds 1-4 in one session (elapsed 10-40 s), stopped, rounds 5-8 in a second one (elapsed restarts: 12-48 s)
    with open(tmp_path / "metrics.csv", "w") as f:
        f.write("iteration,global_step,charts/elapsed_seconds\n")
        for it, elapsed in zip(range(1, 9), (10, 20, 30, 40, 12, 24, 36, 48)):
            f.write(f"{it},{it * 100},{elapsed}\n")
    with open(tmp_path / "eval.csv", "w") as f:
        f.write("iteration,global_step,eval/episodic_return\n2,200,4000.0\n4,400,4999.9\n6,600,5000.0\n8,800,6100.0\n")
    assert time_to_score(tmp_path / "eval.csv", tmp_path / "metrics.csv") == ("600", "64.0")  # 40 + 24 s
    assert time_to_score(tmp_path / "eval.csv", tmp_path / "metrics.csv", score=7000.0) == ("", "")


def test_ten_seeds_get_bootstrap_intervals_and_a_verdict_against_the_published_mean(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import seed_intervals

    monkeypatch.setattr(seed_intervals, "CACHE", tmp_path / "cache.json")
    values = [float(v) for v in range(1, 11)]
    got = seed_intervals.intervals(values, reps=2000)
    assert got["mean"][0] == pytest.approx(5.5) and got["iqm"][0] == pytest.approx(5.5)  # the middle half: 3..8
    assert got["mean"][1] < 5.5 < got["mean"][2] and 2 < got["mean"][1] and got["mean"][2] < 9
    assert seed_intervals.intervals(values, reps=2000) == got  # a fixed random state; the second from the cache
    assert (seed_intervals.verdict((10, 8, 12), 8), seed_intervals.verdict((10, 8, 12), 12.5)) == ("above", "below")
    assert seed_intervals.verdict((10, 8, 12), 9) == "level"

    def row(seed, mean, extra=""):
        return {"env": "Hopper-v5", "seed": str(seed), "world_size": "1", "eval_mean": str(mean), "extra_args": extra,
                "sync_mode": "params", "config": "ppo_ddp/configs/hopper.yaml", "cpu": "AMD EPYC"}  # fmt: skip

    rows = [row(s, 3000 + 10 * s) for s in range(1, 11)] + [row(s, 2900 + 10 * s, "--overlap") for s in range(1, 11)]
    rows += [row(11, 0), row(1, 0, "--overlap --actor-timeout 9")]  # not seeds 1-10 of either column
    # the table's own logic, with an interval that is easy to check: the range of the values
    monkeypatch.setattr(seed_intervals, "intervals", lambda v: {"mean": (sum(v) / len(v), min(v), max(v)),
                                                                "iqm": (0.0, 0.0, 0.0)})  # fmt: skip
    # the verdict is on the preset's own rounds: sync's interval lies above 2950, the overlapped one is level with it
    for preset_overlap, verdict in (("false", "above"), ("true", "level")):
        monkeypatch.setattr(seed_intervals, "preset_settings", lambda config, o=preset_overlap: (o, "gaussian"))
        lines = seed_intervals.ten_seed_table(rows, {env: 2950.0 for env in seed_intervals.COMPARED})
        (line,) = [x for x in lines if x.startswith("| Hopper-v5 |")]
        rounds = "overlap" if preset_overlap == "true" else "sync"
        assert line == (
            f"| Hopper-v5 | {rounds}, gaussian | 10 / 10 | 3055 [3010, 3100] | 0 [0, 0] | 2955 [2910, 3000] | 0 [0, 0] "
            f"| 0.967 | no | 2950 | {verdict} | AMD EPYC |"
        )


def test_a_preset_that_switches_keeps_the_meaning_of_its_rows(tmp_path, monkeypatch):
    """HalfCheetah's preset turned overlap on after its rows ran: sync rows written before the settings columns
    (their flags say what they ran) stay sync, `--overlap` rows become the preset's own, and a row with the
    columns is read by them whatever its flags."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import seed_intervals
    from returns_tables import write_table

    preset = tmp_path / "halfcheetah.yaml"
    preset.write_text("env_id: HalfCheetah-v5\noverlap: true\n")

    def row(seed, mean, extra="", world="1", **columns):
        return {"env": "HalfCheetah-v5", "seed": str(seed), "world_size": world, "total_steps": "1001472",
                "eval_mean": str(mean), "config": str(preset), "extra_args": extra, "sync_mode": "params",
                "commit": "abc1234", "cpu": "AMD EPYC", **columns}  # fmt: skip

    rows = [row(s, 6000 + 10 * s) for s in range(1, 11)] + [row(1, 5000, world="2")]  # sync, before the columns
    rows += [row(s, 5900 + 10 * s, "--overlap") for s in range(1, 10)]
    rows += [row(10, 6000, overlap="true", distribution="gaussian")]  # a run of the preset as it is today
    monkeypatch.setattr(seed_intervals, "intervals", lambda v: {"mean": (sum(v) / len(v), min(v), max(v)),
                                                                "iqm": (0.0, 0.0, 0.0)})  # fmt: skip
    write_table(tmp_path / "returns.md", rows)
    text = (tmp_path / "returns.md").read_text()
    # the 1M cell: the preset as it is today on seeds 1-3, the overlapped rows; the 2-learner run needs --no-overlap
    assert "| HalfCheetah-v5 | 5920 ± 8 (3) |" in text and "| 5000 (1) with `--no-overlap` |" in text
    ten = text.split("## Ten seeds")[1].split("## ")[0]
    assert (
        "| HalfCheetah-v5 | overlap, gaussian | 10 / 10 | 6055 [6010, 6100] | 0 [0, 0] | 5955 [5910, 6000] | 0 [0, 0] "
        "| 0.983 | yes | 5819 | above | AMD EPYC |"
    ) in ten
    worlds = text.split("## World sizes")[1].split("## ")[0]
    assert "| HalfCheetah-v5 | 2, params | `--no-overlap` | 5000 (1) | 0.83 |" in worlds


def test_a_timing_leaves_out_the_warm_up_rounds(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import train_runs

    with open(tmp_path / "metrics.csv", "w", newline="") as f:  # rounds of 2048 steps, the first two slow
        writer = csv.writer(f)
        writer.writerow(["iteration", "global_step", "charts/elapsed_seconds", "charts/rollout_seconds",
                         "charts/train_seconds"])  # fmt: skip
        for i, (elapsed, rollout, update) in enumerate([(9.0, 1, 8), (10.0, 0.5, 0.5), (10.4, 0.3, 0.1),
                                                         (10.9, 0.4, 0.1)], 1):  # fmt: skip
            writer.writerow([i, 2048 * (i + 1), elapsed, rollout, update])
    timed = train_runs.timing(train_runs.read_metrics(tmp_path), warmup=2)
    assert (timed.steps, timed.seconds) == (4096, pytest.approx(0.9)) and timed.sps == pytest.approx(4096 / 0.9)
    assert timed.round_seconds == pytest.approx([0.4, 0.5]) and timed.rollout_seconds == [0.3, 0.4]
    assert timed.update_seconds == [0.1, 0.1]
    with pytest.raises(ValueError, match="leaves none to time"):
        train_runs.timing(train_runs.read_metrics(tmp_path), warmup=4)
