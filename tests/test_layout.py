"""The code's shape targets (docs/design.md, "modules"): small modules, functions that fit a screen, imports that
go one way."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ppo_ddp"

LAYERS = [
    "train",
    "tune",
    "tune_report",
    "tune_trial",
    "tune_space",
    "launch",
    "export",
    "evaluate",
    "trainer",
    "statistics",
    "rounds",
    "debug",
    "checkpointer",
    "run_state",
    "agreement",
    "checkpoint",
    "run_log",
    "evaluator",
    "policy",
    "video",
    "actor_pool",
    "children",
    "actor_process",
    "actor",
    "distributed",
    "learner",
    "compiled",
    "ppo_step",
    "capacity",
    "buffers",
    "signals",
    "recurrent",
    "model",
    "normalization",
    "rollout",
    "configure",
    "config",
    "flags",
    "presets",
    "programs",
    "topology",
    "env_group",
    "env_state",
    "envs",
    "partial_envs",
]
"""Top to bottom: a module imports only modules below it (a type-checking-only import aside)."""


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.glob("*.py") if p.name != "__init__.py")


def test_every_module_has_its_layer():
    assert sorted(p.stem for p in modules()) == sorted(LAYERS)


def test_imports_go_one_way():
    for path in modules():
        tree = ast.parse(path.read_text())
        runtime = [node for node in tree.body if isinstance(node, ast.ImportFrom)]  # not under `if TYPE_CHECKING:`
        below = set(LAYERS[LAYERS.index(path.stem) + 1 :])
        for node in runtime:
            if node.module == "ppo_ddp":
                names = {alias.name for alias in node.names}
            elif node.module and node.module.startswith("ppo_ddp."):
                names = {node.module.split(".")[1]}
            else:
                continue
            assert names <= below, f"{path.name} imports {sorted(names - below)}, which are not below it"
        indented = set(re.findall(r"^\s+from ppo_ddp\.(\w+) import", path.read_text(), re.M))  # in a function or
        allowed = below | ({"trainer"} if path.stem == "debug" else set())  # `if TYPE_CHECKING:` (debug's type hint)
        assert indented <= allowed, f"{path.name} imports {sorted(indented - allowed)}, which are not below it"


def test_modules_are_under_400_lines_and_functions_under_80():
    for path in modules():
        text = path.read_text()
        assert len(text.splitlines()) < 400, f"{path.name}: {len(text.splitlines())} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 80, f"{path.name}: {node.name} is {length} lines"
