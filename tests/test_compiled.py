"""The compiled PPO step (ppo_ddp/compiled.py) against the eager one: the same function, the same numbers.

Each compile costs seconds on the 2-core machine, so the options are grouped: every option the update has is
in one of the configs below, and each config compiles once (inductor's on-disk cache serves the test run
that follows with the same shapes)."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import socket
import sys

import pytest
import torch
import torch._dynamo
from test_train import SMALL, read_csv, run

from ppo_ddp.config import Config
from ppo_ddp.learner import Learner, RolloutBatch
from ppo_ddp.model import ActorCritic
from ppo_ddp.ppo_step import FlatAdam

OBS, ACT, B, MINIBATCHES = 11, 3, 256, 4

# Every option of the update is in one of these (with target_kl low enough to stop after the first epoch).
CONFIGS = {
    "tanh-clip_vloss-ent-normalize_value-target_kl": Config(ent_coef=0.01, normalize_value=True, target_kl=1e-4),
    "relu-deep-no_clip_vloss-adaptive_lr-threads": Config(
        activation="relu",
        hidden_sizes=(32, 16, 8),
        clip_vloss=False,
        anneal_lr=False,
        adaptive_lr=True,
        learner_threads=2,
    ),  # fmt: skip
    "elu-anneal": Config(activation="elu", hidden_sizes=(24,), max_grad_norm=0.05),
}


def mean_std(x: torch.Tensor) -> tuple[float, float]:
    return x.mean().item(), x.std().item()


def batch_for(model: ActorCritic, seed: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, OBS, generator=g)
    with torch.no_grad():
        actions, logp, values = model.sample(obs, g)
    advantages = torch.randn(B, generator=g)
    return RolloutBatch(obs, actions, logp, values, advantages, advantages + values + 0.5)


def learner_for(cfg: Config, compile: bool) -> Learner:
    torch.manual_seed(0)
    model = ActorCritic(OBS, ACT, cfg.hidden_sizes, cfg.activation, cfg.log_std_init)
    cfg = dataclasses.replace(cfg, update_epochs=3, num_minibatches=MINIBATCHES)
    learner = Learner(cfg, model, torch.device("cpu"))
    if compile:
        assert learner.compile(B // MINIBATCHES) is None
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
    from ppo_ddp.ppo_step import ADAM_EPS, PPOStep

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


def test_train_py_without_a_cxx_compiler_warns_once_and_trains_eagerly(tmp_path):
    """A real failure of inductor (its C++ compiler missing), not a stand-in: one warning line that names the cause
    and --no-compile, then the run trains eagerly to its end."""
    env = {"CXX": str(tmp_path / "no-such-c++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}  # cache: a miss
    args = [sys.executable, "train.py", *SMALL, "--total-timesteps", "192", "--runs-dir", str(tmp_path / "runs")]
    proc = run([*args, "--run-name", "eager"], tmp_path, debug=False, env=env)
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "did not compile" in warnings[0] and "--no-compile" in warnings[0], proc.stderr
    assert "done:" in proc.stdout and "compiled in" not in proc.stdout
    assert len(read_csv(tmp_path / "runs" / "eager" / "metrics.csv")) == 2


# ---- two ranks in sync_mode "gradients" ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gradient_rank(rank: int, port: int, compile: bool, results) -> None:
    import torch.distributed as dist

    from ppo_ddp import distributed as D

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        cpu = torch.device("cpu")
        ctx = D.DistContext(rank=rank, world_size=2, local_rank=rank, device=cpu, comm_device=cpu, local_world_size=2)
        cfg = Config(sync_mode="gradients", update_epochs=3, num_minibatches=MINIBATCHES, target_kl=0.05)
        torch.manual_seed(0)
        model = ActorCritic(OBS, ACT)
        learner = Learner(cfg, model, torch.device("cpu"), lambda t: D.average_(ctx, t))
        problem = learner.compile(B // MINIBATCHES) if compile else None
        metrics = learner.train_step(batch_for(model, seed=10 + rank), mean_std)  # each rank its own data
        # numpy copies travel by value; a tensor would travel as a file descriptor the exiting rank closes
        arrays = {k: v.numpy().copy() for k, v in state(learner).items()}
        results.put((rank, problem, arrays, metrics["losses/epochs"]))
    finally:
        dist.destroy_process_group()


def _two_ranks(compile: bool) -> dict[int, tuple]:
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_gradient_rank, args=(r, port, compile, results)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict((r, rest) for r, *rest in (results.get(timeout=300) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


def test_two_ranks_averaging_gradients_compiled_equal_eager_and_each_other():
    eager, compiled = _two_ranks(compile=False), _two_ranks(compile=True)
    assert compiled[0][0] is None and compiled[1][0] is None  # both compiled
    for key in compiled[0][1]:
        ours, other_rank, eager_rank0 = (torch.from_numpy(x[1][key]) for x in (compiled[0], compiled[1], eager[0]))
        assert torch.equal(ours, other_rank), key  # ranks bit-identical
        torch.testing.assert_close(ours, eager_rank0, rtol=1e-4, atol=1e-6, msg=key)
    assert compiled[0][2] == eager[0][2]
