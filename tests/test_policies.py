"""The trained policies the README shows ship in policies/ (scripts/ship_policy.py): each file is the policy alone
and small, plays from a folder that holds nothing but the repository's shipped files (no runs/, nothing trained
here), and scores within the range recorded when it was shipped (policies/policies.csv)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "policies" / "policies.csv"
EPISODES = 1  # evaluate's first seed: the first of the ten episodes the range was recorded over

with open(MANIFEST, newline="") as f:
    SHIPPED = list(csv.DictReader(f))

PLAY = textwrap.dedent(
    """
    import json, sys
    from ppo_ddp.evaluation.playback import evaluate_policy, load_policy
    out = {}
    for path in sys.argv[2:]:
        model, obs_rms, cfg = load_policy(path)
        out[path] = evaluate_policy(model, obs_rms, cfg, int(sys.argv[1]))
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def played(tmp_path_factory) -> dict[str, list[float]]:
    """Every shipped policy's returns, played in one process from an empty folder with the clone's policies/ and
    examples/robots/ copied in (a robot of one's own travels as a path inside the repository)."""
    here = tmp_path_factory.mktemp("clone")
    shutil.copytree(ROOT / "policies", here / "policies")
    shutil.copytree(ROOT / "examples" / "robots", here / "examples" / "robots")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    files = [row["file"] for row in SHIPPED]
    proc = subprocess.run(
        [sys.executable, "-c", PLAY, str(EPISODES), *files], cwd=here, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("row", SHIPPED, ids=[row["name"] for row in SHIPPED])
def test_a_shipped_policy_scores_within_its_recorded_range(row, played):
    returns = played[row["file"]]
    assert len(returns) == EPISODES
    mean = sum(returns) / len(returns)
    low, high = float(row["min"]) - 0.05, float(row["max"]) + 0.05  # recorded to one decimal
    assert low <= mean <= high, (row["name"], returns, row["min"], row["max"])


@pytest.mark.parametrize("row", SHIPPED, ids=[row["name"] for row in SHIPPED])
def test_a_shipped_policy_is_the_policy_alone_and_small(row):
    path = ROOT / row["file"]
    assert path.stat().st_size <= 2_000_000
    state = torch.load(path, weights_only=True)
    assert "optimizer" not in state and "rank_states" not in state
    assert state["env_id"] == row["env_id"]
    assert (ROOT / row["gif"]).stat().st_size <= 1_000_000


def test_the_readme_shows_every_shipped_policy():
    readme = (ROOT / "README.md").read_text()
    assert all(row["gif"] in readme for row in SHIPPED)
    assert "python -m ppo_ddp.evaluate policies/" in readme
