"""scripts/lag_diagnostics.py's measurement of a round against the policy that collected it."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from ppo_ddp.configuration.config import Config
from tests.test_learner import local_mean_std, make

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from lag_diagnostics import lag_row, summary  # noqa: E402


def test_a_round_collected_by_the_starting_weights_has_no_lag():
    learner, batch = make(Config())
    row = lag_row(learner, batch, local_mean_std(batch.advantages))
    assert abs(row["lag_kl"]) < 1e-6 and row["outside"] == 0.0 and row["against"] == 0.0
    assert row["std"] == learner.model.actor_logstd.exp().mean().item()


def test_a_lagged_round_counts_the_samples_outside_the_clip_and_those_moved_against_their_advantage():
    """Behaviour log-probs lower by 0.5 everywhere: every ratio is e^0.5 > 1 + clip, and the samples the min never
    clips are those with a negative advantage."""
    learner, batch = make(Config(clip_coef=0.2))
    stale = dataclasses.replace(batch, logp=batch.logp - 0.5)
    mean, _ = local_mean_std(batch.advantages)
    row = lag_row(learner, stale, (mean, 1.0))
    assert row["outside"] == 1.0
    assert row["against"] == (batch.advantages < mean).float().mean().item()
    assert abs(row["lag_kl"] - ((torch.tensor(0.5).exp() - 1) - 0.5).item()) < 1e-5


def test_the_summary_has_a_line_of_medians_per_fifth_of_the_run():
    rows = [{"round": k, "std": 1.0, "entropy": 0.0, "lag_kl": float(k), "outside": 0.0, "against": 0.0,
             "update_kl": 0.0, "clipfrac": 0.0} for k in range(1, 11)]  # fmt: skip
    lines = summary(rows).splitlines()
    assert len(lines) == 6 and lines[1].split()[:4] == ["1-2", "1", "0", "1.5"]
