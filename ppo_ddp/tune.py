"""Hyperparameter search with Optuna: TPE sampler, median pruner on the evaluations, the study in a database.

    python -m ppo_ddp.tune --space halfcheetah --study hc --n-trials 50 --workers 2
    python -m ppo_ddp.tune --space halfcheetah --study hc --n-trials 50 \\
        --storage postgresql://user:pass@host/db           # the same line on another machine adds a worker
    python -m ppo_ddp.tune --study hc --report              # best preset, table, plot; no trials run
    optuna-dashboard sqlite:///runs/tune/hc/study.db

`ppo-ddp-tune` is the same program. --space takes a search space of the package (halfcheetah, locomotion:
ppo_ddp/configs/tune/) or a YAML file. Each trial is `python -m ppo_ddp.train --config
runs/tune/<study>/trial_<n>/<env>.yaml` in a process of its own, one env after the other (the search space,
ppo_ddp/search/space.py, says which envs and what is searched). While it trains, its eval.csv is read: every
evaluation is reported to optuna (normalised by the env's target score) and a trial the median pruner stops is
sent SIGTERM (it saves and exits) and recorded as pruned. A trial's value is
the mean over envs of its last evaluations' normalised return; a trial whose training exits non-zero (a crash,
a refused config, non-finite losses) or evaluates to a non-finite return is recorded as failed and the study
goes on. Workers on one or more machines share the study through --storage; a stopped study continues when the
same command is run again: workers start trials until the study holds --n-trials of them.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn, Optional

from ppo_ddp.configuration.presets import space_file
from ppo_ddp.configuration.validation import missing_extra
from ppo_ddp.errors import ConfigError
from ppo_ddp.runner.programs import package_env
from ppo_ddp.search.space import Space, load_space
from ppo_ddp.search.study import missing_driver, open_study, shown, stored_space, work
from ppo_ddp.search.trial import Objective

PROG = "tune.py"


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

    from ppo_ddp.search.report import write_report

    optuna.storages.fail_stale_trials(study)  # a trial whose worker was killed shows as failed, not running
    for line in write_report(study, space, study_dir):
        print(line)
    print(f"dashboard: optuna-dashboard {shown(url)}")


if __name__ == "__main__":
    main()
