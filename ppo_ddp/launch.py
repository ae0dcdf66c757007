"""Launching: `python train.py` and torchrun workers alike enter here; what the user is told at the end too.

`main` decides the topology once (ppo_ddp/topology.py), starts the learners through our own elastic launch when
`python train.py` asks for several, or else forms the process group and trains; it maps every ending to one
exit status (docs/reliability.md): 0 done, 1 a failure during training, 2 bad input, 128 + signal stopped by a
signal. A stop's last line says how to resume, with the same launcher and flags.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import uuid
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist

from ppo_ddp import distributed as D
from ppo_ddp.agreement import BAD_INPUT, RunFailed, Stopped
from ppo_ddp.config import Config
from ppo_ddp.signals import ForcedStop, StopRequests, exit_code, signal_name
from ppo_ddp.topology import TrainingTopology
from ppo_ddp.trainer import Trainer


def main(cfg: Config) -> None:
    """Entry of train.py: launch the learners (torchrun, or our own elastic launch), then train."""
    try:
        # Decided once, before any learner starts; our own launch hands its decision to every worker.
        topology = D.training_topology(cfg)
        device = None
        if not D.under_torchrun():
            if topology.num_learners > 1:
                launch_learners(topology, sys.argv)
                return
            device = "cuda:0" if topology.device == "cuda" else topology.device
        # Installed once the process group is up: a signal while it forms (which can wait on other nodes)
        # ends the learner as usual, with nothing to save; from then on it is a stop at the next round.
        with D.process_group(device) as ctx, StopRequests(announce=D.is_local_main()) as stop:
            try:
                Trainer(cfg, ctx, stop, topology.actors_per_learner).train()
            except Stopped as e:
                if ctx.is_main:
                    print(stop_message(e), flush=True)
                raise
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


def launch_learners(topology: TrainingTopology, argv: list[str]) -> None:
    """`python train.py` with several learners: start them through torch's elastic launcher, like torchrun.

    argv is train.py's command line (script first); every learner re-runs it under torchrun's environment
    and takes the actors per learner decided here (D.OWN_LAUNCH_ENV), not a count of its own.
    The rendezvous store listens on 127.0.0.1 only (torchrun --standalone's listens on every interface).
    Exits with the first failed learner's status, or 128 + signal when the launcher itself was signalled.
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
        *argv,
    ]
    print(
        f"starting {topology.num_learners} learners with {topology.actors_per_learner} actor(s) each: "
        f"torchrun {' '.join(args)}",
        flush=True,
    )
    os.environ[D.OWN_LAUNCH_ENV] = str(topology.actors_per_learner)
    try:
        run(parse_args(args))
    except ChildFailedError as e:  # each learner has said what went wrong; torchrun's report would repeat it
        code = e.get_first_failure()[1].exitcode
        raise SystemExit(code if code > 0 else 128 - code) from None
    except SignalException as e:  # Ctrl-C: the learners got it forwarded, saved and stopped
        raise SystemExit(exit_code(int(e.sigval))) from None


def stop_message(e: Stopped) -> str:
    """The stop's line: what was kept, and the command that continues the run."""
    by = f"stopped by {signal_name(e.signum)}"
    if e.checkpoint is None:  # nothing was kept (a stop during the first round): no round count to report
        return f"{by} before the first round finished; nothing saved. Start again with: {resume_command(None)}"
    head = f"{by} after round {e.completed} of {e.num_iterations} ({e.global_step:,} steps)"
    return f"{head}; checkpoint {e.checkpoint}. Resume with: {resume_command(e.run_name)}"


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
    tail = [argv[0], *flags] + (["--resume", "auto", "--run-name", run_name] if run_name is not None else [])
    if not D.under_torchrun() or D.launched_by_us():
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
