"""How many learners, how many actors each, and on which device: pure rules, no torch.distributed.

The rules are those of Method.md ("多 GPU 拓扑"), restated in DESIGN.md:
- the legacy single-machine config num_actors=1, num_gpus=1 starts exactly one actor;
- with several GPUs, num_actors must equal num_gpus * actors_per_gpu;
- fewer GPUs than asked → fewer learners, the same actors per learner;
- no GPU → one CPU learner (MPS where present).
Under torchrun the world size is given instead, and each rank needs a device of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def resolve_training_topology(
    num_actors: Optional[int],
    num_gpus: int,
    actors_per_gpu: Optional[int],
    available_gpus: int,
    mps_available: bool = False,
) -> TrainingTopology:
    """The learners and actors `python train.py` starts on a machine with `available_gpus` CUDA devices."""
    actors = resolve_actors_per_learner(num_actors, num_gpus, actors_per_gpu)
    if available_gpus < 0:
        raise ValueError(f"available_gpus={available_gpus}: must be >= 0")
    if available_gpus == 0:
        return TrainingTopology(1, actors, "mps" if mps_available else "cpu")
    return TrainingTopology(min(num_gpus, available_gpus), actors, "cuda")


def resolve_rank_device(
    world_size: int,
    local_rank: int,
    local_world_size: int,
    cuda_device_count: int,
    mps_available: bool = False,
) -> str:
    """The torch device string of one torchrun rank: cuda:<local_rank>, mps, or cpu.

    A CUDA node that runs more ranks than it has visible devices is an error before any work starts:
    two ranks sharing a GPU under NCCL deadlock or fail obscurely.
    """
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"LOCAL_RANK={local_rank} outside 0..{local_world_size - 1} (LOCAL_WORLD_SIZE={local_world_size})")
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
