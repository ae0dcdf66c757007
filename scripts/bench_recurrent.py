"""A GRU policy's training round against the MLP's, side by side in one run (issue 26's throughput target).

    python scripts/bench_recurrent.py              # ~3 minutes on the 2-core machine
    python scripts/bench_recurrent.py --rounds 80 --repeats 3

Run it alone on the machine: every figure is a wall-clock time. Each way below is `python train.py` on
ppo_ddp/HalfCheetahNoVel-v5 (one learner, 2 actors of 8 envs, 128 steps: 2048 samples a round, compiled, no
evaluation) for --rounds rounds, and the ways alternate --repeats times so that a drift of the machine's speed
touches them alike:

- mlp: the preset halfcheetah_novel, the default shape (Config's defaults: 10 epochs of 32 mini-batches of 64);
- gru: the preset halfcheetah_novel_gru, the same with the GRU policy (32 mini-batches of 4 chunks of 16 steps);
- gru_critic: the same with a privileged critic (`--critic-obs full_obs`: an MLP on the whole observation instead
  of the value head on the GRU).

A round is the wall time between two rounds' rows (charts/elapsed_seconds: rollout, update, the round's bookkeeping),
its median over the rounds after the first three of every run of a way (scripts/train_runs.py); SPS is 2048 over that.
The rollout and update columns are the medians of charts/rollout_seconds and charts/train_seconds. The last line is
`gru/mlp round SPS <ratio>`, after `gru_critic/mlp round SPS <ratio>`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import train_runs  # noqa: E402
from bench_update import train  # noqa: E402

WAYS = {
    "mlp": ["--config", "ppo_ddp/configs/halfcheetah_novel.yaml"],
    "gru": ["--config", "ppo_ddp/configs/halfcheetah_novel_gru.yaml"],
    "gru_critic": ["--config", "ppo_ddp/configs/halfcheetah_novel_gru.yaml", "--critic-obs", "full_obs"],
}


def round_times(rows: list[dict[str, str]]) -> tuple[list[float], list[float], list[float], int]:
    """(round seconds, rollout seconds, update seconds) of a finished run's rounds after its first three; samples."""
    timed = train_runs.timing(rows, warmup=3)
    return timed.round_seconds, timed.rollout_seconds, timed.update_seconds, int(float(rows[-1]["charts/buffer_size"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="training rounds of each run")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way, alternating")
    args = parser.parse_args()
    times: dict[str, tuple[list[float], list[float], list[float]]] = {way: ([], [], []) for way in WAYS}
    samples = 2048
    with tempfile.TemporaryDirectory(prefix="bench_recurrent_") as tmp:
        work = Path(tmp)
        for repeat in range(args.repeats):
            for way, flags in WAYS.items():
                name = f"{way}_{repeat}"
                total = ["--total-timesteps", str((args.rounds + 1) * samples)]
                result = train(ROOT, work, name, [*flags, *total, "--eval-interval", "0", "--save-interval", "1000"])
                if result["warning"]:
                    raise SystemExit(f"bench_recurrent.py: {way}: {result['warning']}")
                rounds, rollout, update, samples = round_times(result["rows"])
                for acc, got in zip(times[way], (rounds, rollout, update)):
                    acc.extend(got)
                compile_s = f", compiled in {result['compile']:.1f} s" if result["compile"] is not None else ""
                print(f"run {repeat}  {way:10s} round {statistics.median(rounds) * 1e3:6.1f} ms{compile_s}", flush=True)
    sps = {}
    for way, (rounds, rollout, update) in times.items():
        sps[way] = samples / statistics.median(rounds)
        ms = [statistics.median(t) * 1e3 for t in (rounds, rollout, update)]
        print(f"{way:10s} round {ms[0]:6.1f} ms  rollout {ms[1]:6.1f} ms  update {ms[2]:6.1f} ms  {sps[way]:7.0f} SPS "
              f"(medians of {len(rounds)} rounds)", flush=True)  # fmt: skip
    print(f"gru_critic/mlp round SPS {sps['gru_critic'] / sps['mlp']:.2f}")
    print(f"gru/mlp round SPS {sps['gru'] / sps['mlp']:.2f}")


if __name__ == "__main__":
    main()
