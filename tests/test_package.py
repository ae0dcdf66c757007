"""The package installs: a fresh venv, `pip install -e .`, then `import ppo_ddp` from another directory."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import ppo_ddp


def test_editable_install_imports_from_anywhere(repo_root: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir)  # no pip of its own: this one installs into it (--python), a few seconds less
    python = env_dir / "bin" / "python"
    # --no-deps: the dependencies (torch, gymnasium, ...) are this interpreter's, reached through a .pth line below,
    # so the test installs nothing big. The package itself comes only from the new venv's editable install: the
    # directory the .pth line adds holds no ppo_ddp (an editable install is a finder hook, which a path added by a
    # .pth line does not run), and the import runs from a directory that is not the checkout.
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
        ]
        + ["-e", str(repo_root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    (Path(site_packages) / "outer_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import importlib.metadata, ppo_ddp, gymnasium as gym; "
        "print(ppo_ddp.__file__); print(importlib.metadata.version('ppo_ddp')); "
        "print(gym.spec('ppo_ddp/HopperNoVel-v5').id)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing but the install points at the checkout
    out = subprocess.run([python, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    where, version, env_id = out.stdout.split()
    assert Path(where) == repo_root / "ppo_ddp" / "__init__.py"
    assert version == ppo_ddp.__version__
    assert env_id == "ppo_ddp/HopperNoVel-v5"  # the registered ids come with the import
