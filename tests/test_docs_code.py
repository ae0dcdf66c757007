"""The docs' code works as a reader copies it. The Python API's names import; every Python block of README.md and
docs/ runs to a finished run (shortened as a reader would, tests/doc_code.py) or says in its first line why it does
not; and every command a doc shows, in a block or inline, names programs, flags, presets, search spaces, envs and
files that exist: each program's `--help` runs, and a doc's flag must be in it (train's flags are Config's fields).
A flag renamed, a preset removed, a script moved: the doc that still names it fails here, not its reader."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from doc_code import (
    DOCS,
    NOT_RUN,
    ROOT,
    assert_finished_runs,
    blocks,
    code_spans,
    commands,
    program,
    python_blocks,
    shortened,
    train_calls,
)  # noqa: E501

import ppo_ddp
from ppo_ddp.configuration.config import field_names
from ppo_ddp.configuration.presets import find_preset, preset_names

PROGRAMS = ("train", "evaluate", "export", "tune", "plot")
ELSEWHERE = {
    "--signal": "Slurm's sbatch option, which examples/slurm/train.sbatch sets",
    "--no-such-flag": "reliability.md's example of a flag that does not exist",
    "--lag-objective": "removed; design.md and returns.md tell what commit 9c57d84 measured with it",
}
"""Flags a doc names that no program of ours has, and why it may."""
REPO_PATH = re.compile(
    r"(?<![\w./<-])((?:ppo_ddp|scripts|tests|docs|examples)/[\w./-]*\.(?:py|ya?ml|md|csv|png|sh|sbatch|txt))"
)


HELP = """
import json, os, runpy, sys
import gymnasium, torch  # imported by most of the programs: once, here, before the forks
results = {}
for name in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the program as `python -m ppo_ddp.NAME --help`, `python SCRIPT --help` or `torchrun --help`
        os.close(read)
        os.dup2(write, 1)
        os.dup2(write, 2)
        code = 1
        try:
            if name == "torchrun":
                sys.argv = ["torchrun", "--help"]
                runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
            elif "/" in name:
                sys.argv, sys.path[0] = [name, "--help"], os.path.dirname(os.path.abspath(name))
                runpy.run_path(name, run_name="__main__")
            else:
                sys.argv = [name, "--help"]
                runpy.run_module(f"ppo_ddp.{name}", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    results[name] = (os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), text)
print(json.dumps(results))
"""
"""Runs each program named in argv with --help, its output and status as JSON: each in a fork of this process, which
imported torch and gymnasium first, as a fresh interpreter would for the program (ppo_ddp's modules and the
scripts' are imported by each fork itself). torch's import, ~2.5 s of CPU, is paid once, not once a program."""


def help_flags(text: str, described: bool) -> set[str]:
    """The flags of a --help text: the option column of argparse's and of tyro's boxed help, and with `described`
    the flags its descriptions mention too (evaluate's --stochastic, an alias of --no-deterministic). Train's are
    the option column alone: Config's fields (test_train_help_lists_every_config_field)."""
    flags = set(re.findall(r"--[\w-]+", text)) if described else set()
    for line in text.splitlines():
        line = line.strip("│ ")
        if line.startswith("-"):
            flags |= set(re.findall(r"--[\w-]+", re.split(r"\s{2,}", line)[0]))
    return flags


def doc_commands(doc: Path, text: str) -> list[list[str]]:
    """The commands of a doc's shell blocks (bash, or unmarked) and inline code."""
    code = [b.text for b in blocks(doc, text) if b.lang in ("bash", "sh", "")] + code_spans(text)
    return [c for snippet in code for c in commands(snippet)]


@pytest.fixture(scope="module")
def flags() -> dict[str, set[str] | None]:
    """Each program the docs run, our four, their scripts and torchrun, with the flags its --help lists (the
    --help of each one run by HELP); None for a script that does not exist."""
    scripts = {
        name for doc in DOCS for c in doc_commands(doc, doc.read_text()) if (name := program(c)[0]) and "/" in name
    }
    names = [*PROGRAMS, "torchrun", *sorted(s for s in scripts if (ROOT / s).is_file())]
    env = {**os.environ, "COLUMNS": "250", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", HELP, *names], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found: dict[str, set[str] | None] = dict.fromkeys(scripts)
    for name, (code, out) in json.loads(proc.stdout).items():
        assert code == 0, f"{name} --help: exit {code}\n{out[-2000:]}"
        found[name] = help_flags(out, described=name != "train")
    assert set(names) <= set(found)
    return found


def placeholder(value: str) -> bool:
    """CONFIG, <run>, NAME|FILE, $VAR, ...: a value the reader fills in."""
    return bool(re.search(r"[<>|$*{}\[\]]|\.\.\.", value)) or value.isupper()


def value_problem(program_name: str, flag: str, value: str) -> str | None:
    """What is wrong with a preset, search space or env that a doc passes to a flag; None if nothing."""
    if placeholder(value) or (value.endswith(".yaml") and not value.startswith("ppo_ddp/")):  # the reader's file
        return None
    if value.endswith(".yaml"):
        return None if placeholder(Path(value).stem) or (ROOT / value).is_file() else f"{value} does not exist"
    if (program_name, flag) == ("train", "--config") and value not in preset_names():
        return f"no preset {value!r}"
    if (program_name, flag) == ("tune", "--space") and not (ROOT / "ppo_ddp/configs/tune" / f"{value}.yaml").is_file():
        return f"no search space {value!r}"
    if flag == "--env-id" and ":" not in value and not value.startswith("dm_control/"):  # module:Id, shimmy's
        try:
            gym.spec(value)
        except gym.error.Error:
            return f"no env {value!r}"
    if (program_name, flag) == ("scripts/benchmark_returns.py", "--envs"):
        stems = {name.rpartition("/")[2] for name in preset_names()}
        return None if value in stems or find_preset(value) else f"no preset {value!r}"
    return None


def args_problems(name: str, args: list[str], flags: dict) -> list[str]:
    """The flags a command gives program `name` that it lacks, and their values that name nothing."""
    problems = []
    for i, word in enumerate(args):
        if not word.startswith("--"):
            continue
        flag, eq, inline = word.partition("=")
        values = [inline] if eq else [v for v in _until_next_flag(args[i + 1 :])]
        if flag not in flags[name]:
            problems.append(f"{name} has no flag {flag}")
        elif flag == "--train-args":
            problems += [f"--train-args: {p}" for v in values for p in args_problems("train", shlex.split(v), flags)]
        else:
            problems += [p for v in values if (p := value_problem(name, flag, v))]
    return problems


def _until_next_flag(words: list[str]) -> list[str]:
    taken = []
    for word in words:
        if word.startswith("-"):
            break
        taken.append(word)
    return taken


def doc_problems(doc: Path, text: str, flags: dict) -> list[str]:
    """Everything in a doc's code that names what does not exist: programs, flags, their values, repository files."""
    label = doc.relative_to(ROOT)
    known = set().union(*(f for f in flags.values() if f)) | set(ELSEWHERE)
    problems = []
    for command in doc_commands(doc, text):
        name, args = program(command)
        shown = f"{label}: `{shlex.join(command)}`"
        if name is None:
            if command[0].startswith("--") and command[0].partition("=")[0] not in known:  # a flag on its own
                problems.append(f"{shown}: no program has the flag {command[0].partition('=')[0]}")
        elif flags.get(name) is None:
            problems.append(f"{shown}: no program {name}")
        else:
            problems += [f"{shown}: {p}" for p in args_problems(name, args, flags)]
    for path in sorted(set(REPO_PATH.findall(text))):
        if not (ROOT / path).exists() and not placeholder(Path(path).stem):
            problems.append(f"{label}: {path} does not exist")
    return problems


def test_every_doc_names_programs_flags_presets_and_files_that_exist(flags):
    problems = [p for doc in DOCS for p in doc_problems(doc, doc.read_text(), flags)]
    assert not problems, "\n".join(problems)


def test_a_doc_that_names_a_renamed_flag_or_a_missing_preset_fails(flags):
    doc = ROOT / "docs" / "usage.md"
    usage = doc.read_text()
    assert not doc_problems(doc, usage, flags)
    for old, new, said in [
        ("--eval-interval 10", "--eval-every 10", "train has no flag --eval-every"),  # a flag renamed
        ("`--rnn-hidden-size`", "`--rnn-size`", "no program has the flag --rnn-size"),
        ("--config scale/humanoid", "--config scale/humanoid_xl", "no preset 'scale/humanoid_xl'"),
        ("--space halfcheetah", "--space cheetah", "no search space 'cheetah'"),
        ("--env-id Ant-v5", "--env-id Ant-v9", "no env 'Ant-v9'"),
        ("examples/play_exported.py", "examples/play_onnx.py", "no program examples/play_onnx.py"),
        ("--episodes 10", "--num-episodes 10", "evaluate has no flag --num-episodes"),
    ]:
        assert old in usage, old
        problems = doc_problems(doc, usage.replace(old, new), flags)
        assert any(said in p for p in problems), (old, new, problems)


def test_train_help_lists_every_config_field(flags):
    fields = {f"--{name.replace('_', '-')}" for name in field_names()}
    assert fields <= flags["train"] and flags["train"] - fields <= {"--help", "--config"} | {
        f"--no-{f[2:]}" for f in fields
    }


def test_the_api_names_come_from_one_table():
    assert set(ppo_ddp._API) == set(ppo_ddp.__all__)
    for name, module in ppo_ddp._API.items():
        assert getattr(ppo_ddp, name).__module__ == module, name
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        ppo_ddp.Trainer  # noqa: B018 (a class of the package, not a name of the API)


def test_the_api_imports_from_an_empty_directory_without_torch_until_used(tmp_path):
    script = (
        "import sys, ppo_ddp; assert 'torch' not in sys.modules, 'import ppo_ddp loaded torch'\n"
        "from ppo_ddp import Config, load_config, train\n"
        "print(load_config('hopper').env_id, Config().env_id, train.__name__)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == ["Hopper-v5", "HalfCheetah-v5", "train"], proc.stderr


def test_python_blocks_that_do_not_run_say_why():
    assert [b.doc.name for b in python_blocks()].count("README.md") == 1  # the one the wheel's test runs
    for block in python_blocks():
        first = block.text.splitlines()[0]
        if first.startswith(NOT_RUN):
            assert len(first.removeprefix(NOT_RUN).strip()) > 20, f"{block}: a reason, please"


RUNNABLE = [b for b in python_blocks() if not b.text.startswith(NOT_RUN) and b.doc.name != "README.md"]
"""The blocks this module runs: README.md's is run by tests/test_package.py, from the installed wheel."""


@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_python_block_runs(block, tmp_path):
    """The block, shortened (SHORT_RUN), run as a reader's script from an empty directory: every train() in it
    finishes its run there."""
    (tmp_path / "block.py").write_text(shortened(block.text))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "block.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"{block}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert_finished_runs(tmp_path / "runs", len(train_calls(ast.parse(block.text))))
