"""Hyperparameter search with Optuna: TPE sampler, median pruner on the evaluations, the study in a database.

    python -m ppo_ddp.tune --space halfcheetah --study hc --n-trials 50 --workers 2
    python -m ppo_ddp.tune --space halfcheetah --study hc --n-trials 50 \\
        --storage postgresql://user:pass@host/db           # the same line on another machine adds a worker
    python -m ppo_ddp.tune --study hc --report              # best preset, table, plot; no trials run
    optuna-dashboard sqlite:///runs/tune/hc/study.db

`ppo-ddp-tune` is the same program. --space takes a search space of the package (halfcheetah, locomotion:
ppo_ddp/configs/tune/) or a YAML file. Each trial is `python -m ppo_ddp.train --config
runs/tune/<study>/trial_<n>/<env>.yaml` in a process of its own, one env after the other (the search space,
ppo_ddp/tune_space.py, says which envs and what is searched). While it trains, its eval.csv is read: every
evaluation is reported to optuna (normalised by the env's target score) and a trial the median pruner stops is
sent SIGTERM (it saves and exits) and recorded as pruned. A trial's value is
the mean over envs of its last evaluations' normalised return; a trial whose training exits non-zero (a crash,
a refused config, non-finite losses) or evaluates to a non-finite return is recorded as failed and the study
goes on. Workers on one or more machines share the study through --storage; a stopped study continues when the
same command is run again: workers start trials until the study holds --n-trials of them.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Optional

from ppo_ddp.config import ConfigError, missing_extra
from ppo_ddp.presets import space_file
from ppo_ddp.programs import package_env
from ppo_ddp.tune_space import Space, load_space, parse_space
from ppo_ddp.tune_trial import Objective

PROG = "tune.py"
SQLITE_BUSY_TIMEOUT_S = 60  # workers sharing a SQLite file wait this long for its lock instead of failing
STORAGE_ATTEMPTS = 3  # opening a storage that workers started at once are making: tries, 2 s apart
# The pip package of each database driver SQLAlchemy may pick for a --storage URL (postgresql://, mysql://, or
# postgresql+psycopg2:// and such); quoted where a shell would read the brackets.
DRIVER_PACKAGES = {
    "psycopg": "'psycopg[binary]'",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
    "mysqldb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysqlconnector": "mysql-connector-python",
}
STUDY_READY_S = 30  # a worker that finds the study just made waits this long for its maker to store the space


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--space",
        help="search space: a packaged one's name (halfcheetah, locomotion: ppo_ddp/configs/tune/) or a YAML file; "
        "needed unless --report",
    )
    p.add_argument("--study", required=True, help="study name: its folder is OUT/STUDY, its trials are in STORAGE")
    p.add_argument("--n-trials", type=int, help="run until the study holds this many trials (see README)")
    p.add_argument("--storage", help="database URL optuna accepts (default: sqlite:///OUT/STUDY/study.db)")
    p.add_argument("--out", default="runs/tune", help="folder of the studies' folders (default: runs/tune)")
    p.add_argument("--workers", type=int, default=1, help="worker processes started here (default: 1)")
    p.add_argument("--seed", type=int, help="sampler seed; worker i uses SEED + i (default: random)")
    p.add_argument("--report", action="store_true", help="only write the best preset, the table and the plot")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between reads of a trial's eval.csv")
    p.add_argument(
        "--heartbeat",
        type=int,
        default=60,
        help="seconds between a running trial's heartbeats; one "
        "silent for 3 heartbeats (its worker was killed) is failed by the next worker that starts a trial",
    )
    p.add_argument("--worker-id", type=int, help=argparse.SUPPRESS)  # one of --workers' processes: no report
    args = p.parse_args(argv)
    if not args.report and (args.space is None or args.n_trials is None):
        p.error("--space and --n-trials are needed to run trials (or --report to only write the report)")
    if (args.n_trials is not None and args.n_trials < 1) or args.workers < 1 or args.poll <= 0 or args.heartbeat < 1:
        p.error("--n-trials and --workers must be >= 1, --poll > 0, --heartbeat >= 1")
    return args


def fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if problem := missing_extra("optuna"):
        fail(problem)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a trial's end is one line of ours, not a traceback
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # the heartbeat is one
    # work() runs optuna's heartbeat thread beside each trial it asks for, as study.optimize would.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    study_dir = (Path(args.out) / args.study).resolve()
    url = args.storage or f"sqlite:///{study_dir / 'study.db'}"
    if args.report and not args.storage and not (study_dir / "study.db").exists():
        fail(f"study={args.study!r}: no database {study_dir / 'study.db'} (see --out and --storage)")
    if problem := missing_driver(url):
        fail(problem)
    study_dir.mkdir(parents=True, exist_ok=True)
    from sqlalchemy.exc import SQLAlchemyError

    try:
        space = load_space(space_file(args.space)) if args.space else None
        worker = args.worker_id or 0
        study = open_study(url, args.study, space, args.seed, worker, args.heartbeat, create=not args.report)
    except ConfigError as e:
        fail(str(e))
    except ValueError as e:  # --space names neither a file nor a packaged space
        if args.space and str(e).startswith(repr(args.space)):
            fail(f"space={e}")
        fail(f"storage={shown(url)!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    except (SQLAlchemyError, ImportError) as e:  # a bad URL, a missing driver, no server
        fail(f"storage={shown(url)!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if space is None:
        if "space" not in study.user_attrs:
            fail(f"study={args.study!r}: not made by tune.py (it stores no search space); give its --space")
        space = stored_space(study)
    if args.report:
        report(study, space, study_dir, url)
        return
    with StopOnSignal():
        if args.workers > 1:
            code = run_workers(args, url)
        else:
            tag = "" if args.worker_id is None else f"[worker {args.worker_id}] "
            code = work(study, Objective(space, study_dir, args.poll, tag), args.n_trials)
    if args.worker_id is None:
        report(study, space, study_dir, url)
    raise SystemExit(code)


def shown(url: str) -> str:
    """The storage URL without its password, for messages."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy reads: the message about it says so
        return url


def missing_driver(url: str) -> Optional[str]:
    """What to pip install when the database driver a --storage URL needs is missing (SQLAlchemy picks it from
    the URL: postgresql:// is psycopg 3 from SQLAlchemy 2.1 on, psycopg2 before it)."""
    from sqlalchemy.engine import make_url

    try:
        dialect = make_url(url).get_dialect()
    except Exception:  # not a URL sqlalchemy reads, or a database it does not know: opening it says so
        return None
    try:
        dialect.import_dbapi()
    except ImportError:
        package = DRIVER_PACKAGES.get(dialect.driver, dialect.driver)
        return f"storage={shown(url)!r}: needs the database driver {dialect.driver}: pip install {package}"
    return None


def make_storage(url: str, heartbeat: int) -> Any:
    import optuna
    from sqlalchemy import event
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    sqlite = url.startswith("sqlite")
    # pysqlite begins a transaction only at its first write, so optuna's SELECT ... FOR UPDATE locks nothing on
    # SQLite: two workers could both read an enqueued trial as WAITING and both claim it, or finish a trial another
    # had just finished. With the driver's own BEGIN off (isolation_level None) and BEGIN IMMEDIATE opening every
    # transaction instead, a transaction holds the database's write lock from its first read: each read-then-write
    # of optuna's is atomic, as row locks make it on a database server. Workers wait up to the busy timeout.
    connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S, "isolation_level": None}
    engine_kwargs = {"connect_args": connect_args} if sqlite else {}

    def storage() -> Any:
        made = optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat, grace_period=3 * heartbeat
        )
        if sqlite:
            event.listen(made.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        return made

    # Workers started at once on a new database race to make its tables and types: the losers get a lock timeout
    # (OperationalError), a duplicate key in the catalogue (IntegrityError) or "type ... already exists"
    # (ProgrammingError, seen on PostgreSQL 15), and find them made when they try again. An error that lasts
    # (a wrong URL, no permission) is raised by the last attempt.
    for attempt in range(STORAGE_ATTEMPTS):
        try:
            return storage()
        except (OperationalError, IntegrityError, ProgrammingError):
            if attempt == STORAGE_ATTEMPTS - 1:
                raise
            time.sleep(2)


def open_study(
    url: str, name: str, space: Optional[Space], seed: Optional[int], worker: int, heartbeat: int, create: bool
) -> Any:
    """The study; made with its space's enqueued trials and the space itself when it does not exist and create is
    True. ConfigError when it was made with another space, or (create False) when there is no such study."""
    import optuna

    storage = make_storage(url, heartbeat)
    sampler = optuna.samplers.TPESampler(
        seed=None if seed is None else seed + worker, constant_liar=True, **(space.sampler if space else {})
    )
    pruner = optuna.pruners.MedianPruner(**(space.pruner if space else {}))
    kwargs = {"study_name": name, "storage": storage, "sampler": sampler, "pruner": pruner}
    if create and space is not None:
        try:  # the database's unique study name decides which of the workers started at once makes the study
            study = optuna.create_study(**kwargs, direction="maximize")
        except optuna.exceptions.DuplicatedStudyError:
            pass
        else:
            fill_new_study(study, space)
            return study
    elif name not in optuna.get_all_study_names(storage):
        raise ConfigError(f"study={name!r}: no such study in {shown(url)}")
    study = optuna.load_study(**kwargs)
    if space is not None and not same_space(study, stored_doc(study, url), space):
        raise ConfigError(
            f"study {name!r} in {shown(url)} was made with another search space "
            f"({study.user_attrs.get('space_source')}); use its file unchanged, or a new --study name"
        )
    return study


def fill_new_study(study: Any, space: Space) -> None:
    """The enqueued trials of a study this worker made, then its space (so that --report needs no file and workers
    agree): the space stored last tells the workers that load the study that it is ready."""
    dists = {d.name: d for d in space.params}
    for params in space.enqueue:
        study.enqueue_trial({k: dists[k].encode(v) for k, v in params.items()})
    study.set_user_attr("space_source", space.source)
    study.set_user_attr("env_base_values", space.base_values)
    study.set_user_attr("space", space.doc)


def stored_doc(study: Any, url: str) -> Any:
    """The space the study stored; a worker started with the one that made it waits for it a moment."""
    deadline = time.monotonic() + STUDY_READY_S
    while (doc := study.user_attrs.get("space")) is None:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"study {study.study_name!r} in {shown(url)} stores no search space: not made by tune.py, or its "
                f"maker stopped before storing it; use a new --study name"
            )
        time.sleep(0.5)
    return doc


def same_space(study: Any, doc: dict[str, Any], space: Space) -> bool:
    """Whether a study may continue with this space: the file it was made with, up to how its `base` names the
    preset (studies made before the presets moved into the package wrote configs/NAME.yaml), whose values must
    not have changed."""
    others = {k: v for k, v in doc.items() if k != "base"} == {k: v for k, v in space.doc.items() if k != "base"}
    return others and stored_space(study).base_values == json.loads(json.dumps(space.base_values))


def stored_space(study: Any) -> Space:
    attrs = study.user_attrs
    base_values = attrs.get("env_base_values")
    if base_values is None:  # a study made before each env could have its own base: one preset for all
        base_values = {env_id: attrs["base_values"] for env_id in attrs["space"]["envs"]}
    return parse_space(attrs["space"], attrs["space_source"], check_env=False, base_values=base_values)


def counted_trials(study: Any) -> int:
    """The trials towards --n-trials: complete, pruned, running, and failed by their training; not those a stopped
    or killed worker left failed, so a continued study still gets its number of trials that ran to their end, nor
    the enqueued ones still waiting for a worker."""
    import optuna
    from optuna.trial import TrialState

    optuna.storages.fail_stale_trials(study)
    counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    trials = study.get_trials(deepcopy=False)
    return sum(1 for t in trials if t.state in counted or "fail_reason" in t.user_attrs)


def work(study: Any, objective: Objective, n_trials: int) -> int:
    """One worker: trials one after the other until the study holds n_trials. Workers that check at the same
    moment may each start one more. A trial the study has ended already (another worker failed it: its heartbeats
    were late) is one line, and the worker goes on with the next trial."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages._heartbeat import get_heartbeat_thread  # what study.optimize runs beside a trial
    from optuna.trial import TrialState

    while counted_trials(study) < n_trials:
        trial = study.ask()  # an enqueued trial, claimed by this worker alone (make_storage), or a sampled one
        try:
            with get_heartbeat_thread(trial._trial_id, study._storage):
                state, value = objective(trial)
        except UpdateFinishedTrialError:  # from a report or an attribute while it trained: its trainer is stopped
            disowned(study, trial, "its training was stopped", objective.say)
            continue
        except BaseException:  # Ctrl-C, SIGTERM or a fault: recorded as failed, then the worker stops
            finish(study, trial, TrialState.FAIL, None, objective.say)
            raise
        finish(study, trial, state, value, objective.say)
    return 0


def finish(study: Any, trial: Any, state: Any, value: Optional[float], say: Callable[[str], None]) -> None:
    """Record the trial's end; the study's record stands where it has the trial ended already."""
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        if study.tell(trial, value, state=state, skip_if_finished=True).state == state:
            return
    except UpdateFinishedTrialError:  # ended by another worker between tell's check and its write
        pass
    disowned(study, trial, f"this worker's {state.name} is not recorded", say)


def disowned(study: Any, trial: Any, outcome: str, say: Callable[[str], None]) -> None:
    recorded = next(t.state.name for t in study.get_trials(deepcopy=False) if t.number == trial.number)
    say(
        f"trial {trial.number}: the study has it {recorded} already (ended by another worker, whose check found "
        f"its heartbeats late); {outcome}, next trial"
    )


class StopOnSignal:
    """SIGTERM and SIGINT raise KeyboardInterrupt once; later ones are ignored, so that the running trainer is
    stopped and waited for in peace. Exit status 128 + signal."""

    def __enter__(self) -> StopOnSignal:
        self.signum: Optional[int] = None
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        self.signum = signum
        raise KeyboardInterrupt

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is KeyboardInterrupt:
            print(f"{PROG}: stopped by {signal.Signals(self.signum or signal.SIGINT).name}", file=sys.stderr)
            raise SystemExit(128 + (self.signum or signal.SIGINT))


def run_workers(args: argparse.Namespace, url: str) -> int:
    """--workers K: K worker processes of this script on the same study (the study and its tables exist already,
    made by main). A signal here is passed on to them; the first failed worker's status is returned."""
    cmd = [sys.executable, "-m", "ppo_ddp.tune", "--space", args.space, "--study", args.study]
    cmd += ["--n-trials", str(args.n_trials), "--storage", url, "--out", args.out, "--poll", str(args.poll)]
    cmd += ["--heartbeat", str(args.heartbeat)] + (["--seed", str(args.seed)] if args.seed is not None else [])
    procs = [subprocess.Popen([*cmd, "--worker-id", str(i)], env=package_env()) for i in range(args.workers)]
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:  # a second signal is ignored by a worker that got the terminal's Ctrl-C already
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        raise
    return next((c for c in codes if c != 0), 0)


def report(study: Any, space: Space, study_dir: Path, url: str) -> None:
    import optuna

    from ppo_ddp.tune_report import write_report

    optuna.storages.fail_stale_trials(study)  # a trial whose worker was killed shows as failed, not running
    for line in write_report(study, space, study_dir):
        print(line)
    print(f"dashboard: optuna-dashboard {shown(url)}")


if __name__ == "__main__":
    main()
