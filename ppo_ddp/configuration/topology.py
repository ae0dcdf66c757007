"""How many learners, how many actors each, and on which device: pure rules, no torch.distributed.

The rules:
- the legacy single-machine config num_actors=1, num_gpus=1 starts exactly one actor;
- with several GPUs, num_actors must equal num_gpus * actors_per_gpu;
- fewer GPUs than asked → fewer learners, the same actors per learner;
- no GPU → one CPU learner (MPS where present);
- actors_per_gpu "auto" (every preset's): the cores this process may use (usable_cores: its affinity, a container's
  CPU quota), shared among the node's learners, decide the actors: the most that split the learner's round of
  num_envs envs evenly (a round does not depend on its split: ppo_ddp/sampling/split.py).
Under torchrun the world size is given instead (by the user, or by our own launch together with the actors it
decided), and each rank needs a device of its own.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

Device = Literal["cuda", "mps", "cpu"]

DEFAULT_NUM_ENVS = 16
"""A learner's envs per round where the config names neither num_envs nor both numbers of a split (2 x 8, the
shape every figure of the 2-core machines was measured with)."""


@dataclass(frozen=True)
class TrainingTopology:
    num_learners: int
    """Learner processes (ranks)."""
    actors_per_learner: int
    """Actor processes each learner owns."""
    device: Device
    """Device type of every learner."""
    cores: Optional[int] = None
    """The cores per learner that decided actors_per_gpu "auto"; None where the config named the actors."""
    cores_limit: str = ""
    """What bounded those cores: "affinity" or "CPU quota" (usable_cores)."""

    @property
    def num_actors(self) -> int:
        return self.num_learners * self.actors_per_learner

    def describe(self, envs_per_actor: int) -> str:
        """The split as the start line says it: "2 cores usable (affinity): 2 actors x 8 envs"."""
        actors = self.actors_per_learner
        split = f"{actors} actor{'s' * (actors != 1)} x {envs_per_actor} env{'s' * (envs_per_actor != 1)}"
        if self.cores is None:
            return split
        per = " per learner" if self.num_learners > 1 else ""
        return f"{self.cores} core{'s' * (self.cores != 1)} usable{per} ({self.cores_limit}): {split}"


def resolve_actors_per_learner(
    num_actors: Optional[int], num_gpus: int, actors_per_gpu: Union[int, str]
) -> Optional[int]:
    """Actors per learner as the config names them; None for "auto" without num_actors (the cores decide);
    ValueError when the numbers do not fit together."""
    for name, value in (("num_actors", num_actors), ("num_gpus", num_gpus)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    if actors_per_gpu != "auto" and (not isinstance(actors_per_gpu, int) or isinstance(actors_per_gpu, bool)
                                     or actors_per_gpu <= 0):  # fmt: skip
        raise ValueError(f"actors_per_gpu={actors_per_gpu!r}: must be a positive integer or auto")
    if actors_per_gpu == "auto":
        if num_actors is None:
            return None
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
    return actors_per_gpu  # type: ignore[return-value]


def round_envs(num_envs: Optional[int], envs_per_actor: Optional[int], actors: Optional[int]) -> int:
    """The envs of a learner's round: num_envs, else actors * envs_per_actor where both are numbers, else
    DEFAULT_NUM_ENVS. ValueError naming the field when a number of the split does not fit the round."""
    if num_envs is None:
        num_envs = actors * envs_per_actor if actors is not None and envs_per_actor is not None else DEFAULT_NUM_ENVS
    elif actors is not None and envs_per_actor is not None and actors * envs_per_actor != num_envs:
        raise ValueError(
            f"num_envs={num_envs} must equal actors_per_gpu * envs_per_actor = {actors} * {envs_per_actor}: "
            "give two of the three"
        )
    for name, part in (("envs_per_actor", envs_per_actor), ("actors_per_gpu", actors)):
        if part is not None and num_envs % part != 0:
            raise ValueError(f"{name}={part}: must divide num_envs {num_envs} (the envs of a learner's round)")
    return num_envs


def actors_for(num_envs: int, cores: int) -> int:
    """actors_per_gpu "auto": as many actors as the cores keep busy, each with the same number of envs (the
    shared buffers hold one [rollout_length, envs_per_actor] block per actor), never more than the envs: the largest
    divisor of num_envs that is at most cores. A round ends with its slowest actor, so an uneven split would gain
    nothing over the even one below it unless cores fall between two divisors (16 envs on 3 cores: 2 actors of 8,
    where 3 actors of 6, 5 and 5 would finish in 6 steps' time instead of 8)."""
    return max(d for d in range(1, min(num_envs, max(1, cores)) + 1) if num_envs % d == 0)


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
    actors_per_gpu: Union[int, str],
    available_gpus: int,
    mps_available: bool = False,
    launch: Launch = Launch(),
    num_envs: Optional[int] = None,
    envs_per_actor: Optional[int] = None,
    cores: Optional[tuple[int, str]] = None,
) -> TrainingTopology:
    """The learners, the actors of each and their device: the one decision, made before any learner starts.

    - plain `python train.py`: min(num_gpus, available_gpus) learners, each with the actors the totals give
      for num_gpus (fewer GPUs than asked: fewer learners, the same actors each);
    - a worker of our own launch: the world size and the actors the launcher decided (recomputing them from
      the granted world size would cram a 4-GPU config's actors onto the 2 GPUs present);
    - a user's torchrun: the world size is the number of learners asked for (it stands for num_gpus), and a
      node must see a GPU for each of its ranks when it sees any.
    actors_per_gpu "auto": num_envs / envs_per_actor where envs_per_actor is given, else actors_for the cores
    (usable_cores(), or `cores` as (count, limit)) shared among the learners of this node.
    """
    if available_gpus < 0:
        raise ValueError(f"available_gpus={available_gpus}: must be >= 0")
    if launch.world_size is not None and launch.world_size <= 0:
        raise ValueError(f"WORLD_SIZE={launch.world_size}: must be a positive integer")
    if launch.world_size is None:
        learners, local = (1, 1) if available_gpus == 0 else (min(num_gpus, available_gpus),) * 2
        device = "cuda" if available_gpus else "mps" if mps_available else "cpu"
        named = resolve_actors_per_learner(num_actors, num_gpus, actors_per_gpu)
    else:
        learners, local = launch.world_size, launch.local_world_size or launch.world_size
        device = resolve_rank_device(launch.world_size, 0, local, available_gpus, mps_available).split(":")[0]
        named = launch.granted_actors or resolve_actors_per_learner(num_actors, launch.world_size, actors_per_gpu)
    envs = round_envs(num_envs, envs_per_actor, named)
    if named is not None or envs_per_actor is not None:
        return TrainingTopology(learners, named or envs // envs_per_actor, device)  # type: ignore[arg-type,operator]
    count, limit = cores or usable_cores()
    per_learner = max(1, count // local)
    return TrainingTopology(learners, actors_for(envs, per_learner), device, per_learner, limit)  # type: ignore[arg-type]


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
