"""Tracking (issue 14): Weights & Biases with --track (offline, as users without a login run it) and TensorBoard's
HParams tab. The W&B run is read back from its own log file (run-<id>.wandb), the records W&B would upload."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from test_train import SMALL, read_csv, run

from ppo_ddp.configuration import validation as validation_module
from ppo_ddp.configuration.loading import parse_config

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2", reason="wandb: pip install -e '.[track]'")

OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
TRACK = ["--track", "--wandb-project", "ppo-tests", "--wandb-group", "g1", "--wandb-tags", "tiny", "hopper"]


def train(tmp_path: Path, total: int, *extra: str):
    args = [sys.executable, "train.py", *SMALL, "--total-timesteps", str(total), "--runs-dir", str(tmp_path / "runs")]
    return run([*args, "--run-name", "w", *extra], tmp_path, debug=False, env=OFFLINE)


def wandb_records(path: Path) -> list:
    """The records of a .wandb file: LevelDB's log format (32 KiB blocks of chunks with a 7-byte header: crc32,
    length, type FULL/FIRST/MIDDLE/LAST) after W&B's own 7-byte header, each record a wandb_internal Record."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunk, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # the block's zero padding
            pos += left
            continue
        chunk, pos = chunk + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_pb.Record()
            record.ParseFromString(chunk)
            out.append(record)
            chunk = b""
    return out


def wandb_run(run_dir: Path) -> dict:
    """id, tags, group, config and history of each W&B offline run in the run folder, oldest first."""
    runs = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        info = {"history": [], "config": {}}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                info.update(id=record.run.run_id, tags=list(record.run.tags), group=record.run.run_group)
                info["project"] = record.run.project
            elif kind == "config":
                info["config"].update({item.key: item.value_json for item in record.config.update})
            elif kind == "history":
                info["history"].append(
                    {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                )
        runs.append(info)
    return runs


EARLIER_ID = "0ea71e40"
"""The W&B id an earlier run left in the run folder (run_log.WANDB_ID_FILE): the first session is a fresh start there,
which must begin a W&B run of its own rather than continue that one. (Two launches, not three: W&B's finish with
TensorBoard synced waits ~10 s, and a third launch, a fresh start after the resumed session, proved no more.)"""


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("track")
    run_dir = tmp_path / "runs" / "w"
    run_dir.mkdir(parents=True)
    (run_dir / "wandb_id").write_text(EARLIER_ID + "\n")
    train(tmp_path, 192, *TRACK)  # a fresh start in the earlier run's folder: round 0 and 2 rounds
    first, id_after_first = wandb_run(run_dir), (run_dir / "wandb_id").read_text().strip()
    train(tmp_path, 320, *TRACK, "--resume", "auto")  # resumed: 2 rounds more
    return run_dir, first, id_after_first, wandb_run(run_dir)


def test_the_wandb_run_holds_the_training_scalars_and_the_resolved_config(tracked):
    run_dir, (run,), _, _ = tracked
    assert run["project"] == "ppo-tests" and run["group"] == "g1" and run["tags"] == ["tiny", "hopper"]
    logged = [row for row in run["history"] if "charts/episodic_return" in row]
    steps = [int(float(row["global_step"])) for row in logged]
    assert steps == [128, 192]  # every round of the first session (round 0 seeds the statistics)
    assert steps == [int(r["global_step"]) for r in read_csv(run_dir / "metrics.csv")][:2]
    for key in ("losses/policy_loss", "losses/value_loss", "charts/SPS", "charts/learning_rate"):
        assert all(key in row for row in logged), key
    config = run["config"]
    assert config["env_id"] == '"Hopper-v5"' and float(config["log_std_init"]) == 0.0
    assert int(config["rollout_length"]) == 32 and int(config["total_timesteps"]) == 192  # flags over defaults
    assert len(config["code_version"].strip('"')) >= 40  # the git commit (with -dirty when uncommitted)


def test_a_resumed_run_continues_the_same_wandb_run_and_a_fresh_start_begins_another(tracked):
    run_dir, (first,), id_after_first, runs = tracked
    # the fresh start: a W&B run of its own, not the earlier one whose id the folder held, and its id kept there
    assert first["id"] != EARLIER_ID and id_after_first == first["id"]
    # the resumed session: the same W&B run, the id kept
    assert len(runs) == 2 and runs[0]["id"] == runs[1]["id"] == first["id"]
    assert (run_dir / "wandb_id").read_text().strip() == first["id"]
    second = [int(float(row["global_step"])) for row in runs[1]["history"] if "charts/episodic_return" in row]
    assert second == [256, 320]  # the resumed rounds, nothing logged twice
    assert int(runs[1]["config"]["total_timesteps"]) == 320  # the config of the latest session


def test_tensorboard_hparams_hold_the_config_and_the_compared_metrics(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run_dir, *_ = tracked
    events = EventAccumulator(str(run_dir))
    events.Reload()
    content = {
        tag: plugin_data_pb2.HParamsPluginData.FromString(raw)
        for tag, raw in events.PluginTagToContent("hparams").items()
    }
    hparams = content["_hparams_/session_start_info"].session_start_info.hparams
    assert hparams["env_id"].string_value == "Hopper-v5" and hparams["rollout_length"].number_value == 32
    assert hparams["hidden_sizes"].string_value == "[64, 64]" and "run_name" not in hparams
    metrics = [m.name.tag for m in content["_hparams_/experiment"].experiment.metric_infos]
    assert metrics == ["charts/episodic_return_avg100", "eval/episodic_return", "charts/SPS"]
    assert "charts/episodic_return_avg100" in events.Tags()["scalars"]  # what the HParams tab shows for the run


@pytest.mark.parametrize(("flag", "module"), [("--track", "wandb"), ("--capture-video", "moviepy")])
def test_an_optional_package_missing_is_one_line_with_the_pip_command(flag, module, monkeypatch, capsys):
    real = validation_module.importlib.util.find_spec
    missing = lambda name: None if name == module else real(name)  # noqa: E731
    monkeypatch.setattr(validation_module.importlib.util, "find_spec", missing)
    with pytest.raises(SystemExit) as exit_:
        parse_config([flag, "--eval-interval", "5"], check_env=False)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"pip install {module}" in err, err
