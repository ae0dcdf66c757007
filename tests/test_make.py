"""The two commands (Makefile): `make train` and `make test` set up .venv on first use, torch first and pinned, then
train or run what CI runs; a second call installs nothing; the README's quickstart and .ci/run name them."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="needs make")


def dry_run(target: str, venv: Path, *variables: str) -> list[str]:
    """The commands `make -n TARGET` would run with the venv at `venv` (absent: a fresh clone's first call)."""
    # Under `make test` the suite inherits make's variables: the inner make would then say which folder it enters.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    proc = subprocess.run(
        [MAKE, "--no-print-directory", "-n", target, f"VENV={venv}", *variables],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [line.strip() for line in proc.stdout.splitlines()]


def position(lines: list[str], pattern: str) -> int:
    """The index of the first line that matches the regular expression; fails naming it where none does."""
    found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    assert found, f"no command matches {pattern!r} in:\n" + "\n".join(lines)
    return found[0]


def test_make_train_builds_the_venv_torch_first_then_the_pins_then_trains(tmp_path):
    venv = tmp_path / "venv"
    lines = dry_run("train", venv, "TORCH_INDEX=https://example.org/whl/cpu", "ARGS=--env-id Hopper-v5 --seed 2")
    made = position(lines, rf"-m venv {venv}$")
    torch = position(lines, rf"^{venv}/bin/pip install torch==2\.13\.0 --extra-index-url https://example\.org/whl/cpu$")
    pins = position(lines, rf"^{venv}/bin/pip install -r requirements\.txt$")
    package = position(lines, rf"^{venv}/bin/pip install --no-deps -e \.$")
    train = position(lines, rf"^{venv}/bin/python train\.py --env-id Hopper-v5 --seed 2$")
    assert made < torch < pins < package < train == len(lines) - 1


def test_torch_comes_from_the_cpu_index_without_a_gpu_and_an_empty_index_means_pypi_s(tmp_path):
    lines = dry_run("train", tmp_path / "venv")
    torch = lines[position(lines, r"pip install torch==")]
    if platform.system() == "Linux" and shutil.which("nvidia-smi") is None:
        try:  # behind a mirror that name does not resolve, and pip's own configuration decides
            socket.getaddrinfo("download.pytorch.org", 443)
            cpu = " --extra-index-url https://download.pytorch.org/whl/cpu"
        except OSError:
            cpu = ""
        assert torch.endswith(f"pip install torch==2.13.0{cpu}")
    pypi = dry_run("train", tmp_path / "venv", "TORCH_INDEX=", "TORCH=torch==2.13.0")
    assert pypi[position(pypi, r"pip install torch==")].endswith("pip install torch==2.13.0")


def test_a_second_call_installs_nothing(tmp_path):
    venv, dmc = tmp_path / "venv", tmp_path / "dmc-site"
    (venv / "bin").mkdir(parents=True)
    dmc.mkdir()
    for stamp in (venv / ".train", venv / ".test", dmc / ".installed"):  # the first call's, newer than the pins
        stamp.touch()
    assert dry_run("train", venv) == [f"{venv}/bin/python train.py"]
    again = dry_run("test", venv, f"DMC_SITE={dmc}")
    assert len(again) == 5 and not any("pip" in line for line in again), again  # lint, format, compile, suite, dmc
    old = os.path.getmtime(ROOT / "requirements.txt") - 10
    os.utime(venv / ".train", (old, old))  # a pin changed since: the set is installed again
    assert any(line.endswith("pip install -r requirements.txt") for line in dry_run("train", venv))


def test_make_test_runs_lint_format_the_suite_and_dm_control_s_tests(tmp_path):
    venv = tmp_path / "venv"
    lines = dry_run("test", venv)
    extras = position(lines, rf"^{venv}/bin/pip install -r requirements-extras\.txt ruff==[\d.]+ 'psycopg\[binary\]")
    assert position(lines, r"pip install -r requirements\.txt$") < extras
    lint = position(lines, rf"^{venv}/bin/ruff check \.$")
    fmt = position(lines, rf"^{venv}/bin/ruff format --check \.$")
    compiled = position(lines, rf"^{venv}/bin/python -m compileall -q ppo_ddp tests scripts")  # once, for every process
    suite = position(lines, rf"^tests/with_postgres\.sh {venv}/bin/python -m pytest -q tests --durations=30")
    dmc_site = position(lines, r'pip install --target \.dmc-site --no-deps --upgrade "mujoco==3\.17\.0" "dm-control==')
    dmc = position(lines, rf'^PYTHONPATH=".*/\.dmc-site" {venv}/bin/python -m pytest -q tests/test_dmc\.py')
    assert extras < lint < fmt < compiled < suite < dmc_site < dmc


def test_ci_and_the_readme_run_the_two_commands():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test"
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", quickstart, re.S).group(1)
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]
    assert commands[-2:] == ["make train", "make test"]
