"""How tyro shows Config's flags: help that reads as prose, and a rejected flag as the project's one-line error.

The field docstrings of Config are the help of its flags. Their source lines break at the line-length limit, and
tyro keeps those breaks (it joins a docstring's lines only where one starts with a letter, and the attribute
docstrings it reads keep their indentation), which cut `--help`'s sentences mid-way. `use_docstrings_as_help`
hands tyro each docstring reflowed into paragraphs, as the field's metadata "help" (tyro's first source of a
flag's help), so that the terminal's width wraps them.

tyro draws a box around the input it rejects. `check_choices` checks the values of the Literal fields before tyro
sees them, and `tyro_errors_as` turns tyro's other rejections into the same kind of line through tyro's
parse-error hook (private: `tyro._errors.on_parse_error`; a tyro without it still draws its box), each raised as
parse_config's ConfigError: "name=value: what is allowed", one line, exit status 2.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import functools
import inspect
import json
import re
import textwrap
import types
import typing
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Optional

import tyro
import tyro.constructors

from ppo_ddp.configuration.presets import occurrences

KINDS = {int: "an integer", float: "a number", str: "a string"}
"""What a flag of each plain type takes, for the line of a value tyro could not convert."""
JSON_EXAMPLE = "'{\"frame_skip\": 5}'"
"""A mapping flag's value as the shell gives it: one JSON object in quotes."""


def _json_object(args: list[str]) -> dict[str, Any]:
    value = json.loads(args[0])
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but {type(value).__name__}")
    return value


JSON_OBJECT = tyro.constructors.PrimitiveConstructorSpec(
    nargs=1,
    metavar="JSON",
    instance_from_str=_json_object,
    is_instance=lambda value: isinstance(value, dict),
    str_from_instance=lambda value: [json.dumps(value)],
)
"""How tyro reads a mapping field (env_kwargs): one JSON object, where tyro's own dict flag would take alternating
keys and values and read every value as the dict's one value type."""


def prose(doc: str) -> str:
    """A docstring as paragraphs of one line each: its line breaks and indentation become single spaces; a blank
    line still separates paragraphs."""
    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(doc))
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


@functools.cache
def use_docstrings_as_help(cls: type) -> None:
    """Give tyro the attribute docstrings of the dataclass cls as prose: each as its field's metadata "help"."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {
        stmt.target.id: doc.value.value
        for stmt, doc in zip(body, body[1:])
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
        if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
    }
    for field in dataclasses.fields(cls):
        if field.name in docs:
            field.metadata = types.MappingProxyType({**field.metadata, "help": prose(docs[field.name])})


def said(name: str, value: Any, allowed: str) -> str:
    """The one wording of a bad value, here and in config.py's checks: name=value: what is allowed."""
    return f"{name}={value!r}: {allowed}"


def check_choices(cls: type, argv: Sequence[str], error: type[Exception]) -> None:
    """Raise error for the first value given to a Literal field of cls that is not one of its choices."""
    for name, hint in typing.get_type_hints(cls).items():
        choices = typing.get_args(hint) if typing.get_origin(hint) is Literal else None
        for values in occurrences(argv, name) if choices else []:
            if values and values[0] not in choices:  # no value at all: tyro says so
                raise error(said(name, values[0], f"must be one of {', '.join(map(str, choices))}"))


def expected(hint: Any) -> str:
    """What a field of this type takes on the command line: "an integer", "a number or None", ..."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(expected(a) for a in args)
    if typing.get_origin(hint) is Literal:
        return " or ".join(map(str, args))
    if hint is type(None):
        return "None"
    if typing.get_origin(hint) is tuple:
        return f"one or more {'integers' if args[0] is int else 'strings'}"
    if typing.get_origin(hint) is dict:
        return f"a JSON object, e.g. {JSON_EXAMPLE}"
    return KINDS.get(hint, "a valid value")


def rejection(event: Any, cls: type, argv: Sequence[str]) -> Optional[str]:
    """The one line for an event of tyro's parse-error hook, or None to leave it to tyro."""
    kind, hints = type(event).__name__, typing.get_type_hints(cls)
    if kind == "UnrecognizedArgs":
        dashed = {n: n.replace("_", "-") for n in hints}
        flags = [f"--{d}" for d in dashed.values()] + [f"--no-{d}" for n, d in dashed.items() if hints[n] is bool]
        close = [m for t in event.tokens if t.startswith("--") for m in difflib.get_close_matches(t, flags, 1, 0.75)]
        return f"unrecognized arguments: {' '.join(event.tokens)}" + (f"; did you mean {close[0]}?" if close else "")
    argument = getattr(event, "argument", None)
    name = getattr(getattr(argument, "field", None), "intern_name", None)
    if name not in hints:
        return None
    if kind == "InvalidChoice":
        return said(name, event.value, f"must be one of {', '.join(event.choices)}")
    if kind == "BadValue" and event.reason == "too_few_values":
        return f"{name}: --{name.replace('_', '-')} needs a value"
    if kind == "InstantiationFailure":
        values = (occurrences(argv, name) or [[]])[-1]  # tyro keeps the last
        value = values if typing.get_origin(hints[name]) is tuple or len(values) != 1 else values[0]
        reason = f" ({event.message})" if typing.get_origin(hints[name]) is dict else ""  # where the JSON breaks
        return said(name, value, f"must be {expected(hints[name])}{reason}")
    return None


def parse_flags(cls: type, argv: Sequence[str], default: Any, prog: str, error: type[Exception]) -> Any:
    """tyro.cli of the dataclass cls over default: its docstrings as prose help, the input it rejects raised as
    error with a one-line message (where the installed tyro lets it be; else tyro's box, exit status 2)."""
    use_docstrings_as_help(cls)
    check_choices(cls, argv, error)
    with tyro_errors_as(error, cls, argv):
        return tyro.cli(cls, args=list(argv), default=default, prog=prog, description=prose(cls.__doc__ or ""))


@contextlib.contextmanager
def tyro_errors_as(error: type[Exception], cls: type, argv: Sequence[str]) -> Iterator[None]:
    """Within: what tyro rejects in argv is raised as error (one line) instead of tyro's box."""
    try:
        from tyro._errors import on_parse_error  # private and experimental (tyro 1.0.17 has it)
    except ImportError:  # a tyro without the hook: its own box, exit status 2
        yield
        return

    def reject(event: Any) -> None:
        message = rejection(event, cls, argv)
        if message is not None:
            raise error(message)

    with on_parse_error(reject):
        yield
