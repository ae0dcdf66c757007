"""python -m ppo_ddp.tune's search spaces: a bad space is refused naming its key (exit 2, one line), the shipped
spaces are valid and found by name, the recurrent policy's fields can be searched, and each env of a space without a
base starts from its own preset."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

optuna = pytest.importorskip("optuna")

from test_tune import ENV, ROOT, TINY, WITHOUT_OPTUNA, bad, tune  # noqa: E402

from ppo_ddp.configuration.presets import space_file  # noqa: E402
from ppo_ddp.errors import ConfigError  # noqa: E402
from ppo_ddp.search.space import load_space, parse_space  # noqa: E402


@pytest.mark.parametrize(
    "doc, message",
    [
        (bad(params__learnin_rate={"type": "float", "low": 0.1, "high": 1}), "params.learnin_rate: not a Config field"),
        (bad(params__env_id={"type": "categorical", "choices": ["Ant-v5"]}), "params.env_id: not settable here"),
        (bad(params__gamma={"type": "uniform"}), "params.gamma.type='uniform': must be one of float, int, categorical"),
        (bad(params__gamma={"type": "float", "low": 0.99, "high": 0.9}), "params.gamma: low=0.99, high=0.9: must be"),
        (bad(params__ent_coef={"type": "float", "low": 0.0, "high": 0.1, "log": True}), "true needs low > 0"),
        (bad(params__save_interval={"type": "float", "low": 1, "high": 4}), "field save_interval takes int or"),
        (bad(params__gamma={"type": "float", "low": 0.9, "high": 1.5}), "params.gamma: gamma=1.5: must be in (0, 1]"),
        (bad(params__gamma={"type": "float", "low": 0.9, "high": 0.99, "q": 1}), "(allowed: low, high, log, step)"),
        (bad(params__activation={"type": "categorical", "choices": ["tanh", "swish"]}), "must be one of tanh, relu"),
        (bad(params__total_timesteps={"type": "int", "low": 64, "high": 128}), "also in fixed"),
        (bad(fixed__eval_interval=3), "fixed.eval_interval: not settable here (set by eval_every_steps)"),
        (bad(envs={"HalfCheetah-v5": 0}), "the target score must be a number > 0"),
        (bad(envs={"NoSuchEnv-v0": 100}), "env_id='NoSuchEnv-v0': not a registered gymnasium env"),
        (bad(pruner={"patience": 3}), "pruner.patience: unknown (allowed: n_startup_trials"),
        (bad(enqueue=[{"rollout_length": 40}]), "enqueue[0].rollout_length=40: outside its distribution"),
        (bad(search={}), "unknown key 'search' (allowed: base, envs"),
    ],
)
def test_a_bad_space_is_refused_naming_the_key(doc, message, tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as e:
        load_space(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)


def test_the_command_line_says_one_line_and_exits_2(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(bad(params__learnin_rate={"type": "float", "low": 0.1, "high": 1})))
    proc = tune("--space", path, "--study", "x", "--n-trials", 1, "--out", tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("tune.py: error: ")
    assert "params.learnin_rate: not a Config field (allowed: " in proc.stderr and "learning_rate" in proc.stderr
    cmd = [sys.executable, "-c", WITHOUT_OPTUNA, "ppo_ddp.tune", "--study", "x", "--report"]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "pip install" in proc.stderr


def test_a_packaged_space_is_found_by_its_name():
    assert load_space(space_file("halfcheetah")).source.endswith("ppo_ddp/configs/tune/halfcheetah.yaml")
    with pytest.raises(ValueError, match="no such file, nor a search space of ppo_ddp .they are: halfcheetah, loco"):
        space_file("halfcheeta")


@pytest.mark.parametrize("path", sorted((ROOT / "ppo_ddp" / "configs" / "tune").glob("*.yaml")), ids=lambda p: p.stem)
def test_the_shipped_spaces_are_valid(path):
    space = load_space(path)
    assert space.enqueue  # each starts from its base preset's values


def test_the_recurrent_policy_s_fields_can_be_searched():
    space = parse_space(
        {
            "base": "hopper_novel",
            "envs": {"ppo_ddp/HopperNoVel-v5": 2500},
            "eval_every_steps": 100_000,
            "params": {
                "policy": {"type": "categorical", "choices": ["mlp", "gru"]},
                "rnn_hidden_size": {"type": "categorical", "choices": [32, 64, 128]},
                "seq_length": {"type": "categorical", "choices": [8, 16, 32]},
            },
            "enqueue": [{"policy": "gru", "rnn_hidden_size": 64, "seq_length": 16}],
        },
        "gru space",
    )
    assert [p.name for p in space.params] == ["policy", "rnn_hidden_size", "seq_length"]


def test_without_base_each_env_starts_from_its_own_preset():
    doc = {k: v for k, v in TINY.items() if k != "base"}
    doc["envs"] = {"Hopper-v5": 2500, "Swimmer-v5": 280, "Pendulum-v1": 200}  # Pendulum-v1 has no preset
    doc["fixed"] = {"total_timesteps": 256, "update_epochs": 1}
    doc["params"] = {"learning_rate": TINY["params"]["learning_rate"]}
    doc["enqueue"] = [{"learning_rate": 3.0e-4}]
    space = parse_space(doc, "per-env space")
    trial = {"learning_rate": 5.0e-4}
    hopper, swimmer, pendulum = (space.trial_values(trial, env) for env in doc["envs"])
    assert hopper["rollout_length"] == 1024 and hopper["gamma"] == 0.995  # ppo_ddp/configs/hopper.yaml
    assert swimmer["gamma"] == 0.9999 and swimmer["num_minibatches"] == 16  # ppo_ddp/configs/swimmer.yaml
    assert pendulum["env_id"] == "Pendulum-v1" and "gamma" not in pendulum  # Config's defaults
    assert {hopper["learning_rate"], swimmer["learning_rate"], hopper["total_timesteps"]} == {5.0e-4, 256}
