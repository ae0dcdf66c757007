"""python -m ppo_ddp.tune (issue 14): a tiny study of real training runs by two workers in parallel, in a SQLite
database; a worker stopped mid-trial and the study continued; the trainer stopped when a trial is pruned; a worker
with another space refused. The space's own checks: tests/test_tune_space.py."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

optuna = pytest.importorskip("optuna")

from ppo_ddp.configuration.loading import load_yaml_defaults  # noqa: E402
from ppo_ddp.search.space import load_space, parse_space  # noqa: E402
from ppo_ddp.search.trial import Monitor, TrialFailed, run_training  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# Rounds of 64 samples (1 actor x 2 envs x 32 steps), round 0 and 3 trained rounds; an evaluation of one episode
# after every round, of 100 steps (HalfCheetah's own are 1000). 48 steps with 64 mini-batches is a round of 96 that
# does not split: train.py refuses it (exit 2), so trial 0 fails as arranged; trial 1 is the base's shape and cannot
# fail.
TINY = {
    "base": "halfcheetah",
    "envs": {"HalfCheetah-v5": 3000},
    # compile off: each trial's shape would be a new compile of ~20 s (the compiled step has its own tests)
    "fixed": {
        "total_timesteps": 256,
        "actors_per_gpu": 1,
        "envs_per_actor": 2,
        "update_epochs": 1,
        "eval_episodes": 1,
        "compile": False,
        "env_kwargs": {"max_episode_steps": 100},
    },
    "eval_every_steps": 64,
    "pruner": {"n_startup_trials": 1, "n_warmup_steps": 0},
    "sampler": {"n_startup_trials": 1},
    "params": {
        "learning_rate": {"type": "float", "low": 1.0e-4, "high": 1.0e-3, "log": True},
        "rollout_length": {"type": "categorical", "choices": [32, 48]},
        "num_minibatches": {"type": "categorical", "choices": [4, 64]},
    },
    "enqueue": [
        {"learning_rate": 3.0e-4, "rollout_length": 48, "num_minibatches": 64},
        {"learning_rate": 3.0e-4, "rollout_length": 32, "num_minibatches": 4},
    ],
}
# Trial 0 fails and trial 1 completes (both enqueued, run together by the two workers); trial 2, started when trial
# 0 has failed, is sampled at random (no trial is complete yet), and trial 3, started when another has ended, by
# TPE where that one completed (the sampler's one start-up trial); the pruner may stop trials 2 and 3.
N_TRIALS = 4
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="")
# `python -c WITHOUT_OPTUNA MODULE ARGS` runs `python -m MODULE ARGS` as if optuna were not installed.
WITHOUT_OPTUNA = (
    "import runpy, sys; sys.modules['optuna'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def tune(*args: object, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ppo_ddp.tune", *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def study_args(tmp: Path) -> list[object]:
    return ["--space", tmp / "tiny.yaml", "--study", "tiny", "--out", tmp / "out", "--poll", "0.3"]


def load(tmp: Path):
    return optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp / 'out' / 'tiny' / 'study.db'}")


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tune")
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    proc = tune(*study_args(tmp), "--n-trials", N_TRIALS, "--workers", 2, "--seed", 0)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, proc


def eval_rows(tmp: Path, number: int) -> list[dict[str, str]]:
    with open(tmp / "out" / "tiny" / f"trial_{number:04d}" / "HalfCheetah-v5" / "eval.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_the_tiny_study_ends_with_its_trials_in_the_sqlite_database(tiny_study):
    tmp, proc = tiny_study
    trials = load(tmp).get_trials()
    # Two workers that check the count at the same moment may each start the last trial.
    assert N_TRIALS <= len(trials) <= N_TRIALS + 1
    assert "[worker 0] trial" in proc.stdout and "[worker 1] trial" in proc.stdout
    first, second = trials[0], trials[1]  # the enqueued ones, started together by the two workers
    assert first.datetime_start < second.datetime_complete and second.datetime_start < first.datetime_complete
    states = {t.state.name for t in trials}
    assert states <= {"COMPLETE", "PRUNED", "FAIL"} and {"COMPLETE", "FAIL"} <= states
    assert first.state.name == "FAIL"
    assert "train.py exited with status 2" in first.user_attrs["fail_reason"]
    assert "num_minibatches=64: must divide the 96 samples" in first.user_attrs["fail_reason"]
    for t in trials:  # failed exactly the trials whose round does not split, and no other
        refused = t.params["rollout_length"] == 48 and t.params["num_minibatches"] == 64
        assert (t.state.name == "FAIL") == refused, (t.number, t.state, t.user_attrs)
        if t.state.name == "COMPLETE":  # the value: the final evaluation's return over the target
            final = float(eval_rows(tmp, t.number)[-1]["eval/episodic_return"])
            assert t.value == pytest.approx(final / 3000, rel=1e-12)
            assert t.user_attrs["return/HalfCheetah-v5"] == pytest.approx(final, rel=1e-12)
        if t.state.name in ("COMPLETE", "PRUNED"):  # every evaluation reported, on the grid of 64 env steps
            assert t.intermediate_values and all(step % 64 == 0 for step in t.intermediate_values)
            assert t.value == pytest.approx(t.intermediate_values[t.last_step])
            assert 1e-4 <= t.params["learning_rate"] <= 1e-3


def test_the_report_lists_every_trial_and_the_best_preset_trains_without_optuna(tiny_study, tmp_path):
    tmp, proc = tiny_study
    study = load(tmp)
    folder = tmp / "out" / "tiny"
    with open(folder / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["number"]), r["state"]) for r in rows] == [(t.number, t.state.name) for t in study.trials]
    assert all(float(r["seconds"]) > 0 for r in rows)
    assert (folder / "trials.md").read_text().count("\n| ") == len(rows) + 1  # the header row and one per trial
    assert (folder / "history.png").read_bytes().startswith(b"\x89PNG")
    best = folder / "best_HalfCheetah-v5.yaml"
    assert f"best preset (trial {study.best_trial.number}" in proc.stdout and str(best) in proc.stdout
    values = load_yaml_defaults(best)  # what train.py --config reads
    assert {k: values[k] for k in study.best_params} == study.best_params
    assert values["env_id"] == "HalfCheetah-v5" and values["total_timesteps"] == 256
    # train.py must not need optuna: the best preset trains with the module made unimportable.
    args = [
        "ppo_ddp.train",
        "--config",
        str(best),
        "--total-timesteps",
        "128",
        "--runs-dir",
        str(tmp_path),
        "--run-name",
        "b",
    ]
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_OPTUNA, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (tmp_path / "b" / "eval.csv").exists()


def test_a_stopped_worker_leaves_its_trial_failed_and_the_study_continues(tiny_study):
    """SIGTERM to a worker while its trainer runs: the trainer is stopped, the trial fails as interrupted, exit 143;
    the same command again runs the study up to its number of trials, the interrupted one not counted. (The trial it
    runs is one enqueued here whose round does not split: refused by train.py within a second, a failed training,
    which counts.)"""
    tmp, _ = tiny_study
    before = len(load(tmp).trials)
    cmd = [sys.executable, "-m", "ppo_ddp.tune", *map(str, study_args(tmp)), "--n-trials", str(before + 1)]
    worker = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp / "out" / "tiny" / f"trial_{before:04d}" / "HalfCheetah-v5.log"
    deadline = time.monotonic() + 120
    while not log.exists() and time.monotonic() < deadline:  # its trainer has started
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=180)
    assert worker.returncode == 143, out[-2000:] + err[-2000:]
    assert f"trial {before} interrupted" in out and "stopped by SIGTERM" in err
    interrupted = load(tmp).trials[before]
    assert interrupted.state.name == "FAIL" and interrupted.user_attrs["interrupted"] is True
    load(tmp).enqueue_trial(TINY["enqueue"][0])
    proc = tune(*study_args(tmp), "--n-trials", before + 1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trials = load(tmp).trials
    assert len(trials) == before + 2 and trials[-1].state.name == "FAIL" and "fail_reason" in trials[-1].user_attrs
    assert f"study tiny: {before + 2} trials" in proc.stdout
    report = tune("--study", "tiny", "--out", tmp / "out", "--report")  # the space comes from the study
    assert report.returncode == 0 and f"study tiny: {before + 2} trials" in report.stdout
    assert "interrupted" in (tmp / "out" / "tiny" / "trials.md").read_text()


def trainer_pids(marker: str) -> list[int]:
    """The processes whose command line holds marker (a trial's preset path)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            pass
    return pids


def test_a_killed_worker_s_trial_is_failed_after_three_silent_heartbeats(tiny_study):
    """SIGKILL leaves the trial RUNNING in the database; with --heartbeat 1 the next worker (here --report) fails it
    once it has been silent for 3 s."""
    tmp, _ = tiny_study
    before = len(load(tmp).trials)
    cmd = [sys.executable, "-m", "ppo_ddp.tune", *map(str, study_args(tmp)), "--n-trials", str(before + 9)]
    worker = subprocess.Popen([*cmd, "--heartbeat", "1"], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL)
    preset = tmp / "out" / "tiny" / f"trial_{before:04d}" / "HalfCheetah-v5.yaml"
    deadline = time.monotonic() + 120
    while not trainer_pids(str(preset)) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.kill()
    worker.wait()
    for pid in trainer_pids(str(preset)):  # its trainer, in a session of its own, would train on: not in a test
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert load(tmp).trials[before].state.name == "RUNNING"
    time.sleep(4)
    proc = tune("--study", "tiny", "--out", tmp / "out", "--report", "--heartbeat", 1)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stale = load(tmp).trials[before]
    assert stale.state.name == "FAIL" and not stale.user_attrs
    assert "its worker stopped (no heartbeat)" in (tmp / "out" / "tiny" / "trials.md").read_text()


def test_several_envs_are_trained_in_turn_and_scored_on_one_scale(tmp_path):
    """One trial on two envs: the value is the mean of return / target; Hopper's evaluations are reported after
    HalfCheetah's span of steps; a best preset per env."""
    doc = bad(envs={"HalfCheetah-v5": 3000, "Hopper-v5": 2500}, fixed__total_timesteps=128)
    doc["enqueue"] = doc["enqueue"][1:]  # the trial that cannot fail
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(doc))
    proc = tune(*study_args(tmp_path), "--n-trials", 1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (trial,) = load(tmp_path).trials
    folder = tmp_path / "out" / "tiny" / "trial_0000"
    final = {}
    for env in ("HalfCheetah-v5", "Hopper-v5"):
        with open(folder / env / "eval.csv", newline="") as f:
            final[env] = float(list(csv.DictReader(f))[-1]["eval/episodic_return"])
        assert load_yaml_defaults(folder / f"{env}.yaml")["env_id"] == env
        assert load_yaml_defaults(tmp_path / "out" / "tiny" / f"best_{env}.yaml")["env_id"] == env
    assert trial.state.name == "COMPLETE"
    assert trial.value == pytest.approx((final["HalfCheetah-v5"] / 3000 + final["Hopper-v5"] / 2500) / 2)
    span = 192  # 128 steps and one evaluation interval, on the grid of 64
    assert list(trial.intermediate_values) == [128, span + 128]
    assert trial.intermediate_values[span + 128] == pytest.approx(trial.value)


STUB = """
import pathlib, signal, sys, time, subprocess
here = pathlib.Path(sys.argv[1])
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (here / "child.pid").write_text(str(subprocess.Popen(["sleep", "600"]).pid))
else:
    signal.signal(signal.SIGTERM, lambda *a: ((here / "got").write_text("SIGTERM"), sys.exit(143)))
rows = ["iteration,global_step,eval/episodic_return\\n", "1,64,-30.0\\n", "2,128," + sys.argv[3] + "\\n"]
(here / "run").mkdir()
for row in rows:
    with open(here / "run" / "eval.csv", "a") as f:
        f.write(row)
time.sleep(600)  # far beyond any bound below: only a stop by the monitor ends it early
"""


def stub_trial(tmp_path: Path, prior: dict[int, float]):
    """A study whose one complete trial reported `prior`, the next trial, and its Monitor on HalfCheetah-v5."""
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(1, 0))
    x = optuna.distributions.FloatDistribution(0, 1)
    done = optuna.trial.create_trial(params={"x": 0.5}, distributions={"x": x}, value=1.0, intermediate_values=prior)
    study.add_trial(done)
    trial = study.ask()
    return trial, Monitor(trial, parse_space(TINY, "tiny", check_env=False), 0, "HalfCheetah-v5", [])


@pytest.mark.parametrize("on_sigterm", ["exit", "ignore"])
def test_a_pruned_trial_stops_its_trainer(tmp_path, on_sigterm):
    """The pruner stops a trial below the median: its trainer gets SIGTERM, or its session is killed when it does
    not stop within the grace period. (A stub stands in for train.py: it writes eval.csv rows, then waits.)"""
    trial, monitor = stub_trial(tmp_path, {64: 1.0, 128: 1.0})
    cmd = [sys.executable, "-c", STUB, str(tmp_path), on_sigterm, "-20.0"]
    start = time.monotonic()
    with pytest.raises(optuna.TrialPruned):
        run_training(cmd, tmp_path / "log", tmp_path / "run" / "eval.csv", monitor.on_row, poll=0.05, grace=1.0)
    assert time.monotonic() - start < 120  # stopped, not waited out (the stub sleeps 600 s)
    assert trial.study.trials[-1].intermediate_values == {64: pytest.approx(-30.0 / 3000)}
    if on_sigterm == "exit":
        assert (tmp_path / "got").read_text() == "SIGTERM"
    else:  # killed with its session, the process it started too
        child = int((tmp_path / "child.pid").read_text())
        time.sleep(0.2)
        assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text()


def test_a_non_finite_evaluation_fails_the_trial(tmp_path):
    trial, monitor = stub_trial(tmp_path, {64: -1.0, 128: -1.0})  # -30 / 3000 is above: no pruning
    cmd = [sys.executable, "-c", STUB, str(tmp_path), "exit", "nan"]
    with pytest.raises(TrialFailed, match="HalfCheetah-v5: evaluation return nan at step 128"):
        run_training(cmd, tmp_path / "log", tmp_path / "run" / "eval.csv", monitor.on_row, poll=0.05, grace=5.0)
    assert (tmp_path / "got").read_text() == "SIGTERM"


def bad(**changes) -> dict:
    doc = yaml.safe_load(yaml.safe_dump(TINY))
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            doc[section][name] = value
        else:
            doc[section] = value
    return doc


def test_a_worker_with_another_space_is_refused(tiny_study):
    tmp, _ = tiny_study
    changed = tmp / "changed.yaml"
    changed.write_text(yaml.safe_dump(bad(eval_every_steps=128)))
    proc = tune("--space", changed, "--study", "tiny", "--out", tmp / "out", "--n-trials", 99)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "was made with another search space" in proc.stderr


def test_a_space_that_names_its_base_as_before_the_presets_moved_continues_the_study(tiny_study):
    # Spaces written before the presets moved into the package named the base by its path in the repository
    # (configs/halfcheetah.yaml); such a space is the same search as one naming the preset, and continues its study.
    tmp, _ = tiny_study
    old = tmp / "old.yaml"
    old.write_text(yaml.safe_dump(dict(TINY, base="configs/halfcheetah.yaml")))
    assert load_space(old).base_values == load_space(tmp / "tiny.yaml").base_values
    proc = tune("--space", old, "--study", "tiny", "--out", tmp / "out", "--n-trials", 1)  # holds more: no trial
    assert proc.returncode == 0 and "best preset (trial" in proc.stdout, proc.stderr
