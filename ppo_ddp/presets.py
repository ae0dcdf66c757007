"""Which YAML file sets a run's defaults: `--config FILE`, else the preset of the env the flags name.

A preset is a YAML file directly in configs/: the tuned 1M-step settings of one env (and policy), whose
results are in docs/benchmarks/returns.md. `python train.py --env-id Hopper-v5` trains on configs/hopper.yaml as
if `--config configs/hopper.yaml` had been given: flags still override its values, and `--config FILE` replaces
it. `python train.py` alone trains Config's env, HalfCheetah-v5, on its preset. An env without a preset trains
on Config's defaults (tuned on HalfCheetah-v5), and the start line says so. The large-batch presets of
configs/scale/ and the search spaces of configs/tune/ are only ever read through --config.

A preset is found by its own `env_id` and `policy` keys (policy "mlp" when absent), so a new preset needs no
registration: drop the file in configs/. With `--policy gru` the env's GRU preset is used, else its MLP one.
Nothing here imports torch or Config: parse_config calls it before anything else is read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"
"""The repository's configs/ (next to the package: a checkout, or `pip install -e .` of one)."""


def presets(directory: Path = PRESET_DIR) -> dict[tuple[str, str], Path]:
    """(env_id, policy) -> preset file, for every YAML file directly in `directory`.

    ValueError when a file is not a YAML mapping with an env_id, or when two files claim the same env and policy:
    which one `--env-id` picks must never depend on the order a directory lists its files in."""
    import yaml

    found: dict[tuple[str, str], Path] = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"preset {shown(path)}: not a readable YAML file ({str(e).splitlines()[0]})") from None
        if not isinstance(raw, dict) or not raw.get("env_id"):
            raise ValueError(f"preset {shown(path)}: must be a YAML mapping that names its env_id")
        key = (str(raw["env_id"]), str(raw.get("policy", "mlp")))
        if key in found:
            both = f"presets {shown(found[key])} and {shown(path)}"
            raise ValueError(f"{both} are both for env {key[0]}, policy {key[1]}")
        found[key] = path
    return found


def find_preset(env_id: str, policy: str = "mlp", directory: Path = PRESET_DIR) -> Optional[Path]:
    """The preset of env_id for this policy, else the env's MLP preset, else None."""
    found = presets(directory)
    return found.get((env_id, policy)) or found.get((env_id, "mlp"))


def split_config_flag(argv: Sequence[str]) -> tuple[Optional[str], list[str]]:
    """`--config FILE` / `--config=FILE` out of argv (it must be read before tyro sees the rest). ValueError when
    the flag has no value."""
    rest: list[str] = []
    path = None
    it = iter(argv)
    for arg in it:
        if arg == "--config":
            path = next(it, None)
            if path is None:
                raise ValueError("config: --config needs the path of a YAML file")
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return path, rest


def implied_preset(argv: Sequence[str], default_env_id: str) -> Optional[str]:
    """The preset (its path as shown to the user) of the env and policy that argv's flags name, without --config."""
    env_id = flag_value(argv, "env-id") or default_env_id
    path = find_preset(env_id, flag_value(argv, "policy") or "mlp")
    return None if path is None else shown(path)


def flag_value(argv: Sequence[str], name: str) -> Optional[str]:
    """The last value of `--name V` / `--name=V` in argv (tyro also reads name's underscore spelling); None if
    absent. The last one, because that is the one tyro keeps."""
    spellings = {f"--{name}", f"--{name.replace('-', '_')}"}
    value = None
    for i, arg in enumerate(argv):
        flag, eq, inline = arg.partition("=")
        if flag in spellings:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def describe(env_id: str, policy: str, config: Optional[str]) -> str:
    """Where a run's hyperparameters came from, for its start line: the env's preset, another config file, or
    Config's defaults."""
    if config is None:
        return f"no preset for {env_id} in configs/, so Config's defaults (tuned on HalfCheetah-v5)"
    preset = find_preset(env_id, policy)
    is_preset = preset is not None and preset.resolve() == Path(config).resolve()
    return f"{'preset' if is_preset else 'config'} {config}"


def shown(path: Path) -> str:
    """path relative to the working directory when it is below it (configs/hopper.yaml), else absolute."""
    relative = os.path.relpath(path.resolve())
    return str(path.resolve()) if relative.startswith("..") else relative
