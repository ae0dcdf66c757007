"""Which YAML file sets a run's defaults: `--config NAME|FILE`, else the preset of the env the flags name.

The presets are package data, in ppo_ddp/configs/, so a wheel carries them as a checkout does. A preset is named by
its path there without `.yaml`: `hopper` (the tuned 1M-step settings of Hopper-v5, whose results are in
docs/benchmarks/returns.md), `scale/humanoid` (a 10M-step large-batch preset). `python train.py --env-id
Hopper-v5` trains on the preset `hopper` as if `--config hopper` had been given: flags still override its values,
and `--config NAME|FILE` replaces it. `python train.py` alone trains Config's env, HalfCheetah-v5, on its preset.
An env without a preset trains on Config's defaults (tuned on HalfCheetah-v5), and the start line says so. The
search spaces of ppo_ddp/configs/tune/ are read by `python -m ppo_ddp.tune --space NAME`.

An env's preset is found by its own `env_id` and `policy` keys (policy "mlp" when absent) among the files directly
in ppo_ddp/configs/, so a new preset needs no registration: drop the file there. With `--policy gru` the env's GRU
preset is used, else its MLP one. Nothing here imports torch or Config: parse_config calls it before anything
else is read.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

PRESET_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The presets, inside the package (package data of the wheel)."""
SPACE_DIR = PRESET_DIR / "tune"
"""The search spaces of `python -m ppo_ddp.tune --space NAME`."""
TRAINING_DIRS = (PRESET_DIR, PRESET_DIR / "scale")
"""Where the names `--config` takes live: the 1M presets, and the large-batch ones as scale/NAME."""


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


def preset_names() -> list[str]:
    """Every name `--config` takes: hopper, ..., scale/ant, scale/humanoid."""
    return sorted(name_of(p) for d in TRAINING_DIRS for p in d.glob("*.yaml"))


def name_of(path: Path) -> str:
    """A packaged file's name: its path under ppo_ddp/configs/ (or under tune/ for a search space) without .yaml."""
    path = path.resolve()
    base = SPACE_DIR if path.parent == SPACE_DIR else PRESET_DIR
    return path.relative_to(base).with_suffix("").as_posix()


def packaged_file(value: str, directory: Path, names: Sequence[str], what: str) -> Path:
    """A YAML file: `value` itself when it is a file, else the packaged one it names (`hopper`, `hopper.yaml`).
    ValueError naming what exists when it is neither."""
    if Path(value).is_file():
        return Path(value)
    name = value[: -len(".yaml")] if value.endswith(".yaml") else value
    if name in names:
        return directory / f"{name}.yaml"
    raise ValueError(f"{value!r}: no such file, nor a {what} of ppo_ddp (they are: {', '.join(names)})")


def config_file(value: str) -> Path:
    """The file of `--config VALUE`: a YAML file, or a preset's name (hopper, scale/humanoid)."""
    return packaged_file(value, PRESET_DIR, preset_names(), "preset")


def space_file(value: str) -> Path:
    """The file of `--space VALUE` (python -m ppo_ddp.tune): a YAML file, or a packaged search space's name."""
    return packaged_file(value, SPACE_DIR, sorted(p.stem for p in SPACE_DIR.glob("*.yaml")), "search space")


def split_config_flag(argv: Sequence[str]) -> tuple[Optional[str], list[str]]:
    """`--config NAME|FILE` / `--config=...` out of argv (it must be read before tyro sees the rest). ValueError
    when the flag has no value."""
    rest: list[str] = []
    path = None
    it = iter(argv)
    for arg in it:
        if arg == "--config":
            path = next(it, None)
            if path is None:
                raise ValueError("config: --config needs a preset's name or the path of a YAML file")
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return path, rest


def implied_preset(env_id: str, policy: str = "mlp") -> Optional[str]:
    """The name of the preset that trains env_id with this policy when no --config is given, or None."""
    path = find_preset(env_id, policy)
    return None if path is None else name_of(path)


def occurrences(argv: Sequence[str], name: str) -> list[list[str]]:
    """The values of each `--name V...` / `--name=V` in argv, in order; name in either spelling (env-id, env_id),
    as tyro reads both."""
    spellings = {f"--{name.replace('_', '-')}", f"--{name.replace('-', '_')}"}
    found = []
    for i, arg in enumerate(argv):
        flag, eq, inline = arg.partition("=")
        if flag in spellings:
            found.append([inline] if eq else list(itertools.takewhile(lambda a: not a.startswith("--"), argv[i + 1 :])))
    return found


def flag_value(argv: Sequence[str], name: str) -> Optional[str]:
    """The last value of `--name V` / `--name=V` in argv; None if absent or given no value. The last one, because
    that is the one tyro keeps."""
    found = occurrences(argv, name)
    return found[-1][0] if found and found[-1] else None


def describe(env_id: str, policy: str, config: Optional[str]) -> str:
    """Where a run's hyperparameters came from, for its start line: the env's preset, another config file, or
    Config's defaults."""
    if config is None:
        preset = find_preset(env_id, policy)
        if preset is not None:  # a Config made in Python, which does not read the env's preset
            return f"Config's defaults (tuned on HalfCheetah-v5), not the preset {name_of(preset)}"
        return f"no preset for {env_id} in ppo_ddp, so Config's defaults (tuned on HalfCheetah-v5)"
    path = config_file(config).resolve()
    packaged = path.parent in TRAINING_DIRS
    if packaged and path == find_preset(env_id, policy):
        return f"preset {name_of(path)}"
    return f"config {name_of(path) if packaged else config}"


def shown(path: Path) -> str:
    """path relative to the working directory when it is below it (ppo_ddp/configs/hopper.yaml), else absolute."""
    relative = os.path.relpath(path.resolve())
    return str(path.resolve()) if relative.startswith("..") else relative
