"""How many learners, how many actors each, and on which device: pure rules, no torch.distributed.

The rules:
- the legacy single-machine config num_actors=1, num_gpus=1 starts exactly one actor;
- with several GPUs, num_actors must equal num_gpus * actors_per_gpu;
- fewer GPUs than asked → fewer learners, the same actors per learner;
- no GPU → one CPU learner (MPS where present).
Under torchrun the world size is given instead (by the user, or by our own launch together with the actors it
decided), and each rank needs a device of its own.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

Device = Literal["cuda", "mps", "cpu"]

DEFAULT_ACTORS_PER_GPU = 2


@dataclass(frozen=True)
class TrainingTopology:
    num_learners: int
    """Learner processes (ranks)."""
    actors_per_learner: int
    """Actor processes each learner owns."""
    device: Device
    """Device type of every learner."""

    @property
    def num_actors(self) -> int:
        return self.num_learners * self.actors_per_learner


def resolve_actors_per_learner(num_actors: Optional[int], num_gpus: int, actors_per_gpu: Optional[int]) -> int:
    """Actors per learner from the requested totals; ValueError when they do not fit together."""
    for name, value in (("num_actors", num_actors), ("num_gpus", num_gpus), ("actors_per_gpu", actors_per_gpu)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    if actors_per_gpu is None:
        if num_actors is None:
            return DEFAULT_ACTORS_PER_GPU
        if num_actors % num_gpus != 0:
            raise ValueError(
                f"num_actors={num_actors} does not split evenly over num_gpus={num_gpus}: "
                f"give a multiple of {num_gpus}, or set actors_per_gpu"
            )
        return num_actors // num_gpus
    if num_actors is not None and num_actors != num_gpus * actors_per_gpu:
        raise ValueError(
            f"num_actors={num_actors} must equal num_gpus * actors_per_gpu = {num_gpus} * {actors_per_gpu} "
            f"= {num_gpus * actors_per_gpu}; drop num_actors or fix one of the three"
        )
    return actors_per_gpu


@dataclass(frozen=True)
class Launch:
    """How this learner process was started, which decides what the topology rules may still change."""

    world_size: Optional[int] = None
    """Ranks torchrun started; None for plain `python train.py` (the rules choose the learners)."""
    local_world_size: Optional[int] = None
    """Ranks on this node (torchrun's LOCAL_WORLD_SIZE; None: all of world_size)."""
    granted_actors: Optional[int] = None
    """Actors per learner that our own launch (`python train.py` starting several learners) decided before it
    started the workers; None under a user's torchrun, where the world size stands for num_gpus."""


def resolve_training_topology(
    num_actors: Optional[int],
    num_gpus: int,
    actors_per_gpu: Optional[int],
    available_gpus: int,
    mps_available: bool = False,
    launch: Launch = Launch(),
) -> TrainingTopology:
    """The learners, the actors of each and their device: the one decision, made before any learner starts.

    - plain `python train.py`: min(num_gpus, available_gpus) learners, each with the actors the totals give
      for num_gpus (fewer GPUs than asked: fewer learners, the same actors each);
    - a worker of our own launch: the world size and the actors the launcher decided (recomputing them from
      the granted world size would cram a 4-GPU config's actors onto the 2 GPUs present);
    - a user's torchrun: the world size is the number of learners asked for (it stands for num_gpus), and a
      node must see a GPU for each of its ranks when it sees any.
    """
    if available_gpus < 0:
        raise ValueError(f"available_gpus={available_gpus}: must be >= 0")
    if launch.world_size is None:
        actors = resolve_actors_per_learner(num_actors, num_gpus, actors_per_gpu)
        if available_gpus == 0:
            return TrainingTopology(1, actors, "mps" if mps_available else "cpu")
        return TrainingTopology(min(num_gpus, available_gpus), actors, "cuda")
    if launch.world_size <= 0:
        raise ValueError(f"WORLD_SIZE={launch.world_size}: must be a positive integer")
    if launch.granted_actors is not None:
        actors = launch.granted_actors
    else:
        actors = resolve_actors_per_learner(num_actors, launch.world_size, actors_per_gpu)
    local = launch.local_world_size or launch.world_size
    device = resolve_rank_device(launch.world_size, 0, local, available_gpus, mps_available).split(":")[0]
    return TrainingTopology(launch.world_size, actors, device)  # type: ignore[arg-type]


def resolve_rank_device(
    world_size: int, local_rank: int, local_world_size: int, cuda_device_count: int, mps_available: bool = False
) -> str:
    """The torch device string of one torchrun rank: cuda:<local_rank>, mps, or cpu.

    A CUDA node that runs more ranks than it has visible devices is an error before any work starts:
    two ranks sharing a GPU under NCCL deadlock or fail obscurely.
    """
    if not 0 <= local_rank < local_world_size:
        raise ValueError(
            f"LOCAL_RANK={local_rank} outside 0..{local_world_size - 1} (LOCAL_WORLD_SIZE={local_world_size})"
        )
    if world_size < local_world_size:
        raise ValueError(f"WORLD_SIZE={world_size} is smaller than LOCAL_WORLD_SIZE={local_world_size}")
    if cuda_device_count > 0:
        if local_world_size > cuda_device_count:
            raise ValueError(
                f"torchrun started {local_world_size} processes on this node but only {cuda_device_count} CUDA "
                f"device(s) are visible: use --nproc_per_node={cuda_device_count} (or set CUDA_VISIBLE_DEVICES)"
            )
        return f"cuda:{local_rank}"
    if mps_available and world_size == 1:
        return "mps"
    return "cpu"


def cpu_learner_threads(learner_threads: int, learners_on_node: int, stepping_actors: int = 0) -> int:
    """torch threads of a CPU learner's update: cfg.learner_threads, at most this learner's share of the cores less
    the actors that step during the update (its own, with overlapped rounds; none in sync rounds, where they wait).

    Mini-batches of a small MLP are too small to split across cores: OpenMP's hand-offs cost more than they save,
    and badly so when actors or other ranks hold the other cores (measured: 0.9 s with one thread against 4-13 s
    with two for a default round's update on a busy 2-core machine). torchrun sets OMP_NUM_THREADS=1 for the same
    reason. Large mini-batches gain from the cores the idle actors leave, and several ranks on one machine update
    at the same time.
    """
    cores, _ = usable_cores()
    return max(1, min(learner_threads, cores // learners_on_node - stepping_actors))


CGROUP_FS = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def usable_cores(cgroup_fs: Path = CGROUP_FS, proc_cgroup: Path = PROC_CGROUP) -> tuple[int, str]:
    """The whole cores this process may keep busy, and what limits them ("affinity" or "CPU quota"): the CPUs of its
    affinity (taskset, Slurm's binding), fewer where a container's CPU quota allows less time (a 2-CPU quota on a
    64-core host is 2 cores' worth, though all 64 are in the affinity), rounded down, at least 1."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota(cgroup_fs, proc_cgroup)
    if quota is not None and quota < affinity:
        return max(1, math.floor(quota)), "CPU quota"
    return affinity, "affinity"


def cgroup_cpu_quota(cgroup_fs: Path = CGROUP_FS, proc_cgroup: Path = PROC_CGROUP) -> Optional[float]:
    """CPUs' worth of time the quotas of this process's cgroups allow, the smallest along its cgroup's path (cgroup
    v2's cpu.max "QUOTA PERIOD", v1's cpu.cfs_quota_us / cpu.cfs_period_us); None where none is set or readable."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy, cpu.max in each cgroup
            for folder in _cgroup_folders(cgroup_fs, path):
                quota, _, period = _read(folder / "cpu.max").partition(" ")
                if quota not in ("", "max"):
                    limits.append(int(quota) / int(period))
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own hierarchy
            for folder in _cgroup_folders(cgroup_fs / controllers, path):
                quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
                if quota and period and int(quota) > 0:
                    limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def _cgroup_folders(root: Path, path: str) -> list[Path]:
    """The folders of a cgroup and of its ancestors up to the hierarchy's root (in a container, whose root is its own
    cgroup, the host's path does not exist below it: the root's files are the container's)."""
    folder, folders = root / path.strip("/"), [root]
    while folder != root and root in folder.parents:
        folders.append(folder)
        folder = folder.parent
    return folders


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
