"""Digests of what an in-process Actor writes, round after round, in scenarios that reach every path of its loop.

tests/test_actor_identity.py compares them with tests/data/rollout_digests.json: a faster actor must write the same
rollouts, field by field and bit for bit. The file was first written by the actor of commit cf789fc (issue 44's
base), then on an AMD machine by 395e257's; it now holds what issue 72's actor wrote on an Intel Xeon (cpu_vendor,
cpu_model) with torch on one thread, as the actors' processes run: its env seeds, action noise and statistics belong
to the envs, not the actors (ppo_ddp/sampling/split.py), which changed every number by design. To write the file
again (only when a change is meant to change the numbers, or on another kind of machine, and the commit message says
so):

    python tests/rollout_digests.py --write

Each scenario runs ROUNDS rounds of one actor with new weights every round (torch's seed k) and, from round 1 on,
the statistics the previous rounds' reports merge to (as training freezes them), so normalisation, reward
scaling and a normalised critic all run. The digest of a round covers every rollout field the config writes, and
the report: episodes and the moments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import torch

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import scripted_env  # noqa: E402,F401  (registers the scripted ids)

from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.envs.make import make_env  # noqa: E402
from ppo_ddp.models.factory import make_model  # noqa: E402
from ppo_ddp.models.flat import num_parameters, write_flat_parameters  # noqa: E402
from ppo_ddp.models.normalization import Moments, merge_rms_states  # noqa: E402
from ppo_ddp.sampling.actor import Actor  # noqa: E402
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers  # noqa: E402

DIGEST_FILE = TESTS_DIR / "data" / "rollout_digests.json"
SCRIPTED = "scripted_env:Scripted-v0"
VALUE_RMS = Moments(np.array(3.0), np.array(25.0), 100.0)

SCENARIOS: dict[str, tuple[dict, int]] = {
    # name: (Config fields, rounds). HalfCheetah's 1000-step episodes truncate in round 15 (64 steps a round).
    "halfcheetah": (dict(env_id="HalfCheetah-v5", envs_per_actor=2, rollout_length=64), 17),
    "hopper_terminations": (dict(env_id="Hopper-v5", envs_per_actor=4, rollout_length=48), 4),
    "ant_no_reward_scaling": (
        dict(env_id="Ant-v5", envs_per_actor=3, rollout_length=32, normalize_reward=False, normalize_value=False),
        3,
    ),
    "scripted_recompute": (
        dict(env_id=SCRIPTED, envs_per_actor=3, rollout_length=12, recompute_advantages=True, hidden_sizes=(16,)),
        4,
    ),
    "scripted_gru": (
        dict(
            env_id=SCRIPTED,
            envs_per_actor=3,
            rollout_length=12,
            policy="gru",
            seq_length=4,
            rnn_hidden_size=8,
            hidden_sizes=(16,),
        ),  # fmt: skip
        4,
    ),
    "hopper_gru": (
        dict(env_id="Hopper-v5", envs_per_actor=2, rollout_length=32, policy="gru", seq_length=8, rnn_hidden_size=16),
        3,
    ),
}


def _cpuinfo(field: str) -> str:
    """The first value of one /proc/cpuinfo field ("unknown" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (line.split(":", 1)[1].strip() for line in f if line.split(":", 1)[0].strip() == field), "unknown"
            )
    except OSError:
        return "unknown"


def cpu_vendor() -> str:
    """The CPU's maker as Linux names it (GenuineIntel, AuthenticAMD): with the same AVX-512 features and library
    versions, the same code wrote other digests on an AMD EPYC than on the machine of the first recording, in the
    fields that torch computes and in MuJoCo's, since libraries pick their kernels by the CPU model too."""
    vendor = _cpuinfo("vendor_id")
    return platform.processor() or "unknown" if vendor == "unknown" else vendor


def cpu_model() -> str:
    """The CPU's family and model numbers: two Intel Xeons with the same AVX-512 features and versions wrote other
    digests (CI's, at fdf634d, against this file's), since OpenBLAS and oneDNN pick their kernels by the model."""
    return f"family {_cpuinfo('cpu family')} model {_cpuinfo('model')}"


def machine() -> dict:
    """What the numbers depend on beyond the code: numpy's SIMD (its matmul's kernels), the CPU's maker and model,
    and the library versions."""
    import mujoco
    from numpy._core._multiarray_umath import __cpu_features__

    features = sorted(name for name, found in __cpu_features__.items() if found and name.startswith("AVX512"))
    versions = {"numpy": np.__version__, "torch": torch.__version__, "mujoco": mujoco.__version__}
    return {**versions, "avx512": features, "cpu_vendor": cpu_vendor(), "cpu_model": cpu_model()}


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def scenario_digests(name: str, restart_at: Optional[int] = None) -> list[dict[str, str]]:
    """_scenario_digests with torch on one thread, as an actor's process runs it (ppo_ddp/sampling/process.py): a
    product's rounding depends on torch's thread count, which an earlier test in the same process may have set (an
    in-process trainer sets its learner's), and CI's failures at fdf634d were that, not another CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _scenario_digests(name, restart_at)
    finally:
        torch.set_num_threads(threads)


def _scenario_digests(name: str, restart_at: Optional[int] = None) -> list[dict[str, str]]:
    """The digests of each round of one scenario: {field: digest}, the report's parts included. restart_at=k: before
    round k the actor is closed and a new one continues from what the old one carried (Actor.carried), as a resumed
    run's actors do; the digests must not change."""
    fields, rounds = SCENARIOS[name]
    cfg = Config(**{"actors_per_gpu": 1, "num_minibatches": 1, "seed": 5, **fields})
    probe = make_env(cfg.env_id)
    obs_dim, act_dim = probe.observation_space.shape[0], probe.action_space.shape[0]
    probe.close()
    torch.manual_seed(0)
    model = make_model(cfg, obs_dim, act_dim)
    buffers = SharedBuffers.create(BufferSpec.for_config(cfg, 1, obs_dim, act_dim, num_parameters(model)))
    actor = None
    out = []
    try:
        actor = Actor(cfg, 1, 0, buffers)
        obs_rms = ret_rms = report = None
        for k in range(rounds):
            torch.manual_seed(k + 1)
            model = make_model(cfg, obs_dim, act_dim)
            with torch.no_grad():
                model.actor_logstd.fill_(-0.5 + 0.1 * k)
            write_flat_parameters(model, buffers.weights)
            buffers.write_stats(obs_rms, ret_rms, VALUE_RMS if k % 2 else None)
            buffers.fill_sentinel()
            if k == restart_at:
                carried = actor.carried()
                actor.close()
                actor = Actor(cfg, 1, 0, buffers)
                actor.restore(carried)
            report = actor.sample(k)
            row = {f: _digest(buffers.arrays[f][0]) for f in buffers.spec.rollout_fields()}
            row["episodes"] = _digest(np.array(report.episode_returns), np.array(report.episode_lengths))
            obs_inc = merge_rms_states(report.obs_moments)
            row["obs_moments"] = _digest(obs_inc.mean, obs_inc.var, np.array(obs_inc.count))
            ret_inc = merge_rms_states(report.return_moments) if report.return_moments is not None else None
            if ret_inc is not None:
                row["return_moments"] = _digest(
                    np.asarray(ret_inc.mean), np.asarray(ret_inc.var), np.array(ret_inc.count)
                )
            out.append(row)
            obs_rms = merge_rms_states([obs_rms, obs_inc])
            if ret_inc is not None:
                ret_rms = merge_rms_states([ret_rms, ret_inc])
    finally:
        if actor is not None:
            actor.close()
        buffers.close()
    return out


def all_digests() -> dict:
    return {"machine": machine(), "scenarios": {name: scenario_digests(name) for name in SCENARIOS}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {DIGEST_FILE.relative_to(TESTS_DIR.parent)}")
    args = parser.parse_args()
    digests = all_digests()
    if args.write:
        DIGEST_FILE.parent.mkdir(exist_ok=True)
        DIGEST_FILE.write_text(json.dumps(digests, indent=1) + "\n")
        print(f"wrote {DIGEST_FILE}")
    else:
        print(json.dumps(digests, indent=1))
