"""The preset of an env, chosen by `--env-id` without `--config` (ppo_ddp/configuration/presets.py), presets by name,
and every preset in ppo_ddp/configs/ training two rounds of its own shape."""

from __future__ import annotations

import csv
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ppo_ddp.configuration.config import Config
from ppo_ddp.configuration.loading import load_config, load_yaml_defaults, parse_config
from ppo_ddp.configuration.presets import (
    PRESET_DIR,
    config_file,
    describe,
    find_preset,
    flag_value,
    preset_names,
    presets,
)
from ppo_ddp.configuration.topology import actors_for, usable_cores
from ppo_ddp.envs.make import is_dm_control, missing_dm_control
from ppo_ddp.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted((ROOT / "ppo_ddp" / "configs").glob("*.yaml"))
HOPPER = ROOT / "ppo_ddp" / "configs" / "hopper.yaml"
MUJOCO_V5 = (
    "Ant HalfCheetah Hopper Humanoid HumanoidStandup InvertedPendulum InvertedDoublePendulum Pusher Reacher Swimmer "
    "Walker2d"
).split()


def values(cfg: Config) -> dict:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k != "config"}


def preset_values(path: Path) -> dict:
    return values(Config(**load_yaml_defaults(path)))


def test_env_id_without_config_trains_on_the_envs_preset():
    cfg = parse_config(["--env-id", "Hopper-v5"])
    assert cfg.config == "hopper" and config_file(cfg.config) == HOPPER
    assert values(cfg) == preset_values(HOPPER)
    assert cfg.rollout_length == 1024 and cfg.gamma == 0.995  # hopper.yaml's, not Config's 128 and 0.99


@pytest.mark.parametrize("spelling", [["--env-id", "Hopper-v5"], ["--env-id=Hopper-v5"], ["--env_id", "Hopper-v5"]])
def test_a_flag_still_overrides_a_preset_value(spelling):
    cfg = parse_config(["--gamma", "0.97", *spelling])
    assert cfg.gamma == 0.97
    assert values(cfg) == {**preset_values(HOPPER), "gamma": 0.97}


def test_a_num_actors_flag_overrides_the_presets_actors_per_gpu():
    cfg = parse_config(["--env-id", "Ant-v5", "--num-actors", "4"])  # ant.yaml says actors_per_gpu: auto
    assert (cfg.num_actors, cfg.actors_per_gpu, cfg.num_envs) == (4, "auto", 64)
    both = parse_config(["--env-id", "Ant-v5", "--num-actors", "4", "--actors-per-gpu", "4"])
    assert (both.num_actors, both.actors_per_gpu) == (4, 4)


@pytest.mark.parametrize(
    "flags, split",
    [
        ([], ("auto", 64, None)),  # the preset's round; the cores decide the actors
        (["--envs-per-actor", "16"], ("auto", 64, 16)),  # the round kept: 4 actors
        (["--actors-per-gpu", "1"], (1, 64, None)),  # the round kept: 1 actor of 64 envs
        (["--actors-per-gpu", "2", "--envs-per-actor", "4"], (2, None, 4)),  # both numbers: a round of 8 envs
        (["--num-envs", "8"], ("auto", 8, None)),
    ],
)
def test_split_flags_replace_the_presets_round_only_where_they_contradict_it(flags, split):
    cfg = parse_config(["--env-id", "Ant-v5", *flags])
    assert (cfg.actors_per_gpu, cfg.num_envs, cfg.envs_per_actor) == split


def test_config_replaces_the_preset(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("env_id: Hopper-v5\nlearning_rate: 1.0e-3\n")
    cfg = parse_config(["--config", str(own)])
    assert cfg.config == str(own)
    assert values(cfg) == values(Config(env_id="Hopper-v5", learning_rate=1e-3))  # none of hopper.yaml's values


def test_no_arguments_train_halfcheetah_on_its_preset():
    cfg = parse_config([])
    assert cfg.env_id == "HalfCheetah-v5" and config_file(cfg.config) == PRESET_DIR / "halfcheetah.yaml"


def test_an_env_without_a_preset_gets_the_defaults():
    cfg = parse_config(["--env-id", "Pendulum-v1"])
    assert cfg.config is None and values(cfg) == values(Config(env_id="Pendulum-v1"))
    assert describe(cfg.env_id, cfg.policy, cfg.config) == (
        "no preset for Pendulum-v1 in ppo_ddp, so Config's defaults (tuned on HalfCheetah-v5)"
    )


def test_the_gru_flag_picks_the_envs_gru_preset_else_its_mlp_one():
    gru = parse_config(["--env-id", "ppo_ddp/HopperNoVel-v5", "--policy", "gru"])
    assert gru.config == "hopper_novel_gru" and gru.policy == "gru"
    fallback = parse_config(["--env-id", "Hopper-v5", "--policy", "gru"])
    assert fallback.config == "hopper" and fallback.policy == "gru"


def test_the_start_line_says_which_preset_or_another_config():
    assert describe("Hopper-v5", "mlp", "hopper") == "preset hopper"
    assert describe("Hopper-v5", "mlp", "ppo_ddp/configs/hopper.yaml") == "preset hopper"  # the same file
    assert describe("Hopper-v5", "mlp", "ant") == "config ant"  # ant's values on Hopper
    assert describe("Humanoid-v5", "mlp", "scale/humanoid") == "config scale/humanoid"
    # Config(env_id="Hopper-v5") made in Python: its own values, though the env has a preset
    assert describe("Hopper-v5", "mlp", None) == "Config's defaults (tuned on HalfCheetah-v5), not the preset hopper"


def test_config_takes_a_presets_name_or_a_file(tmp_path):
    by_name = parse_config(["--config", "scale/humanoid", "--seed", "3"])
    by_file = parse_config(["--config", str(PRESET_DIR / "scale" / "humanoid.yaml"), "--seed", "3"])
    assert by_name.config == "scale/humanoid" and values(by_name) == values(by_file)
    assert values(parse_config(["--config=hopper.yaml"])) == preset_values(HOPPER)


def test_an_unknown_config_is_one_line_naming_the_presets(capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(["--config", "hoper"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    assert err.endswith(f"error: config='hoper': no such file, nor a preset of ppo_ddp (they are: "
                        f"{', '.join(preset_names())})")  # fmt: skip


def test_the_api_loads_configs_as_the_command_line_does():
    assert load_config(env_id="Hopper-v5", seed=2) == parse_config(["--env-id", "Hopper-v5", "--seed", "2"])
    assert load_config("scale/ant", hidden_sizes=[128, 128]) == parse_config(
        ["--config", "scale/ant", "--hidden-sizes", "128", "128"]
    )
    assert load_config(env_id="ppo_ddp/HopperNoVel-v5", policy="gru").config == "hopper_novel_gru"
    assert load_config() == parse_config([])
    with pytest.raises(ConfigError, match="^seedd: not a Config field"):
        load_config(seedd=1)
    with pytest.raises(ConfigError, match="^policy='lstm': must be one of mlp, gru"):
        load_config(policy="lstm")


def test_every_packaged_preset_loads_and_resolves():
    names = preset_names()
    assert {"hopper", "scale/humanoid", "scale/ant"} <= set(names) and len(names) == len(PRESETS) + 2
    for name in names:  # a valid config, whose env (and policy) find it again where it is that env's preset
        cfg = parse_config(["--config", name], check_env=False)  # the dmc presets' envs need the dmc extra
        assert config_file(name).is_file() and cfg.config == name
        if "/" not in name:
            assert find_preset(cfg.env_id, cfg.policy) == config_file(name)


def test_every_gymnasium_mujoco_v5_env_has_a_preset():
    assert {f"{name}-v5" for name in MUJOCO_V5} <= {env for env, policy in presets() if policy == "mlp"}


def test_presets_are_found_by_their_own_env_and_policy_keys(tmp_path):
    (tmp_path / "a.yaml").write_text("env_id: Hopper-v5\n")
    (tmp_path / "b.yaml").write_text("env_id: Hopper-v5\npolicy: gru\n")
    assert find_preset("Hopper-v5", "gru", tmp_path) == tmp_path / "b.yaml"
    assert find_preset("Hopper-v5", "mlp", tmp_path) == tmp_path / "a.yaml"
    assert find_preset("Ant-v5", "mlp", tmp_path) is None
    (tmp_path / "c.yaml").write_text("env_id: Hopper-v5\npolicy: mlp\n")
    with pytest.raises(ValueError, match="a.yaml and .*c.yaml are both for env Hopper-v5, policy mlp"):
        find_preset("Hopper-v5", "mlp", tmp_path)


def test_flag_value_reads_the_last_spelling_tyro_would_keep():
    assert flag_value(["--env-id", "A", "--env_id=B"], "env-id") == "B"
    assert flag_value(["--seed", "1"], "env-id") is None
    assert flag_value(["--env-id"], "env-id") is None  # tyro says what is missing


# ---- every preset trains two rounds ------------------------------------------------------------------------------
# The runs below say compile=False themselves (the compiled step has its own tests): dynamo's config patched here
# would not reach the thread the step compiles on.
@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_preset_loads_and_runs_two_rounds(preset, tmp_path, restore_signal_handlers, capsys):
    from ppo_ddp.runner.launch import main

    env_id = load_yaml_defaults(preset)["env_id"]
    if is_dm_control(env_id) and missing_dm_control() is not None:
        pytest.skip("needs the dmc extra (.ci/run runs it in its own step)")
    policy = load_yaml_defaults(preset).get("policy", "mlp")
    cfg = parse_config(["--env-id", env_id, "--policy", policy, "--runs-dir", str(tmp_path), "--run-name", "p"])
    assert config_file(cfg.config) == preset and PRESET_DIR == preset.parent  # the env id alone finds it
    per_round = cfg.num_envs * cfg.rollout_length
    # round 0 seeds the statistics, then two rounds train, of the preset's shape and mini-batches; one epoch each
    # and no evaluation (its full episodes), to keep 20 presets to seconds each: both have tests of their own. A
    # long actor timeout: on a loaded machine a round of 1024 steps per env can outlast the default's 60 s margin.
    short = dict(total_timesteps=3 * per_round, eval_interval=0, update_epochs=1, actor_timeout=600.0, compile=False)
    main(dataclasses.replace(cfg, **short))
    out = capsys.readouterr().out
    assert f"{env_id}, preset {cfg.config}: 2 rounds of {per_round} steps" in out
    cores, limit = usable_cores()  # actors_per_gpu auto: the start line and config.yaml say what it became
    actors = actors_for(cfg.num_envs, cores)
    assert f" usable ({limit}): {actors} actor" in out
    saved = yaml.safe_load((tmp_path / "p" / "config.yaml").read_text())
    assert saved["split"].startswith(f"{cores} core") and (saved["config"]["actors_per_gpu"], saved["config"][
        "envs_per_actor"], saved["config"]["num_envs"]) == (actors, cfg.num_envs // actors, cfg.num_envs)  # fmt: skip

    with open(tmp_path / "p" / "metrics.csv", newline="") as f:
        assert [int(r["global_step"]) for r in csv.DictReader(f)] == [2 * per_round, 3 * per_round]


def test_auto_takes_the_actors_from_the_cores_of_its_affinity(tmp_path, repo_root):
    # pinned to one core, Walker2d's round of 16 envs is 1 actor's; in a fresh process, as taskset starts it
    flags = ["--env-id", "Walker2d-v5", "--total-timesteps", "192", "--rollout-length", "4", "--num-minibatches", "1",
             "--eval-interval", "0", "--no-compile", "--runs-dir", str(tmp_path), "--run-name", "one"]  # fmt: skip
    proc = subprocess.run(["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "train.py", *flags],
                          cwd=repo_root, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 learner(s) on cpu, 1 core usable (affinity): 1 actor x 16 envs" in proc.stdout
    saved = yaml.safe_load((tmp_path / "one" / "config.yaml").read_text())["config"]
    assert (saved["actors_per_gpu"], saved["envs_per_actor"], saved["num_envs"]) == (1, 16, 16)


def test_a_run_without_a_preset_says_so_on_its_start_line(tmp_path, restore_signal_handlers, capsys):
    from ppo_ddp.runner.launch import main

    tiny = "--actors-per-gpu 1 --envs-per-actor 2 --rollout-length 32 --num-minibatches 4 --update-epochs 1".split()
    main(parse_config(["--env-id", "Pendulum-v1", *tiny, "--total-timesteps", "192", "--eval-interval", "0",
                       "--no-compile", "--runs-dir", str(tmp_path), "--run-name", "p"]))  # fmt: skip
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("Pendulum-v1, no preset for Pendulum-v1 in ppo_ddp, so Config's defaults (tuned on "
                            "HalfCheetah-v5): 2 rounds of 64 steps")  # fmt: skip


def test_a_run_that_recomputes_advantages_trains_its_rounds(tmp_path, restore_signal_handlers):
    # The trainer's side of recompute_advantages: the next observations in the layout, the rewards scaled as the
    # actors did, no advantage statistics merged across ranks; with a critic of normalised returns.
    from ppo_ddp.runner.launch import main

    tiny = "--actors-per-gpu 1 --envs-per-actor 2 --rollout-length 32 --num-minibatches 4 --update-epochs 2".split()
    main(parse_config(["--env-id", "Hopper-v5", *tiny, "--recompute-advantages", "--normalize-value",
                       "--total-timesteps", "192", "--eval-interval", "0", "--no-compile", "--runs-dir",
                       str(tmp_path), "--run-name", "r"]))  # fmt: skip
    with open(tmp_path / "r" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["global_step"]) for r in rows] == [128, 192]
    assert all(float(r["losses/value_loss"]) > 0 and float(r["losses/epochs"]) == 2 for r in rows)
