"""A preset's whole run, sync and overlapped, side by side in one run (and against a base revision, if given).

    python scripts/bench_overlap.py --base cf789fc              # the quickstart (HalfCheetah-v5), two passes
    python scripts/bench_overlap.py --env-id Walker2d-v5 --passes 1    # its preset: sync against --overlap
    python scripts/bench_overlap.py --base cf789fc --steps 200000 --passes 1

Run it alone on the machine: every figure is a wall-clock time. Each pass runs, one after the other:

- base (with --base): `python train.py --env-id ENV` in the base revision (a git worktree): the env's preset, 1M
  steps, evaluation every 50 rounds;
- sync: the same in this checkout with `--no-overlap` (sync rounds, whichever the preset has);
- overlap: this checkout with `--overlap` (the actors collect round k+1 while the learner updates on round k);
- overlap, 1 actor x 16 envs: the same round (the preset's samples) from one actor, so that on a 2-core machine the
  actor and the learner each have a core.

The compiled step is cached first (one short run of each tree), so every timed run starts warm. Prints one line
per run (wall seconds of the whole process, SPS over it, the mean rollout and update seconds of a round as
metrics.csv logs them, the final evaluation) and, as its last line, `ratio <best of this checkout / base>` (without
--base: `ratio <overlap / sync>`, the whole run's SPS, the overlap decision's speed side), each from its fastest pass.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import train_runs  # scripts/, on sys.path when a script runs
from worktree import base_worktree

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's ppo_ddp, installed or not

from ppo_ddp.configuration.loading import parse_config  # noqa: E402
from ppo_ddp.configuration.validation import envs_per_learner  # noqa: E402


def variants(env_id: str) -> dict[str, list[str]]:
    """The runs of this checkout: the preset sync, overlapped, and overlapped with its round (the same samples)
    from one actor of 16 envs, so that on a 2-core machine the actor and the learner each have a core."""
    cfg = parse_config(["--env-id", env_id], check_env=False)
    samples = envs_per_learner(cfg) * cfg.rollout_length
    one_actor = ["--actors-per-gpu", "1", "--envs-per-actor", "16", "--rollout-length", str(samples // 16)]
    # each says its rounds: a preset may overlap already (HalfCheetah's does)
    return {"sync": ["--no-overlap"], "overlap": ["--overlap"], "overlap, 1 actor x 16 envs": ["--overlap", *one_actor]}


def train(tree: Path, work: Path, name: str, flags: list[str]) -> dict:
    """train.py in tree to its end: wall seconds, steps, mean rollout and update seconds after the first two rounds,
    the last evaluation."""
    run = train_runs.train(tree, work, name, flags)
    timed = train_runs.timing(run.rows, warmup=min(2, len(run.rows) - 1))
    evals = [line for line in run.stdout.splitlines() if line.startswith("eval of round")]
    return {
        "wall": run.wall,
        "steps": int(run.rows[-1]["global_step"]),
        "rollout": statistics.fmean(timed.rollout_seconds),
        "update": statistics.fmean(timed.update_seconds),
        "eval": evals[-1].split(": ", 1)[1].split(" over")[0] if evals else "n/a",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=None, help="a git revision to compare with (default: none)")
    parser.add_argument(
        "--env-id", default="HalfCheetah-v5", help="the env whose preset runs (default: the quickstart)"
    )
    parser.add_argument("--steps", type=int, default=1_000_000, help="total_timesteps of each run")
    parser.add_argument("--passes", type=int, default=2, help="times each run is repeated, alternating")
    args = parser.parse_args()
    if args.base is None:
        with tempfile.TemporaryDirectory(prefix="bench_overlap_") as tmp:
            run(args, None, Path(tmp))
        return
    with base_worktree(args.base, "bench_overlap_") as (base, tmp):
        run(args, base, tmp)


def run(args: argparse.Namespace, base: Path | None, tmp: Path) -> None:
    env = ["--env-id", args.env_id]
    runs = [("base", base, env)] if base is not None else []
    mine = variants(args.env_id)
    runs += [(label, ROOT, [*env, *flags]) for label, flags in mine.items()]
    for label, tree, flags in runs:  # the compiled step into inductor's cache, for every tree and shape
        train(tree, tmp, "warm_" + label.replace(" ", "_").replace(",", ""), [*flags, "--total-timesteps", "8192"])
    sps: dict[str, float] = {}
    for n in range(args.passes):
        for label, tree, flags in runs:
            name = f"p{n}_" + label.replace(" ", "_").replace(",", "")
            r = train(tree, tmp, name, [*flags, "--total-timesteps", str(args.steps)])
            sps[label] = max(sps.get(label, 0.0), r["steps"] / r["wall"])
            rate = f"{r['wall']:6.1f} s whole process  {r['steps'] / r['wall']:7,.0f} SPS"
            rounds = f"round: rollout {r['rollout']:.3f} s, update {r['update']:.3f} s"
            print(f"pass {n + 1}  {label:28s} {rate}  {rounds}  eval {r['eval']}", flush=True)
    reference = "base" if base is not None else "sync"
    for label in mine:
        if label != reference:
            print(f"{label}/{reference} {sps[label] / sps[reference]:.2f}x SPS (fastest passes)")
    print(f"ratio {max(sps[label] for label in mine if label != reference) / sps[reference]:.2f}")


if __name__ == "__main__":
    main()
