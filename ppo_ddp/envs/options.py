"""An env's options (Config's env_kwargs): the keywords gym.make passes to the env class, checked before a run starts.

gymnasium's MuJoCo v5 robots take their options as keywords of the class: `xml_file` (another MJCF model),
`frame_skip`, the reward weights, the health ranges. What a class accepts is read from its `__init__` signature
(through the entry point of the env's registration; a partly observed id's from its base env's class), following
`**kwargs` up the base classes (a v5 robot's go to MujocoEnv: width, height, camera_name, ...). A value's type is
checked against the keyword's annotation, else its default's type. A relative `xml_file` is made absolute against
the directory the user ran from (`resolve_env_kwargs`, once, where the config is loaded), so the actor processes, a
later `python -m ppo_ddp.evaluate` run from elsewhere and an export all find the same file.
"""

from __future__ import annotations

import inspect
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import gymnasium as gym

from ppo_ddp.envs.partial import make_partly_observed

MAKE_OPTIONS = {"max_episode_steps": inspect.Parameter("max_episode_steps", inspect.Parameter.KEYWORD_ONLY, default=1)}
"""What gym.make itself takes besides the env class's keywords: the episode's step limit (its TimeLimit)."""
RESERVED = {"render_mode": "ppo_ddp sets it (rgb_array for videos, none for training)"}
"""Keywords the env takes that ppo_ddp sets itself, and why."""
GYMNASIUM_ASSETS = Path(gym.__file__).parent / "envs" / "mujoco" / "assets"
"""Where gymnasium's MuJoCo envs look up an `xml_file` that does not start with '.', '/' or '~'."""
_KINDS: dict[type, tuple[str, Callable[[Any], bool]]] = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
    dict: ("a mapping", lambda v: isinstance(v, dict)),
    type(None): ("null", lambda v: v is None),
}
"""The types a keyword's value is checked against: what it takes, in words, and the check."""


def plain(value: Any) -> Any:
    """value with its tuples as lists, throughout: one form for config.yaml, checkpoints and comparisons."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def is_plain(value: Any) -> bool:
    """Whether value is made of what YAML and JSON say alike: None, booleans, numbers, strings, lists (or tuples) of
    them, mappings with string keys."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def resolve_env_kwargs(env_kwargs: dict[str, Any], cwd: Optional[Path] = None) -> dict[str, Any]:
    """env_kwargs in plain form (`plain`), a relative `xml_file` made absolute against cwd (default: this process's
    working directory) where the file is there. A bare name that is not (`hopper.xml`) stays as it is: gymnasium
    looks it up among its own assets, and a missing file is validation's to report."""
    if not isinstance(env_kwargs, dict):  # validation's to refuse
        return env_kwargs
    resolved = plain(env_kwargs)
    xml = resolved.get("xml_file")
    if isinstance(xml, str) and xml and not os.path.isabs(os.path.expanduser(xml)):
        candidate = Path(cwd or Path.cwd()) / xml
        if candidate.exists():
            resolved["xml_file"] = os.path.abspath(candidate)
    return resolved


def relative_env_kwargs(env_kwargs: dict[str, Any], root: Path) -> dict[str, Any]:
    """The inverse of resolve_env_kwargs for a file that travels: an absolute xml_file under root becomes
    './<its path from root>', which resolves again from any copy of root (a policy file shipped in a repository)."""
    xml = env_kwargs.get("xml_file")
    if not isinstance(xml, str) or not os.path.isabs(xml):
        return env_kwargs
    try:
        inside = Path(xml).resolve().relative_to(Path(root).resolve())
    except ValueError:  # outside root: kept absolute
        return env_kwargs
    return {**env_kwargs, "xml_file": f"./{inside.as_posix()}"}


def _env_creator(registered_id: str) -> tuple[Any, dict[str, Any]]:
    """The callable gym.make calls for registered_id (a class or a function), and its registered kwargs."""
    spec = gym.spec(registered_id)
    creator = spec.entry_point
    if isinstance(creator, str):
        from gymnasium.envs.registration import load_env_creator

        creator = load_env_creator(creator)
    return creator, dict(spec.kwargs or {})


def _keywords(function: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool]:
    """A callable's keyword parameters with their annotations evaluated where they can be, and whether it also
    takes **kwargs."""
    signature = inspect.signature(function)
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # an annotation that does not evaluate here: its default's type is checked instead
        hints = {}
    named = {
        name: p.replace(annotation=hints.get(name, inspect.Parameter.empty))
        for name, p in signature.parameters.items()
        if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    return named, any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())


def accepted_options(registered_id: str) -> Optional[dict[str, inspect.Parameter]]:
    """The keywords gym.make(registered_id, ...) accepts, by name; None where they cannot be known (a creator that
    takes **kwargs and hands them to what cannot be read)."""
    creator, registered = _env_creator(registered_id)
    if creator is make_partly_observed:  # its kwargs go to the base env
        return accepted_options(registered["base_id"])
    owners = [k for k in creator.__mro__ if "__init__" in vars(k)] if isinstance(creator, type) else [creator]
    options: dict[str, inspect.Parameter] = {}
    for depth, owner in enumerate(owners):
        named, more = _keywords(owner.__init__ if isinstance(owner, type) else owner)
        for name, p in named.items():
            # a base class's keyword without a default is one the subclass passes itself (MujocoEnv's model_path)
            if name not in options and (depth == 0 or p.default is not p.empty):
                options[name] = p
        if not more:
            return {**options, **MAKE_OPTIONS}
    return None


def _allowed_kinds(p: inspect.Parameter) -> Optional[list[type]]:
    """The types a keyword takes (from its annotation, else its default's), or None where not checkable."""
    hint = p.annotation
    if hint is p.empty:
        if p.default is p.empty or p.default is None:
            return None
        hint = type(p.default)
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = [typing.get_origin(m) or m for m in members]
    kinds = [list if k is tuple else k for k in kinds]
    return kinds if all(k in _KINDS or k is list for k in kinds) else None


def type_problem(name: str, value: Any, p: inspect.Parameter) -> Optional[str]:
    """Why value does not fit keyword p (named name), or None: the types of its annotation or default; a tuple of
    numbers (a range) as a list of as many numbers."""
    kinds = _allowed_kinds(p)
    if kinds is None:
        return None
    wanted = []
    for kind in kinds:
        if kind is list:
            default = p.default if isinstance(p.default, (tuple, list)) else None
            size = f"{len(default)} " if default is not None else ""
            numbers = default is not None and all(_KINDS[float][1](v) for v in default)
            wanted.append(f"a list of {size}{'numbers' if numbers else 'values'}")
            if isinstance(value, (list, tuple)) and (default is None or len(value) == len(default)):
                if not numbers or all(_KINDS[float][1](v) for v in value):
                    return None
        else:
            said, fits = _KINDS[kind]
            wanted.append(said)
            if fits(value):
                return None
    default = "" if p.default is p.empty else f" (its default: {plain(p.default)!r})"
    return f"{name}={value!r} must be {' or '.join(wanted)}{default}"


def xml_file_problem(xml_file: Any) -> Optional[str]:
    """Why a MuJoCo env cannot read this xml_file, where gymnasium's MujocoEnv looks for it, or None."""
    if not isinstance(xml_file, str):
        return None  # type_problem's
    if xml_file.startswith((".", "/", "~")):
        path = Path(os.path.expanduser(xml_file))
        where = str(path.resolve()) if not path.is_absolute() else str(path)
    else:  # not found beside the user (resolve_env_kwargs): gymnasium's own assets
        path = GYMNASIUM_ASSETS / xml_file
        where = f"neither {Path.cwd() / xml_file} nor among gymnasium's assets"
    return None if path.is_file() else f"xml_file={xml_file!r}: no such file ({where})"


def _is_mujoco(registered_id: str) -> bool:
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    creator, registered = _env_creator(registered_id)
    if creator is make_partly_observed:
        return _is_mujoco(registered["base_id"])
    return isinstance(creator, type) and issubclass(creator, MujocoEnv)


def options_problem(env_id: str, env_kwargs: dict[str, Any]) -> Optional[str]:
    """Why env_kwargs cannot be given to env_id, a registered id (its module, for `module:Env-v0`, imported): an
    option it does not take, a value of another type, a missing xml_file, one ppo_ddp sets itself; or None. The
    reason names the option and the env."""
    registered_id = env_id.split(":", 1)[-1]
    options = accepted_options(registered_id)
    for name, value in env_kwargs.items():
        if name in RESERVED:
            return f"{name} for {env_id}: {RESERVED[name]}"
        if options is None:
            continue
        if name not in options:
            allowed = ", ".join(n for n in options if n not in RESERVED)
            return f"{name} is not an option of {env_id} (its options: {allowed})"
        if problem := type_problem(name, value, options[name]):
            return f"{problem}, for {env_id}"
    if "xml_file" in env_kwargs and _is_mujoco(registered_id):
        if problem := xml_file_problem(env_kwargs["xml_file"]):
            return f"{problem}, for {env_id}"
    return None
