"""An actor that continues from what another carried (Actor.carried / Actor.restore, issue 47's exact resume) writes
the rollouts the first would have, bit for bit: the scenarios of tests/rollout_digests.py, each restarted mid-run
and compared with its own uninterrupted digests (computed here, so no machine dependence)."""

from __future__ import annotations

import pytest
import rollout_digests

from ppo_ddp.configuration.config import Config
from ppo_ddp.sampling.actor import Actor
from ppo_ddp.storage.shared import BufferSpec, SharedBuffers

RESTARTS = {  # scenario: the round before which the actor is replaced
    "halfcheetah": 9,  # batch-stepped; its episodes truncate in round 15, after the restart
    "hopper_terminations": 2,  # batch-stepped, falls and resets on both sides of the restart
    "ant_no_reward_scaling": 1,  # gymnasium's step: Ant reads derived fields (body positions) before simulating
    "hopper_gru": 1,  # a GRU's memory and episode-start flags
}


@pytest.mark.parametrize("name", sorted(RESTARTS))
def test_a_restarted_actor_continues_bit_for_bit(name: str) -> None:
    uninterrupted = rollout_digests.scenario_digests(name)
    restarted = rollout_digests.scenario_digests(name, restart_at=RESTARTS[name])
    for k, (now, then) in enumerate(zip(restarted, uninterrupted, strict=True)):
        differ = sorted(f for f in now if now[f] != then[f])
        assert not differ, f"{name}: round {k} differs after the restart in {differ}"


def test_an_actor_whose_envs_cannot_be_captured_carries_nothing() -> None:
    cfg = Config(env_id=rollout_digests.SCRIPTED, actors_per_gpu=1, envs_per_actor=2, rollout_length=4)
    buffers = SharedBuffers.create(BufferSpec.for_config(cfg, 1, 3, 2, 10_000))
    try:
        actor = Actor(cfg, 0, 0, buffers)
        assert actor.carried() is None
        actor.close()
    finally:
        buffers.close()
