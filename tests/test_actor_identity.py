"""The actor writes today's rollouts bit for bit: digests of every field and report, round after round, in
scenarios that reach each path of its loop (tests/rollout_digests.py), against those of issue 44's base actor.

Speeding the actor up (issue 44) must not change one number a run trains on. The digests depend on numpy's
matmul kernels too, which it picks by the CPU's AVX-512 features, and on the CPU's maker (rollout_digests.machine):
on a machine that differs in either the comparison cannot be made, and the test says so as its skip reason.
"""

from __future__ import annotations

import json

import pytest
import rollout_digests


@pytest.fixture(scope="module")
def recorded() -> dict:
    data = json.loads(rollout_digests.DIGEST_FILE.read_text())
    here = rollout_digests.machine()
    if here != data["machine"]:
        pytest.skip(f"digests recorded with {data['machine']}, this machine has {here}")
    return data["scenarios"]


@pytest.mark.parametrize("name", sorted(rollout_digests.SCENARIOS))
def test_rollout_is_bit_identical_to_the_base_actor(recorded, name):
    rounds = rollout_digests.scenario_digests(name)
    assert len(rounds) == len(recorded[name])
    for k, (now, then) in enumerate(zip(rounds, recorded[name])):
        differ = sorted(f for f in set(now) | set(then) if now.get(f) != then.get(f))
        assert not differ, f"{name}: round {k} differs from the base actor's in {differ}"
