"""The same run pinned to 1, 2, 4, ... cores: its steps per second, the split `actors_per_gpu: auto` chose and a
round's rollout and update at each count, against the model that predicts them; optionally the time to score on one
env against rl_games + EnvPool pinned to the same cores.

    python scripts/bench_cores.py                                    # the HalfCheetah preset on 1, 2, 4, ... cores
    python scripts/bench_cores.py --config scale/humanoid --cores 1 2
    python scripts/bench_cores.py --cores 1 2 --passes 5             # a drifting machine: alternated, medians
    python scripts/bench_cores.py --cores 1 2 --paired-rounds 100    # + 1 core's rollout over 2's, round by round
    python scripts/bench_cores.py --cores 1 2 --score-env HalfCheetah-v5 --cap-minutes 10   # + time to score

Each count k runs `taskset -c 0-(k-1) python train.py --config PRESET --no-overlap` (`auto` sees k cores in its
affinity) for --warmup-rounds + --rounds rounds after round 0: in sync rounds the learner waits for the whole
rollout, so metrics.csv's rollout and update seconds are each part's own (scripts/train_runs.py); the split comes
from config.yaml. A preset that overlaps its rounds runs as it is too, for its steps per second. On 1 core it also
runs with 2 actors (both on that core): the difference is what one more actor costs a round. The model
(docs/benchmarks/throughput.md, "Cores"):

- rollout(k) = f + w / A(k): the round's env work w (every env's steps, policy and bookkeeping) spread over the
  A(k) = actors_for(num_envs, k) actors, each of which also pays a fixed cost f a round (its messages, its weights,
  the per-step policy calls that do not shrink with fewer envs); fitted on 1 core, where 1 actor's rollout is
  f + w and 2 actors' is 2f + w;
- update(k): the 1-core update, and from 2 cores on the update measured with the learner's threads there
  (min(learner_threads, k), the presets' at most 2), the same at every larger count: more cores do not shrink it;
- a sync round is rollout + update; an overlapped one (the actors collect round k+1 during the update of round k)
  is the longest of the rollout, the update and the round's CPU work over the cores ((f A + w + update) / k).

The rows it predicts at the measured counts are printed beside the measurement (the 1-core rows fit the model, so
the 2-core row is its test), then the model's table for 1-64 cores. --learners L: at each count of at least L cores,
the same round split over L CPU learners (`torchrun`, `--sync-mode gradients`, num_envs / L envs each: the same
samples and the same mini-batches, so it learns as one learner), against one learner's update. --score-env: per
count, ppo_ddp's preset and rl_games with its stock EnvPool config (scripts/bench_peers.py's runs and venv), each to
the env's score or the cap.

--paired-rounds N: the rollout's ratio, 1 core against each larger count, measured without whole runs: two actor
pools open side by side, their rounds alternating, each pair's ratio taken in one stretch of the machine's speed
(a shared machine's speed drifts by 10-30% over minutes, which separate runs put into their ratio).

Run it alone on the machine: every figure is a wall-clock time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import train_runs  # noqa: E402

from ppo_ddp.configuration.loading import parse_config  # noqa: E402
from ppo_ddp.configuration.topology import actors_for, usable_cores  # noqa: E402
from ppo_ddp.configuration.validation import envs_per_learner  # noqa: E402

MODEL_CORES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Measured:
    cores: int
    split: str
    sps: float
    rollout: float  # mean seconds of a round's rollout (the learner's wait for it, overlapped)
    update: float


@dataclass(frozen=True)
class Model:
    """rollout(k) = fixed + work / actors(k); the update from its measurements (module docstring)."""

    num_envs: int
    steps: int  # env steps a round
    fixed: float
    work: float
    update_one: float  # the update on 1 core
    update_more: float  # with the learner's threads of 2 cores or more
    overlap: bool

    def actors(self, cores: int) -> int:
        return actors_for(self.num_envs, cores)

    def rollout(self, cores: int) -> float:
        return self.fixed + self.work / self.actors(cores)

    def update(self, cores: int) -> float:
        return self.update_one if cores == 1 else self.update_more

    def round(self, cores: int) -> float:
        rollout, update = self.rollout(cores), self.update(cores)
        if not self.overlap:
            return rollout + update
        cpu = self.fixed * self.actors(cores) + self.work + update
        return max(rollout, update, cpu / cores)


def pinned(cores: int) -> list[str]:
    """taskset's prefix that pins a command to the first `cores` CPUs this process may use."""
    cpus = sorted(os.sched_getaffinity(0))[:cores]
    return ["taskset", "-c", ",".join(map(str, cpus))]


def measure(
    preset: str, flags: list[str], cores: int, warmup: int, rounds: int, steps: int, learners: int = 1
) -> Measured:
    """The preset (with flags) pinned to `cores` CPUs: its rates over the timed rounds and the split it chose.
    learners > 1: that many CPU learners (torchrun), each with its share of the round's envs."""
    total = (1 + warmup + rounds) * steps  # round 0 seeds the statistics
    run_flags = ["--config", preset, *flags, "--total-timesteps", str(total), "--save-interval", str(10**6),
                 "--eval-interval", "0"]  # fmt: skip
    launcher = [*pinned(cores), sys.executable]
    if learners > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={learners}"]
    with tempfile.TemporaryDirectory(prefix="bench_cores_") as tmp:
        run = train_runs.train(ROOT, Path(tmp), "run", run_flags, launcher=launcher)
        facts = yaml.safe_load((Path(tmp) / "run" / "config.yaml").read_text())
    timed = train_runs.timing(run.rows, warmup)
    return Measured(
        cores,
        facts["split"],
        timed.sps,
        statistics.fmean(timed.rollout_seconds),
        statistics.fmean(timed.update_seconds),
    )


def alternating(runs: dict, passes: int) -> dict:
    """Each of `runs` (name -> a measurement) `passes` times, in turn: a, b, c, a, b, c, ... A shared machine's
    speed drifts by 10-30% over minutes, which one pass per row puts into the ratios between rows; alternated,
    the drift falls on every row alike. Each row is its passes' median, field by field; with more than one pass,
    each pass's rollout on 1 core over its rollout on 2 is printed (the ratio in a stretch of one speed)."""
    measured: dict = {name: [] for name in runs}
    for p in range(passes):
        for name, run in runs.items():
            measured[name].append(run())
        if passes > 1 and 1 in measured and 2 in measured:
            print(f"pass {p + 1}: rollout 1 core / 2 cores {measured[1][-1].rollout / measured[2][-1].rollout:.2f}x "
                  f"({measured[1][-1].rollout:.3f} / {measured[2][-1].rollout:.3f} s)", flush=True)  # fmt: skip
    return {name: median_row(rows) for name, rows in measured.items()}


def median_row(rows: list[Measured]) -> Measured:
    """The rows' median, field by field (their cores and split are one)."""
    return Measured(
        rows[0].cores,
        rows[0].split,
        statistics.median(r.sps for r in rows),
        statistics.median(r.rollout for r in rows),
        statistics.median(r.update for r in rows),
    )


def paired_rollout(preset: str, flags: list[str], cores: int, rounds: int) -> list[float]:
    """The preset's rollout on 1 core over its rollout on `cores` cores, round by round: two actor pools open side by
    side (1 actor, and auto's split for `cores`; each actor pinned; a fresh policy with frozen statistics, no
    update), their rounds alternating, so that each pair of rounds runs in one stretch of the machine's speed.
    Returns each pair's ratio (the learner's part of a round, its start and the batch, is not in it)."""
    from bench_rollout import warm_pool

    from ppo_ddp.runner.launch import learner_config

    cpus = sorted(os.sched_getaffinity(0))[:cores]
    envs = envs_per_learner(parse_config(["--config", preset, *flags], check_env=False))
    with contextlib.ExitStack() as stack:
        rounds_of = []
        for k in (1, cores):
            cfg = learner_config(
                parse_config(["--config", preset, *flags, "--actors-per-gpu", str(actors_for(envs, k))])
            )
            pool, model, stats = stack.enter_context(warm_pool(cfg))
            for a, pid in enumerate(pool.pids):
                os.sched_setaffinity(pid, {cpus[a % k]})
            rounds_of.append(functools.partial(timed_round, pool, model, stats))
        for _ in range(3):  # warm-up, pinned
            rounds_of[0](), rounds_of[1]()
        ratios = []
        for i in range(rounds):  # which pool goes first alternates too
            if i % 2:
                more, one = rounds_of[1](), rounds_of[0]()
            else:
                one, more = rounds_of[0](), rounds_of[1]()
            ratios.append(one / more)
        return ratios


def timed_round(pool, model, stats) -> float:
    start = time.perf_counter()
    pool.collect(model, *stats)
    return time.perf_counter() - start


def show(row: Measured, model: Model | None, label: str = "") -> None:
    line = (
        f"{row.cores:>3} cores{label}: {row.split}; {row.sps:,.0f} steps/s, a round {row.rollout:.3f} s rollout + "
        f"{row.update:.3f} s update"
    )
    if model is not None:
        predicted = model.steps / model.round(row.cores)
        line += f"; model: {predicted:,.0f} steps/s (measured/model {row.sps / predicted:.2f})"
        if not model.overlap:
            rollout = model.rollout(row.cores)
            line += f", rollout {rollout:.3f} s ({row.rollout / rollout:.2f})"
    print(line, flush=True)


def model_table(model: Model) -> str:
    lines = ["| cores | actors x envs | rollout s | update s | round s | steps/s |", "|---:|---|---:|---:|---:|---:|"]
    for k in MODEL_CORES:
        a = model.actors(k)
        lines.append(
            f"| {k} | {a} x {model.num_envs // a} | {model.rollout(k):.3f} | {model.update(k):.3f} | "
            f"{model.round(k):.3f} | {model.steps / model.round(k):,.0f} |"
        )
    return "\n".join(lines)


def time_to_score(env_id: str, cores: int, seed: int, cap: float) -> None:
    """ppo_ddp's preset and rl_games + EnvPool, each pinned to `cores` CPUs, to the env's score (bench_peers)."""
    import bench_peers

    for trainer in ("ppo_ddp", "rl_games"):
        row = bench_peers.measure(trainer, env_id, seed, cap, prefix=pinned(cores))
        if row is None:
            raise SystemExit(143)
        reached = f"{row['reached_seconds']} s ({row['reached_steps']:,} steps)" if row["reached_seconds"] else "not"
        print(
            f"{cores:>3} cores, {trainer}: score {row['score']} reached {reached}; at the end {row['end_steps']:,} "
            f"steps in {row['end_seconds']} s, return {row['end_return']}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = usable_cores()[0]
    default = [k for k in MODEL_CORES if k <= here] + ([here] if here not in MODEL_CORES else [])
    parser.add_argument("--config", default="halfcheetah", help="the preset (a name or a YAML file)")
    parser.add_argument("--flags", default="", help="train.py flags on top of the preset")
    parser.add_argument("--cores", type=int, nargs="+", default=default, help="core counts (default: 1, 2, 4, ...)")
    parser.add_argument("--warmup-rounds", type=int, default=3, help="rounds after round 0 left out of the timing")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds")
    parser.add_argument("--passes", type=int, default=1, help="sync measurements alternated, each row their median")
    parser.add_argument("--paired-rounds", type=int, default=0,
                        help="also 1 core's rollout over each count's, rounds of two pools alternating")  # fmt: skip
    parser.add_argument(
        "--learners", type=int, default=1, help="also the round split over this many CPU learners (gradients sync)"
    )
    parser.add_argument("--score-env", help="also the time to score on this env, ppo_ddp against rl_games")
    parser.add_argument("--seed", type=int, default=1, help="seed of the time-to-score runs")
    parser.add_argument("--cap-minutes", type=float, default=10.0, help="cap of each time-to-score run")
    args = parser.parse_args(argv)
    if args.passes < 1:
        parser.error(f"--passes: at least 1, not {args.passes}")
    if any(k < 1 or k > here for k in args.cores) or 1 not in args.cores:
        parser.error(f"--cores: counts from 1 to the {here} usable here, 1 included (the model's fit)")

    flags = args.flags.split()
    cfg = parse_config(["--config", args.config, *flags], check_env=False)
    envs = envs_per_learner(cfg)
    steps = envs * cfg.rollout_length
    print(f"# {cfg.env_id}, {args.config} {args.flags}: rounds of {envs} envs x {cfg.rollout_length} steps; "
          f"{here} usable cores; load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    timing = (args.warmup_rounds, args.rounds, steps)
    sync = [*flags, "--no-overlap"]
    runs = {k: (lambda k=k: measure(args.config, sync, k, *timing)) for k in sorted(args.cores)}
    runs["2 on 1"] = lambda: measure(args.config, [*sync, "--actors-per-gpu", "2"], 1, *timing)
    rows = alternating(runs, args.passes)
    two_on_one = rows.pop("2 on 1")
    fixed = max(0.0, two_on_one.rollout - rows[1].rollout)
    more = next((r.update for k, r in sorted(rows.items()) if k > 1), rows[1].update)
    fit = Model(envs, steps, fixed, rows[1].rollout - fixed, rows[1].update, more, overlap=False)
    print(f"model: an actor's fixed cost {fixed:.4f} s a round, the round's env work {fit.work:.3f} s", flush=True)
    show(two_on_one, None, ", sync, 2 actors")
    for row in rows.values():
        show(row, fit, ", sync")
    if cfg.overlap:  # the preset as it runs: the learner's wait is not the rollout, so only its rate is compared
        model = dataclasses.replace(fit, overlap=True)
        for k in sorted(args.cores):
            show(measure(args.config, flags, k, *timing), model, ", overlapped")
    print("sync rounds:\n" + model_table(fit), flush=True)
    if cfg.overlap:
        print("overlapped rounds:\n" + model_table(dataclasses.replace(fit, overlap=True)), flush=True)
    for k in sorted(c for c in args.cores if c >= args.learners > 1):  # the same round, its update split
        split = [*sync, "--sync-mode", "gradients", "--num-envs", str(envs // args.learners)]
        row = measure(args.config, split, k, *timing, learners=args.learners)
        print(f"{k:>3} cores, {args.learners} learners (sync-mode gradients, {envs // args.learners} envs each): "
              f"{row.sps:,.0f} steps/s, a round {row.rollout:.3f} s rollout + {row.update:.3f} s update, against "
              f"one learner's {rows[k].sps:,.0f} steps/s, {rows[k].update:.3f} s update", flush=True)  # fmt: skip
    for k in sorted(c for c in args.cores if c > 1 and args.paired_rounds):
        ratios = sorted(paired_rollout(args.config, flags, k, args.paired_rounds))
        quartiles = statistics.quantiles(ratios, n=4)
        print(f"paired rounds, rollout 1 core / {k} cores: median {statistics.median(ratios):.2f}x, quartiles "
              f"{quartiles[0]:.2f}-{quartiles[2]:.2f}x over {len(ratios)} pairs", flush=True)  # fmt: skip
    if args.score_env:
        for k in sorted(args.cores):
            time_to_score(args.score_env, k, args.seed, args.cap_minutes * 60)


if __name__ == "__main__":
    main()
