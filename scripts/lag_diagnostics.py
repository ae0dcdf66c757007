"""What one round of policy lag does to the PPO update: per round, at the weights the update starts from.

    python scripts/lag_diagnostics.py runs/lag_overlap.csv --env-id HalfCheetah-v5 --seed 1
    python scripts/lag_diagnostics.py runs/lag_sync.csv --env-id HalfCheetah-v5 --seed 1 --no-overlap

Trains one learner in this process (every flag after the CSV's path is train.py's) and, before each round's update,
measures the round against the policy that collected it (the behaviour policy: in sync rounds the update's starting
weights themselves; overlapped, the weights of the round before): a row per round in the CSV, and a table of medians
per fifth of the run at the end. Learning results are deterministic per seed, so it may share the machine.

Columns:
- `std`: the Gaussian's mean standard deviation (exp of actor_logstd; nan for the bounded distributions), and
  `entropy`, the policy's entropy on the round, both at the update's start;
- `lag_kl`: KL(behaviour || start), the k3 estimate over the round's samples (0 in sync rounds);
- `outside`: the fraction of samples whose ratio start / behaviour already lies outside [1 - clip, 1 + clip], and
  `against`, those of them the lag moved against their advantage (ratio above the range with a negative advantage,
  below it with a positive one): PPO's pessimistic min never clips these, so a clip centred on the behaviour policy
  gives them their whole gradient however far the update goes;
- `update_kl` and `clipfrac`: the update's own (losses/approx_kl, losses/clipfrac of metrics.csv).
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ppo_ddp.algorithm import learner as learner_module  # noqa: E402

COLUMNS = ["round", "std", "entropy", "lag_kl", "outside", "against", "update_kl", "clipfrac"]


@torch.no_grad()
def lag_row(learner: learner_module.Learner, batch, adv_mean_std: tuple[float, float]) -> dict[str, float]:
    """The round at the learner's current weights (those its update starts from), against the stored log-probs."""
    model, eps = learner.model, learner.cfg.clip_coef
    logp, entropy, _, _ = model.evaluate_minibatch(learner_module.whole_round(batch), list(model.parameters()))
    log_ratio = logp - batch.logp
    ratio = log_ratio.exp()
    advantages = batch.advantages - adv_mean_std[0]
    against = ((ratio > 1 + eps) & (advantages < 0)) | ((ratio < 1 - eps) & (advantages > 0))
    gaussian = learner.cfg.distribution == "gaussian"
    return {
        "std": model.actor_logstd.exp().mean().item() if gaussian else float("nan"),
        "entropy": entropy.mean().item(),
        "lag_kl": learner_module.approx_kl(log_ratio).item(),
        "outside": ((ratio - 1).abs() > eps).float().mean().item(),
        "against": against.float().mean().item(),
    }


def summary(rows: list[dict[str, float]], parts: int = 5) -> str:
    """Medians of each column per fifth of the run."""
    lines = [" ".join(f"{c:>10}" for c in ["rounds", *COLUMNS[1:]])]
    size = max(1, len(rows) // parts)
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        cells = [f"{part[0]['round']}-{part[-1]['round']}"]
        cells += [f"{statistics.median(r[c] for r in part):.4g}" for c in COLUMNS[1:]]
        lines.append(" ".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)


def main(out: Path, train_argv: list[str]) -> None:
    rows: list[dict[str, float]] = []
    train_step = learner_module.Learner.train_step

    def measured(self, batch, global_mean_std, value_stats=None):
        row = {"round": len(rows) + 1, **lag_row(self, batch, global_mean_std(batch.advantages))}
        metrics = train_step(self, batch, global_mean_std, value_stats)
        rows.append({**row, "update_kl": metrics["losses/approx_kl"], "clipfrac": metrics["losses/clipfrac"]})
        return metrics

    learner_module.Learner.train_step = measured
    from ppo_ddp.train import main as train

    try:
        train(train_argv)
    finally:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        if rows:
            print(summary(rows))
        print(f"{len(rows)} rounds in {out}")


if __name__ == "__main__":  # the actors start by spawn/forkserver: they import this module
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python scripts/lag_diagnostics.py OUT.csv [train.py flags]")
    main(Path(sys.argv[1]), sys.argv[2:])
