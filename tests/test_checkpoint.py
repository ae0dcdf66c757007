"""Checkpoint files: weights_only round trip, atomic writes, clear errors (ppo_ddp.storage.checkpoint)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import signal_handlers_kept

from ppo_ddp.configuration.config import Config, config_from_dict, config_to_dict
from ppo_ddp.errors import CheckpointError
from ppo_ddp.evaluation.playback import load_policy
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import Moments, compute_batch_moments
from ppo_ddp.storage.checkpoint import load_checkpoint, mean_policy, save_checkpoint


def trained_model_and_optimizer(seed: int = 0) -> tuple[ActorCritic, torch.optim.Adam]:
    """A small actor-critic after one Adam step, so the optimizer has moments worth saving."""
    torch.manual_seed(seed)
    model = ActorCritic(obs_dim=5, act_dim=2, hidden_sizes=(16, 16))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    obs = torch.randn(8, 5)
    action, _, _ = model.sample(obs)
    log_prob, entropy, value = model.evaluate(obs, action)
    (value.pow(2).mean() - log_prob.mean() - entropy.mean()).backward()
    optimizer.step()
    return model, optimizer


def full_payload(model, optimizer, obs_rms: Moments, return_rms: Moments) -> dict:
    """The two mandatory keys plus the resume data the trainer keeps beside them."""
    return {
        "actor": model.state_dict(),
        "obs_rms_state": obs_rms.to_state(),
        "return_rms_state": return_rms.to_state(),
        "optimizer": optimizer.state_dict(),
        "iteration": 12,
        "global_step": 24576,
        "torch_rng_state": torch.get_rng_state(),
        "config": config_to_dict(Config()),
    }


@pytest.fixture
def payload():
    rng = np.random.default_rng(0)
    model, optimizer = trained_model_and_optimizer()
    obs_rms = compute_batch_moments(rng.normal(3.0, 2.0, size=(100, 5)))
    return_rms = compute_batch_moments(rng.normal(0.0, 5.0, size=300))
    return full_payload(model, optimizer, obs_rms, return_rms)


def test_round_trip_loads_with_weights_only(tmp_path, payload):
    path = tmp_path / "model_run.pt"
    save_checkpoint(path, payload)

    # Plain torch.load with weights_only=True, as any outside tool would read it.
    raw = torch.load(path, weights_only=True)
    assert raw.keys() == payload.keys()
    for name, tensor in payload["actor"].items():
        assert torch.equal(raw["actor"][name], tensor), name

    loaded = load_checkpoint(path)
    model = ActorCritic(obs_dim=5, act_dim=2, hidden_sizes=(16, 16))
    model.load_state_dict(loaded["actor"])
    reference, _ = trained_model_and_optimizer()
    obs = torch.randn(4, 5)
    assert torch.equal(model.action_mean(obs), reference.action_mean(obs))
    assert torch.equal(model.value(obs), reference.value(obs))

    for key in ("obs_rms_state", "return_rms_state"):
        want, got = Moments.from_state(payload[key]), Moments.from_state(loaded[key])
        np.testing.assert_array_equal(got.mean, want.mean)
        np.testing.assert_array_equal(got.var, want.var)
        assert got.count == want.count  # restored as is: never multiplied by a world size on resume

    # Adam moments and step survive, so a resumed run continues the same optimisation.
    fresh_model, _ = trained_model_and_optimizer(seed=1)
    optimizer = torch.optim.Adam(fresh_model.parameters(), lr=1e-3)
    optimizer.load_state_dict(loaded["optimizer"])
    state = optimizer.state_dict()["state"]
    for index, saved in payload["optimizer"]["state"].items():
        assert torch.equal(state[index]["exp_avg"], saved["exp_avg"])
        assert torch.equal(state[index]["exp_avg_sq"], saved["exp_avg_sq"])

    assert loaded["iteration"] == 12 and loaded["global_step"] == 24576
    assert torch.equal(loaded["torch_rng_state"], payload["torch_rng_state"])
    assert config_from_dict(loaded["config"]) == Config()


def test_obs_rms_state_may_be_none(tmp_path):
    # A run with normalize_obs=False still writes the key, with None.
    model, _ = trained_model_and_optimizer()
    save_checkpoint(tmp_path / "m.pt", {"actor": model.state_dict(), "obs_rms_state": None})
    assert load_checkpoint(tmp_path / "m.pt")["obs_rms_state"] is None


def test_save_leaves_no_temporary_files(tmp_path, payload):
    path = tmp_path / "model_run.pt"
    save_checkpoint(path, payload)
    payload["iteration"] = 13
    save_checkpoint(path, payload)  # overwrite, as every save_interval does
    assert os.listdir(tmp_path) == ["model_run.pt"]
    assert load_checkpoint(path)["iteration"] == 13


def test_save_creates_the_run_folder(tmp_path, payload):
    path = tmp_path / "runs" / "new_run" / "model_new_run.pt"
    save_checkpoint(path, payload)
    assert load_checkpoint(path)["global_step"] == 24576


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, payload):
    # A crash mid-write (here: something torch.save cannot serialise) must not destroy the last good
    # checkpoint, nor leave a half-written temp file behind.
    path = tmp_path / "model_run.pt"
    save_checkpoint(path, payload)
    before = path.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 (whatever pickle raises for a lambda: the file must stay whole)
        save_checkpoint(path, {**payload, "iteration": lambda: 13})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model_run.pt"]
    assert load_checkpoint(path)["iteration"] == 12


def test_saving_without_the_required_keys_is_refused(tmp_path):
    with pytest.raises(ValueError, match="obs_rms_state"):
        save_checkpoint(tmp_path / "m.pt", {"actor": {}})
    assert not (tmp_path / "m.pt").exists()


def unreadable_message(path) -> str:
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    message = str(error.value)
    assert str(path) in message and "\n" not in message and "\x1b" not in message
    return message


def test_truncated_file_is_a_clear_error(tmp_path, payload):
    path = tmp_path / "model_run.pt"
    save_checkpoint(path, payload)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # e.g. a copy interrupted half-way
    assert "unreadable (truncated, corrupt or not a torch file)" in unreadable_message(path)


@pytest.mark.parametrize(
    "content", [bytes(range(256)) * 4, b"not a checkpoint\n" * 20, b""], ids=["binary garbage", "text", "empty"]
)
def test_garbage_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "model_run.pt"
    path.write_bytes(content)
    message = unreadable_message(path)
    assert "unreadable (truncated, corrupt or not a torch file)" in message
    # torch's own text suggests weights_only=False: wrong for a corrupt file, unsafe for a foreign one.
    assert "weights_only` set to `False" not in message


class NotAPlainType:
    pass


def test_pickled_objects_are_refused(tmp_path):
    # weights_only=True never runs code from a checkpoint: a file holding a pickled class is an error.
    path = tmp_path / "model_run.pt"
    torch.save({"actor": NotAPlainType(), "obs_rms_state": None}, path)
    assert "NotAPlainType" in unreadable_message(path)


@pytest.mark.parametrize(
    "content, shown",
    [
        ({"actor": {}}, "has ['actor']"),
        ({"model": {}, "obs_rms": None}, "has ['model', 'obs_rms']"),
        (torch.zeros(3), "has Tensor"),
    ],
)
def test_a_torch_file_that_is_not_ours_names_the_required_keys(tmp_path, content, shown):
    path = tmp_path / "other.pt"
    torch.save(content, path)
    message = unreadable_message(path)
    assert "needs keys ['actor', 'obs_rms_state']" in message and shown in message


def test_missing_file_is_a_clear_error(tmp_path):
    assert "no such file" in unreadable_message(tmp_path / "nope.pt")


def test_top_level_policy_is_the_mean_over_ranks():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    b = {"w": torch.tensor([3.0, 2.0]), "b": torch.tensor([1.5])}
    mean = mean_policy([a, b])
    assert torch.equal(mean["w"], torch.tensor([2.0, 2.0])) and torch.equal(mean["b"], torch.tensor([1.0]))
    third = torch.tensor([0.1, 0.7, 1.3])  # ranks that agree: their own tensors, bit for bit (no 3 * x / 3)
    same = mean_policy([{"w": third.clone()} for _ in range(3)])
    assert torch.equal(same["w"], third)


BEFORE_THE_FOLDERS = Path(__file__).resolve().parent / "data" / "checkpoint_fcb6401.pt"
"""A checkpoint written by commit fcb6401, the last before the package's modules moved into folders: Hopper-v5,
1 actor x 1 env, rounds of 256 steps, 768 steps (`python train.py --env-id Hopper-v5 --actors-per-gpu 1
--envs-per-actor 1 --rollout-length 256 --num-minibatches 4 --update-epochs 1 --total-timesteps 768 --no-compile
--eval-interval 0`)."""


def test_a_checkpoint_from_before_the_folders_loads_and_resumes(tmp_path, capsys):
    from ppo_ddp.configuration.loading import parse_config
    from ppo_ddp.runner.launch import main

    model, obs_rms, cfg = load_policy(BEFORE_THE_FOLDERS)
    assert cfg.env_id == "Hopper-v5" and obs_rms is not None and sum(p.numel() for p in model.parameters()) > 0
    flags = "--env-id Hopper-v5 --actors-per-gpu 1 --envs-per-actor 1 --rollout-length 256 --num-minibatches 4"
    flags += " --update-epochs 1 --total-timesteps 1280 --no-compile --eval-interval 0"
    argv = [*flags.split(), "--runs-dir", str(tmp_path), "--run-name", "after", "--resume", str(BEFORE_THE_FOLDERS)]
    with signal_handlers_kept():
        main(parse_config(argv), ["train.py", *argv])  # train.py's main, in this process: no interpreter to start
    out = capsys.readouterr().out
    assert "resumed from" in out and "done: 1,280 steps" in out, out
