"""The compiled PPO step (ppo_ddp/algorithm/compiled.py) against the eager one: the same function, the same numbers,
compiled for the mini-batches a run compiles for and never recompiled; and a train.py run that compiles it, once,
before its first round.

A new shape's compile costs ~20 s of CPU on the 2-core machine, so the options are grouped: every option the update
has is in one of the configs below, each compiles once, and the train.py run of this file trains the default shape
one of them compiled, loading that step from inductor's on-disk cache (a few seconds) instead of building it again."""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch._dynamo
from test_train import SMALL, read_csv, run

from ppo_ddp import evaluate
from ppo_ddp.algorithm.compiled import compile_functions
from ppo_ddp.algorithm.learner import Learner
from ppo_ddp.algorithm.ppo_step import FlatAdam
from ppo_ddp.configuration.config import Config
from ppo_ddp.configuration.validation import minibatch_rows
from ppo_ddp.models.factory import make_model
from ppo_ddp.models.gru import RecurrentActorCritic
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.storage.batch import RolloutBatch

# Hopper's sizes and the mini-batch of 16 that tests/test_train.py's SMALL runs train on: the default config's
# step compiled here is the one those runs load from inductor's cache, and the reverse (one build per shape).
OBS, ACT, B, MINIBATCHES = 11, 3, 64, 4
CRITIC = 7  # the width of the privileged critic's observation (critic_obs)
BOUNDS = (np.array([-0.4, -1.0, 0.0], np.float32), np.array([0.4, 1.0, 2.0], np.float32))  # the bounded ones

# Every option of the update is in one of these (with target_kl low enough to stop after the first epoch), grouped so
# that options which change the traced graph share a compile where they can: 5 compiles instead of 7.
CONFIGS = {
    # the default network, the graph of the train.py run below (test_single_process_run_then_evaluate): ent_coef,
    # normalize_value and target_kl are tensors or the learner's, outside the graph
    "tanh-clip_vloss-ent-normalize_value-target_kl": Config(ent_coef=0.01, normalize_value=True, target_kl=1e-4),
    # one trunk for policy and value (rl_games' separate: False): the value loss's gradient reaches the policy's
    # layers; a deep trunk, the unclipped value loss, the bounds loss, the adaptive rate, two learner threads
    "relu-deep-shared_trunk-no_clip_vloss-bounds_loss-adaptive_lr-threads": Config(
        activation="relu",
        hidden_sizes=(32, 16, 8),
        shared_trunk=True,
        clip_vloss=False,
        normalize_value=True,
        vf_coef=4.0,
        bounds_loss_coef=0.01,
        anneal_lr=False,
        adaptive_lr=True,
        learner_threads=2,
    ),  # fmt: skip
    # the critic values observations of its own (critic_obs); a Beta policy (its lgamma and digamma, issue 61)
    "elu-anneal-critic_obs-beta": Config(
        activation="elu",
        hidden_sizes=(24,),
        max_grad_norm=0.05,
        critic_obs="full_obs",
        distribution="beta",
        ent_coef=0.01,
    ),  # fmt: skip
    # the recurrent policy: mini-batches of chunks, unrolled from their entering states with resets inside (chunks of
    # 2 steps: the graph unrolls every step, and 2 cost ~5 s less to compile than 4)
    "gru-chunks": Config(policy="gru", seq_length=2, rnn_hidden_size=8, hidden_sizes=(16,), ent_coef=0.01),
    # a GRU policy with an MLP critic of its own observation; a head MLP on the GRU's state, between it and the
    # linear heads (rnn_head_sizes); a tanh-squashed Gaussian; the bounds loss on the GRU's policy
    "gru-critic_obs-head-tanh_gaussian-bounds_loss": Config(
        policy="gru",
        seq_length=2,
        rnn_hidden_size=8,
        hidden_sizes=(16,),
        critic_obs="full_obs",
        rnn_head_sizes=(12, 10),
        distribution="tanh_gaussian",
        ent_coef=0.01,
        bounds_loss_coef=0.01,
    ),  # fmt: skip
}


def mean_std(x: torch.Tensor) -> tuple[float, float]:
    return x.mean().item(), x.std().item()


def batch_for(model: ActorCritic | RecurrentActorCritic, seed: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    if isinstance(model, RecurrentActorCritic):  # B samples as chunks of L steps, episodes starting inside some
        L = CONFIGS["gru-chunks"].seq_length
        obs, h0 = torch.randn(B // L, L, OBS, generator=g), 0.5 * torch.randn(B // L, 8, generator=g)
        starts = (torch.rand(B // L, L, generator=g) < 0.2).float()
        critic = torch.randn(B // L, L, CRITIC, generator=g) if model.critic_dim else None
        with torch.no_grad():
            out, values, _ = model.forward_chunks(obs, h0, starts, critic_obs=critic)
            actions = model.dist.sample(out, model.actor_logstd, g)
            logp = model.dist.log_prob(out, model.actor_logstd, actions)
        advantages = torch.randn(B // L, L, generator=g)
        returns = advantages + values + 0.5
        return RolloutBatch(obs, actions.detach(), logp, values, advantages, returns, h0, starts, critic_obs=critic)
    obs = torch.randn(B, OBS, generator=g)
    critic = torch.randn(B, CRITIC, generator=g) if model.critic_dim else None
    with torch.no_grad():
        actions, logp, values = model.sample(obs, g, critic)
    advantages = torch.randn(B, generator=g)
    return RolloutBatch(obs, actions, logp, values, advantages, advantages + values + 0.5, critic_obs=critic)


def learner_for(cfg: Config, compile: bool) -> Learner:
    torch.manual_seed(0)
    model = make_model(cfg, OBS, ACT, CRITIC if cfg.critic_obs else 0, BOUNDS)
    # rounds of B samples (one actor's 2 envs x B/2 steps), as batch_for makes them
    cfg = dataclasses.replace(
        cfg, update_epochs=3, num_minibatches=MINIBATCHES, num_envs=2, envs_per_actor=2, rollout_length=B // 2
    )
    learner = Learner(cfg, model, torch.device("cpu"))
    if compile:  # for the mini-batches a run compiles for (the trainer's minibatch_rows: samples, or a GRU's chunks)
        assert learner.compile(minibatch_rows(cfg)) is None
    return learner


def two_rounds(learner: Learner) -> list[dict[str, float]]:
    """Two rounds of 3 epochs, with the rate changed between them as the schedules do."""
    value_stats = (0.5, 2.0) if learner.cfg.normalize_value else None
    metrics = []
    for seed, lr in ((1, learner.cfg.learning_rate), (2, learner.cfg.learning_rate * 0.7)):
        learner.set_learning_rate(lr)
        metrics.append(learner.train_step(batch_for(learner.model, seed), mean_std, value_stats))
    return metrics


def state(learner: Learner) -> dict[str, torch.Tensor]:
    adam = learner.optimizer
    return {"params": learner.params, "exp_avg": adam.exp_avg, "exp_avg_sq": adam.exp_avg_sq, "step": adam.step}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_compiled_step_equals_eager_step(name):
    cfg = CONFIGS[name]
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.learner_threads)
    try:
        eager, compiled = learner_for(cfg, compile=False), learner_for(cfg, compile=True)
        # compile() ran one step on example data and put everything back
        assert all(torch.equal(a, b) for a, b in zip(state(eager).values(), state(compiled).values()))
        with torch._dynamo.config.patch(error_on_recompile=True):  # no recompilation after the first round
            eager_metrics, compiled_metrics = two_rounds(eager), two_rounds(compiled)
    finally:
        torch.set_num_threads(threads)
    for key, value in state(eager).items():
        torch.testing.assert_close(state(compiled)[key], value, rtol=1e-4, atol=1e-6, msg=key)
    assert state(eager)["step"].item() > 0
    for e, c in zip(eager_metrics, compiled_metrics):
        assert e.keys() == c.keys() and e["losses/epochs"] == c["losses/epochs"]
        for key in e:
            assert c[key] == pytest.approx(e[key], rel=1e-3, abs=1e-5), key
    if cfg.target_kl is not None:
        assert eager_metrics[0]["losses/epochs"] < 3  # the early stop was exercised


# ---- a train.py run that compiles, on a shape compiled above (inductor's cache: loaded, not built again) -----------
# Must follow test_compiled_step_equals_eager_step in this file, whose tanh-... config builds it.


def test_single_process_run_then_evaluate(tmp_path, capsys):
    proc = run(
        [
            sys.executable,
            "train.py",
            *SMALL,
            "--total-timesteps",
            "256",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--run-name",
            "solo",
            "--compile",  # the default a user gets, over SMALL's --no-compile
        ],
        tmp_path,
        debug=False,
        env={"TORCH_LOGS": "recompiles"},  # dynamo logs any recompilation of the step
    )
    run_dir = tmp_path / "runs" / "solo"
    assert len(read_csv(run_dir / "metrics.csv")) == 3  # 256 steps / 64 per round, round 0 seeding the statistics
    assert "done:" in proc.stdout
    # the step compiled before the first round and never again (three rounds trained)
    assert "compiled in" in proc.stdout and "Recompiling" not in proc.stderr, proc.stderr[-2000:]
    evaluate.main([str(run_dir / "model_solo.pt"), "--episodes", "2"])  # `python -m ppo_ddp.evaluate`'s main
    out = capsys.readouterr().out
    assert "mean return" in out and "2 deterministic episodes" in out
    value = float(out.split("mean return")[1].split()[0])
    assert math.isfinite(value)


def test_a_compiler_that_fails_leaves_the_step_eager(monkeypatch):
    def failing_compile(*args, **kwargs):
        raise RuntimeError("stand-in compiler failure\nsecond line")

    monkeypatch.setattr(torch, "compile", failing_compile)
    learner = learner_for(Config(), compile=False)
    assert learner.compile(B // MINIBATCHES) == "RuntimeError: stand-in compiler failure"
    assert learner.step is learner.ppo  # the eager function itself
    reference = learner_for(Config(), compile=False)
    assert two_rounds(learner) == two_rounds(reference)


def test_flat_adam_is_torch_adam():
    """The step's Adam against torch.optim.Adam on the same gradients, and checkpoints of either load in the other."""
    from ppo_ddp.algorithm.ppo_step import ADAM_EPS, PPOStep

    torch.manual_seed(0)
    model = ActorCritic(OBS, ACT)
    cfg = Config(max_grad_norm=1e9)  # no clipping: Adam alone
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ours, theirs = flat.clone(), torch.nn.Parameter(flat.clone())
    adam, torch_adam = FlatAdam(ours, 3e-3), torch.optim.Adam([theirs], lr=3e-3, eps=ADAM_EPS)
    step = PPOStep(cfg, model)
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        grad = torch.randn(flat.shape, generator=g)
        step.apply(ours, grad, adam)
        theirs.grad = grad.clone()
        torch_adam.step()
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-5, atol=2e-6)  # its bias corrections in float64
    torch.testing.assert_close(adam.exp_avg_sq, torch_adam.state[theirs]["exp_avg_sq"])
    restored = FlatAdam(ours, 1.0)
    restored.load_state_dict(torch_adam.state_dict())
    assert restored.step.item() == 50 and restored.lr_value == 3e-3
    torch.testing.assert_close(restored.exp_avg, torch_adam.state[theirs]["exp_avg"], rtol=0, atol=0)
    again = torch.optim.Adam([torch.nn.Parameter(flat.clone())], lr=1.0)
    again.load_state_dict(adam.state_dict())
    assert again.param_groups[0]["lr"] == 3e-3


def test_the_background_compile_runs_with_the_main_thread_s_torch_threads_and_reports_once():
    from ppo_ddp.algorithm.compiled import Background

    seen, said, gathered = [], [], []
    release = threading.Event()

    def compile(minibatch: int) -> None:
        release.wait(timeout=60)
        seen.append((minibatch, torch.get_num_threads(), threading.current_thread() is threading.main_thread()))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        background = Background(compile, 16, torch.device("cpu"))
        release.set()  # from here the compile may finish before finish() looks, or after
        background.finish(lambda problem: gathered.append(problem) or [problem, None], said.append)
    finally:
        torch.set_num_threads(threads)
    assert seen == [(16, 1, False)] and gathered == [None]
    assert said[-1].startswith("compiled in ") and all(line.startswith("compiling the PPO step") for line in said[:-1])

    def failing(minibatch: int) -> None:
        raise KeyboardInterrupt  # not a compiler's failure (those come back as a reason): the run's own, re-raised

    with pytest.raises(KeyboardInterrupt):
        Background(failing, 16, torch.device("cpu")).finish(lambda problem: [problem], said.append)


def test_train_py_without_a_cxx_compiler_warns_once_and_trains_eagerly(tmp_path):
    """A real failure of inductor (its C++ compiler missing), not a stand-in: one warning line that names the cause
    and --no-compile, then the run trains eagerly to its end."""
    env = {"CXX": str(tmp_path / "no-such-c++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}  # cache: a miss
    args = [
        sys.executable,
        "train.py",
        *SMALL,
        "--compile",
        "--total-timesteps",
        "192",
        "--runs-dir",
        str(tmp_path / "runs"),
    ]
    proc = run([*args, "--run-name", "eager"], tmp_path, debug=False, env=env)
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "did not compile" in warnings[0] and "--no-compile" in warnings[0], proc.stderr
    assert "done:" in proc.stdout and "compiled in" not in proc.stdout
    assert len(read_csv(tmp_path / "runs" / "eager" / "metrics.csv")) == 2


# ---- two ranks in sync_mode "gradients" ------------------------------------------------------------------------


class ThreadRanks:
    """The ranks of a "gradients" run as threads of this process, averaging through memory: Learner's rank_mean
    is its seam for torch.distributed, so the step's two compiled parts and the average between them are the
    run's own, without two interpreters to start (tests/test_scale.py runs them under torchrun and gloo).
    Every rank sums the slots in rank order, so the mean is bitwise the same on all of them, as gloo's is."""

    def __init__(self, world: int) -> None:
        self.world, self.slots = world, [torch.zeros(0)] * world
        self.barrier = threading.Barrier(world, timeout=120)

    def rank_mean(self, rank: int) -> Callable[[torch.Tensor], None]:
        def mean_(tensor: torch.Tensor) -> None:
            self.slots[rank] = tensor.clone()
            self.barrier.wait()
            total = self.slots[0].clone()
            for other in self.slots[1:]:
                total += other
            self.barrier.wait()  # every rank has read every slot before any rank writes its next one
            tensor.copy_(total / self.world)

        return mean_

    def run(self, work: Callable[[int], Any]) -> list[Any]:
        """work(rank) on a thread per rank; their results in rank order, or the first rank's exception."""
        results: list[Any] = [None] * self.world

        def target(rank: int) -> None:
            try:
                results[rank] = work(rank)
            except BaseException as e:  # re-raised in the test's thread below
                results[rank] = e
                self.barrier.abort()  # a rank waiting on the failed one fails at once instead of timing out

        threads = [threading.Thread(target=target, args=(rank,)) for rank in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results


def two_gradient_ranks(compile: bool) -> list[tuple[dict[str, torch.Tensor], float]]:
    """Two ranks of sync_mode "gradients" training one round of 3 epochs, each on its own data; per rank, its
    state and its epochs (the early stop is decided on the KL averaged over ranks)."""
    ranks = ThreadRanks(2)
    cfg = Config(sync_mode="gradients", update_epochs=3, num_minibatches=MINIBATCHES, target_kl=0.05)
    learners = []
    for rank in range(2):
        torch.manual_seed(0)
        model = ActorCritic(OBS, ACT)
        learners.append(Learner(cfg, model, torch.device("cpu"), ranks.rank_mean(rank)))
        if compile:
            assert learners[-1].compile(B // MINIBATCHES) is None

    def train(rank: int) -> tuple[dict[str, torch.Tensor], float]:
        learner = learners[rank]
        metrics = learner.train_step(batch_for(learner.model, seed=10 + rank), mean_std)
        return state(learner), metrics["losses/epochs"]

    with torch._dynamo.config.patch(error_on_recompile=True):
        return ranks.run(train)


def test_two_ranks_averaging_gradients_compiled_equal_eager_and_each_other():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a rank's share of a 2-core machine under torchrun: tests/test_scale.py's shape
    try:
        eager, compiled = two_gradient_ranks(compile=False), two_gradient_ranks(compile=True)
    finally:
        torch.set_num_threads(threads)
    for key, ours in compiled[0][0].items():
        assert torch.equal(ours, compiled[1][0][key]), key  # ranks bit-identical
        torch.testing.assert_close(ours, eager[0][0][key], rtol=1e-4, atol=1e-6, msg=key)
    assert compiled[0][1] == compiled[1][1] == eager[0][1]
    torch.manual_seed(0)
    start = torch.cat([p.detach().reshape(-1) for p in ActorCritic(OBS, ACT).parameters()])
    assert not torch.equal(eager[0][0]["params"], start)  # it trained


def _scaled_sum(x: torch.Tensor) -> torch.Tensor:
    return (2.0 * x).sum()


def test_config_after_config_in_one_process_never_reaches_dynamo_s_recompile_limit(monkeypatch):
    # The Python API's train() in a loop compiles one step after another in one process, each of another shape;
    # dynamo's recompile limit (8; 1 here, to show it with two) used to fail the ninth, which then ran eagerly.
    # The limit is dynamo's (its cache of graphs per function), whatever compiles the graphs: dynamo's "eager" backend
    # here, instead of building two C++ kernels with inductor for it (~3 s each).
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda f, **kwargs: compile_(f, **{**kwargs, "backend": "eager"}))
    with torch._dynamo.config.patch(recompile_limit=1):
        for n in (3, 5):
            parts, problem = compile_functions([_scaled_sum], lambda f, n=n: f(torch.ones(n)), [])
            assert problem is None and parts[0](torch.ones(n)) == 2.0 * n
