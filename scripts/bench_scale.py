"""Throughput of a large-batch preset against the raw env limit of this machine, measured side by side in one run.

    python scripts/bench_scale.py                                   # ppo_ddp/configs/scale/humanoid.yaml
    python scripts/bench_scale.py --config ppo_ddp/configs/scale/ant.yaml --rounds 20
    python scripts/bench_scale.py --flags "--hidden-sizes 64 64 --update-epochs 2"    # a variant of the preset

1. The limit: one process per core (os.cpu_count(), or --cores), all at once, each stepping one plain
   `make_env` env with uniform random actions (resets included), in env steps per second summed over the
   processes. Measured before and after the training run; the larger value is used, so drift of a shared
   machine cannot flatter the ratio.
2. Training: `python train.py --config PRESET` for --warmup-rounds + --rounds rounds (after round 0); the
   rate is the env steps of the timed rounds over their wall time, from metrics.csv (charts/elapsed_seconds
   at the end of each round), with the mean rollout and update seconds of a round.

Prints both and, as its last line, `ratio <training rate / limit>`. Run it alone on the machine: anything else
running distorts both numbers.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import train_runs  # noqa: E402
from bench_rollout import raw_env_rate, side_by_side  # noqa: E402

from ppo_ddp.configuration.loading import parse_config  # noqa: E402
from ppo_ddp.configuration.validation import envs_per_learner  # noqa: E402


def side_by_side_limit(env_id: str, processes: int, seconds: float) -> float:
    """Env steps per second of `processes` plain envs stepped at once, one per process."""
    return sum(side_by_side(processes, raw_env_rate, env_id, seconds, 1, "uniform"))


def training_rate(
    preset: str, flags: list[str], warmup: int, rounds: int, work: Path
) -> tuple[float, float, float, int]:
    """(env steps per second over the timed rounds, mean rollout s, mean update s, steps per round)."""
    cfg = parse_config(["--config", preset, *flags])
    steps = envs_per_learner(cfg) * cfg.rollout_length
    total = (1 + warmup + rounds) * steps  # round 0 seeds the statistics
    flags = ["--config", preset, *flags, "--total-timesteps", str(total), "--save-interval", str(10**6)]
    run = train_runs.train(ROOT, work, "bench", [*flags, "--eval-interval", "0"])
    timed = train_runs.timing(run.rows, warmup)
    return timed.sps, statistics.fmean(timed.rollout_seconds), statistics.fmean(timed.update_seconds), steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="ppo_ddp/configs/scale/humanoid.yaml", help="the preset to train with")
    parser.add_argument("--flags", default="", help="train.py flags on top of the preset, e.g. '--update-epochs 2'")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="processes of the limit")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds of each limit measurement")
    parser.add_argument("--warmup-rounds", type=int, default=3, help="rounds after round 0 left out of the timing")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds")
    args = parser.parse_args(argv)
    if args.warmup_rounds < 1 or args.rounds < 1:
        parser.error("--warmup-rounds and --rounds must be at least 1")

    flags = shlex.split(args.flags)
    env_id = parse_config(["--config", args.config, *flags]).env_id
    print(
        f"# {env_id}, {args.config} {args.flags}; {args.cores} cores; load average {os.getloadavg()[0]:.2f}", flush=True
    )
    before = side_by_side_limit(env_id, args.cores, args.seconds)
    print(f"raw env limit ({args.cores} processes side by side): {before:,.0f} steps/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rate, rollout, update, steps = training_rate(args.config, flags, args.warmup_rounds, args.rounds, Path(tmp))
    print(
        f"training: {rate:,.0f} steps/s over {args.rounds} rounds of {steps} steps "
        f"(a round: {rollout:.3f} s rollout + {update:.3f} s update)",
        flush=True,
    )
    after = side_by_side_limit(env_id, args.cores, args.seconds)
    limit = max(before, after)
    print(f"raw env limit again: {after:,.0f} steps/s; limit used {limit:,.0f}; load average {os.getloadavg()[0]:.2f}")
    print(f"ratio {rate / limit:.3f}")


if __name__ == "__main__":
    main()
