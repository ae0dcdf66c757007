"""python -m ppo_ddp.tune with workers that share a study (issue 29): each enqueued trial is run by one worker only, a
new study is made once by the workers started at once, a worker whose trial another worker ended says so in one line
and goes on, and a --storage URL whose driver is missing names the pip command. Without the claim made atomic on
SQLite, two workers took the same enqueued trial and the second to end it crashed ('Cannot tell a FAIL trial')."""

from __future__ import annotations

import collections
import functools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

optuna = pytest.importorskip("optuna")

ROOT = Path(__file__).resolve().parent.parent

from test_tune import ENV, TINY  # noqa: E402

from ppo_ddp.search import study as tune  # noqa: E402
from ppo_ddp.search.space import load_space  # noqa: E402


def refused(learning_rate: float) -> dict:
    return {"learning_rate": round(learning_rate, 6), "rollout_length": 48, "num_minibatches": 64}


# Every trial of this space is refused by train.py within seconds (a round of 48 x 2 samples does not split into 64
# mini-batches, exit 2), so the workers claim a trial every few seconds each: the claims collide more often than
# in a real search, whose trials take minutes. Failed trials count towards --n-trials; the study goes on.
REFUSED = {
    **TINY,
    "params": {
        "learning_rate": {"type": "float", "low": 1.0e-4, "high": 1.0e-3, "log": True},
        "rollout_length": {"type": "categorical", "choices": [48]},
        "num_minibatches": {"type": "categorical", "choices": [64]},
    },
}
REFUSED["enqueue"] = [refused(1.0e-4 * (1 + k / 4)) for k in range(24)]

# Workers of a study started at the same moment (after a barrier of files): each opens the study as tune.py does,
# then claims and ends trials as fast as it can, and prints the numbers of the trials it got, one line a worker. They
# are forks of one process that has imported optuna and ppo_ddp (~1.5 s of CPU that each would pay on its own); each
# makes its own connection to the database after the fork.
CLAIMER = """
import os, sys, time, traceback
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import optuna
from ppo_ddp.search import study as tune
from ppo_ddp.search.space import load_space
optuna.logging.set_verbosity(optuna.logging.ERROR)
url, name, space, folder = sys.argv[2], sys.argv[3], load_space(sys.argv[4]), Path(sys.argv[5])
workers, n = int(sys.argv[6]), int(sys.argv[7])
pids = []
for worker in range(workers):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            (folder / f"ready_{worker}").touch()
            while not (folder / "go").exists():
                time.sleep(0.001)
            study = tune.open_study(url, name, space, 0, worker, 60, create=True)
            got = []
            for _ in range(n):
                trial = study.ask()
                got.append(trial.number)
                study.tell(trial, 0.0)
            print(*got, flush=True)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    pids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
print("exit codes", *codes, file=sys.stderr)
sys.exit(int(any(codes)))
"""


# The README's story for machines that share a study: a database server. Set TUNE_TEST_POSTGRES_URL (a database
# URL optuna accepts, e.g. postgresql://postgres@127.0.0.1:5433/tune; pip install psycopg2-binary) to run the
# claims against one too.
STORAGES = [
    "sqlite",
    pytest.param(
        "server",
        marks=pytest.mark.skipif(
            not os.environ.get("TUNE_TEST_POSTGRES_URL"), reason="needs TUNE_TEST_POSTGRES_URL: a PostgreSQL database"
        ),
    ),
]


@pytest.mark.parametrize("storage", STORAGES)
def test_workers_started_at_once_make_the_study_once_and_claim_each_enqueued_trial_once(tmp_path, storage):
    """Six processes open a new study at the same instant and claim trials in a tight loop: the study's enqueued
    trials are enqueued once, and no trial number is handed to two processes."""
    doc = REFUSED  # 24 enqueued trials
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'race.db'}" if storage == "sqlite" else os.environ["TUNE_TEST_POSTGRES_URL"]
    name, workers, each = f"race-{tmp_path.name}-{os.getpid()}-{time.time_ns()}", 6, 6  # new in a shared database
    args = [str(ROOT), url, name, str(tmp_path / "space.yaml"), str(tmp_path), str(workers), str(each)]
    proc = subprocess.Popen(
        [sys.executable, "-c", CLAIMER, *args],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready_*"))) < workers and time.monotonic() < deadline:
        time.sleep(0.01)
    (tmp_path / "go").touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert len(out.splitlines()) == workers, out  # a line from each worker
    claimed = collections.Counter(int(n) for n in out.split())
    assert sum(claimed.values()) == workers * each
    assert [n for n, times in claimed.items() if times > 1] == []
    trials = optuna.load_study(study_name=name, storage=url).get_trials()
    enqueued = [t.system_attrs["fixed_params"]["learning_rate"] for t in trials if "fixed_params" in t.system_attrs]
    assert sorted(enqueued) == sorted(p["learning_rate"] for p in doc["enqueue"])  # each once, none twice
    assert len(trials) == workers * each and {t.state.name for t in trials} == {"COMPLETE"}


STARTED = re.compile(r"^\[worker (\d+)\] trial (\d+) started: ", re.M)


def test_many_workers_on_a_loaded_machine_never_run_a_trial_twice(tmp_path):
    """The tiny study's search with 4 workers on one core, twenty-four enqueued trials, and that core loaded by a busy
    process: every trial number is started by one worker, the enqueued parameter sets are each tried once, and every
    worker exits 0. (One core, not the machine's every core with 4 workers and a busy process each: the same crowding
    of a core, descheduling a worker anywhere in its claim, for a quarter of the CPU the suite's other tests share.
    One study of 24 trials rather than two of 12: as many claims for half the workers' start-ups.)"""
    doc = REFUSED  # 24 enqueued trials
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(doc))
    workers, n_trials = 4, len(doc["enqueue"])
    core = max(os.sched_getaffinity(0))
    on_the_core = functools.partial(os.sched_setaffinity, 0, {core})  # the workers inherit it
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=on_the_core)]
    try:
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "ppo_ddp.tune", "--space", tmp_path / "space.yaml", "--study", "stress"]
        cmd += ["--out", out, "--poll", "0.3", "--n-trials", n_trials, "--workers", workers, "--seed", 0]
        proc = subprocess.run(
            list(map(str, cmd)), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900, preexec_fn=on_the_core
        )
    finally:
        for p in load:
            p.kill()
            p.wait()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    started = collections.Counter(int(n) for _, n in STARTED.findall(proc.stdout))
    assert [n for n, times in started.items() if times > 1] == [], proc.stdout
    study = optuna.load_study(study_name="stress", storage=f"sqlite:///{out / 'stress' / 'study.db'}")
    trials = study.get_trials()
    # The lines name the study's trials. (Not all of them, always: once in 18 runs here one trial's line was
    # missing from the captured output, though its folder, log and record showed it had run once.)
    assert set(started) <= {t.number for t in trials}, proc.stdout
    assert len(trials) >= n_trials and {t.state.name for t in trials} == {"FAIL"}
    assert all("must divide the 96 samples" in t.user_attrs["fail_reason"] for t in trials)
    enqueued = [t.params["learning_rate"] for t in trials if "fixed_params" in t.system_attrs]
    assert sorted(enqueued) == [p["learning_rate"] for p in doc["enqueue"]]


class AnotherWorkerEnds:
    """Stands in for tune_trial.Objective: while trial 0 trains, and after trial 1 has trained, another worker
    fails the trial (as optuna.storages.fail_stale_trials does when it finds a trial's heartbeats late); trial 0
    then reports an evaluation, as the Monitor does."""

    def __init__(self, url: str) -> None:
        self.other = optuna.storages.RDBStorage(url)  # the other worker's own connection to the database
        self.lines: list[str] = []

    def __call__(self, trial):
        if trial.number < 2:
            assert self.other.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        if trial.number == 0:
            trial.report(0.5, 64)
        return optuna.trial.TrialState.COMPLETE, 1.0 + trial.number

    def say(self, text: str) -> None:
        self.lines.append(text)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning", "ignore:Heartbeat of storage")
def test_a_trial_another_worker_ended_is_one_line_and_the_worker_goes_on(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    space = load_space(_write(tmp_path, dict(TINY, enqueue=[])))
    study = tune.open_study(url, "tiny", space, 0, 0, 60, create=True)
    objective = AnotherWorkerEnds(url)
    assert tune.work(study, objective, n_trials=1) == 0  # the two failed by the other worker do not count
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "FAIL", "COMPLETE"]
    assert study.get_trials()[2].value == 3.0
    assert objective.lines == [
        "trial 0: the study has it FAIL already (ended by another worker, whose check found its heartbeats late); "
        "its training was stopped, next trial",
        "trial 1: the study has it FAIL already (ended by another worker, whose check found its heartbeats late); "
        "this worker's COMPLETE is not recorded, next trial",
    ]


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_storage_whose_driver_is_missing_says_what_to_install(tmp_path):
    """The README's server URL with its driver not installed (postgresql:// is psycopg 3 in SQLAlchemy 2.1): one
    line with the pip command, the password hidden, exit 2."""
    without_psycopg = (
        "import runpy, sys; sys.modules['psycopg'] = None; sys.argv = sys.argv[1:]; "
        "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
    )
    url = "postgresql://user:secret@localhost/db"
    cmd = [sys.executable, "-c", without_psycopg, "ppo_ddp.tune", "--study", "x", "--report", "--storage", url]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and proc.stdout == "" and list(tmp_path.iterdir()) == []
    assert proc.stderr == (
        "tune.py: error: storage='postgresql://user:***@localhost/db': needs the database driver psycopg: "
        "pip install 'psycopg[binary]'\n"
    )
