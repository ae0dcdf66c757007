"""The command line: YAML defaults, flag overrides, --help, and validation before anything starts.

A user who mistypes a value must get one line that names the field, the value and what is allowed, and
exit status 2 (the argparse convention), not a traceback from deep inside a worker minutes later. The
subprocess tests run `python train.py` exactly as a user would; the rest run in-process, which is cheap.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys

import pytest

import ppo_ddp.configuration.config as config_module
from ppo_ddp.configuration.config import Config, config_from_dict, config_to_dict
from ppo_ddp.configuration.loading import load_yaml_defaults, parse_config
from ppo_ddp.configuration.validation import validate
from ppo_ddp.envs.make import missing_dm_control
from ppo_ddp.errors import ConfigError


@pytest.fixture
def yaml_file(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "cfg.yaml"
        path.write_text(text)
        return str(path)

    return write


# ---- `python train.py ...` in a subprocess ----------------------------------------------------------------

# Each case: (argv builder given a yaml writer, fragment of the one error line).
CLI_CASES = {
    "unknown yaml key": (
        lambda y: ["--config", y("lerning_rate: 0.001\n")],
        r"unknown key 'lerning_rate' in .*cfg\.yaml \(allowed: .*learning_rate",
    ),
    "wrong yaml type": (lambda y: ["--config", y("update_epochs: ten\n")], r"update_epochs='ten': must be an integer"),
    "non-positive count": (lambda y: ["--envs-per-actor", "0"], r"envs_per_actor=0: must be a positive integer"),
    "gamma zero": (lambda y: ["--gamma", "0"], r"gamma=0\.0: must be in \(0, 1\]"),
    "gamma above one": (lambda y: ["--gamma", "1.5"], r"gamma=1\.5: must be in \(0, 1\]"),
    "gae_lambda outside": (lambda y: ["--gae-lambda", "1.1"], r"gae_lambda=1\.1: must be in \[0, 1\]"),
    "bad choice": (lambda y: ["--policy", "lstm"], r"policy='lstm': must be one of mlp, gru"),
    "rollout not split": (
        lambda y: ["--num-minibatches", "7"],
        r"num_minibatches=7: must divide the 2048 samples a learner collects per round",
    ),
    "unknown env id": (
        lambda y: ["--env-id", "NoSuchRobot-v5"],
        r"env_id='NoSuchRobot-v5': not a registered gymnasium env",
    ),
    "discrete actions": (
        lambda y: ["--env-id", "CartPole-v1"],
        r"env_id='CartPole-v1': action space is Discrete\(2\).*Box",
    ),
}
if missing_dm_control():  # the venv without the dmc extra (CI's main step); tests/test_dmc.py runs with it
    CLI_CASES["dm_control without its install"] = (
        lambda y: ["--env-id", "dm_control/cheetah-run-v0"],
        r"env_id='dm_control/cheetah-run-v0': needs dm_control and shimmy: pip install mujoco==3\.17\.0 dm-control",
    )


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_input_exits_2_with_one_line(case, run_train, yaml_file, tmp_path):
    build_args, message = CLI_CASES[case]
    # Should validation ever let a case through, train one round into tmp_path, not for minutes into runs/.
    proc = run_train(*build_args(yaml_file), "--total-timesteps", "1", "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(r"train\.py: error: " + message + ".*", lines[0]), lines[0]
    assert proc.stdout == ""  # nothing started


# ---- YAML defaults and flags -----------------------------------------------------------------------------

YAML = """\
env_id: Hopper-v5
gamma: 0.95
hidden_sizes: [32, 32]
learning_rate: 1          # an int for a float field is fine
normalize_reward: false
target_kl: 0.02
num_actors: null
"""


def test_yaml_sets_defaults(yaml_file):
    path = yaml_file(YAML)
    cfg = parse_config(["--config", path], check_env=False)
    assert cfg.env_id == "Hopper-v5"
    assert cfg.gamma == 0.95
    assert cfg.hidden_sizes == (32, 32)  # YAML lists become the field's tuple
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert cfg.normalize_reward is False
    assert cfg.target_kl == 0.02
    assert cfg.num_actors is None
    assert cfg.config == path  # the run's saved config records where its defaults came from
    assert cfg.update_epochs == Config().update_epochs  # keys the file does not name keep the built-in default


@pytest.mark.parametrize("style", ["separate", "equals"])
def test_flags_override_yaml(yaml_file, style):
    path = yaml_file(YAML)
    config_args = ["--config", path] if style == "separate" else [f"--config={path}"]
    cfg = parse_config([*config_args, "--gamma", "0.9", "--hidden-sizes", "128", "256"], check_env=False)
    assert cfg.gamma == 0.9
    assert cfg.hidden_sizes == (128, 256)
    assert cfg.env_id == "Hopper-v5"  # not overridden: still from the file


def test_flags_override_yaml_wherever_config_appears(yaml_file):
    path = yaml_file(YAML)
    assert parse_config(["--gamma", "0.9", "--config", path], check_env=False).gamma == 0.9


def test_empty_yaml_is_the_defaults(yaml_file):
    assert load_yaml_defaults(yaml_file("# nothing here\n")) == {}


def field_docstrings() -> dict[str, str]:
    """Config's attribute docstrings, read from the source independently of tyro."""
    tree = ast.parse(inspect.getsource(config_module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    docs = {}
    for stmt, following in zip(cls.body, cls.body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
        ):
            docs[stmt.target.id] = following.value.value
    return docs


def squash(text: str) -> str:
    """Help text without rich's box drawing and line wrapping."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_every_field_has_a_docstring():
    assert set(field_docstrings()) == {f.name for f in dataclasses.fields(Config)}


def test_help_lists_every_field_with_its_docstring(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--help"])
    assert exit_info.value.code == 0
    text = squash(capsys.readouterr().out)
    for name, doc in field_docstrings().items():
        assert "--" + name.replace("_", "-") in text, name
        assert squash(doc) in text, name


def test_help_flows_as_prose_the_terminal_wraps(capsys, monkeypatch):
    # A docstring's source lines break at ruff's 120 columns; the help must not: on a terminal wide enough,
    # each flag's help is one line that holds its whole docstring, sentences unbroken.
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    lines = capsys.readouterr().out.splitlines()
    docs = {"description": Config.__doc__, **field_docstrings()}
    multi_line = [name for name, doc in docs.items() if "\n" in doc.strip()]
    assert {"sync_mode", "compile", "learner_threads"} <= set(multi_line)
    for name in docs:
        assert any(" ".join(docs[name].split()) in line for line in lines), name


# ---- validation, in-process ------------------------------------------------------------------------------


def exit_line(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv, check_env=False)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--total-timesteps", "0"], "total_timesteps=0: must be a positive integer"),
        (["--num-actors", "-1"], "num_actors=-1: must be a positive integer"),
        (["--update-epochs", "0"], "update_epochs=0: must be a positive integer"),
        (["--gae-lambda", "-0.1"], r"gae_lambda=-0.1: must be in [0, 1]"),
        (["--learning-rate", "0"], "learning_rate=0.0: must be > 0"),
        (["--ent-coef", "-0.01"], "ent_coef=-0.01: must be >= 0"),
        (["--target-kl", "0"], "target_kl=0.0: must be > 0 or None"),
        (["--lag-weight-max", "0"], "lag_weight_max=0.0: must be > 0 or None"),
        (["--no-overlap", "--lag-weight-max", "1"], "lag_weight_max=1.0: needs overlap"),
        (["--hidden-sizes", "64", "0"], "hidden_sizes=[64, 0]: must be one or more positive integers"),
        (["--num-minibatches", "3"], "num_minibatches=3: must divide the 2048 samples a learner collects per round"),
        (
            ["--actors-per-gpu", "1", "--envs-per-actor", "3", "--rollout-length", "5", "--num-minibatches", "2"],
            "(num_envs 3 * rollout_length 5)",
        ),
        (["--actors-per-gpu", "3"], "actors_per_gpu=3: must divide num_envs 16 (the envs of a learner's round)"),
        (["--envs-per-actor", "5"], "envs_per_actor=5: must divide num_envs 16"),
        (["--actors-per-gpu", "some"], "actors_per_gpu='some': must be an integer or auto"),
        (["--num-envs", "0"], "num_envs=0: must be a positive integer"),
        (["--num-envs", "8", "--actors-per-gpu", "2", "--envs-per-actor", "8"], "num_envs=8 must equal"),
        (
            ["--num-actors", "8", "--num-gpus", "2", "--actors-per-gpu", "3"],
            "num_actors=8 must equal num_gpus * actors_per_gpu",
        ),
        (["--policy", "gru", "--recompute-advantages"], 'recompute_advantages=True: needs policy "mlp"'),
        (["--rnn-head-sizes", "64"], 'rnn_head_sizes=[64]: needs policy "gru"'),
        (["--policy", "gru", "--rnn-head-sizes", "64", "0"], "rnn_head_sizes=[64, 0]: must be positive integers"),
        (["--resume", "no/such/checkpoint.pt"], "resume='no/such/checkpoint.pt': must be 'auto' or the path"),
        (["--config", "no/such/file.yaml"], "config='no/such/file.yaml': no such file"),
        (["--config"], "config: --config needs a preset's name or the path of a YAML file"),
    ],
)
def test_validation_messages(argv, message, capsys):
    assert message in exit_line(argv, capsys)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--policy", "lstm"], "policy='lstm': must be one of mlp, gru"),
        (["--policy=lstm"], "policy='lstm': must be one of mlp, gru"),
        (["--sync_mode", "x"], "sync_mode='x': must be one of params, gradients"),
        (["--sync-mode=gradients", "--sync-mode", "x"], "sync_mode='x': must be one of params, gradients"),
        (["--activation", "sigmoid"], "activation='sigmoid': must be one of tanh, relu, elu"),
        (["--mp_start_method=fork"], "mp_start_method='fork': must be one of forkserver, spawn"),
        (["--seed", "abc"], "seed='abc': must be an integer"),
        (["--gamma", "abc"], "gamma='abc': must be a number"),
        (["--num-actors", "x"], "num_actors='x': must be an integer or None"),
        (["--hidden-sizes", "64", "x"], "hidden_sizes=['64', 'x']: must be one or more integers"),
        (["--seed"], "seed: --seed needs a value"),
        (["--no-such-flag", "3"], "unrecognized arguments: --no-such-flag 3"),
        (["--lerning-rate", "1e-4"], "unrecognized arguments: --lerning-rate 1e-4; did you mean --learning-rate?"),
    ],
)
def test_flags_tyro_rejects_are_one_line(argv, message, capsys, monkeypatch):
    # the project's line, not tyro's box: `PROG: error: name=value: what is allowed`, exit status 2
    monkeypatch.setattr(sys, "argv", ["/somewhere/ppo-ddp-train"])
    assert exit_line(argv, capsys) == f"ppo-ddp-train: error: {message}"


@pytest.mark.parametrize(
    "text, message",
    [
        ("env-id: Hopper-v5\n", "did you mean 'env_id'?"),
        ("- gamma\n- 0.9\n", "must be a YAML mapping"),
        ("gamma: [0.9\n", "not a readable YAML file"),
        ("hidden_sizes: 64\n", "hidden_sizes=64: must be a list of integers"),
        ("normalize_obs: 1\n", "normalize_obs=1: must be true or false"),
        ("activation: sigmoid\n", "activation='sigmoid': must be one of tanh, relu, elu"),
        ("num_gpus: true\n", "num_gpus=True: must be an integer"),
        ("gamma: 2\n", "gamma=2.0: must be in (0, 1]"),  # a well-typed YAML value is still validated
        ("learning_rate: 1e-4\n", "learning_rate='1e-4': must be a number (YAML reads 1e-4 as text: write 1.0e-4)"),
    ],
)
def test_yaml_errors(text, message, yaml_file, capsys):
    assert message in exit_line(["--config", yaml_file(text)], capsys)


def test_the_defaults_are_valid_including_the_env():
    # `python train.py` with no flags must start: HalfCheetah-v5 on one CPU learner.
    validate(Config(), check_env=True)


def test_validate_raises_config_error_for_programmatic_use():
    with pytest.raises(ConfigError, match="gamma"):
        validate(dataclasses.replace(Config(), gamma=0.0), check_env=False)


def test_config_dict_round_trip_uses_plain_types():
    # What checkpoints and the run's saved YAML hold: no tuples, no dataclass.
    cfg = dataclasses.replace(Config(), hidden_sizes=(256, 256), target_kl=0.01, num_actors=4)
    values = config_to_dict(cfg)
    assert values["hidden_sizes"] == [256, 256]
    assert config_from_dict(values) == cfg
    # A checkpoint from a newer version with an extra key still loads.
    assert config_from_dict({**values, "some_future_field": 1}) == cfg


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().gamma = 0.5  # type: ignore[misc]
