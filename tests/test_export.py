"""python -m ppo_ddp.export: an exported file acts as `python -m ppo_ddp.evaluate` does (normalisation, policy mean,
action clip; a GRU's state over steps and resets), carries its metadata, and examples/play_exported.py scores the
returns evaluate scores without torch or ppo_ddp."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import ppo_ddp
from ppo_ddp import export
from ppo_ddp.configuration.config import Config, config_to_dict
from ppo_ddp.envs.make import make_env
from ppo_ddp.evaluation.playback import evaluate_policy, load_policy
from ppo_ddp.models.factory import make_model
from ppo_ddp.models.normalization import Moments, normalize_obs
from ppo_ddp.storage.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parent.parent
ENV_ID = "Hopper-v5"  # MuJoCo's float64 observations, bounds [-1, 1], episodes short under a random policy
OBS_DIM, ACT_DIM, H = 11, 3, 8
KINDS = ("mlp", "gru", "mlp-beta", "gru-tanh_gaussian")  # policy[-distribution], a Gaussian's by default
BOUNDS = (np.full(ACT_DIM, -1.0, np.float32), np.full(ACT_DIM, 1.0, np.float32))  # Hopper's


def make_checkpoint(path: Path, policy: str) -> Path:
    """A checkpoint as the trainer writes its policy part, without training: weights pushed well off their
    initialisation (the action head's 0.01 gain would keep every action near 0 and inside the bounds) and
    statistics far from (0, 1), so normalisation, both clips and the GRU's state all change the actions."""
    network, _, distribution = policy.partition("-")
    cfg = Config(env_id=ENV_ID, policy=network, hidden_sizes=(16,), rnn_hidden_size=H, obs_clip=3.0,
                 distribution=distribution or "gaussian")  # fmt: skip
    torch.manual_seed(KINDS.index(policy))
    model = make_model(cfg, OBS_DIM, ACT_DIM, 0, BOUNDS)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    rng = np.random.default_rng(3)
    obs_rms = Moments(rng.normal(0.0, 1.0, OBS_DIM), rng.uniform(0.05, 4.0, OBS_DIM), 1000.0)
    payload = {"actor": model.state_dict(), "obs_rms_state": obs_rms.to_state(), "config": config_to_dict(cfg)}
    save_checkpoint(path, {**payload, "env_id": ENV_ID, "obs_dim": OBS_DIM, "act_dim": ACT_DIM})
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("checkpoints")
    return {kind: make_checkpoint(folder / f"model_{kind}.pt", kind) for kind in KINDS}


@pytest.fixture(scope="module")
def torchscript_files(checkpoints, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ts") / "not" / "yet"  # the command creates the folders
    out = {kind: folder / f"{kind}.pt" for kind in KINDS}
    for kind in KINDS:
        export.main([str(checkpoints[kind]), "--format", "torchscript", "--output", str(out[kind])])
    return out


@pytest.fixture(scope="module")
def onnx_files(checkpoints, tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("onnxruntime")
    folder = tmp_path_factory.mktemp("onnx")
    out = {kind: folder / f"{kind}.onnx" for kind in KINDS}
    for kind in KINDS:
        export.main([str(checkpoints[kind]), "--format", "onnx", "--output", str(out[kind])])
    return out


def env_observations(steps: int, envs: int) -> np.ndarray:
    """[steps, envs, OBS_DIM] float64 observations of Hopper envs under random actions (reset where one ends)."""
    out = np.empty((steps, envs, OBS_DIM))
    for e in range(envs):
        env = make_env(ENV_ID)
        env.action_space.seed(e)
        obs, _ = env.reset(seed=e)
        for t in range(steps):
            out[t, e] = obs
            obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                obs, _ = env.reset()
        env.close()
    return out


def reference(checkpoint: Path, obs: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
    """The checkpoint's deterministic actions [T, N, A] for obs [T, N, D], computed apart from the exported
    module: the actors' numpy normalisation, the network as the learner unrolls it (chunks with episode starts,
    its gradient path), the distribution's deterministic action and numpy's clip to the env's bounds. Also the
    state after the last step (GRU)."""
    model, obs_rms, cfg = load_policy(checkpoint)
    x = torch.as_tensor(normalize_obs(obs, obs_rms, cfg.obs_clip)).transpose(0, 1)  # [N, T, D]
    if cfg.policy == "gru":
        mean, _, last = model.forward_chunks(x, model.initial_state(x.shape[0]), torch.as_tensor(starts).T.float())
    else:
        mean, last = model.action_mean(x), None
    action = model.dist.mode(mean, model.actor_logstd).detach().transpose(0, 1).numpy()
    space = make_env(ENV_ID).action_space
    return np.clip(action, space.low, space.high), last


def run_onnx(path: Path, obs: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The file run step by step by onnxruntime, h zeroed where an episode starts (the user's part)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    recurrent = [i.name for i in session.get_inputs()] == ["obs", "h"]
    h, actions = np.zeros((obs.shape[1], H), np.float32), []
    for t in range(obs.shape[0]):
        h[starts[t]] = 0.0
        out = session.run(None, {"obs": obs[t].astype(np.float32), **({"h": h} if recurrent else {})})
        actions.append(out[0])
        h = out[1] if recurrent else h
    return np.stack(actions), h


def run_torchscript(path: Path, obs: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The file loaded by torch.jit.load and run as run_onnx runs its file."""
    module = torch.jit.load(str(path))
    recurrent = len(list(module.graph.inputs())) == 3  # self, obs, h
    h, actions = torch.zeros(obs.shape[1], H), []
    with torch.no_grad():
        for t in range(obs.shape[0]):
            h[torch.as_tensor(starts[t])] = 0.0
            x = torch.as_tensor(obs[t], dtype=torch.float32)
            action, h = module(x, h) if recurrent else (module(x), h)
            actions.append(action.numpy())
    return np.stack(actions), h.numpy()


@pytest.fixture(scope="module")
def sequence() -> tuple[np.ndarray, np.ndarray]:
    """8 steps of 5 envs' observations; envs 1 and 3 start a new episode (their state reset) inside it."""
    starts = np.zeros((8, 5), dtype=bool)
    starts[0] = True
    starts[3, 1] = starts[6, 3] = True
    return env_observations(8, 5), starts


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_exported_policy_acts_as_the_checkpoint(fmt, kind, checkpoints, sequence, request):
    files = request.getfixturevalue(f"{fmt}_files")
    obs, starts = sequence
    if kind.startswith("mlp"):
        obs, starts = obs.reshape(1, -1, OBS_DIM), starts.reshape(1, -1)  # one batch of 40 observations
    want, last = reference(checkpoints[kind], obs, starts)
    got, h = (run_onnx if fmt == "onnx" else run_torchscript)(files[kind], obs, starts)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    if "-" not in kind:  # the check can fail: the Gaussian's clip to the bounds [-1, 1] is in play
        assert 0.1 < np.mean(np.abs(want) == 1.0) < 0.9
    else:  # and a bounded distribution's squashing: its actions spread over the bounds, never at them
        assert np.abs(want).max() < 1.0 and np.abs(want).max() > 0.5
    if kind.startswith("gru"):
        np.testing.assert_allclose(h, last.detach().numpy(), rtol=0, atol=1e-5)
        stateless, _ = reference(checkpoints[kind], obs, np.ones_like(starts))
        assert np.abs(stateless - want)[1:].max() > 1e-2


def test_the_metadata_travels_with_both_formats(onnx_files, torchscript_files):
    import onnxruntime as ort

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = commit or "unknown"  # run_log.code_version's word outside a checkout
    for kind in KINDS:
        props = ort.InferenceSession(str(onnx_files[kind])).get_modelmeta().custom_metadata_map
        extra = {"metadata.json": ""}
        torch.jit.load(str(torchscript_files[kind]), _extra_files=extra)
        # ONNX's values are strings: numbers and lists in JSON
        numbers = ("obs_dim", "act_dim", "action_low", "action_high", "rnn_hidden_size")
        from_onnx = {k: json.loads(v) if k in numbers else v for k, v in props.items()}
        for meta in (from_onnx, json.loads(extra["metadata.json"])):
            network, _, distribution = kind.partition("-")
            assert meta["env_id"] == ENV_ID and meta["policy"] == network
            assert meta["distribution"] == (distribution or "gaussian")
            assert (meta["obs_dim"], meta["act_dim"]) == (OBS_DIM, ACT_DIM)
            assert meta["action_low"] == [-1.0] * ACT_DIM and meta["action_high"] == [1.0] * ACT_DIM
            assert meta.get("rnn_hidden_size") == (H if network == "gru" else None)
            assert meta["ppo_ddp_version"] == ppo_ddp.__version__ == "0.1.0"
            assert meta["git_commit"] in (commit, commit + "-dirty")


@pytest.mark.parametrize("kind", KINDS)
def test_play_exported_scores_what_evaluate_scores_without_torch(kind, checkpoints, onnx_files):
    model, obs_rms, cfg = load_policy(checkpoints[kind])
    want = evaluate_policy(model, obs_rms, cfg, episodes=2, seed=77)
    script = [str(ROOT / "examples" / "play_exported.py"), str(onnx_files[kind]), "--episodes", "2", "--seed", "77"]
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *script, "--json"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # -X importtime lists every module imported, one a line: "import time: self | cumulative | name"
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in out.stderr.splitlines()}
    assert "onnxruntime" in imported and not imported & {"torch", "ppo_ddp"}
    got = json.loads(out.stdout.splitlines()[-1])
    # the same episodes; onnxruntime sums its products in another order, so the actions agree to ~1e-7
    assert got == pytest.approx(want, rel=1e-4)
    assert len(set(np.round(want, 3))) == 2  # two different episodes, not one counted twice


def _with_weights_moved(checkpoint: Path, path: Path, prefix: str) -> Path:
    """A copy of the checkpoint with the weights whose names start with prefix moved (an empty prefix: none)."""
    state = torch.load(checkpoint, weights_only=True)
    state["actor"] = {k: v + 1.0 if prefix and k.startswith(prefix) else v for k, v in state["actor"].items()}
    save_checkpoint(path, state)
    return path


def _tensors_of(torchscript_file: Path) -> dict[str, bytes]:
    """The weights a TorchScript file holds: a frozen module's constants (its zip's <name>/constants/), by entry."""
    with zipfile.ZipFile(torchscript_file) as archive:
        return {n.split("/", 1)[1]: archive.read(n) for n in archive.namelist() if "/constants" in n}


@pytest.mark.parametrize("kind", KINDS)
def test_the_torchscript_file_carries_the_policy_alone(kind, checkpoints, tmp_path):
    """The value network (MLP) or head (GRU) is not in the file: moving its weights leaves the weights the file
    holds as they were, while moving the policy's changes them."""
    tensors = {}
    for name, prefix in (("same", ""), ("critic", "critic."), ("policy", "actor_mean.")):
        source = _with_weights_moved(checkpoints[kind], tmp_path / f"{name}.pt", prefix)
        export.main([str(source), "--format", "torchscript", "--output", str(tmp_path / f"{name}.ts")])
        tensors[name] = _tensors_of(tmp_path / f"{name}.ts")
    assert tensors["same"] and tensors["critic"] == tensors["same"]
    assert tensors["policy"] != tensors["same"]


def test_it_says_what_it_wrote(checkpoints, tmp_path, capsys):
    export.main([str(checkpoints["gru"]), "--format", "torchscript", "--output", str(tmp_path / "p.pt")])
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"wrote {tmp_path / 'p.pt'} (torchscript, ")
    assert line.endswith(f"{ENV_ID} gru policy, obs {OBS_DIM} -> action {ACT_DIM}, state h {H}")


def one_error_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        export.main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("export: error: ") and captured.out == ""
    return line


def test_a_file_that_is_not_a_checkpoint_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "notes.pt"
    bad.write_text("not a checkpoint")
    line = one_error_line(capsys, [str(bad), "--format", "torchscript", "--output", str(tmp_path / "p.pt")])
    assert "not a torch file" in line and not (tmp_path / "p.pt").exists()


def test_an_unknown_format_is_one_line_and_exit_2(checkpoints, tmp_path, capsys):
    line = one_error_line(capsys, [str(checkpoints["mlp"]), "--format", "tflite", "--output", str(tmp_path / "p")])
    assert "'tflite'" in line and "onnx, torchscript" in line


def test_onnx_without_its_packages_names_the_pip_command(checkpoints, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(export, "missing_extra", lambda m: f"needs {m}: pip install {m}" if m == "onnxscript" else None)
    line = one_error_line(capsys, [str(checkpoints["mlp"]), "--format", "onnx", "--output", str(tmp_path / "p")])
    assert "pip install onnxscript" in line and not (tmp_path / "p").exists()


def test_a_policy_file_keeps_the_policy_alone_and_plays_as_the_checkpoint(checkpoints, tmp_path, capsys):
    """--format policy: the resume state (optimiser, RNG, every rank's envs) is left out and the tensors hold only
    their own bytes (a training run's parameters are views of one flat buffer); evaluate scores what it scores on
    the checkpoint."""
    state = torch.load(checkpoints["gru"], weights_only=True)
    flat = torch.cat([v.flatten() for v in state["actor"].values()])  # as a trainer's flat parameter buffer
    views, start = {}, 0
    for k, v in state["actor"].items():
        views[k], start = flat[start : start + v.numel()].view_as(v), start + v.numel()
    big = torch.zeros(10_000_000, dtype=torch.uint8)  # ~10 MB of resume state
    save_checkpoint(tmp_path / "full.pt", {**state, "actor": views, "optimizer": {"state": big}, "rank_states": [big]})
    export.main([str(tmp_path / "full.pt"), "--format", "policy", "--output", str(tmp_path / "p" / "policy.pt")])
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'p' / 'policy.pt'} (policy, ")
    slim = torch.load(tmp_path / "p" / "policy.pt", weights_only=True)
    assert set(slim) == {"actor", "obs_rms_state", "config", "env_id", "obs_dim", "act_dim"}
    assert (tmp_path / "p" / "policy.pt").stat().st_size < flat.numel() * 4 + 50_000
    scores = []
    for path in (checkpoints["gru"], tmp_path / "p" / "policy.pt"):
        model, obs_rms, cfg = load_policy(path)
        scores.append(evaluate_policy(model, obs_rms, cfg, 2))
    assert scores[0] == scores[1]


def test_a_policy_files_robot_model_travels_with_the_folder_it_was_written_in(checkpoints, tmp_path, monkeypatch):
    """An xml_file under the working directory is stored relative to it: a copy of that folder plays the file."""
    state = torch.load(checkpoints["mlp"], weights_only=True)
    xml = tmp_path / "repo" / "robots" / "hopper.xml"
    xml.parent.mkdir(parents=True)
    xml.write_text((Path(gymnasium_assets()) / "hopper.xml").read_text())
    state["config"] = {**state["config"], "env_kwargs": {"xml_file": str(xml)}}
    save_checkpoint(tmp_path / "repo" / "model.pt", state)
    monkeypatch.chdir(tmp_path / "repo")
    export.main(["model.pt", "--format", "policy", "--output", "policies/hopper.pt"])
    slim = torch.load(tmp_path / "repo" / "policies" / "hopper.pt", weights_only=True)
    assert slim["config"]["env_kwargs"] == {"xml_file": "./robots/hopper.xml"}
    (tmp_path / "repo").rename(tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")
    model, obs_rms, cfg = load_policy("policies/hopper.pt")
    assert len(evaluate_policy(model, obs_rms, cfg, 1)) == 1


def gymnasium_assets() -> Path:
    from ppo_ddp.envs.options import GYMNASIUM_ASSETS

    return GYMNASIUM_ASSETS
