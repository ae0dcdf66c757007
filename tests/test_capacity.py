"""Work that cannot fit on the node is refused before any actor starts (ppo_ddp.sampling.capacity)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ppo_ddp.errors import ConfigError
from ppo_ddp.sampling.capacity import ENV_RESIDENT_BYTES, GIB, check_round_fits, round_memory
from ppo_ddp.storage.shared import BufferSpec

DEFAULT = BufferSpec(num_actors=2, rollout_length=128, envs_per_actor=8, obs_dim=17, act_dim=6, num_params=10_000)


def test_shared_part_is_the_rollout_block_of_every_learner_on_the_node():
    one, four = round_memory(DEFAULT, 1), round_memory(DEFAULT, 4)
    assert one.shared == DEFAULT.layout()[3] and four.shared == 4 * one.shared and four.private == 4 * one.private
    samples = 2 * 128 * 8
    assert one.shared >= samples * (4 * (17 + 6 + 6) + 2)  # obs, actions, six float columns, two flags
    assert one.private >= 2 * 8 * ENV_RESIDENT_BYTES + 2 * 129 * 8 * 17 * 8


def test_the_default_round_fits_a_laptop():
    check_round_fits(DEFAULT, 1, free_shm=64 * 1024**2, available=2 * GIB)  # a container's 64 MB /dev/shm


def test_a_block_larger_than_dev_shm_is_refused_naming_the_sizes():
    big = BufferSpec(2, 128, 4096, 17, 6, 10_000)  # about 0.12 GiB of rollout buffers
    with pytest.raises(
        ConfigError,
        match=r"^num_envs=8192: the round of this node \(1 learner\(s\) x num_envs 8192 \(2 actors x 4096 envs\) "
        r"x rollout_length 128\) needs 0\.\d\d GiB of shared memory "
        r"for its rollout buffers, /dev/shm has 0\.06 GiB free",
    ):
        check_round_fits(big, 1, free_shm=64 * 1024**2, available=None)
    check_round_fits(big, 1, free_shm=None, available=64 * GIB)  # where /dev/shm does not exist: memory alone


def test_a_round_larger_than_memory_is_refused():
    many = BufferSpec(2, 128, 100_000, 17, 6, 10_000)
    with pytest.raises(ConfigError, match=r"needs at least \d+\.\d\d GiB of memory .* 16\.00 GiB is available"):
        check_round_fits(many, 1, free_shm=None, available=16 * GIB)


def test_impossible_size_exits_2_with_one_line_before_starting_anything(repo_root, tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "train.py",
            "--num-envs",
            "200000",
            "--rollout-length",
            "100000",
            "--runs-dir",
            str(tmp_path / "runs"),
        ],
        cwd=repo_root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its session: its processes
    _, stderr = proc.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, stderr
    assert lines[0].startswith("train.py: error: num_envs=200000: the round of this node") and "GiB" in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing started: no run folder
    assert not _session_members(proc.pid), "processes of the run outlived it"


def _session_members(session: int) -> list[int]:
    """Processes still running in that session (an actor or forkserver would have stayed in it)."""
    members = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session:  # fields after the name: state, ppid, pgrp, session
            members.append(int(entry))
    return members
