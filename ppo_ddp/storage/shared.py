"""The shared memory between one learner and its actor processes: one block, a fixed layout, no pickles.

The learner allocates one `multiprocessing.shared_memory.SharedMemory` block per run (`SharedBuffers.create`),
named `ppo_ddp_<learner pid>_<8 hex digits>` (so a block that a killed learner left in /dev/shm says whose it
was); the actors attach to it by name (`SharedBuffers.attach`), and the learner alone unlinks it (`close`). Every
field is a numpy view of the block (`.arrays`) and a torch tensor sharing the same memory (attributes named as
the fields). The layout is a pure function of (A, T, E, obs_dim, act_dim, P, critic_dim, ...), so an actor
rebuilds exactly the learner's views from a small `BufferSpec`.

Layout (offsets rise in this order; every field starts on a 64-byte boundary, the rollout region on a page
boundary and spans whole pages, so it can be page-locked with cudaHostRegister on its own):

=============  =======  ==================  ======================================================
field          dtype    shape               written by / meaning
=============  =======  ==================  ======================================================
*parameters*
weights        float32  [P]                 learner: flat actor-critic parameters (model.parameters() order)
obs_mean       float64  [obs_dim]           learner: frozen observation statistics of the round
obs_var        float64  [obs_dim]
obs_count      float64  [1]                 0 => no statistics yet (actors normalise with the identity)
ret_mean       float64  [1]                 learner: frozen discounted-return statistics of the round
ret_var        float64  [1]
ret_count      float64  [1]                 0 => no statistics yet (rewards are not scaled)
val_mean       float64  [1]                 learner: frozen statistics of the returns (value targets) of the round
val_var        float64  [1]
val_count      float64  [1]                 0 => the critic's output is used as it is (no value normalisation)
critic_mean    float64  [Dc]                learner: frozen statistics of the critic's own observations (critic_obs;
critic_var     float64  [Dc]                Dc = critic_dim, 0 without: empty fields)
critic_count   float64  [1]                 0 => no statistics yet
*rollout*      (actor a writes only [a]; the learner fills it with the sentinel before each round)
obs            float32  [A, T, E, obs_dim]  observation as the policy saw it (normalised with the frozen stats, clipped)
actions        float32  [A, T, E, act_dim]  raw Normal sample = policy_action (the env got its clip to the bounds)
logp           float32  [A, T, E]           log-prob of actions under the round's weights
values         float32  [A, T, E]           V(obs), in reward units (the critic's output de-normalised with val_*)
next_values    float32  [A, T, E]           V(obs after the step, before any reset): V(final obs) at episode ends
advantages     float32  [A, T, E]           GAE(gamma, lambda) on the (scaled) rewards
returns        float32  [A, T, E]           advantages + values
rewards        float32  [A, T, E]           raw env reward (unscaled)
terminated     uint8    [A, T, E]           1 / 0
truncated      uint8    [A, T, E]           1 / 0
*critic*       (critic_obs only: critic_dim Dc > 0)
critic_obs     float32  [A, T, E, Dc]       the critic's observation of step t (the env's privileged one), normalised
                                            with the critic_* statistics and clipped: what values is V of
*next_obs*     (recompute_advantages only)
next_obs       float32  [A, T, E, Dv]       the critic's observation after step t, before any reset, normalised as
                                            obs (Dv: critic_dim with critic_obs, else obs_dim): what next_values is V
                                            of, for the learner to value again with a newer critic
*recurrent*    (policy "gru" only: rnn_hidden H > 0; L = seq_length, T a multiple of it)
episode_start  uint8    [A, T, E]           1: obs[t] is the first of an episode (the state entering step t is zero)
hidden         float32  [A, T/L, E, H]      the GRU state entering step c * L of each env: the state the update
                                            unrolls chunk c from
=============  =======  ==================  ======================================================

Rollout slots: with overlapped rounds (cfg.overlap) the rollout region is laid out twice, one after the other (`slots`
2): the actors write round k into slot k % 2 while the learner trains on the other. `buffers.slot(s)` views slot s
with the same fields and the same parameter region; `buffers` itself is slot 0. Each slot is allocated once, with
the block.

Sentinel (`fill_sentinel`): NaN in every float field of the rollout, `FLAG_SENTINEL` (255) in the flags, so a
slot an actor failed to write is visible in tests and in the learner's sanity checks.
"""

from __future__ import annotations

import mmap
import os
import secrets
import warnings
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import NamedTuple, Optional

import numpy as np
import torch

from ppo_ddp.configuration.config import Config
from ppo_ddp.models.normalization import Moments

ALIGN = 64
PAGE = mmap.PAGESIZE
FLAG_SENTINEL = 255


def block_name() -> str:
    """A new block's name: its owner's pid, and random digits for the blocks one process makes in turn (at most 25
    characters with the leading slash: macOS allows 31)."""
    return f"ppo_ddp_{os.getpid()}_{secrets.token_hex(4)}"


# prefixes of the frozen statistics: observations, discounted returns, values, the critic's observations
STATISTICS = ("obs", "ret", "val", "critic")
VECTOR_STATISTICS = ("obs", "critic")  # per entry of an observation; the others are scalars
PARAMETER_FIELDS = ("weights", *(f"{p}_{s}" for p in STATISTICS for s in ("mean", "var", "count")))
ROLLOUT_FIELDS = (
    "obs",
    "actions",
    "logp",
    "values",
    "next_values",
    "advantages",
    "returns",
    "rewards",
    "terminated",
    "truncated",
)
CRITIC_FIELDS = ("critic_obs",)
NEXT_OBS_FIELDS = ("next_obs",)
RECURRENT_FIELDS = ("episode_start", "hidden")
FLAG_FIELDS = ("terminated", "truncated", "episode_start")


class FrozenStats(NamedTuple):
    """A round's frozen statistics as the learner published them (None: not published, not normalising)."""

    obs: Optional[Moments]
    ret: Optional[Moments]
    value: Optional[Moments]
    critic: Optional[Moments]


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class BufferSpec:
    """Everything that determines the layout; small and picklable, sent to each actor once."""

    num_actors: int
    rollout_length: int
    envs_per_actor: int
    obs_dim: int
    act_dim: int
    num_params: int
    rnn_hidden: int = 0
    """Width of the GRU state (0: an MLP policy, no recurrent fields)."""
    seq_length: int = 1
    next_obs: bool = False
    """Keep each step's next observation (cfg.recompute_advantages)."""
    slots: int = 1
    """Rollout regions: 2 when rounds overlap (cfg.overlap), so that round k+1 is written while round k trains."""
    critic_dim: int = 0
    """Width of the critic's own observation (cfg.critic_obs; 0: the critic sees the policy's)."""

    @staticmethod
    def for_config(
        cfg: Config, num_actors: int, obs_dim: int, act_dim: int, num_params: int, critic_dim: int = 0
    ) -> BufferSpec:
        """The layout of a config's round with num_actors actors (the recurrent fields for policy "gru")."""
        gru = cfg.policy == "gru"
        return BufferSpec(
            num_actors, cfg.rollout_length, cfg.envs_per_actor, obs_dim, act_dim, num_params,
            rnn_hidden=cfg.rnn_hidden_size if gru else 0, seq_length=cfg.seq_length if gru else 1,
            next_obs=cfg.recompute_advantages, slots=2 if cfg.overlap else 1, critic_dim=critic_dim,
        )  # fmt: skip

    @property
    def value_dim(self) -> int:
        """Width of what the critic reads: its own observation, or the policy's."""
        return self.critic_dim or self.obs_dim

    def rollout_fields(self) -> tuple[str, ...]:
        """The fields an actor writes, in layout order."""
        return (
            ROLLOUT_FIELDS
            + (CRITIC_FIELDS if self.critic_dim else ())
            + (NEXT_OBS_FIELDS if self.next_obs else ())
            + (RECURRENT_FIELDS if self.rnn_hidden else ())
        )

    def fields(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        A, T, E = self.num_actors, self.rollout_length, self.envs_per_actor
        f32, f64, u8 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.uint8)
        return {
            "weights": (f32, (self.num_params,)),
            "obs_mean": (f64, (self.obs_dim,)),
            "obs_var": (f64, (self.obs_dim,)),
            "obs_count": (f64, (1,)),
            "ret_mean": (f64, (1,)),
            "ret_var": (f64, (1,)),
            "ret_count": (f64, (1,)),
            "val_mean": (f64, (1,)),
            "val_var": (f64, (1,)),
            "val_count": (f64, (1,)),
            "critic_mean": (f64, (self.critic_dim,)),
            "critic_var": (f64, (self.critic_dim,)),
            "critic_count": (f64, (1,)),
            "obs": (f32, (A, T, E, self.obs_dim)),
            "actions": (f32, (A, T, E, self.act_dim)),
            "logp": (f32, (A, T, E)),
            "values": (f32, (A, T, E)),
            "next_values": (f32, (A, T, E)),
            "advantages": (f32, (A, T, E)),
            "returns": (f32, (A, T, E)),
            "rewards": (f32, (A, T, E)),
            "terminated": (u8, (A, T, E)),
            "truncated": (u8, (A, T, E)),
            **({"critic_obs": (f32, (A, T, E, self.critic_dim))} if self.critic_dim else {}),
            **({"next_obs": (f32, (A, T, E, self.value_dim))} if self.next_obs else {}),
            **(
                {"episode_start": (u8, (A, T, E)), "hidden": (f32, (A, T // self.seq_length, E, self.rnn_hidden))}
                if self.rnn_hidden
                else {}
            ),
        }

    def layout(self) -> tuple[dict[str, int], int, int, int]:
        """(offset of each field in slot 0, rollout region start, one slot's size, total size) in bytes; slot s's
        fields lie s slot sizes further on."""
        fields = self.fields()
        offsets: dict[str, int] = {}
        pos = 0
        for name in PARAMETER_FIELDS:
            pos = _round_up(pos, ALIGN)
            offsets[name] = pos
            dtype, shape = fields[name]
            pos += dtype.itemsize * int(np.prod(shape))
        rollout_start = pos = _round_up(pos, PAGE)
        for name in self.rollout_fields():
            pos = _round_up(pos, ALIGN)
            offsets[name] = pos
            dtype, shape = fields[name]
            pos += dtype.itemsize * int(np.prod(shape))
        rollout_size = _round_up(pos - rollout_start, PAGE)
        return offsets, rollout_start, rollout_size, rollout_start + self.slots * rollout_size


class SharedBuffers:
    """Views of one shared-memory block laid out as in the module docstring.

    Attributes named as the fields are torch tensors on the shared memory (e.g. `buffers.obs`, [A, T, E, D]);
    `arrays[name]` are the numpy views of the same bytes. The creator (learner) owns the block and unlinks it
    in `close()`; attached users (actors) only unmap it.
    """

    def __init__(self, spec: BufferSpec, shm: shared_memory.SharedMemory, owner: bool, slot: int = 0) -> None:
        """slot > 0: a view of another rollout slot, made by slot(); it shares the block and owns nothing."""
        self.spec = spec
        self.name = shm.name
        self.owner = owner
        self._shm: Optional[shared_memory.SharedMemory] = shm
        self._pinned_ptr: Optional[int] = None
        offsets, self._rollout_start, self._rollout_size, _ = spec.layout()
        rollout = set(spec.rollout_fields())
        self.arrays: dict[str, np.ndarray] = {}
        for name, (dtype, shape) in spec.fields().items():
            offset = offsets[name] + (slot * self._rollout_size if name in rollout else 0)
            array = np.ndarray(shape, dtype=dtype, buffer=shm.buf, offset=offset)
            self.arrays[name] = array
            setattr(self, name, torch.from_numpy(array))
        self._rollout_bytes = np.ndarray(
            (spec.slots * self._rollout_size,), dtype=np.uint8, buffer=shm.buf, offset=self._rollout_start
        )
        self._root = self  # the slot-0 object, which pins, closes and lists the slots
        self._slots = [self]
        if slot == 0:
            self._slots += [SharedBuffers(spec, shm, owner=False, slot=s) for s in range(1, spec.slots)]
            for view in self._slots[1:]:
                view._root = self

    def slot(self, s: int) -> SharedBuffers:
        """The views of rollout slot s (the parameter fields are the block's one set); slot(0) is self."""
        return self._slots[s]

    # ---- lifetime -------------------------------------------------------------------------------
    @classmethod
    def create(cls, spec: BufferSpec) -> SharedBuffers:
        size = spec.layout()[3]
        shm = shared_memory.SharedMemory(name=block_name(), create=True, size=size)
        try:
            buffers = cls(spec, shm, owner=True)
        except BaseException:
            shm.close()
            shm.unlink()
            raise
        for prefix in STATISTICS:
            buffers.arrays[f"{prefix}_count"][:] = 0.0
        buffers.fill_sentinel()
        return buffers

    @classmethod
    def attach(cls, spec: BufferSpec, name: str) -> SharedBuffers:
        return cls(spec, shared_memory.SharedMemory(name=name), owner=False)

    def pin(self) -> None:
        """Page-lock the rollout region (every slot) for asynchronous host-to-GPU copies (learner side, CUDA only)."""
        if self._pinned_ptr is not None:
            return
        ptr = self._rollout_bytes.ctypes.data
        err = torch.cuda.cudart().cudaHostRegister(ptr, self._rollout_bytes.size, 0)
        if int(err) != 0:
            raise RuntimeError(
                f"cudaHostRegister of the {self._rollout_bytes.size}-byte rollout region failed with CUDA error "
                f"{int(err)}"
            )
        self._pinned_ptr = ptr

    @property
    def pinned(self) -> bool:
        return self._root._pinned_ptr is not None

    def close(self) -> None:
        """Unpin, drop the views, unmap, and (owner only) unlink the block. Idempotent."""
        if self._shm is None:
            return
        shm, self._shm = self._shm, None
        try:
            if self._pinned_ptr is not None:
                ptr, self._pinned_ptr = self._pinned_ptr, None
                err = torch.cuda.cudart().cudaHostUnregister(ptr)
                if int(err) != 0:
                    warnings.warn(
                        f"cudaHostUnregister of the rollout buffer failed with CUDA error {int(err)}", stacklevel=2
                    )
        finally:
            for view in self._slots:
                for name in view.arrays:
                    setattr(view, name, None)
                view.arrays = {}
                view._rollout_bytes = None
            try:
                shm.close()
            except BufferError:
                # Someone still holds a view (e.g. a tensor kept by the caller): the mapping lives on until it
                # is dropped; unlinking below still removes the name, so nothing leaks past the process.
                pass
            finally:
                if self.owner:
                    try:
                        shm.unlink()
                    except FileNotFoundError:
                        pass

    # ---- rollout ----------------------------------------------------------------------------------
    def fill_sentinel(self) -> None:
        """NaN in every float field of the rollout, FLAG_SENTINEL in the flags."""
        for name in self.spec.rollout_fields():
            self.arrays[name].fill(FLAG_SENTINEL if name in FLAG_FIELDS else np.nan)

    # ---- frozen statistics -----------------------------------------------------------------------------
    def write_stats(
        self,
        obs_rms: Optional[Moments],
        ret_rms: Optional[Moments],
        value_rms: Optional[Moments] = None,
        critic_rms: Optional[Moments] = None,
    ) -> None:
        for prefix, moments in zip(STATISTICS, (obs_rms, ret_rms, value_rms, critic_rms)):
            if moments is None or moments.count == 0:
                self.arrays[f"{prefix}_count"][:] = 0.0
                continue
            mean = self.arrays[f"{prefix}_mean"]
            if np.size(moments.mean) != mean.size:
                raise ValueError(f"{prefix}_rms has {np.size(moments.mean)} entries, the buffer holds {mean.size}")
            mean[:] = np.reshape(moments.mean, mean.shape)
            self.arrays[f"{prefix}_var"][:] = np.reshape(moments.var, mean.shape)
            self.arrays[f"{prefix}_count"][:] = moments.count

    def read_stats(self) -> FrozenStats:
        """The statistics as published; copies, so they stay valid when the learner writes the next round's."""
        out = []
        for prefix in STATISTICS:
            count = float(self.arrays[f"{prefix}_count"][0])
            if count == 0:
                out.append(None)
                continue
            mean = self.arrays[f"{prefix}_mean"].copy()
            var = self.arrays[f"{prefix}_var"].copy()
            if prefix not in VECTOR_STATISTICS:  # the return statistics are scalars
                mean, var = mean.reshape(()), var.reshape(())
            out.append(Moments(mean, var, count))
        return FrozenStats(*out)
