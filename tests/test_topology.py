"""Learners, actors per learner and devices: the topology rules, one test per rule (ppo_ddp.configuration.topology)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ppo_ddp.configuration.topology import (
    DEFAULT_NUM_ENVS,
    Launch,
    TrainingTopology,
    actors_for,
    cgroup_cpu_quota,
    resolve_rank_device,
    resolve_training_topology,
    usable_cores,
)


def topo(
    num_actors=None, num_gpus=1, actors_per_gpu="auto", available_gpus=1, mps_available=False, launch=Launch(), **split
) -> TrainingTopology:
    """The topology on a node of 2 usable cores, of learners with rounds of 240 envs (which every count of actors
    these tests name divides), unless `cores` and `num_envs` say otherwise."""
    split.setdefault("cores", (2, "affinity"))
    split.setdefault("num_envs", 240)
    return resolve_training_topology(
        num_actors, num_gpus, actors_per_gpu, available_gpus, mps_available, launch, **split
    )


def own_launch(
    num_actors=None, num_gpus=1, actors_per_gpu="auto", available_gpus=1, mps_available=False
) -> TrainingTopology:
    """What every worker of our own launch decides: the launcher's decision handed down, on the same devices."""
    chosen = topo(num_actors, num_gpus, actors_per_gpu, available_gpus, mps_available)
    launch = Launch(chosen.num_learners, chosen.num_learners, granted_actors=chosen.actors_per_learner)
    return topo(num_actors, num_gpus, actors_per_gpu, available_gpus, mps_available, launch)


# ---- resolve_training_topology ---------------------------------------------------------------------------


@pytest.mark.parametrize("available_gpus", [1, 0], ids=["gpu box", "cpu box"])
def test_legacy_single_actor_config_starts_exactly_one_actor(available_gpus):
    # num_actors=1, num_gpus=1 is the predecessor's single-machine config: one actor, not the default two.
    t = topo(num_actors=1, num_gpus=1, available_gpus=available_gpus)
    assert (t.num_learners, t.actors_per_learner, t.num_actors) == (1, 1, 1)


def test_several_gpus_with_matching_totals():
    t = topo(num_actors=8, num_gpus=4, actors_per_gpu=2, available_gpus=4)
    assert t == TrainingTopology(num_learners=4, actors_per_learner=2, device="cuda")
    assert t.num_actors == 8


def test_actors_per_gpu_is_derived_from_the_totals():
    assert topo(num_actors=12, num_gpus=4, available_gpus=4).actors_per_learner == 3


def test_actors_per_gpu_alone_needs_no_total():
    assert topo(num_gpus=2, actors_per_gpu=5, available_gpus=2) == TrainingTopology(2, 5, "cuda")


def test_neither_count_given_lets_the_cores_decide():
    # 2 learners share the 2 cores: one actor each, with all 16 envs of its round
    assert topo(num_gpus=2, available_gpus=2) == TrainingTopology(2, 1, "cuda", cores=1, cores_limit="affinity")
    assert topo(num_gpus=1, available_gpus=0).actors_per_learner == 2


def test_totals_that_disagree_are_an_error_naming_the_product():
    with pytest.raises(ValueError, match=r"num_actors=6 must equal num_gpus \* actors_per_gpu = 4 \* 2 = 8"):
        topo(num_actors=6, num_gpus=4, actors_per_gpu=2, available_gpus=4)


def test_actors_that_do_not_split_over_the_gpus_are_an_error():
    with pytest.raises(ValueError, match="num_actors=6 does not split evenly over num_gpus=4"):
        topo(num_actors=6, num_gpus=4, available_gpus=4)


def test_fewer_gpus_than_asked_gives_fewer_learners_with_the_same_actors_each():
    # A 4-GPU config on a 2-GPU box: 2 learners, still 3 actors each (6 in all, not 12 crammed onto 2).
    t = topo(num_actors=12, num_gpus=4, actors_per_gpu=3, available_gpus=2)
    assert t == TrainingTopology(num_learners=2, actors_per_learner=3, device="cuda")


def test_more_gpus_than_asked_uses_only_the_asked_ones():
    assert topo(num_gpus=2, actors_per_gpu=3, available_gpus=8).num_learners == 2


def test_no_gpu_gives_one_cpu_learner_with_the_same_actors():
    assert topo(num_gpus=4, actors_per_gpu=3, available_gpus=0) == TrainingTopology(1, 3, "cpu")


def test_no_cuda_but_mps_gives_one_mps_learner():
    assert topo(num_gpus=4, actors_per_gpu=3, available_gpus=0, mps_available=True) == TrainingTopology(1, 3, "mps")


def test_cuda_wins_over_mps():
    assert topo(num_gpus=1, available_gpus=1, mps_available=True).device == "cuda"


@pytest.mark.parametrize(
    "field, kwargs",
    [
        ("num_actors", dict(num_actors=0)),
        ("num_actors", dict(num_actors=-2)),
        ("num_gpus", dict(num_gpus=0)),
        ("num_gpus", dict(num_gpus=-1, actors_per_gpu=2)),
        ("actors_per_gpu", dict(actors_per_gpu=0)),
        ("actors_per_gpu", dict(num_actors=4, num_gpus=2, actors_per_gpu=-2)),
    ],
)
def test_non_positive_counts_are_an_error_naming_the_field(field, kwargs):
    with pytest.raises(ValueError, match=f"^{field}=-?\\d+: must be a positive integer"):
        topo(**kwargs)


def test_negative_available_gpus_is_an_error():
    with pytest.raises(ValueError, match="available_gpus=-1"):
        topo(available_gpus=-1)


# ---- the same decision in the workers of our own launch, and under a user's torchrun ----------------------


@pytest.mark.parametrize(
    "num_actors, num_gpus, actors_per_gpu, available_gpus, expected",
    [
        (12, 4, "auto", 2, TrainingTopology(2, 3, "cuda")),  # was 6 actors per learner: recomputed from 2 learners
        (12, 4, 3, 2, TrainingTopology(2, 3, "cuda")),  # was a refusal: 12 != 2 * 3
        (8, 4, "auto", 3, TrainingTopology(3, 2, "cuda")),  # was a refusal: 8 does not split over 3
        (8, 4, 2, 4, TrainingTopology(4, 2, "cuda")),
        (1, 1, "auto", 1, TrainingTopology(1, 1, "cuda")),  # the legacy single-actor config
    ],
)
def test_our_own_launch_keeps_the_actors_decided_before_it(
    num_actors, num_gpus, actors_per_gpu, available_gpus, expected
):
    assert topo(num_actors, num_gpus, actors_per_gpu, available_gpus) == expected
    assert own_launch(num_actors, num_gpus, actors_per_gpu, available_gpus) == expected


def test_under_a_users_torchrun_the_world_size_stands_for_num_gpus():
    assert topo(num_actors=8, launch=Launch(4, 4), available_gpus=4) == TrainingTopology(4, 2, "cuda")
    assert topo(actors_per_gpu=3, launch=Launch(2, 2), available_gpus=0) == TrainingTopology(2, 3, "cpu")
    assert topo(num_actors=2, launch=Launch(1, 1), available_gpus=0, mps_available=True) == TrainingTopology(
        1, 2, "mps"
    )
    assert (
        topo(num_actors=4, launch=Launch(2, 2), available_gpus=0, mps_available=True).device == "cpu"
    )  # no MPS backend
    with pytest.raises(ValueError, match="num_actors=6 does not split evenly over num_gpus=4"):
        topo(num_actors=6, launch=Launch(4, 4), available_gpus=4)


def test_a_users_torchrun_with_fewer_visible_gpus_than_ranks_is_refused():
    with pytest.raises(ValueError, match=r"4 processes on this node but only 2 CUDA device\(s\)"):
        topo(launch=Launch(4, 4), available_gpus=2)
    # 2 nodes of 4 ranks on 64 cores: each rank's share is 16 cores, 16 actors of one env each
    assert topo(launch=Launch(8, 4), available_gpus=4, cores=(64, "affinity")) == TrainingTopology(
        8, 16, "cuda", cores=16, cores_limit="affinity"
    )


# ---- resolve_rank_device (torchrun) ----------------------------------------------------------------------


def test_each_local_rank_gets_its_own_cuda_device():
    assert [resolve_rank_device(4, r, 4, cuda_device_count=4) for r in range(4)] == [f"cuda:{r}" for r in range(4)]


def test_multi_node_ranks_use_the_local_rank():
    # Node 2 of 2, 4 processes per node: global ranks 4..7 are local ranks 0..3.
    assert resolve_rank_device(world_size=8, local_rank=3, local_world_size=4, cuda_device_count=4) == "cuda:3"


@pytest.mark.parametrize("local_rank", [0, 3])
def test_more_local_ranks_than_devices_is_a_clear_error_on_every_rank(local_rank):
    # Every rank must refuse, including rank 0 whose device exists: otherwise rank 0 starts a collective
    # and waits forever for the ranks that failed.
    with pytest.raises(ValueError, match=r"4 processes on this node but only 2 CUDA device\(s\).*--nproc_per_node=2"):
        resolve_rank_device(world_size=4, local_rank=local_rank, local_world_size=4, cuda_device_count=2)


def test_without_cuda_every_rank_runs_on_cpu():
    assert [resolve_rank_device(3, r, 3, cuda_device_count=0) for r in range(3)] == ["cpu"] * 3


def test_mps_only_for_a_single_process():
    # torch.distributed has no MPS backend: several ranks on a Mac fall back to CPU (gloo).
    assert resolve_rank_device(1, 0, 1, cuda_device_count=0, mps_available=True) == "mps"
    assert resolve_rank_device(2, 1, 2, cuda_device_count=0, mps_available=True) == "cpu"


@pytest.mark.parametrize(
    "world_size, local_rank, local_world_size, match",
    [
        (2, 2, 2, "LOCAL_RANK=2"),
        (2, -1, 2, "LOCAL_RANK=-1"),
        (2, 0, 4, "WORLD_SIZE=2 is smaller than LOCAL_WORLD_SIZE=4"),
    ],
)
def test_inconsistent_launcher_environment_is_an_error(world_size, local_rank, local_world_size, match):
    with pytest.raises(ValueError, match=match):
        resolve_rank_device(world_size, local_rank, local_world_size, cuda_device_count=8)


def test_learner_threads_leave_the_cores_of_actors_that_step_during_the_update(monkeypatch):
    from ppo_ddp.configuration.topology import cpu_learner_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)), raising=False)
    assert cpu_learner_threads(2, 1) == 2  # sync rounds: the actors wait, their cores are the update's
    assert cpu_learner_threads(2, 1, stepping_actors=2) == 1  # overlapped: they step on both cores
    assert cpu_learner_threads(2, 2) == 1  # two learners share the two cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert cpu_learner_threads(16, 1, stepping_actors=2) == 14
    assert cpu_learner_threads(4, 1, stepping_actors=2) == 4


# ---- the cores a process may use (issue 72): its affinity and a container's CPU quota ------------------------------
def fake_cgroups(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A /sys/fs/cgroup of the given files and a /proc/self/cgroup of the given text, for the reader to point at."""
    fs = tmp_path / "cgroup"
    fs.mkdir(parents=True)
    for name, text in files.items():
        (fs / name).parent.mkdir(parents=True, exist_ok=True)
        (fs / name).write_text(text + "\n")
    (tmp_path / "proc_cgroup").write_text(proc + "\n")
    return fs, tmp_path / "proc_cgroup"


def with_affinity(monkeypatch, cpus: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))


def test_a_2_cpu_quota_on_a_64_core_host_is_2_cores(tmp_path, monkeypatch):
    # cgroup v2: the job's cgroup allows 2 CPUs' worth of time; its parent none
    files = {"cpu.max": "max 100000", "user.slice/job/cpu.max": "200000 100000"}
    fs, proc = fake_cgroups(tmp_path, "0::/user.slice/job", files)
    with_affinity(monkeypatch, 64)
    assert cgroup_cpu_quota(fs, proc) == 2.0
    assert usable_cores(fs, proc) == (2, "CPU quota")


def test_the_smaller_of_affinity_and_quota_wins(tmp_path, monkeypatch):
    # cgroup v1, inside a container: the host's path is not below the container's root, whose files are its own
    proc = "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc"
    files = {"cpu,cpuacct/cpu.cfs_quota_us": "350000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}
    fs, proc_file = fake_cgroups(tmp_path, proc, files)
    with_affinity(monkeypatch, 16)
    assert usable_cores(fs, proc_file) == (3, "CPU quota")  # 3.5 CPUs' worth: 3 whole cores
    with_affinity(monkeypatch, 2)  # taskset to 2 CPUs under the same quota
    assert usable_cores(fs, proc_file) == (2, "affinity")


def test_no_quota_leaves_the_affinity(tmp_path, monkeypatch):
    v1 = {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}
    for proc, files in (("0::/", {"cpu.max": "max 100000"}), ("1:cpu:/", v1), ("0::/", {})):
        fs, proc_file = fake_cgroups(tmp_path / str(len(files)) / proc[0], proc, files)
        with_affinity(monkeypatch, 8)
        assert cgroup_cpu_quota(fs, proc_file) is None and usable_cores(fs, proc_file) == (8, "affinity")
    assert cgroup_cpu_quota(tmp_path / "none", tmp_path / "no_such_file") is None


# ---- actors_per_gpu "auto" ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_envs, cores, actors",
    [(16, 2, 2), (16, 1, 1), (16, 16, 16), (16, 64, 16), (16, 12, 8), (16, 3, 2), (2, 16, 2), (64, 6, 4), (7, 4, 1)],
)
def test_auto_takes_the_most_actors_that_split_the_envs_evenly_within_the_cores(num_envs, cores, actors):
    assert actors_for(num_envs, cores) == actors


def test_auto_shares_the_cores_among_the_learners_of_the_node():
    assert topo(launch=Launch(2, 2), available_gpus=0, cores=(8, "affinity")) == TrainingTopology(
        2, 4, "cpu", cores=4, cores_limit="affinity"
    )
    assert (
        topo(launch=Launch(4, 4), available_gpus=0, cores=(2, "CPU quota")).actors_per_learner == 1
    )  # 0 cores each: 1


def test_auto_keeps_the_round_and_a_given_envs_per_actor_fixes_the_actors():
    t = topo(num_envs=64, cores=(16, "affinity"), available_gpus=0)
    assert (t.actors_per_learner, t.cores) == (16, 16)
    t = topo(num_envs=64, envs_per_actor=16, cores=(16, "affinity"), available_gpus=0)
    assert (t.actors_per_learner, t.cores) == (4, None)  # the config named the split
    assert topo(actors_per_gpu=4, num_envs=64, available_gpus=0).actors_per_learner == 4


@pytest.mark.parametrize(
    "split, match",
    [
        (dict(actors_per_gpu=3, num_envs=None), f"actors_per_gpu=3: must divide num_envs {DEFAULT_NUM_ENVS}"),
        (dict(envs_per_actor=5, num_envs=32), "envs_per_actor=5: must divide num_envs 32"),
        (
            dict(actors_per_gpu=2, envs_per_actor=4, num_envs=16),
            r"num_envs=16 must equal actors_per_gpu \* envs_per_actor = 2 \* 4",
        ),
        (dict(actors_per_gpu="many"), "actors_per_gpu='many': must be a positive integer or auto"),
    ],
)
def test_a_split_that_does_not_fit_the_round_is_an_error_naming_the_field(split, match):
    with pytest.raises(ValueError, match=match):
        topo(available_gpus=0, **split)


def test_the_start_line_says_what_auto_chose_and_from_what():
    assert topo(available_gpus=0, num_envs=16).describe(8) == "2 cores usable (affinity): 2 actors x 8 envs"
    assert topo(actors_per_gpu=1, available_gpus=0).describe(16) == "1 actor x 16 envs"
    t = topo(launch=Launch(2, 2), available_gpus=0, cores=(2, "CPU quota"))
    assert t.describe(16) == "1 core usable per learner (CPU quota): 1 actor x 16 envs"


def test_auto_follows_the_smaller_of_a_faked_affinity_and_a_faked_quota(tmp_path, monkeypatch):
    fs, proc_file = fake_cgroups(tmp_path, "0::/job", {"job/cpu.max": "200000 100000"})  # a 2-CPU quota
    with_affinity(monkeypatch, 64)
    t = resolve_training_topology(None, 1, "auto", 0, num_envs=16, cores=usable_cores(fs, proc_file))
    assert (t.actors_per_learner, t.cores, t.cores_limit) == (2, 2, "CPU quota")
    with_affinity(monkeypatch, 1)  # taskset -c 0 under the same quota
    t = resolve_training_topology(None, 1, "auto", 0, num_envs=16, cores=usable_cores(fs, proc_file))
    assert (t.actors_per_learner, t.cores, t.cores_limit) == (1, 1, "affinity")
