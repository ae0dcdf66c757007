"""The process group: setup and teardown in one place, how this process was launched, and the rank's context.

Every run has a process group, even `python train.py` with one learner (world size 1, an in-memory
store), so every rank runs the same code path. The collectives over it are ppo_ddp/distributed/collectives.py.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

# Imported before any process group exists: its functions take `group=group.WORLD` as a default argument, so a
# first import after init_process_group (torch.optim's first optimizer imports it, through torch._dynamo) would
# hold the default group for good; destroy_process_group could not free it, and gloo's threads would run into
# interpreter shutdown, where they sometimes abort the process ("terminate called without an active
# exception", SIGABRT) after it has said its last word.
import torch.distributed.nn.functional  # noqa: F401

from ppo_ddp.configuration.config import Config
from ppo_ddp.configuration.topology import Launch, TrainingTopology, resolve_rank_device, resolve_training_topology
from ppo_ddp.errors import ConfigError

OWN_LAUNCH_ENV = "PPO_DDP_ACTORS_PER_LEARNER"
"""Set by our own launch (`python train.py` starting several learners) for its workers: the actors per learner
it decided. Its presence also tells a worker that the user typed `python train.py`, not torchrun."""

# A collective that waits longer than this means a peer rank is gone or stuck; better a clear timeout
# than a hang. It is the last line of defence: a rank that fails in its own work tells the others through
# `agree` within a round, and a rank that dies on one node makes torchrun stop its peers within seconds
# (docs/reliability.md). It only decides when a whole node vanishes under NCCL, and it must exceed the
# longest legitimate wait: one rank's slowest rollout plus update. Rounds are seconds long.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    """This rank's learner device."""
    comm_device: torch.device
    """Where collective tensors live: the GPU under NCCL, the CPU under gloo."""
    local_world_size: int = 1
    """Learners on this node (they share its memory and /dev/shm)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def is_local_main() -> bool:
    """Rank 0 of this node (or the only process): the one that prints what every rank of the node would."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def say_once_per_node(line: str, patience_s: float = 10.0) -> None:
    """Print a line that every rank of this node found alike (bad input found before or outside the agreement),
    once: rank 0 of the node says it.

    The other ranks wait to be ended instead of exiting with it: torchrun stops the whole group at the first exit,
    so one that left at once could cut rank 0 off before its line was out. A rank still running after patience_s
    says the line itself (rank 0 did not find the same, or is stuck); a launcher's SIGTERM ends the wait at once.
    """
    if not is_local_main():
        time.sleep(patience_s)
    print(line, file=sys.stderr, flush=True)


def lost_contact(e: BaseException) -> str:
    """What a rank says when a collective broke because a peer died or was stopped."""
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    return f"lost contact with another rank, which died or was stopped ({first})"


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def current_launch() -> Launch:
    """How this process was started, from the environment torchrun (and our own launch) set."""
    if not under_torchrun():
        return Launch()
    world = int(os.environ["WORLD_SIZE"])
    granted = os.environ.get(OWN_LAUNCH_ENV)
    return Launch(world, int(os.environ.get("LOCAL_WORLD_SIZE", world)), int(granted) if granted else None)


def launched_by_us() -> bool:
    """A worker of our own launch (the user ran `python train.py`), not of the user's torchrun."""
    return OWN_LAUNCH_ENV in os.environ


def training_topology(cfg: Config) -> TrainingTopology:
    """This run's learners, actors and device (topology.resolve_training_topology) for the devices and cores this
    process sees and how it was launched; ConfigError when the config does not fit them."""
    try:
        return resolve_training_topology(
            cfg.num_actors,
            cfg.num_gpus,
            cfg.actors_per_gpu,
            torch.cuda.device_count(),
            _mps_available(),
            current_launch(),
            num_envs=cfg.num_envs,
            envs_per_actor=cfg.envs_per_actor,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None


def setup(single_process_device: Optional[str] = None) -> DistContext:
    """Create the process group. Under torchrun: RANK/LOCAL_RANK/WORLD_SIZE from the environment
    (global rank, so several nodes work); otherwise a world of one on single_process_device."""
    if under_torchrun():
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        try:
            device = torch.device(
                resolve_rank_device(
                    world_size, local_rank, local_world_size, torch.cuda.device_count(), _mps_available()
                )
            )
        except ValueError as e:  # every rank of the node finds the same mismatch, before any collective
            raise ConfigError(str(e)) from None
        store = None
    else:
        rank, world_size, local_rank, local_world_size = 0, 1, 0, 1
        device = torch.device(single_process_device or "cpu")
        store = dist.HashStore()
    if under_torchrun() and world_size == local_world_size:
        _loopback_sockets()
    if device.type == "cuda":
        # Bind before the first collective: otherwise every rank's NCCL communicator lands on cuda:0.
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    kwargs: dict[str, Any] = {"backend": backend, "timeout": COLLECTIVE_TIMEOUT}
    if store is None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = _attempt_store(world_size)
    if store is not None:
        kwargs.update(store=store, rank=rank, world_size=world_size)
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    return DistContext(
        rank, world_size, local_rank, device, device if backend == "nccl" else torch.device("cpu"), local_world_size
    )


def _attempt_store(world_size: int) -> dist.Store:
    """The torchelastic agent's store, with a key prefix of its own for each restart of the group.

    The agent's store outlives a restart (--max-restarts) and torch's env:// setup reuses it without a
    prefix, so a restarted rank can read the address a dead rank of the previous attempt published there and
    wait for it for the whole collective timeout (seen with torch 2.13 and gloo). A prefix per attempt
    keeps each attempt's keys apart.
    """
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=COLLECTIVE_TIMEOUT,
    )
    return dist.PrefixStore(f"ppo_ddp/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)


def _loopback_interface() -> Optional[str]:
    try:
        return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)
    except OSError:
        return None


def _loopback_sockets() -> None:
    """All ranks on this one node: let gloo and NCCL listen on the loopback interface only.

    By default they listen on the address the host name resolves to, which may be reachable from the
    network; a user's own choice (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME already set) is kept.
    """
    lo = _loopback_interface()
    if lo is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def process_group(single_process_device: Optional[str] = None) -> Iterator[DistContext]:
    """setup() ... teardown() in a finally, so a failing rank still releases its group."""
    ctx = setup(single_process_device)
    try:
        yield ctx
    finally:
        teardown()


# ---- our own launch of several learners on one machine (`python train.py --num-gpus N`) -----------------
