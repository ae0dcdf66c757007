"""The code's shape targets (docs/design.md, "Folders"): small modules, functions that fit a screen, imports that
go one way."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ppo_ddp"

LAYERS = [
    "programs",  # train, evaluate, export, tune, plot: the package's root modules a user runs
    "search",
    "runner",
    "records",
    "evaluation",
    "distributed",
    "sampling",
    "algorithm",
    "storage",
    "models",
    "configuration",
    "envs",
    "errors",  # the root module errors.py: the exceptions several layers raise
]
"""The package's folders, top to bottom: a module imports only from folders below its own (type-checking imports
and imports inside functions included), and within a folder the modules import each other without a circle."""
PROGRAMS = {"train", "evaluate", "export", "tune", "plot"}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


def layer(path: Path) -> str:
    """A module's layer: its folder, or for a root module "programs" or "errors"."""
    parts = path.relative_to(PACKAGE).parts
    if len(parts) == 1:
        return "errors" if path.stem == "errors" else "programs"
    return parts[0]


def dotted(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def imported(path: Path) -> set[str]:
    """Every package module `path` imports, wherever the import stands (a function, `if TYPE_CHECKING:`), as dotted
    names under ppo_ddp ("runner.trainer", "errors")."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ppo_ddp":
            base = node.module.split(".")[1:]
            for alias in node.names:
                candidate = ".".join([*base, alias.name])  # `from ppo_ddp.runner import trainer`
                found.add(candidate if (PACKAGE / (candidate.replace(".", "/") + ".py")).exists() else ".".join(base))
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("ppo_ddp.")}
    return {name for name in found if name and (PACKAGE / (name.replace(".", "/") + ".py")).exists()}


def test_every_module_has_its_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"programs", "errors"}
    roots = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert roots == PROGRAMS | {"errors"}


def test_folders_import_only_folders_below():
    for path in modules():
        below = set(LAYERS[LAYERS.index(layer(path)) + 1 :])
        for name in imported(path):
            target = layer(PACKAGE / (name.replace(".", "/") + ".py"))
            assert target in below or target == layer(path) != "programs", (
                f"{dotted(path)} imports {name}, which is not below {layer(path)}"
            )


def test_no_import_circle_between_modules():
    graph = {dotted(p): imported(p) for p in modules()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        assert name not in path, f"import circle: {' -> '.join([*path[path.index(name) :], name])}"
        if name in done:
            return
        for other in sorted(graph.get(name, ())):
            visit(other, [*path, name])
        done.add(name)

    for name in graph:
        visit(name, [])


def test_modules_are_under_400_lines_and_functions_under_80():
    for path in modules():
        text = path.read_text()
        assert len(text.splitlines()) < 400, f"{dotted(path)}: {len(text.splitlines())} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 80, f"{dotted(path)}: {node.name} is {length} lines"
