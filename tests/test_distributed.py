"""The collectives of ppo_ddp.distributed on a real 2-rank gloo group (spawned processes, torchrun-style env); and on
those ranks, learners of sync_mode "gradients": against one learner with both ranks' samples, and their early stop."""

from __future__ import annotations

import functools
import os
import pickle
import signal
import socket
import subprocess
import sys
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from helpers import thread_names

from ppo_ddp.algorithm.learner import Learner
from ppo_ddp.configuration.config import Config
from ppo_ddp.distributed import collectives as C
from ppo_ddp.distributed import process_group as D
from ppo_ddp.models.flat import flatten_parameters_
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import compute_batch_moments
from ppo_ddp.storage.batch import RolloutBatch

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def equivalence_step(rank: int, world: int, rank_mean: Optional[Callable[[torch.Tensor], None]] = None) -> torch.Tensor:
    """A learner of sync_mode "gradients" (value normalisation, clipped value loss) on this rank's 1/world of a
    fixed round of 256 samples, one mini-batch of it per epoch for 3 epochs, its gradients averaged by rank_mean
    (none: one learner alone); its flat parameters after the round."""
    B, OBS, ACT = 256, 6, 3
    cfg = Config(update_epochs=3, num_minibatches=1, sync_mode="gradients", clip_vloss=True, normalize_value=True)
    g = torch.Generator().manual_seed(7)
    data = RolloutBatch(
        obs=torch.randn(B, OBS, generator=g), actions=torch.randn(B, ACT, generator=g),
        logp=torch.randn(B, generator=g) - 3.0, values=torch.randn(B, generator=g) * 5 + 2,
        advantages=torch.randn(B, generator=g), returns=torch.randn(B, generator=g) * 5 + 2,
    )  # fmt: skip
    adv_stats = (float(data.advantages.mean()), float(data.advantages.std()))
    value_stats = (float(data.returns.mean()), float(data.returns.std()))
    mine = slice(rank * B // world, (rank + 1) * B // world)
    fields = ("obs", "actions", "logp", "values", "advantages", "returns")
    batch = RolloutBatch(*(getattr(data, f)[mine] for f in fields))
    torch.manual_seed(0)
    model = ActorCritic(OBS, ACT, (32, 32))
    learner = Learner(cfg, model, torch.device("cpu"), *([rank_mean] if rank_mean else []))
    learner.train_step(batch, lambda adv: adv_stats, value_stats)
    return learner.flat_params.detach().clone()


def early_stop(rank: int, rank_mean: Callable[[torch.Tensor], None], gather: Callable[[Any], list]) -> dict:
    """Two learners of sync_mode "gradients" on this rank's own round (64 samples of its own policy, 4 mini-batches,
    2 epochs), the ranks' KLs averaged by rank_mean: the first, stopped after its first epoch, tells the ranks' own
    KLs of it; the second takes target_kl between their mean and the larger, so the mean says go on and the rank with
    the larger, alone, would stop. The KLs, that target and the epochs the second took."""
    g = torch.Generator().manual_seed(20 + rank)
    obs = torch.randn(64, 6, generator=g)
    torch.manual_seed(0)
    with torch.no_grad():
        actions, logp, values = ActorCritic(6, 3, (32, 32)).sample(obs, g)
    advantages = torch.randn(64, generator=g)
    batch = RolloutBatch(obs, actions, logp, values, advantages, advantages + values)

    def train(target_kl: float) -> dict[str, float]:
        cfg = Config(sync_mode="gradients", update_epochs=2, num_minibatches=4, target_kl=target_kl)
        torch.manual_seed(0)
        learner = Learner(cfg, ActorCritic(6, 3, (32, 32)), torch.device("cpu"), rank_mean)
        return learner.train_step(batch, lambda adv: (0.0, 1.0))

    kls = gather(train(1e-12)["losses/approx_kl"])  # a rank's approx_kl: its own, of the one epoch it took
    target = (sum(kls) / len(kls) + max(kls)) / 2
    return {"kls": kls, "target_kl": target, "epochs": train(target)["losses/epochs"]}


def _worker(rank: int, port: int, folder: str) -> None:
    """One rank: its findings pickled to folder/<rank>.pkl (or the traceback of its failure)."""
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
            mean_, gather = functools.partial(C.average_, ctx), functools.partial(C.gather_objects, ctx)
            out["equivalence"] = equivalence_step(rank, WORLD, mean_)
            out["early_stop"] = early_stop(rank, mean_, gather)
            torch.optim.Adam(model.parameters())  # the learner's first optimizer (torch imports much on the first)
        out["threads_after_teardown"] = thread_names(os.getpid())
        result = out
    except BaseException:
        result = traceback.format_exc()
    with open(os.path.join(folder, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    # Two CPU ranks even on a GPU box (spawned workers inherit the environment): this tests gloo.
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        return _run_workers(tmp_path_factory.mktemp("ranks"))
    finally:
        if saved is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def _run_workers(folder: Path) -> dict:
    """The ranks' findings, through files (a multiprocessing Manager would be a third interpreter to start)."""
    mp.start_processes(_worker, args=(_free_port(), str(folder)), nprocs=WORLD, start_method="spawn", join=True)
    out = {}
    for rank in range(WORLD):
        with open(folder / f"{rank}.pkl", "rb") as f:
            out[rank] = pickle.load(f)
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


def test_the_early_stop_is_decided_on_the_kl_averaged_over_ranks(results):
    """With target_kl between the ranks' mean first-epoch KL and the larger one, the mean says go on, one rank alone
    would stop: both take the second epoch (moved here from a train.py run of tests/test_scale.py: the decision is
    the learner's, on the KL averaged by the same rank_mean as the gradients, over gloo here as there)."""
    kls, target = results[0]["early_stop"]["kls"], results[0]["early_stop"]["target_kl"]
    assert kls[0] != kls[1] and sum(kls) / 2 < target < max(kls)
    assert [results[rank]["early_stop"]["epochs"] for rank in range(WORLD)] == [2.0, 2.0]
    assert results[1]["early_stop"]["kls"] == kls


# ---- one learner with mini-batches of 2m is two gradient-synced learners with m each ---------------------------
def test_two_ranks_with_m_samples_step_as_one_learner_with_2m(results):
    """The ranks above (gloo, average_ of the flat gradient) each trained on their half of a round; the one learner
    here, on all of it, takes the same steps."""
    one = equivalence_step(0, 1)
    torch.manual_seed(0)
    start = torch.cat([p.detach().reshape(-1) for p in ActorCritic(6, 3, (32, 32)).parameters()])
    assert not torch.allclose(one, start)  # three Adam steps moved it
    for rank in range(WORLD):
        torch.testing.assert_close(results[rank]["equivalence"], one, rtol=1e-5, atol=1e-6)


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


def _said_in_process(local_rank: int, patience_s: float, capsys) -> tuple[str, list[float]]:
    """say_once_per_node in this process as that local rank: what it printed on stderr, and the waits it took
    (recorded instead of slept)."""
    waits: list[float] = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(D, "time", types.SimpleNamespace(sleep=waits.append))
        m.setenv("LOCAL_RANK", str(local_rank))
        D.say_once_per_node("the line", patience_s)
    return capsys.readouterr().err, waits


def test_a_line_found_alike_is_said_once_per_node_by_its_rank_0(capsys):
    assert _said_in_process(0, 60.0, capsys) == ("the line\n", [])  # says it at once
    # The others wait for the launcher to end them (torchrun stops the group at the first exit: one that left at
    # once could end rank 0 before its line was out) ...
    other = _say(1, 60.0)  # a process of its own: the launcher's SIGTERM ends it
    with pytest.raises(subprocess.TimeoutExpired):
        other.wait(timeout=1)
    other.send_signal(signal.SIGTERM)
    assert other.wait(timeout=30) == -signal.SIGTERM and other.stderr.read() == ""
    # ... and say it themselves when nobody ends them (rank 0 did not find the same)
    assert _said_in_process(1, 0.5, capsys) == ("the line\n", [0.5])
