"""Config's validation: every value checked before any process, env or collective starts; a bad one is a
ConfigError that names the field, the value and what is allowed (ppo_ddp/configuration/config.py's contract)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

from ppo_ddp.configuration.config import Config, invalid
from ppo_ddp.configuration.topology import resolve_actors_per_learner, round_envs
from ppo_ddp.envs.make import bounds_problem, critic_obs_problem, env_problems
from ppo_ddp.envs.options import is_plain
from ppo_ddp.errors import ConfigError

COUNT_FIELDS = tuple(
    "total_timesteps num_gpus num_actors num_envs envs_per_actor rollout_length param_sync_interval "
    "update_epochs num_minibatches save_interval learner_threads eval_episodes rnn_hidden_size seq_length".split()
)
POSITIVE_FLOAT_FIELDS = tuple(
    "learning_rate lr_kl_target clip_coef max_grad_norm obs_clip reward_clip actor_timeout".split()
)
NON_NEGATIVE_FLOAT_FIELDS = ("ent_coef", "vf_coef", "bounds_loss_coef")


def missing_extra(module: str) -> Optional[str]:
    """What to install when an optional dependency (an extra of pyproject.toml) is missing, else None."""
    return None if importlib.util.find_spec(module) else f"needs {module}: pip install {module}"


def validate(cfg: Config, check_env: bool = True) -> None:
    """Raise ConfigError for the first invalid value of cfg."""
    for name in COUNT_FIELDS:
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise invalid(name, value, "must be a positive integer")
    for name in POSITIVE_FLOAT_FIELDS:
        value = getattr(cfg, name)
        if not value > 0:
            raise invalid(name, value, "must be > 0")
    for name in NON_NEGATIVE_FLOAT_FIELDS:
        value = getattr(cfg, name)
        if not value >= 0:
            raise invalid(name, value, "must be >= 0")
    if not 0 < cfg.gamma <= 1:
        raise invalid("gamma", cfg.gamma, "must be in (0, 1]")
    if not 0 <= cfg.gae_lambda <= 1:
        raise invalid("gae_lambda", cfg.gae_lambda, "must be in [0, 1]")
    if cfg.target_kl is not None and not cfg.target_kl > 0:
        raise invalid("target_kl", cfg.target_kl, "must be > 0 or None")
    if cfg.lag_weight_max is not None and not cfg.lag_weight_max > 0:
        raise invalid("lag_weight_max", cfg.lag_weight_max, "must be > 0 or None")
    if cfg.lag_weight_max is not None and not cfg.overlap:
        raise invalid("lag_weight_max", cfg.lag_weight_max, "needs overlap (sync rounds have no lag to weigh)")
    if cfg.eval_interval < 0:
        raise invalid("eval_interval", cfg.eval_interval, "must be >= 0 (0: no evaluation)")
    if cfg.capture_video and not cfg.eval_interval:
        raise invalid("capture_video", True, "records evaluation episodes: set eval_interval > 0 (--eval-interval N)")
    for name, module in (("capture_video", "moviepy"), ("track", "wandb")):
        if getattr(cfg, name) and (problem := missing_extra(module)):  # optional: said at start, not later
            raise invalid(name, True, problem)
    if cfg.adaptive_lr and cfg.anneal_lr:
        raise invalid("adaptive_lr", True, "the rate follows the KL, so anneal_lr must be false (--no-anneal-lr)")
    if cfg.sync_mode == "gradients" and cfg.param_sync_interval != 1:
        raise invalid(
            "param_sync_interval", cfg.param_sync_interval, 'must be 1 with sync_mode "gradients" (ranks never differ)'
        )
    if cfg.recompute_advantages and cfg.policy == "gru":
        raise invalid("recompute_advantages", True, 'needs policy "mlp" (a GRU\'s values depend on its state)')
    if cfg.shared_trunk and cfg.policy == "gru":
        raise invalid("shared_trunk", True, 'needs policy "mlp" (a GRU\'s encoder and core are always shared)')
    if cfg.critic_obs is not None and cfg.shared_trunk:
        raise invalid("critic_obs", cfg.critic_obs, "needs shared_trunk false (a shared trunk reads one observation)")
    if not cfg.hidden_sizes or any(h <= 0 for h in cfg.hidden_sizes):
        raise invalid("hidden_sizes", list(cfg.hidden_sizes), "must be one or more positive integers")
    if any(h <= 0 for h in cfg.rnn_head_sizes):
        raise invalid("rnn_head_sizes", list(cfg.rnn_head_sizes), "must be positive integers (none: no head MLP)")
    if cfg.rnn_head_sizes and cfg.policy != "gru":
        raise invalid("rnn_head_sizes", list(cfg.rnn_head_sizes), 'needs policy "gru" (an MLP policy has no GRU)')
    if cfg.resume is not None and cfg.resume != "auto" and not Path(cfg.resume).is_file():
        raise invalid("resume", cfg.resume, "must be 'auto' or the path of an existing checkpoint file")
    if cfg.resume == "auto" and not cfg.run_name:
        raise invalid("resume", cfg.resume, "needs --run-name: the run whose latest checkpoint to continue")
    if cfg.run_name is not None and (not cfg.run_name.strip() or "/" in cfg.run_name or cfg.run_name in (".", "..")):
        raise invalid("run_name", cfg.run_name, "must be a folder name (not empty, no '/')")
    check_round_split(cfg)  # whatever the split: the round's envs are the config's, not the machine's
    if not isinstance(cfg.env_kwargs, dict) or not is_plain(cfg.env_kwargs):  # what config.yaml can hold
        raise invalid("env_kwargs", cfg.env_kwargs, "must map names to numbers, strings, booleans, lists or mappings")
    if check_env:
        problem, options = env_problems(cfg.env_id, cfg.env_kwargs)
        if problem is not None:
            raise invalid("env_id", cfg.env_id, problem)
        if options is not None:
            raise invalid("env_kwargs", cfg.env_kwargs, options)
        if cfg.critic_obs is not None and (problem := critic_obs_problem(cfg.env_id, cfg.critic_obs, cfg.env_kwargs)):
            raise invalid("critic_obs", cfg.critic_obs, f"{cfg.env_id}: {problem}")
        if cfg.distribution != "gaussian" and (problem := bounds_problem(cfg.env_id, cfg.env_kwargs)):
            raise invalid("distribution", cfg.distribution, f"{cfg.env_id}: {problem}")


def envs_per_learner(cfg: Config) -> int:
    """The envs of a learner's round (topology.round_envs); ConfigError naming the field that does not fit."""
    try:
        return round_envs(cfg.num_envs, cfg.envs_per_actor,
                          resolve_actors_per_learner(cfg.num_actors, cfg.num_gpus, cfg.actors_per_gpu))  # fmt: skip
    except ValueError as e:
        raise ConfigError(str(e)) from None


def minibatch_rows(cfg: Config) -> int:
    """Rows of a learner's mini-batch: samples, or chunks of seq_length steps (policy "gru")."""
    rows = envs_per_learner(cfg) * cfg.rollout_length // (cfg.seq_length if cfg.policy == "gru" else 1)
    return rows // cfg.num_minibatches


def check_round_split(cfg: Config) -> None:
    """A learner's round must split into the mini-batches; ConfigError naming the field if not."""
    envs = envs_per_learner(cfg)
    rows, what, shape = envs * cfg.rollout_length, "samples", f"num_envs {envs} * rollout_length {cfg.rollout_length}"
    if cfg.policy == "gru":
        if cfg.rollout_length % cfg.seq_length != 0:
            raise invalid("seq_length", cfg.seq_length, f"must divide rollout_length {cfg.rollout_length} (policy gru)")
        rows, what, shape = rows // cfg.seq_length, f"chunks of seq_length {cfg.seq_length}", f"{shape} / seq_length"
    if rows % cfg.num_minibatches != 0:
        raise invalid("num_minibatches", cfg.num_minibatches, f"must divide the {rows} {what} a learner collects per "
                    f"round ({shape})")  # fmt: skip
