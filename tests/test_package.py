"""A newcomer with only the wheel: build it, install it into a fresh venv, and from an empty directory outside the
checkout train Hopper-v5 on its preset, evaluate and export the checkpoint, run a one-trial search, and run the
README's Python example (`from ppo_ddp import Config, load_config, train`) to a finished run. Nothing may come from
the checkout. And the pins of requirements.txt against pyproject's ranges."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
import yaml
from doc_code import assert_finished_runs, python_blocks, shortened
from packaging.requirements import Requirement

import ppo_ddp
from ppo_ddp.configuration.presets import preset_names
from ppo_ddp.envs.make import DM_CONTROL_INSTALL

ROOT = Path(__file__).resolve().parent.parent
TINY = "--total-timesteps 1536 --rollout-length 256 --num-minibatches 8 --update-epochs 1 --eval-interval 0".split()
"""Hopper's preset (2 actors x 1 env) with rounds of 512 steps: the seeding round and two trained ones."""
SCRIPTS = ("ppo-ddp-train", "ppo-ddp-evaluate", "ppo-ddp-export", "ppo-ddp-tune", "ppo-ddp-plot")
WHERE_FROM = """
if __name__ == "__main__":
    import sys
    print("checkpoint", checkpoint)
    api = ("ppo_ddp", "ppo_ddp.configuration.loading", "ppo_ddp.runner.launch")
    print("modules", *(sys.modules[m].__file__ for m in api))
"""
"""Appended to the README's Python block: the checkpoint it got, and where the API's modules came from."""
SPACE = {
    "base": "hopper",  # a preset's name: the wheel's package data
    "envs": {"Hopper-v5": 1000},
    "fixed": {
        "total_timesteps": 1536,
        "rollout_length": 256,
        "num_minibatches": 8,
        "update_epochs": 1,
        "eval_episodes": 1,
        "compile": False,
    },  # fmt: skip
    "eval_every_steps": 512,
    "params": {"learning_rate": {"type": "float", "low": 1.0e-4, "high": 1.0e-3, "log": True}},
}


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(the wheel, the fresh venv's bin folder, the environment to run it in)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the tracked files, as a clean clone would be, so the checkout gets no build/ folder.
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in tracked.splitlines():
        if (ROOT / name).is_file() and not name.startswith(("docs/", "runs/")):
            (tmp / "src" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tmp / "src" / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    build = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", tmp / "src"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (tmp / "dist").glob("ppo_ddp-*.whl")
    venv.create(tmp / "venv")  # no pip of its own: this one installs into it (--python)
    python = tmp / "venv" / "bin" / "python"
    # --no-deps: the dependencies (torch, gymnasium, ...) are this interpreter's, reached through a .pth line below,
    # so the test downloads nothing. That folder holds no ppo_ddp (the checkout's is an editable install, a finder
    # hook that a path added by a .pth line does not run), so the package comes from the wheel alone.
    install = subprocess.run([*pip, "--python", python, "install", "--quiet", "--no-deps", wheel],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    (Path(purelib) / "outer_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing but the install points anywhere
    env["PATH"] = f"{tmp / 'venv' / 'bin'}{os.pathsep}{env['PATH']}"
    env["CUDA_VISIBLE_DEVICES"] = ""
    (tmp / "elsewhere").mkdir()
    return wheel, tmp / "venv" / "bin", env


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_the_wheel_carries_the_presets_and_the_programs(wheel_env):
    wheel, bin_dir, _ = wheel_env
    names = zipfile.ZipFile(wheel).namelist()
    packaged = {n[len("ppo_ddp/configs/") : -len(".yaml")] for n in names if n.startswith("ppo_ddp/configs/")}
    assert set(preset_names()) | {"tune/halfcheetah", "tune/locomotion"} == packaged
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "ppo_ddp").rglob("*.py")}  # every folder's, __init__ too
    assert modules <= set(names) and not any(n.startswith(("scripts/", "examples/")) for n in names)
    assert all((bin_dir / script).is_file() for script in SCRIPTS)


def test_a_newcomer_with_only_the_wheel_trains_evaluates_exports_searches(wheel_env, tmp_path):
    _, bin_dir, env = wheel_env
    where = tmp_path / "elsewhere"  # an empty directory outside the checkout
    where.mkdir()
    site = bin_dir.parent
    probe = run(
        [bin_dir / "python", "-c", "import ppo_ddp, sys; print(ppo_ddp.__file__); print(*sys.path)"], where, env
    )
    module, path = probe.stdout.splitlines()
    assert Path(module).is_relative_to(site) and str(ROOT) not in path.split()

    train = run(["ppo-ddp-train", "--env-id", "Hopper-v5", "--no-compile", *TINY, "--run-name", "h"], where, env)
    assert train.stdout.startswith("Hopper-v5, preset hopper: 2 rounds of 512 steps"), train.stdout
    checkpoint = where / "runs" / "h" / "model_h.pt"
    saved = yaml.safe_load((where / "runs" / "h" / "config.yaml").read_text())
    assert saved["config"]["gamma"] == 0.995 and saved["packages"]["ppo_ddp"] == ppo_ddp.__version__  # the preset's

    evaluated = run(["ppo-ddp-evaluate", checkpoint, "--episodes", "2"], where, env)
    assert evaluated.stdout.startswith("Hopper-v5: mean return ") and "over 2 deterministic" in evaluated.stdout
    run(["ppo-ddp-export", checkpoint, "--format", "torchscript", "--output", "policy.pt"], where, env)
    assert (where / "policy.pt").stat().st_size > 0

    (where / "space.yaml").write_text(yaml.safe_dump(SPACE))
    # one trial: its trainer and evaluations run from the wheel (a second trial is the same again, ~9 s of CPU)
    search = ["ppo-ddp-tune", "--space", "space.yaml", "--study", "s", "--n-trials", "1", "--seed", "0"]
    tuned = run(search, where, env, timeout=600)
    assert "trial 0 complete" in tuned.stdout, tuned.stdout
    assert (where / "runs" / "tune" / "s" / "best_Hopper-v5.yaml").is_file()

    # The README's Python example as a reader runs it (shortened: tests/doc_code.py), from the wheel alone.
    (readme,) = [b for b in python_blocks() if b.doc.name == "README.md"]
    api_dir = where / "api"
    api_dir.mkdir()
    (api_dir / "api.py").write_text(shortened(readme.text) + WHERE_FROM)
    api = run([bin_dir / "python", "api.py"], api_dir, env)
    assert_finished_runs(api_dir / "runs", 1)
    checkpoint = next(line for line in api.stdout.splitlines() if line.startswith("checkpoint ")).split()[1]
    assert Path(checkpoint).is_file() and Path(checkpoint).is_relative_to(api_dir / "runs"), api.stdout
    modules = next(line for line in api.stdout.splitlines() if line.startswith("modules ")).split()[1:]
    assert all(Path(m).is_relative_to(site) for m in modules), modules


def test_the_pins_are_inside_pyprojects_ranges():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    ranges = [Requirement(r) for r in project["dependencies"]]
    ranges += [Requirement(r) for name, reqs in extras.items() if name != "dmc" for r in reqs]  # dmc: its own pins
    pins = {}
    for file in ("requirements.txt", "requirements-extras.txt"):
        for line in (ROOT / file).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, version = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip()).groups()
                pins[canonical(name)] = version
    for req in ranges:
        assert canonical(req.name) in pins, f"{req.name} is not pinned"
        assert req.specifier.contains(pins[canonical(req.name)], prereleases=True), (req, pins[canonical(req.name)])
    base = {canonical(line.split("==")[0]) for line in (ROOT / "requirements.txt").read_text().splitlines()}
    assert {canonical(Requirement(r).name) for r in project["dependencies"] + extras["test"]} <= base
    # The dmc extra's pins, spelled out in the message of an env that needs them.
    assert all(pin.replace('"', "") in DM_CONTROL_INSTALL.replace("'", "") for pin in extras["dmc"])


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
