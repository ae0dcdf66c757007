"""Evaluate a checkpoint: `python -m ppo_ddp.evaluate runs/<run>/model_<run>.pt --episodes 10`.

`--video DIR` records every episode as an mp4, `--gif FILE` the first one's start as a GIF (the README's animations).
Everything comes from the checkpoint alone: the network shape from its config, the observation
normalisation from its frozen obs_rms_state. Deterministic evaluation acts with the
policy's deterministic action (the Gaussian's mean; a bounded distribution's, docs/design.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import tyro

from ppo_ddp.configuration.flags import use_docstrings_as_help
from ppo_ddp.configuration.validation import missing_extra
from ppo_ddp.envs.make import env_problem, make_video_env
from ppo_ddp.envs.video import render_problem
from ppo_ddp.errors import CheckpointError
from ppo_ddp.evaluation.playback import evaluate_policy, load_policy


@dataclass(frozen=True)
class EvalArgs:
    """Evaluate a ppo_ddp checkpoint on its environment."""

    checkpoint: tyro.conf.Positional[str]
    """Path of a model_<run>.pt or model_<run>_best.pt file."""
    episodes: int = 10
    """Episodes to run."""
    deterministic: bool = True
    """Act with the policy's deterministic action (the Gaussian's mean); --stochastic (same as --no-deterministic)
    samples from the policy's distribution."""
    seed: int = 12345
    """Seed of the evaluation episodes (different from training seeds by default)."""
    video: Optional[str] = None
    """Folder to record an mp4 of every episode into, with a camera that follows the robot (needs moviepy and a
    MuJoCo renderer: without a display MUJOCO_GL=egl is tried, or set MUJOCO_GL=osmesa)."""
    gif: Optional[str] = None
    """File to write the first episode's first seconds to as a looping GIF (about 160 pixels a side, under 1 MB for
    a README; needs a MuJoCo renderer, as --video does, not moviepy)."""
    env_id: Optional[str] = None
    """Override the env of the checkpoint (same observation and action shapes); it is made with the checkpoint's
    env_kwargs, the options of the robot the policy was trained on."""


def main(argv: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = ["--no-deterministic" if a == "--stochastic" else a for a in argv]
    use_docstrings_as_help(EvalArgs)  # --help as prose, like train's
    args = tyro.cli(EvalArgs, args=argv, prog="python -m ppo_ddp.evaluate")
    if args.episodes <= 0:
        print(f"evaluate: error: episodes={args.episodes}: must be a positive integer", file=sys.stderr)
        raise SystemExit(2)
    try:
        model, obs_rms, cfg = load_policy(args.checkpoint)
    except CheckpointError as e:
        print(f"evaluate: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    env_id = args.env_id or cfg.env_id
    # a dm_control run's checkpoint in a venv without dm_control, say, or the run's xml_file moved since
    if problem := env_problem(env_id, cfg.env_kwargs):
        print(f"evaluate: error: env_id={env_id!r}: {problem}", file=sys.stderr)
        raise SystemExit(2)
    if args.video or args.gif:  # one probe of the renderer for both; moviepy only for the mp4 files
        _check_video(env_id, cfg.env_kwargs, "--video" if args.video else "--gif", writes_mp4=bool(args.video))
    returns = evaluate_policy(
        model, obs_rms, cfg, args.episodes, args.deterministic, args.seed, args.env_id, args.video, args.gif
    )
    mode = "deterministic" if args.deterministic else "stochastic"
    print(
        f"{args.env_id or cfg.env_id}: mean return {np.mean(returns):.1f} ± {np.std(returns):.1f} "
        f"over {len(returns)} {mode} episodes (min {np.min(returns):.1f}, max {np.max(returns):.1f})"
    )
    if args.video:
        print(f"videos in {args.video}")
    if args.gif:
        print(f"wrote {args.gif} ({Path(args.gif).stat().st_size / 1024:.0f} KiB)")


def _check_video(env_id: str, env_kwargs: dict[str, Any], flag: str, writes_mp4: bool) -> None:
    """Fail with advice instead of a traceback when videos cannot be written here."""
    problem = missing_extra("moviepy") if writes_mp4 else None  # moviepy writes the mp4 files, pillow the GIF
    if problem is None:
        env = make_video_env(env_id, **env_kwargs)
        problem = render_problem(env)
        env.close()
    if problem is not None:
        print(f"evaluate: error: {flag}: {problem}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
