"""The study of a search and its workers: the storage (SQLite or a database server), the study opened or made with
its search space stored, and a worker's loop that claims trials and ends them, also when a signal or a lost
heartbeat ends one."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Optional

from ppo_ddp.errors import ConfigError
from ppo_ddp.search.space import Space, parse_space
from ppo_ddp.search.trial import Objective

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
        # optuna never counts a trial with no heartbeat as stale, and the thread's first write can come after the
        # trainer has started: a worker killed in between would leave its trial RUNNING for good. So the first
        # heartbeat is written here, before the trial's trainer exists.
        study._storage.record_heartbeat(trial._trial_id)
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
