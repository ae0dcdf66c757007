"""Will a round fit on this node? Refuse one that cannot before any actor starts.

A round that cannot fit otherwise fails late and obscurely: the shared-memory block does not fit /dev/shm (a
container's default is 64 MB) and the actors die with a bus error, or the actors build envs until the machine
swaps and the learner gives up after its start timeout. The estimate counts what a round certainly holds:

- shared: the rollout block of every learner on the node (ppo_ddp/storage/shared.py, exact);
- private: each actor's scratch arrays of the round (raw float64 observations, rewards, action noise), a
  lower bound of ENV_RESIDENT_BYTES for each env, and the learner's shuffled copy of its rollout for the
  epochs (ppo_ddp/algorithm/learner.py).

The shared block counts against both /dev/shm and memory. Only work the estimate says cannot fit is refused:
it is a lower bound, so a refusal is certain and a pass is not a promise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ppo_ddp.errors import ConfigError
from ppo_ddp.storage.shared import BufferSpec

ENV_RESIDENT_BYTES = 100 * 1024
"""A lower bound of one gymnasium MuJoCo env's resident memory (measured: Hopper-v5 128 KB, Humanoid-v5 360 KB,
HalfCheetah-v5 1.1 MB each, over 100 envs in one process)."""

SHM_PATH = "/dev/shm"
GIB = 1024**3


@dataclass(frozen=True)
class RoundMemory:
    """Bytes one node holds for a round: `shared` in /dev/shm, `private` in the processes' own memory."""

    shared: int
    private: int

    @property
    def total(self) -> int:
        return self.shared + self.private


def round_memory(spec: BufferSpec, learners_on_node: int) -> RoundMemory:
    """What learners_on_node learners with rollouts of this spec, and their actors, hold during a round."""
    samples = spec.rollout_length * spec.envs_per_actor  # per actor
    actor = (
        8 * (spec.rollout_length + 1) * spec.envs_per_actor * spec.obs_dim  # raw observations, float64
        + 10 * samples  # rewards (float64) and the two flags
        + 8 * samples * spec.act_dim  # the round's action noise and a bounded distribution's outputs, float32
        + ENV_RESIDENT_BYTES * spec.envs_per_actor
    )
    shuffled = (
        4 * spec.num_actors * samples * (spec.obs_dim + spec.act_dim + 4)
    )  # obs, actions, logp, values, adv, returns
    return RoundMemory(
        shared=learners_on_node * spec.layout()[3], private=learners_on_node * (spec.num_actors * actor + shuffled)
    )


def check_round_fits(
    spec: BufferSpec, learners_on_node: int, free_shm: Optional[int], available: Optional[int]
) -> None:
    """ConfigError (one line: the fields, the size needed, the space available) when the round cannot fit.

    free_shm / available: free bytes of /dev/shm and available memory (None where the system does not say).
    """
    need = round_memory(spec, learners_on_node)
    envs = spec.num_actors * spec.envs_per_actor
    fields = (
        f"{learners_on_node} learner(s) x num_envs {envs} ({spec.num_actors} actors x {spec.envs_per_actor} envs) "
        f"x rollout_length {spec.rollout_length}"
    )
    head = f"num_envs={envs}: the round of this node ({fields})"
    if free_shm is not None and need.shared > free_shm:
        raise ConfigError(
            f"{head} needs {need.shared / GIB:.2f} GiB of shared memory for its rollout buffers, "
            f"{SHM_PATH} has {free_shm / GIB:.2f} GiB free: use fewer envs or shorter rollouts, or "
            f"enlarge {SHM_PATH} (docker: --shm-size)"
        )
    if available is not None and need.total > available:
        raise ConfigError(
            f"{head} needs at least {need.total / GIB:.2f} GiB of memory ({need.shared / GIB:.2f} GiB "
            f"rollout buffers, {need.private / GIB:.2f} GiB for actors, envs and the update), "
            f"{available / GIB:.2f} GiB is available: use fewer envs or shorter rollouts"
        )


def free_shared_memory() -> Optional[int]:
    """Free bytes of /dev/shm, where POSIX shared memory lives on Linux; None where there is no such folder."""
    try:
        st = os.statvfs(SHM_PATH)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def available_memory() -> Optional[int]:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping); None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
