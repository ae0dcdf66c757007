"""Export a checkpoint's policy for deployment:
`python -m ppo_ddp.export runs/<run>/model_<run>.pt --format onnx --output policy.onnx` (or --format torchscript),
or to share: `--format policy`, a checkpoint of the policy alone that evaluate and export read (`write_policy_file`).

The file computes what `python -m ppo_ddp.evaluate` acts with (ppo_ddp/evaluation/policy.py's EnvPolicy, deterministic):
raw observations float32 [N, obs_dim] -> normalised with the checkpoint's frozen statistics and clipped to
±obs_clip -> the policy's deterministic action (the Gaussian's mean; a bounded distribution's, inside the bounds) ->
clipped to the env's action bounds -> actions float32 [N, act_dim]. A GRU policy's state is an input and an output:
(obs [N, D], h [N, H]) -> (action [N, A], h_next [N, H]), h zeros at an episode's start. What it is for (env id,
sizes, bounds, policy kind, distribution, code version) travels inside the file: ONNX
metadata_props (strings; lists as JSON), TorchScript's extra file metadata.json. docs/usage.md, "Exporting a
policy"; examples/play_exported.py runs an ONNX file with onnxruntime alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import tyro

import ppo_ddp
from ppo_ddp.configuration.config import Config
from ppo_ddp.configuration.flags import use_docstrings_as_help
from ppo_ddp.configuration.validation import missing_extra
from ppo_ddp.envs.make import make_env
from ppo_ddp.envs.options import relative_env_kwargs
from ppo_ddp.errors import CheckpointError
from ppo_ddp.evaluation.playback import load_policy
from ppo_ddp.evaluation.policy import EnvPolicy
from ppo_ddp.records.run_log import code_version
from ppo_ddp.storage.checkpoint import load_checkpoint, policy_state, save_checkpoint

ONNX_MODULES = ("onnx", "onnxscript")
"""What torch.onnx.export's exporter (torch.export-based, torch's default) imports; onnxruntime runs the file."""
EXAMPLE_BATCH = 2  # not 1: the exporters would take a batch of one for a fixed size rather than a dynamic one


@dataclass(frozen=True)
class ExportArgs:
    """Export a ppo_ddp checkpoint's deterministic policy (normalisation and action clipping included)."""

    checkpoint: tyro.conf.Positional[str]
    """Path of a model_<run>.pt or model_<run>_best.pt file."""
    format: str
    """onnx (run it with onnxruntime: examples/play_exported.py), torchscript (torch.jit.load), or policy: a
    checkpoint of the policy alone (network, observation statistics, config; no optimiser or resume state), which
    `python -m ppo_ddp.evaluate` plays as it plays the checkpoint (the files under policies/)."""
    output: str
    """The file to write (its folder is created)."""


def input_names(policy: EnvPolicy) -> list[str]:
    return ["obs", "h"] if policy.recurrent else ["obs"]


def output_names(policy: EnvPolicy) -> list[str]:
    return ["action", "h_next"] if policy.recurrent else ["action"]


def example_inputs(policy: EnvPolicy) -> tuple[torch.Tensor, ...]:
    """Inputs to trace with: any values do, only their shapes and dtypes are recorded."""
    obs = torch.zeros(EXAMPLE_BATCH, policy.model.obs_dim)
    return (obs, policy.initial_state(EXAMPLE_BATCH)) if policy.recurrent else (obs,)


def export_metadata(policy: EnvPolicy, cfg: Config) -> dict[str, Any]:
    """What a user of the file needs to run it, without the checkpoint or ppo_ddp."""
    meta: dict[str, Any] = {
        "env_id": cfg.env_id,
        "env_kwargs": cfg.env_kwargs,  # the options the env must be made with (another MJCF model, its weights)
        "policy": cfg.policy,
        "distribution": cfg.distribution,  # the action is its deterministic one (ppo_ddp/models/distributions.py)
        "obs_dim": policy.model.obs_dim,
        "act_dim": policy.model.act_dim,
        "action_low": policy.low.tolist(),
        "action_high": policy.high.tolist(),
        "ppo_ddp_version": ppo_ddp.__version__,
        "git_commit": code_version(),  # '-dirty' when exported from uncommitted changes, 'unknown' outside git
    }
    if policy.recurrent:
        meta["rnn_hidden_size"] = policy.model.rnn_hidden_size
    return meta


def onnx_metadata_props(meta: dict[str, Any]) -> dict[str, str]:
    """ONNX metadata values are strings: text as is, numbers as their digits, lists as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}


@contextlib.contextmanager
def _quiet_onnx_exporter() -> Iterator[None]:
    """The ONNX exporter logs and warns about what does not concern this model (torchvision's operators that it
    skips, its own deprecations); the command says one line."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def export_onnx(policy: EnvPolicy, path: Path, meta: dict[str, Any]) -> None:
    names = input_names(policy)
    batch = torch.export.Dim("batch")
    with _quiet_onnx_exporter():
        program = torch.onnx.export(
            policy,
            example_inputs(policy),
            dynamo=True,
            verbose=False,
            input_names=names,
            output_names=output_names(policy),
            dynamic_shapes=tuple({0: batch} for _ in names),  # any number of envs at once
        )
    program.model.metadata_props.update(onnx_metadata_props(meta))
    program.save(str(path))


def export_torchscript(policy: EnvPolicy, path: Path, meta: dict[str, Any]) -> None:
    # Traced, not scripted: the networks' Python (parameter lists, the GRU's loop over a chunk of one step) is
    # recorded as the ops it runs, and nothing in the step depends on the values. Frozen: the weights the step uses
    # become constants and the rest (the value network or head, a privileged critic) is left out of the file.
    traced = torch.jit.freeze(torch.jit.trace(policy, example_inputs(policy)))
    torch.jit.save(traced, str(path), _extra_files={"metadata.json": json.dumps(meta)})


EXPORTERS: dict[str, Callable[[EnvPolicy, Path, dict[str, Any]], None]] = {
    "onnx": export_onnx,
    "torchscript": export_torchscript,
}


FORMATS = (*EXPORTERS, "policy")


def write_policy_file(checkpoint: str | Path, output: str | Path) -> dict[str, Any]:
    """Write the checkpoint's policy alone to output (storage.checkpoint.policy_state) and return it. An xml_file
    under the working directory is stored relative to it, so the file plays from any copy of that folder (the
    trotter of examples/ from a clone of the repository)."""
    state = load_checkpoint(checkpoint)
    env_kwargs = relative_env_kwargs(state["config"].get("env_kwargs") or {}, Path.cwd())
    slim = policy_state(state, env_kwargs)
    save_checkpoint(output, slim)
    return slim


def export_policy(checkpoint: str | Path, fmt: str, output: str | Path) -> tuple[EnvPolicy, dict[str, Any]]:
    """Write the checkpoint's policy to output in format fmt; returns the exported module and its metadata.
    CheckpointError for a file that is not a checkpoint."""
    model, obs_rms, cfg = load_policy(checkpoint)
    env = make_env(cfg.env_id, **cfg.env_kwargs)  # the bounds the env clips to are the env's, not the checkpoint's
    low, high = env.action_space.low, env.action_space.high
    env.close()
    policy = EnvPolicy(model, obs_rms, cfg.obs_clip, low, high).eval().requires_grad_(False)
    meta = export_metadata(policy, cfg)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    EXPORTERS[fmt](policy, output, meta)
    return policy, meta


def _fail(message: str) -> None:
    print(f"export: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Optional[list[str]] = None) -> None:
    use_docstrings_as_help(ExportArgs)  # --help as prose, like train's
    args = tyro.cli(ExportArgs, args=argv, prog="python -m ppo_ddp.export")
    if args.format not in FORMATS:
        _fail(f"--format {args.format!r}: must be one of {', '.join(FORMATS)}")
    if args.format == "policy":
        try:
            slim = write_policy_file(args.checkpoint, args.output)
        except CheckpointError as e:
            _fail(str(e))
        size = Path(args.output).stat().st_size
        print(f"wrote {args.output} (policy, {size / 1024:.1f} KiB): {slim['env_id']}, step {slim.get('global_step')}")
        return
    if args.format == "onnx":
        for module in ONNX_MODULES:
            if problem := missing_extra(module):
                _fail(f"--format onnx {problem} (or all of them: pip install onnx onnxscript onnxruntime)")
    try:
        policy, meta = export_policy(args.checkpoint, args.format, args.output)
    except CheckpointError as e:
        _fail(str(e))
    state = f", state h {meta['rnn_hidden_size']}" if policy.recurrent else ""
    size = Path(args.output).stat().st_size
    print(
        f"wrote {args.output} ({args.format}, {size / 1024:.1f} KiB): {meta['env_id']} {meta['policy']} policy, "
        f"obs {meta['obs_dim']} -> action {meta['act_dim']}{state}"
    )


if __name__ == "__main__":
    main()
