"""A checkpoint's policy played on its env: rebuilt from the file (`load_policy`) and run for deterministic or
sampled episodes, seeded as `python -m ppo_ddp.evaluate` seeds them (`evaluate_policy`). The evaluate program,
export and the benchmarks call it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ppo_ddp.configuration.config import Config, config_from_dict
from ppo_ddp.envs.make import make_env, make_video_env
from ppo_ddp.envs.video import EpisodeGif, EpisodeVideo
from ppo_ddp.errors import CheckpointError
from ppo_ddp.evaluation.evaluator import play_episodes
from ppo_ddp.models.factory import make_model
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import Moments
from ppo_ddp.storage.checkpoint import load_checkpoint


def load_policy(path: str | Path) -> tuple[ActorCritic, Optional[Moments], Config]:
    """Rebuild the actor-critic and its frozen observation statistics from a checkpoint file."""
    state = load_checkpoint(path)
    if "config" not in state:
        raise CheckpointError(f"checkpoint {path}: has no 'config', cannot rebuild the network")
    cfg = config_from_dict(state["config"])
    obs_dim, act_dim = int(state["obs_dim"]), int(state["act_dim"])
    env = make_env(cfg.env_id, **cfg.env_kwargs)  # the bounds a bounded distribution acts within are the env's
    bounds = (env.action_space.low, env.action_space.high)
    env.close()
    model = make_model(cfg, obs_dim, act_dim, int(state.get("critic_dim", 0)), bounds)  # the critic: loaded, unused
    model.load_state_dict(state["actor"])
    model.eval()
    obs_rms = Moments.from_state(state["obs_rms_state"]) if state["obs_rms_state"] is not None else None
    return model, obs_rms, cfg


def evaluate_policy(
    model: ActorCritic,
    obs_rms: Optional[Moments],
    cfg: Config,
    episodes: int,
    deterministic: bool = True,
    seed: int = 12345,
    env_id: Optional[str] = None,
    video_dir: Optional[str] = None,
    gif_path: Optional[str] = None,
) -> list[float]:
    """Undiscounted returns of `episodes` episodes, statistics frozen throughout; every episode recorded as an mp4
    in video_dir, the first one's start as a GIF at gif_path (envs/video.py), when they are given."""
    env_id = env_id or cfg.env_id
    if video_dir or gif_path:
        env = make_video_env(env_id, **cfg.env_kwargs)
        if video_dir:
            env = EpisodeVideo(env)
            env.record_all(Path(video_dir))
        if gif_path:
            env = gif = EpisodeGif(env)
    else:
        env = make_env(env_id, **cfg.env_kwargs)
    try:
        returns = [ret for ret, _ in play_episodes(env, model, obs_rms, cfg.obs_clip, episodes, seed, deterministic)]
    finally:
        env.close()
    if gif_path:
        gif.save(gif_path)
    return returns
