"""Rank 0's outputs of a run: TensorBoard (scalars, hyperparameters, evaluation videos), metrics.csv, eval.csv, the
resolved config, the progress line, and the Weights & Biases run of --track."""

from __future__ import annotations

import csv
import importlib.metadata
import math
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import yaml

import ppo_ddp
from ppo_ddp.configuration.config import Config, config_to_dict
from ppo_ddp.envs.video import gif_bytes
from ppo_ddp.errors import ConfigError

PACKAGES = ("torch", "gymnasium", "mujoco", "numpy", "tensorboard", "tyro", "PyYAML")
"""The packages a run's config.yaml records the versions of (with Python's and ppo_ddp's): what it ran on."""
HPARAM_METRICS = ("charts/episodic_return_avg100", "eval/episodic_return", "charts/SPS")
"""The scalars TensorBoard's HParams tab shows beside each run's hyperparameters (their last values)."""
NOT_HPARAMS = ("run_name", "runs_dir", "metrics_path", "resume", "track", "wandb_project", "wandb_entity")
"""Config fields that do not change what a run computes, left out of the HParams tab (W&B's own fields too)."""
WANDB_ID_FILE = "wandb_id"
"""In the run folder: the W&B run id, so that a resumed run continues the same W&B run."""


def code_version(paths: Sequence[str] = (), short: bool = False) -> str:
    """The git commit of the code (with '-dirty' for uncommitted changes), or 'unknown' outside a checkout.

    paths: only uncommitted changes under these count (default: any tracked file); short: the abbreviated hash.
    """
    root = Path(__file__).resolve().parents[2]  # the checkout: ppo_ddp/records/run_log.py
    try:
        commit = subprocess.run(
            ["git", "rev-parse", *(["--short"] if short else []), "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit + ("-dirty" if dirty else "")) if commit else "unknown"


def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0], "ppo_ddp": ppo_ddp.__version__}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def default_run_name(env_id: str, seed: int, started: float) -> str:
    """<env_id>__<seed>__<start time>, one folder name: a namespaced id's '/' (ppo_ddp/HopperNoVel-v5) as '-'."""
    return f"{env_id.replace('/', '-')}__{seed}__{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}"


def write_run_config(path: Path, cfg: Config, extra: dict[str, Any]) -> None:
    doc = {"config": config_to_dict(cfg), "code_version": code_version(), "packages": package_versions(), **extra}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def open_run_folder(
    run_dir: Path, cfg: Config, facts: dict[str, Any], total_steps: int, resumed: bool, start_step: int
) -> RunLogger:
    """Rank 0: the run folder (without the temp files of a process killed while writing), config.yaml with the
    run's facts, and the logger. ConfigError (exit 2) when the folder cannot be written."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.glob(".*.tmp"):  # left by a process killed while writing; never the real files
            stale.unlink(missing_ok=True)
        write_run_config(run_dir / "config.yaml", cfg, facts)
        tracker = start_wandb(cfg, run_dir, facts, resumed) if cfg.track else None  # before TensorBoard: W&B syncs it
        metrics_path = Path(cfg.metrics_path) if cfg.metrics_path else run_dir / "metrics.csv"
        logger = RunLogger(run_dir, metrics_path, total_steps, resumed, start_step, tracker)
        logger.log_hparams(cfg)
        return logger
    except OSError as e:
        raise ConfigError(
            f"runs_dir={cfg.runs_dir!r}: cannot write the run folder {run_dir}: {e.strerror or e}"
        ) from None


def start_wandb(cfg: Config, run_dir: Path, facts: dict[str, Any], resumed: bool) -> Any:
    """The W&B run of --track: a resumed run continues the W&B run whose id the run folder keeps, a fresh start
    begins a new one; the resolved config, the git commit and the run's facts as its config; TensorBoard's scalars
    synced."""
    import wandb

    id_path = run_dir / WANDB_ID_FILE
    keep = resumed and id_path.is_file()
    run_id = id_path.read_text().strip() if keep else secrets.token_hex(4)  # W&B ids: [a-z0-9]
    id_path.write_text(run_id + "\n")
    try:
        tracker = wandb.init(
            project=cfg.wandb_project,
            entity=cfg.wandb_entity,
            group=cfg.wandb_group,
            tags=list(cfg.wandb_tags) or None,
            name=facts["run_name"],
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            sync_tensorboard=True,
        )
    except Exception as e:  # not logged in, no network, a bad entity: the user's to fix, before any round
        reason = str(e).strip().splitlines()
        raise ConfigError(
            f"track=True: W&B could not start ({type(e).__name__}: {reason[0] if reason else ''}); `wandb login`, "
            f"or WANDB_MODE=offline to keep the run here and `wandb sync` it later"
        ) from None
    # a resume may change a value (total_timesteps, the resumed_from fact): the latest is the run's config
    values = {**config_to_dict(cfg), "code_version": code_version(), "packages": package_versions(), **facts}
    tracker.config.update(values, allow_val_change=True)
    return tracker


def format_duration(seconds: float) -> str:
    """1h02m, or 3m05s under an hour; ? when unknown."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _drop_rows_after(path: Path, last_step: int) -> None:
    """Keep the header and the whole rows with global_step <= last_step (atomically: temp file + rename)."""
    with open(path, newline="") as f:
        text = f.read()
    rows = list(csv.reader(text.splitlines()))
    if not rows or "global_step" not in rows[0]:
        return
    col = rows[0].index("global_step")

    def keep(row: list[str]) -> bool:
        try:
            return len(row) == len(rows[0]) and int(float(row[col])) <= last_step
        except ValueError:
            return False

    kept = [rows[0]] + [r for r in rows[1:] if keep(r)]
    if len(kept) == len(rows) and text.endswith("\n"):  # nothing past the checkpoint, no torn last line
        return
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        csv.writer(f).writerows(kept)
    os.replace(tmp, path)


class RunLogger:
    """TensorBoard scalars, one CSV row per round and a progress line; only rank 0 makes one."""

    def __init__(
        self, run_dir: Path, metrics_path: Path, total_steps: int, resumed: bool, start_step: int, tracker: Any = None
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = run_dir
        self.tracker = tracker  # the W&B run of --track, or None
        # purge_step drops events a crashed run wrote past its last checkpoint, so a resumed curve has no duplicates.
        self.writer = SummaryWriter(str(run_dir), purge_step=start_step + 1 if resumed else None)
        self.metrics_path = metrics_path
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        append = resumed and self.metrics_path.exists() and self.metrics_path.stat().st_size > 0
        if append:  # likewise for the CSV: rows past the checkpoint are redone by this run
            _drop_rows_after(self.metrics_path, start_step)
        self._csv_file = open(self.metrics_path, "a" if append else "w", newline="")
        self._csv: Optional[csv.DictWriter] = None
        self._fieldnames: Optional[list[str]] = None
        if append:
            with open(self.metrics_path, newline="") as f:
                self._fieldnames = next(csv.reader(f), None)
        self.eval_path = run_dir / "eval.csv"
        if resumed and self.eval_path.exists():
            _drop_rows_after(self.eval_path, start_step)
        elif not resumed:  # a fresh start in an old run's folder: its evaluations are not this run's
            self.eval_path.unlink(missing_ok=True)
        self.total_steps = total_steps
        self.tty = sys.stdout.isatty()

    def log_hparams(self, cfg: Config) -> None:
        """The run's hyperparameters for TensorBoard's HParams tab, with HPARAM_METRICS as its metrics (TensorBoard
        shows their latest values, so a stopped or running run compares too)."""
        from torch.utils.tensorboard.summary import hparams

        values = {k: v for k, v in config_to_dict(cfg).items() if k not in NOT_HPARAMS}
        values = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in values.items()}
        for summary in hparams(values, dict.fromkeys(HPARAM_METRICS, 0.0)):
            self.writer.file_writer.add_summary(summary)

    def log(self, iteration: int, global_step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):
                self.writer.add_scalar(key, value, global_step)
        row = {"iteration": iteration, "global_step": global_step, **metrics}
        if self._csv is None:
            self._fieldnames = self._fieldnames or list(row)
            self._csv = csv.DictWriter(self._csv_file, fieldnames=self._fieldnames, extrasaction="ignore")
            if self._csv_file.tell() == 0:
                self._csv.writeheader()
        self._csv.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()})
        self._csv_file.flush()
        self._progress(iteration, global_step, metrics)

    def log_evaluation(self, evaluation: Any, replaced: int) -> None:
        """An evaluation (evaluator.Evaluation) against the global step of the round it evaluated: TensorBoard's
        eval/ scalars, a row of eval.csv, a line."""
        metrics = evaluation.metrics()
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, evaluation.global_step)
        new = not self.eval_path.exists() or self.eval_path.stat().st_size == 0
        with open(self.eval_path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["iteration", "global_step", *metrics, "episodes", "replaced"])
            writer.writerow(
                [evaluation.iteration, evaluation.global_step, *metrics.values(), len(evaluation.episodes), replaced]
            )
        if evaluation.video is not None:
            self._log_video(*evaluation.video, evaluation.global_step)
        self.message(
            f"eval of round {evaluation.iteration} (step {evaluation.global_step:,}): return "
            f"{metrics['eval/episodic_return']:.1f} ± {metrics['eval/episodic_return_std']:.1f} over "
            f"{len(evaluation.episodes)} episodes, {metrics['eval/seconds']:.1f} s"
        )

    def _log_video(self, path: str, preview: Any, fps: float, global_step: int) -> None:
        """An evaluation's video: its preview in TensorBoard (which plays videos as animated GIFs; torch's add_video
        needs moviepy 1), the mp4 in W&B."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        if len(preview):
            _, height, width, channels = preview.shape
            gif = Summary.Image(
                height=height, width=width, colorspace=channels, encoded_image_string=gif_bytes(preview, fps)
            )
            self.writer.file_writer.add_summary(
                Summary(value=[Summary.Value(tag="eval/video", image=gif)]), global_step
            )
        if self.tracker is not None:
            import wandb

            self.tracker.log({"videos/eval": wandb.Video(path, format="mp4")})

    def _progress(self, iteration: int, global_step: int, metrics: dict[str, float]) -> None:
        rate = metrics.get("charts/SPS", float("nan"))  # the trained rounds' rate (Trainer._gather_metrics)
        eta = (self.total_steps - global_step) / rate if rate > 0 else float("nan")
        ret = metrics.get("charts/episodic_return_avg100", float("nan"))
        pct = 100.0 * global_step / self.total_steps
        line = (
            f"iter {iteration} | steps {global_step:,}/{self.total_steps:,} ({pct:.0f}%) | "
            f"SPS {rate:,.0f} | return {ret:.1f} | "
            f"ETA {format_duration(eta)}"
        )
        if self.tty:
            print("\r" + line.ljust(100), end="", flush=True)
        else:
            print(line, flush=True)

    def message(self, text: str) -> None:
        """A line of its own, under the live progress line."""
        print(("\n" if self.tty else "") + text, flush=True)

    def close(self) -> None:
        if self.tty:
            print(flush=True)
        self.writer.close()
        self._csv_file.close()
        if self.tracker is not None:
            self.tracker.finish()
