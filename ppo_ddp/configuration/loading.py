"""Where a run's Config comes from: a preset or a YAML file, then the command line's flags (`parse_config`, what
train.py calls) or Python's keyword fields (`load_config`, what the API calls).

`--config NAME|FILE.yaml`, or else the preset of the env the flags name (ppo_ddp/configs/hopper.yaml for `--env-id
Hopper-v5`, ppo_ddp/configuration/presets.py), supplies defaults; flags override them (ppo_ddp/configuration/flags.py:
tyro, with prose help); the result is validated (ppo_ddp/configuration/validation.py) before any process, env or
collective starts. A bad value is one line on stderr that names the field, the value and what is allowed, and exit
status 2.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Optional

from ppo_ddp.configuration.config import Config, coerce, field_names
from ppo_ddp.configuration.flags import parse_flags
from ppo_ddp.configuration.presets import config_file, flag_value, implied_preset, split_config_flag
from ppo_ddp.configuration.validation import validate
from ppo_ddp.envs.options import resolve_env_kwargs
from ppo_ddp.errors import ConfigError

SPLIT_FIELDS = ("num_actors", "actors_per_gpu", "num_envs", "envs_per_actor")
"""The fields that split a learner's round over actors: named over a file, they replace its numbers that they
contradict (file_defaults)."""


def read_yaml(path: str | Path, label: str) -> Any:
    """A YAML file's content; ConfigError starting with label when it is missing or not YAML."""
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{label}: no such file") from None
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{label}: not a readable YAML file ({str(e).splitlines()[0]})") from None


def load_yaml_defaults(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping of Config field names to values, checked against the fields' types."""
    path = Path(path)
    raw = read_yaml(path, f"config={str(path)!r}")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config={str(path)!r}: must be a YAML mapping of field names to values")
    hints = typing.get_type_hints(Config)
    known = set(field_names()) - {"config"}
    values = {}
    for key, value in raw.items():
        if key not in known:
            hint = f"; did you mean {key.replace('-', '_')!r}?" if str(key).replace("-", "_") in known else ""
            raise ConfigError(f"unknown key {key!r} in {path}{hint} (allowed: {', '.join(sorted(known))})")
        values[key] = coerce(key, hints[key], value)
    return values


def file_defaults(config: Optional[str], given: Collection[str] = ()) -> dict:
    """The defaults `--config CONFIG` sets: a preset's name or a YAML file (None: none). ConfigError when it is
    neither. `given`: the fields named over it, whose numbers of the split replace the file's that they contradict
    (uncontradicted)."""
    if config is None:
        return {}
    try:
        file = config_file(config)
    except ValueError as e:
        raise ConfigError(f"config={e}") from None
    return uncontradicted(load_yaml_defaults(file), given)


def uncontradicted(values: dict[str, Any], given: Collection[str]) -> dict[str, Any]:
    """A file's values less the numbers of its split that the fields `given` over it replace: a num_actors without
    actors_per_gpu replaces the count per learner, a num_envs the envs_per_actor, and both numbers of a split
    (actors and envs_per_actor) the num_envs."""
    drop = set()
    if "num_actors" in given and "actors_per_gpu" not in given:
        drop.add("actors_per_gpu")
    if "num_envs" in given and "envs_per_actor" not in given:
        drop.add("envs_per_actor")
    if "envs_per_actor" in given and {"num_actors", "actors_per_gpu"} & set(given) and "num_envs" not in given:
        drop.add("num_envs")
    return {k: v for k, v in values.items() if k not in drop}


def with_resolved_env_kwargs(cfg: Config) -> Config:
    """cfg with its env_kwargs resolved where it is loaded (envs.options.resolve_env_kwargs: a relative xml_file
    made absolute against this working directory, tuples as lists): the actors, a later evaluate from another
    directory and the export then read the same file, and config.yaml and checkpoints record where it is."""
    resolved = resolve_env_kwargs(cfg.env_kwargs)
    return cfg if resolved == cfg.env_kwargs else dataclasses.replace(cfg, env_kwargs=resolved)


def load_config(config: Optional[str] = None, **fields: Any) -> Config:
    """What `train.py [--config CONFIG] [--FIELD VALUE ...]` trains, for Python: the preset or YAML file `config`
    (without it, the preset of the env and policy that fields name, as --env-id picks it), the fields over it,
    validated. ConfigError (its message names the field) on bad input.

        load_config(env_id="Hopper-v5", seed=2)        # Hopper's preset, seed 2
        load_config("scale/humanoid", total_timesteps=20_000_000)
    """
    known = [name for name in field_names() if name != "config"]  # config is the first argument
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ConfigError(f"{unknown[0]}: not a Config field (allowed: {', '.join(known)})")
    config = config or implied_preset(fields.get("env_id", Config.env_id), fields.get("policy", "mlp"))
    values = file_defaults(config, fields)
    hints = typing.get_type_hints(Config)
    values.update({k: coerce(k, hints[k], v) for k, v in fields.items()})
    cfg = with_resolved_env_kwargs(Config(**values, config=config))
    validate(cfg)
    return cfg


def parse_config(argv: Optional[Sequence[str]] = None, check_env: bool = True) -> Config:
    """Config from flags over `--config FILE.yaml`, or over the preset of the env they name
    (ppo_ddp/configuration/presets.py); exits with status 2 and one line on bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = Path(sys.argv[0]).name or "train.py"
    try:
        try:
            path, rest = split_config_flag(argv)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        # no --config: the env's preset, if it has one
        path = path or implied_preset(flag_value(rest, "env-id") or Config.env_id, flag_value(rest, "policy") or "mlp")
        values = file_defaults(path, [name for name in SPLIT_FIELDS if flag_value(rest, name.replace("_", "-"))])
        default = Config(**values, config=path)
        cfg = parse_flags(Config, rest, default, prog, ConfigError)  # tyro: prose help, a rejection as one line
        if path:  # tyro no longer sees --config; keep where the defaults came from (the start line names it)
            cfg = dataclasses.replace(cfg, config=path)
        cfg = with_resolved_env_kwargs(cfg)
        validate(cfg, check_env=check_env)
    except ConfigError as e:
        if os.environ.get("LOCAL_RANK", "0") == "0":  # under torchrun every rank finds it: one line per node
            print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return cfg
