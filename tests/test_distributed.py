"""The collectives of ppo_ddp.distributed on a real 2-rank gloo group (spawned processes, torchrun-style env)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import traceback

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from helpers import thread_names

from ppo_ddp.distributed import collectives as C
from ppo_ddp.distributed import process_group as D
from ppo_ddp.models.flat import flatten_parameters_
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import compute_batch_moments

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, results) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    try:
        with D.process_group() as ctx:
            assert (ctx.rank, ctx.world_size, ctx.device.type) == (rank, WORLD, "cpu")
            out = {}
            # Different weights per rank (different seeds), then one average.
            torch.manual_seed(100 + rank)
            model = ActorCritic(5, 2)
            flat = flatten_parameters_(model)  # as the learner holds them
            out["before"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
            C.average_(ctx, flat)
            out["after"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
            # Each rank holds a disjoint chunk of data of a different size.
            rng = np.random.default_rng(rank)
            data = rng.normal(rank, 1 + rank, size=(7 + 13 * rank, 3))
            out["data"] = data
            # three sets in one collective: [N, 3] rows, a scalar column, and a set rank 0 does not have
            merged, column, partial = C.merge_moments_across_ranks(
                ctx,
                [
                    compute_batch_moments(data),
                    compute_batch_moments(data[:, 0]),
                    None if rank == 0 else compute_batch_moments(data),
                ],
                [(3,), (), (3,)],
            )
            out["merged"] = (merged.mean, merged.var, merged.count)
            out["column"] = (column.mean, column.var, column.count)
            out["none_merge"] = partial.count
            out["metrics"] = C.average_metrics(ctx, {"a": float(rank), "b": 10.0 * rank + 1}, [(rank, 7)] * (rank + 1))
            out["gathered"] = C.gather_objects(ctx, [rank] * (rank + 1))
            out["broadcast"] = C.broadcast_object(ctx, f"name-from-{rank}")
            out["agree_quiet"] = C.agree(ctx, 0, False)
            out["agree"] = C.agree(ctx, 15 if rank == 1 else 0, rank == 0)  # rank 1 got SIGTERM, rank 0 failed
            out["gather_to_main"] = C.gather_to_main(ctx, {"rank": rank})
            torch.optim.Adam(model.parameters())  # the learner's first optimizer (torch imports much on the first)
        out["threads_after_teardown"] = thread_names(os.getpid())
        results[rank] = out
    except BaseException:
        results[rank] = traceback.format_exc()


@pytest.fixture(scope="module")
def results():
    # Two CPU ranks even on a GPU box (spawned workers inherit the environment): this tests gloo.
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        return _run_workers()
    finally:
        if saved is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def _run_workers() -> dict:
    manager = mp.get_context("spawn").Manager()
    shared = manager.dict()
    mp.start_processes(_worker, args=(_free_port(), shared), nprocs=WORLD, start_method="spawn", join=True)
    out = dict(shared)
    manager.shutdown()
    for rank in range(WORLD):
        assert not isinstance(out[rank], str), out[rank]
    return out


def test_average_is_the_mean_and_bitwise_equal_on_all_ranks(results):
    r0, r1 = results[0], results[1]
    assert not torch.equal(r0["before"], r1["before"])
    assert torch.equal(r0["after"], r1["after"])
    torch.testing.assert_close(r0["after"], (r0["before"] + r1["before"]) / 2)


def test_moments_merged_across_ranks_equal_moments_of_all_data(results):
    everything = np.concatenate([results[0]["data"], results[1]["data"]])
    for rank in range(WORLD):
        mean, var, count = results[rank]["merged"]
        assert count == len(everything)
        np.testing.assert_allclose(mean, everything.mean(0), rtol=1e-12)
        np.testing.assert_allclose(var, everything.var(0), rtol=1e-12)
    # identical, not merely close, on every rank
    assert all(np.array_equal(a, b) for a, b in zip(results[0]["merged"][:2], results[1]["merged"][:2]))
    # a rank without data contributes nothing (rank 1's rows only)
    assert results[0]["none_merge"] == results[1]["none_merge"] == len(results[1]["data"])


def test_several_moment_sets_share_one_gather(results):
    column = np.concatenate([results[0]["data"][:, 0], results[1]["data"][:, 0]])
    for rank in range(WORLD):
        mean, var, count = results[rank]["column"]
        assert count == len(column) and np.shape(mean) == np.shape(var) == ()
        assert mean == pytest.approx(column.mean(), rel=1e-12)
        assert var == pytest.approx(column.var(), rel=1e-12)


def test_metrics_are_averaged_gathered_and_broadcast(results):
    for rank in range(WORLD):
        assert results[rank]["metrics"] == ({"a": 0.5, "b": 6.0}, [(0, 7), (1, 7), (1, 7)])  # episodes in rank order
        assert results[rank]["gathered"] == [[0], [1, 1]]
        assert results[rank]["broadcast"] == "name-from-0"


def test_agreement_and_gather_to_main(results):
    for rank in range(WORLD):
        assert results[rank]["agree_quiet"] == (0, False)
        assert results[rank]["agree"] == (15, True)  # the same answer on every rank
    assert results[0]["gather_to_main"] == [{"rank": 0}, {"rank": 1}]
    assert results[1]["gather_to_main"] is None


def test_teardown_releases_the_group(results):
    # A group that outlives destroy_process_group keeps gloo's threads running into interpreter shutdown, where
    # they sometimes abort a process that has already said its last line (exit status -6 instead of 2).
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc to list threads")
    for rank in range(WORLD):
        assert not [name for name in results[rank]["threads_after_teardown"] if "gloo" in name], results[rank]


_SAY = (
    "from ppo_ddp.distributed import process_group as D; print('ready', flush=True); "
    "D.say_once_per_node('the line', {})"
)


def _say(local_rank: int, patience_s: float) -> subprocess.Popen[str]:
    env = {**os.environ, "LOCAL_RANK": str(local_rank)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAY.format(patience_s)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_a_line_found_alike_is_said_once_per_node_by_its_rank_0():
    main = _say(0, 60.0)  # says it at once
    assert main.wait(timeout=30) == 0 and main.stderr.read() == "the line\n"
    # The others wait for the launcher to end them (torchrun stops the group at the first exit: one that left at
    # once could end rank 0 before its line was out) ...
    other = _say(1, 60.0)
    with pytest.raises(subprocess.TimeoutExpired):
        other.wait(timeout=2)
    other.send_signal(signal.SIGTERM)
    assert other.wait(timeout=30) == -signal.SIGTERM and other.stderr.read() == ""
    # ... and say it themselves when nobody ends them (rank 0 did not find the same)
    alone = _say(1, 0.5)
    assert alone.wait(timeout=30) == 0 and alone.stderr.read() == "the line\n"
