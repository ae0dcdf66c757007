"""The tables and figures of the learning benchmark, rebuilt from docs/benchmarks/returns.csv's rows.

scripts/benchmark_returns.py runs and records; this module turns every row so far into returns.md and the
curves: the 1M presets against published PPO numbers, world sizes and sync modes, the 10M large-batch presets,
the partly observed envs (ppo_ddp/envs/partial.py), whose policies are compared with each other and with the
full-observation preset of their robot, and the DeepMind Control Suite presets (MuJoCo 3.17.0) against CleanRL.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import numpy as np
from distribution_table import distribution_table
from published import REFERENCE, REFERENCE_10M, REFERENCE_DMC, published_means
from returns_figures import plot_seeds
from returns_rows import (
    BENCHMARK_SEEDS,
    PARTIAL_PREFIX,
    ROOT,
    cell,
    flags_today,
    gym_1m_rows,
    is_dmc,
    is_partial,
    is_scale,
    mean_std,
    other_flags,
    own_shape,
    preset_settings,
    row_key,
    runs_of,
    settings,
    shape_flags,
)
from seed_intervals import COMPARED, seed_rows, ten_seed_table

from ppo_ddp.configuration.presets import find_preset
from ppo_ddp.plot import plot_curves


def _setting(row: dict[str, str], field: str) -> str:
    """A Config field as a row ran it: its flag in the row's extra args (--critic-obs for critic_obs), else its line
    in the row's preset file, else "" (the field's default)."""
    flags, flag = shlex.split(row["extra_args"]), "--" + field.replace("_", "-")
    if flag in flags[:-1]:
        return flags[flags.index(flag) + 1]
    preset = ROOT / row["config"]
    text = preset.read_text() if preset.exists() else ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(f"{field}:")), "")


def _policy(row: dict[str, str]) -> str:
    return _setting(row, "policy") or "mlp"


def _critic(row: dict[str, str]) -> str:
    """What the row's critic read: the policy's observation, or the env's privileged one (critic_obs)."""
    key = _setting(row, "critic_obs")
    return f"`info[{key!r}]`" if key not in ("", "None") else "the policy's"


def _presetcell(rows: list[dict[str, str]]) -> str:
    """The preset as it is; runs with flags that change it only where there is none, and then with their flags."""
    own = [r for r in rows if own_shape(r)]
    if own or not rows:
        return cell(own, 10**6)
    flags = sorted({" ".join(flags_today(r)) for r in rows})
    return cell(rows, 10**6) + f" with `{'`, `'.join(flags)}`"


def one_learner_rows(small: list[dict[str, str]], env_id: str) -> tuple[list[dict[str, str]], bool]:
    """The rows behind an env's 1M cell and curve, and whether they are the preset exactly as `--env-id ENV` runs
    it today on seeds 1-3 (with flags that only restate it, as `--overlap` does on a preset that overlaps). Rows
    with any other flag (an --actor-timeout too) are older: they count only where no exact row exists, and the
    cell names their flags."""
    solo = [r for r in small if r["env"] == env_id and row_key(r)[4] == "params" and r["world_size"] == "1"]
    exact = [r for r in solo if r["seed"] in BENCHMARK_SEEDS and not flags_today(r)]
    return (exact, True) if exact else (solo, False)


def write_table(path: Path, rows: list[dict[str, str]]) -> None:
    small = gym_1m_rows(rows)
    # a preset's eval_episodes sets its rows' count; the exceptions are read from the rows, not kept here
    other = sorted({(r["env"], int(r["eval_episodes"])) for r in rows if r.get("eval_episodes", "") not in ("", "10")})
    episodes = "each preset's eval_episodes: 10" + "".join(f"; {env}: {n}" for env, n in other)
    lines = [
        "# PPO returns",
        "",
        f"Ours: deterministic evaluation of the final policy over episodes ({episodes}), mean ± std "
        "over seeds (their number in brackets); rows from "
        "`returns.csv`, written by `scripts/benchmark_returns.py`. Its `mujoco` column is the MuJoCo version of "
        "the run (the dmc extra installs 3.17.0 in place of 4.0.0); it is empty in the rows written before the "
        "column existed: the package asks for mujoco>=3.2 and nothing recorded which one they had. "
        "A cell marked †N holds N runs that were stopped and resumed before resumes were exact (issue 47: their "
        "envs started new episodes, so a fresh run of the same commit and seed computes another run); every other "
        "row is a fresh run or an exactly resumed one, which a fresh run reproduces (the `resumed` and "
        "`resume_exact` columns). The `overlap` and `distribution` columns say what each run had, so a preset that "
        "switched one (docs/usage.md) keeps its older rows under the flags that run them today (`--no-overlap`).",
        "",
        "## 1M env steps, the presets in ppo_ddp/configs/",
        "",
        "Every gymnasium MuJoCo v5 env, each on its preset (`python train.py --env-id ENV`), seeds 1-3; the commit "
        "column is the code that ran them. Published: the best PPO figure at 1M env steps we found, and its source.",
        "",
        "| env | ppo_ddp, 1 learner (seeds) | best published PPO, 1M | its source | commit | ppo_ddp, 2 learners (seeds) |",  # noqa: E501
        "|---|---|---|---|---|---|",
    ]
    for env_id, (figure, source) in REFERENCE.items():
        chosen, exact = one_learner_rows(small, env_id)
        one = cell(chosen, 10**6) if exact else _presetcell(chosen)
        commits = ", ".join(sorted({r["commit"] for r in chosen})) or "—"
        mine = [r for r in small if r["env"] == env_id and row_key(r)[4] == "params"]
        two = _presetcell([r for r in mine if r["world_size"] == "2"])
        lines.append(f"| {env_id} | {one} | {figure} | {source} | {commits} | {two} |")
    lines += ["", "![learning curves of these rows](returns_all.png)", ""]
    lines += ten_seed_table(small, published_means(REFERENCE, COMPARED))
    lines += [
        "Each preset's own rounds above, as the README's table quotes them: periodic evaluations (top; rows written "
        "before their eval.csv was kept show the final evaluation alone) and training returns (bottom), the mean "
        "over seeds and its 95% bootstrap interval (scripts/returns_figures.py).",
        "",
        "![evaluation and training returns of each preset's ten seeds](returns.png)",
        "",
    ]
    lines += _overlap_table(small)
    lines += distribution_table(small)
    lines += _world_size_table([r for r in small if settings(r) == SYNC_GAUSSIAN])
    lines += _scale_table([r for r in rows if is_scale(r)])
    lines += _partial_table(rows)
    lines += _dmc_table([r for r in rows if is_dmc(r) and not is_scale(r) and int(r["world_size"]) == 1])
    path.write_text("\n".join(lines))


def _overlap_table(rows: list[dict[str, str]]) -> list[str]:
    """Overlapped rounds against sync ones: one learner, the preset's distribution, seeds 1-3; the ratio of the
    means. The ten-seed table above decides; this one keeps the first A/B and its `--lag-objective` column."""
    envs = [env for env in REFERENCE if _overlap_columns(rows, env)[1]]
    if not envs:
        return []
    lines = [
        "## Overlapped rounds (`--overlap`), 1M env steps, 1 learner",
        "",
        "The learner updates on round k while its actors collect round k+1 with the weights of round k-1 "
        '(docs/design.md, "Overlapped rounds"). Each preset with sync rounds and with the flags, seeds 1-3; the '
        "ratio is the mean's over sync's. The commits are the code that ran each column.",
        "",
        "| env | sync (seeds) | `--overlap` (seeds) | ratio | `--overlap --lag-objective decoupled` (seeds) | ratio "
        "| commits |",
        "|---|---|---|---|---|---|---|",
    ]
    for env_id in envs:
        columns = _overlap_columns(rows, env_id)
        base = np.mean([float(r["eval_mean"]) for r in columns[0]]) if columns[0] else math.nan
        cells = [cell(columns[0], 10**6)]
        for got in columns[1:]:
            mean = np.mean([float(r["eval_mean"]) for r in got]) if got else math.nan
            cells += [cell(got, 10**6), f"{mean / base:.2f}" if got and columns[0] else "—"]
        commits = ", ".join(sorted({r["commit"] for column in columns for r in column}))
        lines.append(f"| {env_id} | {' | '.join(cells)} | {commits} |")
    return lines + ["", "![overlapped rounds](overlap.png)", ""]


def _overlap_columns(rows: list[dict[str, str]], env_id: str) -> list[list[dict[str, str]]]:
    """Seeds 1-3 of sync rounds, of `--overlap` and of `--overlap --lag-objective decoupled`."""
    kinds = (("false", ()), ("true", ()), ("true", ("--lag-objective", "decoupled")))
    return [[r for r in runs_of(rows, env_id, o, other=other) if r["seed"] in BENCHMARK_SEEDS] for o, other in kinds]


SYNC_GAUSSIAN = ("false", "gaussian")
"""The settings every world-size run had (returns_rows.settings): sync rounds and the Gaussian."""


def _world_size_table(rows: list[dict[str, str]]) -> list[str]:
    """The 1M presets on 1, 2 and 4 ranks, both sync modes, each round shape run; the ratio to one learner. The
    flags are those that run each row on today's preset (`--no-overlap` where the preset now overlaps)."""
    envs = sorted({r["env"] for r in rows if int(r["world_size"]) > 1})
    if not envs:
        return []
    lines = [
        "## World sizes and sync modes, 1M env steps",
        "",
        "`torchrun --standalone --nproc_per_node=W` (gloo, CPU) on the same preset and total steps. With the preset's "
        "own shape each rank has its actors, so a round holds W times the samples; the flags in the third column "
        "divide a rank's round by W instead, so that the round (2048 samples) and the mini-batch (64 samples over "
        "all ranks) are one learner's. Every run here had sync rounds and the Gaussian; where a preset has since "
        "switched, its flags say so (`--no-overlap`). Ratio: to one learner's mean with sync rounds and the "
        "Gaussian (target >= 0.9).",
        "",
        "| env | ranks, sync | flags | ppo_ddp (seeds) | ratio |",
        "|---|---|---|---|---|",
    ]
    for env_id in envs:
        mine = [r for r in rows if r["env"] == env_id]
        solo = [r for r in mine if r["world_size"] == "1" and not shape_flags(shlex.join(other_flags(r)))]
        base = [float(r["eval_mean"]) for r in solo]
        shape = lambda r: (int(r["world_size"]), row_key(r)[4], " ".join(flags_today(r)))  # noqa: E731
        for world, mode, flags in sorted({shape(r) for r in mine}):
            got = [r for r in mine if shape(r) == (world, mode, flags)]
            ratio = np.mean([float(r["eval_mean"]) for r in got]) / np.mean(base) if base else math.nan
            lines.append(f"| {env_id} | {world}, {mode} | `{flags}` | {cell(got, 10**6)} | {ratio:.2f} |")
    return lines + ["", "![world sizes](world_sizes.png)", ""]


def _scale_table(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return []
    lines = [
        "## 10M env steps, the large-batch presets in ppo_ddp/configs/scale/",
        "",
        "Wall time and SPS on the 2-core CPU machine (training time summed over the sessions a run spanned; runs "
        "that shared the machine are slower than a run alone).",
        "",
        "Time to score: the env steps and training time at which the periodic deterministic evaluation first "
        "reached 5000 (— when it never did, or the row predates the record).",
        "",
        "| env | ppo_ddp (seeds) | per seed: return, wall, SPS, time to 5000 | Sample Factory APPO | rl_games PPO (training) | target |",  # noqa: E501
        "|---|---|---|---|---|---|",
    ]
    for env_id in sorted({r["env"] for r in rows}):
        mine = [r for r in rows if r["env"] == env_id and int(r["world_size"]) == 1 and own_shape(r)]
        per_seed = "; ".join(
            f"s{r['seed']}: {float(r['eval_mean']):.0f}, {float(r['wall_seconds']) / 3600:.1f} h, "
            f"{int(r['total_steps']) / float(r['wall_seconds']):,.0f}, {_time_to_score(r)}"
            for r in mine
        )
        refs = REFERENCE_10M.get(env_id, ("—", "—", "—"))
        lines.append(f"| {env_id} | {cell(mine, 10**7)} | {per_seed} | {' | '.join(refs)} |")
    return lines + ["", "![10M-step learning curves](returns_10m.png)", ""]


def _time_to_score(row: dict[str, str]) -> str:
    steps, seconds = row.get("first_5000_steps"), row.get("first_5000_seconds")
    return f"{int(steps) / 1e6:.1f}M in {float(seconds) / 3600:.1f} h" if steps else "—"


def _partial_table(rows: list[dict[str, str]]) -> list[str]:
    """The partly observed envs, 1M steps, one learner: each policy on the masked observations, and the robot's
    full-observation preset (the first table) for reference."""
    mine = [r for r in rows if is_partial(r) and int(r["world_size"]) == 1 and not is_scale(r)]
    if not mine:
        return []
    lines = [
        "## Partly observed envs (velocities hidden), 1M env steps (PendulumNoVel-v1: 300k)",
        "",
        "`ppo_ddp/<Robot>NoVel-v5`: the robot's observation without its velocity block (ppo_ddp/envs/partial.py); "
        "`ppo_ddp/PendulumNoVel-v1`: Pendulum's without its angular velocity. "
        "Per policy, the preset (or the flags) each row ran; the last column is the full-observation preset's "
        "mean from the first table. The rows of an MLP preset run with `--policy gru` are the first GRU "
        "(a core each for actor and critic, commits 517a7ac-81f9359); the `*_novel_gru.yaml` presets run the "
        'GRU of today, one core for both (docs/design.md, "Recurrent policies"), or for the policy alone where the '
        "critic reads the env's full observation, an MLP on `info['full_obs']` (`critic_obs`, the column critic "
        'reads; docs/design.md, "A privileged critic").',
        "",
        "| env | policy | critic reads | preset, flags | ppo_ddp (seeds) | full observation, 1 learner |",
        "|---|---|---|---|---|---|",
    ]
    small = gym_1m_rows(rows)  # the first table's rows, whose cell each robot's full-observation column repeats
    for env_id in sorted({r["env"] for r in mine}):
        full_id = env_id.removeprefix(PARTIAL_PREFIX).replace("NoVel", "")
        full = [float(r["eval_mean"]) for r in one_learner_rows(small, full_id)[0]]
        for config, flags in sorted({(r["config"], r["extra_args"]) for r in mine if r["env"] == env_id}):
            got = [r for r in mine if (r["env"], r["config"], r["extra_args"]) == (env_id, config, flags)]
            where = f"{config} `{flags}`" if flags else config
            cells = [env_id, _policy(got[0]), _critic(got[0]), where, cell(got, 10**6), mean_std(full)]
            lines.append(f"| {' | '.join(cells)} |")
    return lines + ["", "![partly observed envs](returns_partial.png)", ""]


def _dmc_table(rows: list[dict[str, str]]) -> list[str]:
    """The DeepMind Control Suite presets, 1M steps, one learner, against CleanRL's PPO (a training return: our
    training return over the last 10% of steps is the like-for-like column)."""
    if not rows:
        return []
    lines = [
        "## DeepMind Control Suite, 1M env steps, 1 learner",
        "",
        "`dm_control/<domain>-<task>-v0` through shimmy (the dmc extra: MuJoCo 3.17.0, the `mujoco` column); "
        "observations flattened in sorted key order (docs/usage.md). Returns are in [0, 1000]: 1000 steps, a reward "
        "in [0, 1] each.",
        "",
        "| env | preset, flags | CleanRL PPO (training return) | ppo_ddp eval (seeds) | ppo_ddp training, last 10% | mujoco |",  # noqa: E501
        "|---|---|---|---|---|---|",
    ]
    for env_id in sorted({r["env"] for r in rows}):
        for config, flags in sorted({(r["config"], r["extra_args"]) for r in rows if r["env"] == env_id}):
            got = [r for r in rows if (r["env"], r["config"], r["extra_args"]) == (env_id, config, flags)]
            where = f"{config} `{flags}`" if flags else config
            train = mean_std([float(r["train_return_last10pct"]) for r in got])
            versions = ", ".join(sorted({r.get("mujoco") or "—" for r in got}))
            ref = REFERENCE_DMC.get(env_id, "—")
            lines.append(f"| {env_id} | {where} | {ref} | {cell(got, 10**6)} | {train} | {versions} |")
    return lines + ["", "![DeepMind Control Suite learning curves](returns_dmc.png)", ""]


def preset_overlap(env_id: str) -> str:
    """Whether env_id's 1M preset overlaps its rounds today: "true" or "false"."""
    path = find_preset(env_id)
    return preset_settings(str(path.relative_to(ROOT)))[0] if path else "false"


def plot_all(rows: list[dict[str, str]], out_dir: Path) -> None:
    def curves(selected: list[tuple[str, dict[str, str]]]) -> list[tuple[str, Path]]:
        return [(label, ROOT / r["curve"]) for label, r in selected if (ROOT / r["curve"]).exists()]

    small = gym_1m_rows(rows)
    # the runs behind the 1M table's cells, not every older row of the env
    one = [(env_id, r) for env_id in REFERENCE for r in one_learner_rows(small, env_id)[0]]
    dmc = [(r["env"], r) for r in rows if is_dmc(r) and not is_scale(r)]
    if dmc:
        plot_curves(curves(dmc), out_dir / "returns_dmc.png")
    plot_curves(curves(one), out_dir / "returns_all.png")
    # the README's cells: each compared robot's ten seeds of its preset's own rounds, evaluations and training
    ten = {env_id: seed_rows(small, env_id, preset_overlap(env_id)) for env_id in COMPARED}
    if any(ten.values()):
        published = published_means(REFERENCE, COMPARED)
        plot_seeds({e: got for e, got in ten.items() if got}, out_dir / "returns.png", published, "best published PPO")
    partial = [(f"{r['env']}, {_policy(r)}", r) for r in rows if is_partial(r) and not is_scale(r)]
    if partial:
        plot_curves(curves(partial), out_dir / "returns_partial.png")
    scale: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        if is_scale(r):
            scale.setdefault(r["env"], []).append(r)
    if scale:
        plot_seeds(scale, out_dir / "returns_10m.png", published_means(REFERENCE_10M, scale), "Sample Factory APPO")
    envs = {r["env"] for r in small if int(r["world_size"]) > 1}
    worlds = [
        (f"{r['env']}, {r['world_size']} rank(s), {row_key(r)[4]}\n{' '.join(flags_today(r))}".strip(), r)
        for r in small
        if r["env"] in envs and settings(r) == SYNC_GAUSSIAN
    ]
    ab = [(env_id, _overlap_columns(small, env_id)[:2]) for env_id in REFERENCE]
    labelled = [(f"{env_id}, {kind}", r) for env_id, (sync, overlap) in ab if overlap
                for kind, column in (("sync", sync), ("--overlap", overlap)) for r in column]  # fmt: skip
    if labelled:
        plot_curves(curves(labelled), out_dir / "overlap.png")
    if worlds:
        plot_curves(curves(worlds), out_dir / "world_sizes.png")
