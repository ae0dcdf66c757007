"""The search space of python -m ppo_ddp.tune: its YAML file checked against Config's fields, a trial's config, scores.

No optuna here (a trial is anything with optuna's suggest_* methods), so a space can be checked without it.
The file's keys (ppo_ddp/configs/tune/halfcheetah.yaml is an example):

    base: halfcheetah                     the preset every trial starts from (a preset's name, or a YAML file);
                                          without it, each env's own preset (ppo_ddp/configuration/presets.py:
                                          hopper for Hopper-v5), or Config's defaults for an env that has none
    envs: {HalfCheetah-v5: 3000}          env id -> target score; a trial's score on an env is return / target
    fixed: {total_timesteps: 1000000}     Config fields set for every trial, over the base preset
    eval_every_steps: 100000              env steps between evaluations (sets each trial's eval_interval)
    final_evals: 1                        a trial's score on an env: the mean of its last this many evaluations
    pruner: {n_startup_trials: 5, n_warmup_steps: 300000, interval_steps: 1}     optuna's MedianPruner
    sampler: {n_startup_trials: 10}       optuna's TPESampler: random trials before TPE takes over
    params:                               Config field -> distribution
      learning_rate: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}
      update_epochs: {type: int, low: 3, high: 10}
      hidden_sizes: {type: categorical, choices: [[64, 64], [256, 256]]}
    enqueue:                              parameter sets tried first, when the study is new
      - {learning_rate: 3.0e-4, update_epochs: 10, hidden_sizes: [64, 64]}
"""

from __future__ import annotations

import json
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from ppo_ddp.configuration.config import YAML_EXPONENT_HINT, Config, config_from_dict, field_names
from ppo_ddp.configuration.loading import load_yaml_defaults, read_yaml, uncontradicted
from ppo_ddp.configuration.presets import config_file, find_preset
from ppo_ddp.configuration.validation import envs_per_learner, validate
from ppo_ddp.envs.make import env_problem
from ppo_ddp.envs.options import resolve_env_kwargs
from ppo_ddp.errors import ConfigError

TOP_KEYS = ("base", "envs", "fixed", "eval_every_steps", "final_evals", "pruner", "sampler", "params", "enqueue")
# env_id comes from `envs`, eval_interval from eval_every_steps; the rest name a trial's own files.
NOT_TUNABLE = {
    "env_id": "set by envs",
    "eval_interval": "set by eval_every_steps",
    "config": "a trial's own file",
    "run_name": "a trial's own folder",
    "runs_dir": "a trial's own folder",
    "metrics_path": "a trial's own file",
    "resume": "every trial starts fresh",
}
RANGE_KEYS = ("low", "high", "log", "step")
DIST_KEYS = {"float": RANGE_KEYS, "int": RANGE_KEYS, "categorical": ("choices",)}
PRUNER_KEYS = ("n_startup_trials", "n_warmup_steps", "interval_steps")
SAMPLER_KEYS = ("n_startup_trials",)


def _number(value: Any, integer: bool = False) -> bool:
    kinds = int if integer else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)


def _field_kind(name: str) -> type:
    """int, float, or object (anything else: only a categorical distribution suits it)."""
    hint = typing.get_type_hints(Config)[name]
    if typing.get_origin(hint) is typing.Union:  # Optional[X]
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint if hint in (int, float) else object


@dataclass(frozen=True)
class Dist:
    """One searched Config field: optuna's float, int or categorical distribution."""

    name: str
    kind: str
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The trial's value of the field, in Config's terms (a list where Config takes a tuple)."""
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.name, self.low, self.high, log=self.log, step=self.step or 1)
        return self.decode(trial.suggest_categorical(self.name, [self.encode(c) for c in self.choices]))

    # optuna stores categorical choices as None, bool, int, float or str; a list choice (hidden_sizes) travels as
    # its YAML text, "[64, 64]", which is also what the dashboard and the trials table show.
    @staticmethod
    def encode(value: Any) -> Any:
        return yaml.safe_dump(list(value), default_flow_style=True).strip() if isinstance(value, list) else value

    def decode(self, value: Any) -> Any:
        return yaml.safe_load(value) if any(isinstance(c, list) for c in self.choices) and value is not None else value


@dataclass(frozen=True)
class Space:
    source: str
    doc: dict[str, Any]  # the file as read: a study remembers it, and a worker that joins must bring the same
    base_values: dict[str, dict[str, Any]]  # env id -> the preset its trials start from
    envs: dict[str, float]
    fixed: dict[str, Any]
    params: tuple[Dist, ...]
    eval_every_steps: int
    final_evals: int
    pruner: dict[str, int]
    sampler: dict[str, int]
    enqueue: tuple[dict[str, Any], ...]

    def trial_values(self, params: dict[str, Any], env_id: str) -> dict[str, Any]:
        """A trial's preset for one env: base, fixed, the trial's parameters, the env, its evaluation interval."""
        over = {**self.fixed, **params}
        values = {**uncontradicted(self.base_values[env_id], over), **over, "env_id": env_id}
        values = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}  # YAML has lists
        values["eval_interval"] = max(1, round(self.eval_every_steps / round_size(values)))
        order = field_names()
        return {k: values[k] for k in sorted(values, key=order.index)}

    def env_step_span(self) -> int:
        """Env steps set aside for each env in the steps a trial reports at: the longest a trial can train on one
        env, on the evaluation grid, so every trial reports env k's evaluations at the same steps."""
        base_total = max(v.get("total_timesteps", Config.total_timesteps) for v in self.base_values.values())
        total = self.fixed.get("total_timesteps", base_total)
        for dist in self.params:
            if dist.name == "total_timesteps":
                total = int(dist.high) if dist.kind == "int" else max(dist.choices)
        return math.ceil(total / self.eval_every_steps + 1) * self.eval_every_steps

    def report_step(self, env_index: int, global_step: int) -> int:
        """The step a trial reports an evaluation at: the nearest point of the evaluation grid (round sizes differ
        between trials, and optuna's pruner compares trials at equal steps), after the envs before it."""
        return env_index * self.env_step_span() + round(global_step / self.eval_every_steps) * self.eval_every_steps


def round_size(values: dict[str, Any]) -> int:
    """Env steps of one learner's round (a trial runs `python -m ppo_ddp.train`, one learner on a CPU machine)."""
    cfg = config_from_dict(values)
    return envs_per_learner(cfg) * cfg.rollout_length


def env_file_name(env_id: str) -> str:
    """An env id as a file or run name ("module:Env-v0" has a colon)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", env_id)


def write_preset(path: Path, values: dict[str, Any], header: list[str]) -> None:
    """A YAML preset `python -m ppo_ddp.train --config` reads, with comment lines on top."""
    path.parent.mkdir(parents=True, exist_ok=True)
    comments = "".join(f"# {line}\n" for line in header)
    path.write_text(comments + yaml.safe_dump(values, sort_keys=False, default_flow_style=None))


def load_space(path: str | Path, check_env: bool = True) -> Space:
    """Read and check a search-space file; ConfigError naming the key and what is allowed."""
    return parse_space(read_yaml(path, str(path)), str(path), check_env=check_env)


def parse_space(doc: Any, source: str, check_env: bool = True, base_values: Optional[dict] = None) -> Space:
    """A Space from the file's mapping. base_values: each env's base preset as a study stored it (else read from
    disk)."""
    try:
        doc = json.loads(json.dumps(doc))  # as the study stores it, so that a stored space compares equal
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: holds a value that is not plain data ({e})") from None
    try:
        return _parse(doc, source, check_env, base_values)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def _parse(doc: Any, source: str, check_env: bool, base_values: Optional[dict]) -> Space:
    if not isinstance(doc, dict):
        raise ConfigError("must be a YAML mapping with keys " + ", ".join(TOP_KEYS))
    for key in doc:
        if key not in TOP_KEYS:
            raise ConfigError(f"unknown key {key!r} (allowed: {', '.join(TOP_KEYS)})")
    for key in ("envs", "params"):
        if key not in doc:
            raise ConfigError(f"{key}: missing")
    fixed = _fixed(doc.get("fixed") or {})
    envs = _envs(doc["envs"], check_env, fixed.get("env_kwargs") or {})
    if base_values is None:
        base_values = _base_values(doc.get("base"), envs, fixed.get("policy", "mlp"))
    if not (_number(doc.get("eval_every_steps"), integer=True) and doc["eval_every_steps"] > 0):
        raise ConfigError(f"eval_every_steps={doc.get('eval_every_steps')!r}: must be a positive integer (env steps)")
    final_evals = doc.get("final_evals", 1)
    if not (_number(final_evals, integer=True) and final_evals > 0):
        raise ConfigError(f"final_evals={final_evals!r}: must be a positive integer")
    starts = [{**uncontradicted(base_values[env_id], fixed), **fixed, "env_id": env_id} for env_id in envs]
    for start in starts:  # the trials' common part must be a valid config on its own
        validate(config_from_dict({**start, "eval_interval": 1}), check_env=False)
    if not isinstance(doc["params"], dict) or not doc["params"]:
        raise ConfigError("params: must map one or more Config fields to distributions")
    params = tuple(_dist(name, spec, starts, fixed) for name, spec in doc["params"].items())
    return Space(
        source=source,
        doc=doc,
        base_values=base_values,
        envs=envs,
        fixed=fixed,
        params=params,
        eval_every_steps=doc["eval_every_steps"],
        final_evals=final_evals,
        pruner=_counts("pruner", doc.get("pruner") or {}, PRUNER_KEYS),
        sampler=_counts("sampler", doc.get("sampler") or {}, SAMPLER_KEYS),
        enqueue=_enqueue(doc.get("enqueue") or [], params),
    )


def _base_values(base: Any, envs: dict[str, float], policy: str) -> dict[str, dict[str, Any]]:
    """Each env's base preset: the file `base` names for all of them, else the env's own preset, else nothing
    (Config's defaults)."""
    if base is not None:
        base = str(base)
        if base.startswith("configs/") and not Path(base).is_file():  # a space written before the presets moved
            base = base[len("configs/") :]  # into the package named them by their path in the repository
        try:
            values = load_yaml_defaults(config_file(base))
        except ValueError as e:
            raise ConfigError(f"base={e}") from None
        return {env_id: values for env_id in envs}
    try:
        own = {env_id: find_preset(env_id, policy) for env_id in envs}
    except ValueError as e:  # two presets claim one env
        raise ConfigError(str(e)) from None
    return {env_id: load_yaml_defaults(path) if path else {} for env_id, path in own.items()}


def _envs(envs: Any, check_env: bool, env_kwargs: dict[str, Any]) -> dict[str, float]:
    if not isinstance(envs, dict) or not envs:
        raise ConfigError("envs: must map one or more env ids to their target score (e.g. HalfCheetah-v5: 3000)")
    for env_id, target in envs.items():
        if not (_number(target) and target > 0):
            raise ConfigError(f"envs.{env_id}={target!r}: the target score must be a number > 0")
        problem = env_problem(str(env_id), resolve_env_kwargs(env_kwargs)) if check_env else None
        if problem is not None:
            raise ConfigError(f"env_id={str(env_id)!r}: {problem}")
    return {str(k): float(v) for k, v in envs.items()}


def _tunable(where: str, name: Any) -> str:
    if name in NOT_TUNABLE:
        raise ConfigError(f"{where}.{name}: not settable here ({NOT_TUNABLE[name]})")
    if name not in field_names():
        allowed = ", ".join(n for n in field_names() if n not in NOT_TUNABLE)
        raise ConfigError(f"{where}.{name}: not a Config field (allowed: {allowed})")
    return name


def _fixed(fixed: Any) -> dict[str, Any]:
    if not isinstance(fixed, dict):
        raise ConfigError("fixed: must map Config fields to values")
    out = {}
    for name, value in fixed.items():
        _tunable("fixed", name)
        config_from_dict({name: value})  # the field's type
        out[name] = value
    return out


def _counts(where: str, values: Any, keys: tuple[str, ...]) -> dict[str, int]:
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: must be a mapping with keys {', '.join(keys)}")
    for key, value in values.items():
        if key not in keys:
            raise ConfigError(f"{where}.{key}: unknown (allowed: {', '.join(keys)})")
        if not (_number(value, integer=True) and value >= (1 if key == "interval_steps" else 0)):
            raise ConfigError(f"{where}.{key}={value!r}: must be an integer >= {1 if key == 'interval_steps' else 0}")
    return dict(values)


def _dist(name: Any, spec: Any, starts: list[dict[str, Any]], fixed: dict[str, Any]) -> Dist:
    where = f"params.{_tunable('params', name)}"
    if name == "env_kwargs":  # optuna's categorical choices are plain values
        raise ConfigError(f"{where}: not searched; set it in fixed (the same options for every trial)")
    if name in fixed:
        raise ConfigError(f"{where}: also in fixed; a field is either fixed or searched")
    if not isinstance(spec, dict) or spec.get("type") not in DIST_KEYS:
        raise ConfigError(
            f"{where}.type={spec.get('type') if isinstance(spec, dict) else spec!r}: must be one of "
            f"{', '.join(DIST_KEYS)} (e.g. {{type: float, low: 1.0e-4, high: 1.0e-3, log: true}})"
        )
    kind = spec["type"]
    for key in spec:
        if key != "type" and key not in DIST_KEYS[kind]:
            allowed = ", ".join(DIST_KEYS[kind])
            raise ConfigError(f"{where}.{key}: not a key of a {kind} distribution (allowed: {allowed})")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}.choices: must be a non-empty list of values")
        for choice in choices:
            _check_value(where, name, choice, starts)
        return Dist(name, kind, choices=tuple(choices))
    return _range(where, name, kind, spec, starts)


def _range(where: str, name: str, kind: str, spec: dict[str, Any], starts: list[dict[str, Any]]) -> Dist:
    field = _field_kind(name)
    if field is object or (kind == "float" and field is int):
        allowed = "categorical" if field is object else "int or categorical"
        raise ConfigError(f"{where}.type={kind!r}: field {name} takes {allowed} distributions")
    integer = kind == "int"
    low, high, log, step = spec.get("low"), spec.get("high"), spec.get("log", False), spec.get("step")
    if not (_number(low, integer) and _number(high, integer) and low <= high and (integer or low < high)):
        order = "<=" if integer else "<"
        hint = f"; {YAML_EXPONENT_HINT}" if isinstance(low, str) or isinstance(high, str) else ""
        raise ConfigError(f"{where}: low={low!r}, high={high!r}: must be {kind}s with low {order} high{hint}")
    if not isinstance(log, bool) or (log and not low > 0):
        raise ConfigError(f"{where}.log={log!r}: must be true or false; true needs low > 0")
    if step is not None and not (_number(step, integer) and step > 0 and not log):
        raise ConfigError(f"{where}.step={step!r}: must be a {kind} > 0, and not with log: true")
    for value in (low, high):
        _check_value(where, name, value, starts)
    return Dist(name, kind, low=low, high=high, log=log, step=step)


def _check_value(where: str, name: str, value: Any, starts: list[dict[str, Any]]) -> None:
    """A value must fit the field's type and be valid with each env's base preset and the fixed values. A value that
    fails only because of another field (a round that does not split into the mini-batches) is left to its trial,
    which fails: another searched field may make it valid."""
    for start in starts:
        try:
            cfg = config_from_dict({**start, name: value, "eval_interval": 1})
            validate(cfg, check_env=False)
        except ConfigError as e:
            if str(e).startswith(f"{name}="):
                raise ConfigError(f"{where}: {e}") from None


def _enqueue(entries: Any, params: tuple[Dist, ...]) -> tuple[dict[str, Any], ...]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError("enqueue: must be a list of mappings of searched fields to values")
    dists = {d.name: d for d in params}
    for i, entry in enumerate(entries):
        for name, value in entry.items():
            dist = dists.get(name)
            if dist is None:
                raise ConfigError(f"enqueue[{i}].{name}: not a searched field (searched: {', '.join(dists)})")
            inside = (
                value in dist.choices
                if dist.kind == "categorical"
                else _number(value, dist.kind == "int") and dist.low <= value <= dist.high
            )
            if not inside:
                allowed = dist.choices if dist.kind == "categorical" else f"[{dist.low}, {dist.high}]"
                raise ConfigError(f"enqueue[{i}].{name}={value!r}: outside its distribution ({allowed})")
    return tuple(entries)


def normalised(episode_return: float, target: float) -> float:
    """An env's return on the study's common scale: 1.0 is the env's target score."""
    return episode_return / target
