"""The compiled PPO step against the eager one and against a base revision, side by side in one run.

    python scripts/bench_update.py --base 19d5d3e               # both parts below
    python scripts/bench_update.py --base 19d5d3e --skip-1m     # the update only (a few minutes)

Run it alone on the machine: every figure is a wall-clock time. The runs go one after the other:

- update: `python train.py` with the default preset (HalfCheetah-v5, one learner, 2048 samples a round,
  10 epochs of 32 mini-batches of 64) for --rounds training rounds, in three ways: the base revision (a git
  worktree), this checkout with --no-compile, this checkout compiled. The figure is the median over the rounds
  after the first two of charts/train_seconds (the update alone, on the learner's one thread).
- 1M: `python train.py` as the README's quickstart (1M steps, evaluation on), the whole process timed from
  start to exit: the base revision, then this checkout compiled twice, first with an empty inductor cache
  (TORCHINDUCTOR_CACHE_DIR in a fresh folder: the first run on a machine), then with that cache filled.
  Start-up: the seconds of the "compiled in" line.

Prints one line per run and the ratios; the last line is `update <base / compiled> 1M <compiled / base SPS>`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
from pathlib import Path

import train_runs  # scripts/, on sys.path when a script runs
from worktree import base_worktree

ROOT = Path(__file__).resolve().parent.parent


def train(tree: Path, work: Path, name: str, flags: list[str], env: dict[str, str] | None = None) -> dict:
    """Run train.py in tree to its end; its wall seconds, compile seconds, train_seconds, last row and rows."""
    run = train_runs.train(tree, work, name, flags, env=env)
    compiled = re.search(r"compiled in ([0-9.]+) s", run.stdout)
    return {
        "wall": run.wall,
        "compile": float(compiled.group(1)) if compiled else None,
        "train_seconds": [float(r["charts/train_seconds"]) for r in run.rows],
        "last": run.rows[-1],
        "rows": run.rows,
        "warning": next((line for line in run.stderr.splitlines() if "did not compile" in line), None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with (its update is eager)")
    parser.add_argument("--rounds", type=int, default=30, help="training rounds of each update run")
    parser.add_argument("--skip-1m", action="store_true", help="the update part only")
    args = parser.parse_args()
    with base_worktree(args.base, "bench_update_") as (base, tmp):
        run(args, base, tmp)


def run(args: argparse.Namespace, base: Path, tmp: Path) -> None:
    total = (args.rounds + 1) * 2048  # round 0 seeds the statistics
    short = ["--total-timesteps", str(total), "--eval-interval", "0", "--save-interval", "1000"]
    update = {}
    for label, tree, flags in (
        ("base (eager)", base, short),
        ("this, --no-compile", ROOT, [*short, "--no-compile"]),
        ("this, compiled", ROOT, short),
    ):
        result = train(tree, tmp, label.replace(" ", "_").replace(",", ""), flags)
        timed = result["train_seconds"][2:]
        update[label] = statistics.median(timed)
        print(f"update  {label:20s} {update[label] * 1e3:7.1f} ms a round (median of {len(timed)})"
              + (f"  {result['warning']}" if result["warning"] else ""), flush=True)  # fmt: skip
    base_s, eager_s, compiled_s = update["base (eager)"], update["this, --no-compile"], update["this, compiled"]
    print(f"update  base/compiled {base_s / compiled_s:.2f}x  base/--no-compile {base_s / eager_s:.2f}x  "
          f"--no-compile/compiled {eager_s / compiled_s:.2f}x", flush=True)  # fmt: skip
    if args.skip_1m:
        print(f"update {base_s / compiled_s:.2f}")
        return
    cache = tmp / "inductor_cache"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    sps = {}
    for label, tree in (("base", base), ("compiled, cold cache", ROOT), ("compiled, warm cache", ROOT)):
        result = train(tree, tmp, "1m_" + label.replace(" ", "_").replace(",", ""), [], env)
        steps = float(result["last"]["global_step"]) if "global_step" in result["last"] else 1_000_000
        sps[label] = steps / result["wall"]
        start = f", start-up compile {result['compile']:.1f} s" if result["compile"] is not None else ""
        ret = result["last"].get("charts/episodic_return_avg100", "?")
        print(f"1M      {label:22s} {result['wall']:6.0f} s whole process, {sps[label]:6.0f} SPS{start}; "
              f"return_avg100 {float(ret):.0f}", flush=True)  # fmt: skip
    for label in ("compiled, cold cache", "compiled, warm cache"):
        print(f"1M      {label}/base {sps[label] / sps['base']:.2f}x SPS", flush=True)
    print(f"update {base_s / compiled_s:.2f} 1M {sps['compiled, warm cache'] / sps['base']:.2f}")


if __name__ == "__main__":
    main()
