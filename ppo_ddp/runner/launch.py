"""Launching: the command line, the Python API and torchrun workers alike enter here; what the user is told at the
end too.

The command line is one program under three names: `python -m ppo_ddp.train`, the console script `ppo-ddp-train` and a
checkout's `python train.py` (ppo_ddp/train.py parses its flags, then calls `main`); `torchrun --nproc_per_node=N -m
ppo_ddp.train` (or `... train.py`) starts one per GPU. `ppo_ddp.train(...)` is the same run for Python (`train`). Both
go through `run`, which decides the topology once (ppo_ddp/configuration/topology.py), starts the learners through our
own elastic launch when one process asks for several, or else forms the process group and trains. `main` maps every
ending of the command line to one exit status (docs/reliability.md): 0 done, 1 a failure during training, 2 bad input,
128 + signal stopped by a signal. A stop's last line says how to resume, with the same launcher and flags.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import socket
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional, Union

import torch.distributed as dist
import yaml

from ppo_ddp.configuration.config import Config, config_to_dict
from ppo_ddp.configuration.loading import load_config, with_resolved_env_kwargs
from ppo_ddp.configuration.topology import TrainingTopology
from ppo_ddp.configuration.validation import envs_per_learner, validate
from ppo_ddp.distributed import process_group as D
from ppo_ddp.distributed.agreement import BAD_INPUT, RunFailed, Stopped
from ppo_ddp.distributed.signals import ForcedStop, StopRequests, exit_code, signal_name
from ppo_ddp.records.checkpointer import checkpoint_paths
from ppo_ddp.records.run_log import default_run_name
from ppo_ddp.runner.programs import TRAIN_FILE, package_env, program
from ppo_ddp.runner.trainer import Trainer


def train(config: Union[Config, str, None] = None, **fields: Any) -> Path:
    """Train a policy, as the command line would, and return the absolute path of the run's latest checkpoint
    (runs_dir/run_name/model_<run_name>.pt; the best one lies beside it as model_<run_name>_best.pt).

        train(Config(env_id="Hopper-v5"))              # exactly this Config (Config's defaults elsewhere)
        train("hopper", seed=2)                        # a preset by name (or a YAML file), fields over it
        train(env_id="Hopper-v5", seed=2)              # as `--env-id Hopper-v5 --seed 2`: Hopper's preset

    Call it under `if __name__ == "__main__":` in a script: the actor processes start by forkserver or spawn, which
    import the script again. Raises ConfigError (or CheckpointError) for bad input, RunFailed when training failed,
    Stopped when a signal (Ctrl-C) stopped it after saving (its .checkpoint says where)."""
    if isinstance(config, Config):
        cfg = with_resolved_env_kwargs(dataclasses.replace(config, **fields))
        validate(cfg)
    else:
        cfg = load_config(config, **fields)
    return run(cfg).resolve()


def main(cfg: Config, argv: Optional[list[str]] = None) -> None:
    """Train cfg as the command line `argv` (default: this process's) asked, and map every ending to an exit
    status."""
    try:
        run(cfg, list(sys.argv if argv is None else argv))
    except BAD_INPUT as e:  # found alike by every rank (e.g. a topology that does not fit)
        D.say_once_per_node(f"train.py: error: {e}")
        raise SystemExit(2) from None
    except RunFailed as e:  # said by the trainer already
        raise SystemExit(e.exit_code) from None
    except (Stopped, ForcedStop) as e:
        raise SystemExit(exit_code(e.signum)) from None
    except dist.DistError as e:  # a peer lost while the group was still forming (the trainer handles the rest)
        print(f"train.py: error: rank {os.environ.get('RANK', '0')}: {D.lost_contact(e)}", file=sys.stderr)
        raise SystemExit(1) from None


def run(cfg: Config, argv: Optional[list[str]] = None) -> Path:
    """Launch the learners (torchrun, or our own elastic launch), then train; the latest checkpoint's path.

    argv: the command line to start several learners with (program first); None (the Python API) starts them
    with cfg itself, written into the run folder as launch.yaml."""
    # Decided once, before any learner starts; our own launch hands its decision to every worker.
    topology = D.training_topology(cfg)
    if D.under_torchrun() or topology.num_learners == 1:  # a learner: the split as numbers, as config.yaml records
        cfg = split_config(cfg, topology)
    device = None
    if not D.under_torchrun():
        if topology.num_learners > 1:
            # The learners would each name the run by their start time: the launcher names it for all of them.
            cfg = dataclasses.replace(cfg, run_name=cfg.run_name or default_run_name(cfg.env_id, cfg.seed, time.time()))
            launch_learners(topology, argv + ["--run-name", cfg.run_name] if argv else launch_command(cfg))
            return checkpoint_paths(Path(cfg.runs_dir) / cfg.run_name, cfg.run_name)[0]
        device = "cuda:0" if topology.device == "cuda" else topology.device
    # Installed once the process group is up: a signal while it forms (which can wait on other nodes)
    # ends the learner as usual, with nothing to save; from then on it is a stop at the next round.
    with D.process_group(device) as ctx, StopRequests(announce=D.is_local_main()) as stop:
        trainer = Trainer(cfg, ctx, stop, topology)
        try:
            trainer.train()
        except Stopped as e:
            if ctx.is_main:
                print(stop_message(e, api=argv is None), flush=True)
            raise
    return trainer.checkpointer.latest


def learner_config(cfg: Config) -> Config:
    """cfg as a learner started here would run it: its split decided for this process's devices and cores (for the
    scripts that build an actor pool of their own)."""
    return split_config(cfg, D.training_topology(cfg))


def split_config(cfg: Config, topology: TrainingTopology) -> Config:
    """cfg with the split its topology decided as numbers (actors_per_gpu, envs_per_actor, num_envs): what every
    part of the learner reads, and what config.yaml records."""
    envs, actors = envs_per_learner(cfg), topology.actors_per_learner
    return dataclasses.replace(cfg, actors_per_gpu=actors, envs_per_actor=envs // actors, num_envs=envs)


def launch_command(cfg: Config) -> list[str]:
    """The command line that trains cfg: `-m ppo_ddp.train --config RUN_FOLDER/launch.yaml`, for the API."""
    path = Path(cfg.runs_dir) / cfg.run_name / "launch.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {k: v for k, v in config_to_dict(cfg).items() if k != "config"}
    path.write_text(f"# ppo_ddp.train({cfg.config or 'Config(...)'}): the run as launched\n" + yaml.safe_dump(values))
    return [str(TRAIN_FILE), "--config", str(path)]


def launch_learners(topology: TrainingTopology, argv: list[str]) -> None:
    """One process asked for several learners: start them through torch's elastic launcher, like torchrun.

    argv is the command line (program first: `-m ppo_ddp.train`'s file, train.py or ppo-ddp-train); every learner
    re-runs it under torchrun's environment and takes the actors per learner decided here (D.OWN_LAUNCH_ENV), not
    a count of its own. The rendezvous store listens on 127.0.0.1 only (torchrun --standalone's listens on every
    interface). RunFailed with the first failed learner's status (which said what went wrong); exit status
    128 + signal when the launcher itself was signalled (the learners saved and stopped).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    register_loopback_rendezvous()
    args = [
        f"--rdzv-backend={LOOPBACK_RDZV_BACKEND}",
        "--rdzv-endpoint=127.0.0.1:0",
        f"--rdzv-id={uuid.uuid4()}",
        "--nnodes=1",
        f"--nproc_per_node={topology.num_learners}",
        *program(argv[0]),
        *argv[1:],
    ]
    print(
        f"starting {topology.num_learners} learners with {topology.actors_per_learner} actor(s) each: "
        f"torchrun {' '.join(args)}",
        flush=True,
    )
    os.environ[D.OWN_LAUNCH_ENV] = str(topology.actors_per_learner)
    os.environ["PYTHONPATH"] = package_env()["PYTHONPATH"]  # the learners import this ppo_ddp
    try:
        run(parse_args(args))
    except ChildFailedError as e:  # each learner has said what went wrong; torchrun's report would repeat it
        code = e.get_first_failure()[1].exitcode
        raise RunFailed("a learner failed", code if code > 0 else 128 - code) from None
    except SignalException as e:  # Ctrl-C: the learners got it forwarded, saved and stopped
        raise SystemExit(exit_code(int(e.sigval))) from None


def stop_message(e: Stopped, api: bool = False) -> str:
    """The stop's line: what was kept, and the command (the call, for the Python API) that continues the run."""
    by = f"stopped by {signal_name(e.signum)}"
    if e.checkpoint is None:  # nothing was kept (a stop during the first round): no round count to report
        again = "the same call" if api else resume_command(None)
        return f"{by} before the first round finished; nothing saved. Start again with: {again}"
    head = f"{by} after round {e.completed} of {e.num_iterations} ({e.global_step:,} steps)"
    again = f"train(..., resume='auto', run_name={e.run_name!r})" if api else resume_command(e.run_name)
    return f"{head}; checkpoint {e.checkpoint}. Resume with: {again}"


def resume_command(run_name: Optional[str], argv: Optional[list[str]] = None) -> str:
    """The command line that continues this run: the same flags plus `--resume auto --run-name NAME`
    (run_name None: the command as it was)."""
    argv = list(sys.argv if argv is None else argv)
    flags, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0].replace("_", "-")
        if run_name is not None and name in ("--resume", "--run-name"):
            skip = "=" not in arg
            continue
        flags.append(arg)
    tail = [*program(argv[0]), *flags] + (["--resume", "auto", "--run-name", run_name] if run_name is not None else [])
    if not D.under_torchrun() or D.launched_by_us():
        if tail[0] != "-m" and not tail[0].endswith(".py"):  # a console script: its name, where the PATH finds it
            name = Path(tail[0]).name
            return shlex.join([name if shutil.which(name) == str(Path(tail[0]).resolve()) else tail[0], *tail[1:]])
        return shlex.join(["python", *tail])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world == local:
        return shlex.join(["torchrun", "--standalone", f"--nproc_per_node={local}", *tail])
    return f"torchrun <the same launcher options on every node> {shlex.join(tail)}"


LOOPBACK_RDZV_BACKEND = "ppo-loopback"


def _loopback_rendezvous(params: Any) -> Any:
    """A torchelastic rendezvous for one node whose TCPStore listens on 127.0.0.1 only.

    torchrun's --standalone store binds every interface (TCPStore does unless handed a listening socket);
    this one is handed a socket bound to loopback. Otherwise it is torchrun's static rendezvous for one node:
    the workers use this store (the agent store) for their process group too.
    """
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo, RendezvousStoreInfo

    class LoopbackRendezvous(RendezvousHandler):
        def __init__(self, run_id: str, timeout: timedelta) -> None:
            self.run_id = run_id
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.bind(("127.0.0.1", 0))
            self._listener.listen()
            self.port = self._listener.getsockname()[1]
            self._store = dist.TCPStore(
                "127.0.0.1", self.port, 1, True, timeout, multi_tenant=True, master_listen_fd=self._listener.fileno()
            )

        def get_backend(self) -> str:
            return LOOPBACK_RDZV_BACKEND

        @property
        def use_agent_store(self) -> bool:
            return True

        def next_rendezvous(self) -> Any:
            return RendezvousInfo(
                dist.PrefixStore(self.run_id, self._store), 0, 1, RendezvousStoreInfo("127.0.0.1", self.port)
            )

        def is_closed(self) -> bool:
            return False

        def set_closed(self) -> None:
            pass

        def num_nodes_waiting(self) -> int:
            return 0

        def get_run_id(self) -> str:
            return self.run_id

        def shutdown(self) -> bool:
            return True

    if params.max_nodes != 1:
        raise ValueError(f"the {LOOPBACK_RDZV_BACKEND} rendezvous is for one node, not {params.max_nodes}")
    return LoopbackRendezvous(params.run_id, timedelta(seconds=int(params.config.get("timeout", 600))))


def register_loopback_rendezvous() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(LOOPBACK_RDZV_BACKEND, _loopback_rendezvous)
