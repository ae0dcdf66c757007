"""Evaluation while training (issue 14): a 2-rank run with --eval-interval, checked against the rounds' own record."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_train import dump, read_csv, torchrun

from ppo_ddp.configuration.config import Config
from ppo_ddp.envs.make import make_env
from ppo_ddp.evaluation.evaluator import eval_seed, play_episodes
from ppo_ddp.models.factory import make_model
from ppo_ddp.models.flat import read_flat_parameters
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import Moments

EVAL = ["--eval-interval", "2", "--eval-episodes", "2", "--param-sync-interval", "3"]  # round 2: ranks differ


def steps_after(iteration: int) -> int:
    return (iteration + 1) * 128  # round 0 seeds the statistics


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("eval")
    proc = torchrun(tmp_path, *EVAL)
    return tmp_path, proc


def mean_policy_of(tmp_path, iteration: int) -> torch.Tensor:
    return torch.stack([dump(tmp_path, rank, iteration)["params"] for rank in (0, 1)]).mean(0)


def replay(tmp_path, iteration: int) -> list[tuple[float, int]]:
    """The evaluation of a round redone here: the ranks' mean policy and the statistics after that round."""
    cfg = Config(env_id="Hopper-v5", seed=1, log_std_init=0.0)
    model = make_model(cfg, 11, 3)
    read_flat_parameters(model, mean_policy_of(tmp_path, iteration))
    obs_rms = Moments.from_state(dump(tmp_path, 0, iteration)["obs_rms"])
    env = make_env("Hopper-v5")
    try:
        return play_episodes(env, model, obs_rms, cfg.obs_clip, 2, eval_seed(cfg.seed))
    finally:
        env.close()


def test_evaluations_are_logged_at_the_global_steps_of_their_rounds(eval_run):
    tmp_path, proc = eval_run
    rows = read_csv(tmp_path / "runs" / "t" / "eval.csv")
    assert [int(r["iteration"]) for r in rows] == [2, 4]  # every 2 rounds; the last round (4) is one of them
    assert [int(r["global_step"]) for r in rows] == [steps_after(2), steps_after(4)]
    assert "eval of round 2 (step 384)" in proc.stdout


def test_the_evaluated_policy_is_the_rank_average_with_that_round_s_statistics(eval_run):
    tmp_path, _ = eval_run
    assert not torch.equal(dump(tmp_path, 0, 2)["params"], dump(tmp_path, 1, 2)["params"])  # not a sync round
    for row in read_csv(tmp_path / "runs" / "t" / "eval.csv"):
        episodes = replay(tmp_path, int(row["iteration"]))
        returns = [r for r, _ in episodes]
        assert float(row["eval/episodic_return"]) == pytest.approx(sum(returns) / len(returns), rel=1e-12)
        assert float(row["eval/episodic_length"]) == pytest.approx(sum(n for _, n in episodes) / len(episodes))


def test_the_best_checkpoint_is_the_policy_that_evaluated_best(eval_run):
    tmp_path, proc = eval_run
    rows = read_csv(tmp_path / "runs" / "t" / "eval.csv")
    best = max(rows, key=lambda r: float(r["eval/episodic_return"]))
    state = torch.load(tmp_path / "runs" / "t" / "model_t_best.pt", weights_only=True)
    assert state["evaluation"]["iteration"] == int(best["iteration"]) == state["iteration"]
    assert state["evaluation"]["eval/episodic_return"] == pytest.approx(float(best["eval/episodic_return"]))
    assert state["best_eval_return"] == pytest.approx(float(best["eval/episodic_return"]))
    flat = torch.cat([v.reshape(-1) for v in state["actor"].values()])
    model = ActorCritic(11, 3, (64, 64))
    read_flat_parameters(model, mean_policy_of(tmp_path, int(best["iteration"])))
    assert torch.equal(flat, torch.cat([v.reshape(-1) for v in model.state_dict().values()]))
    assert f"best evaluation {float(best['eval/episodic_return']):.1f}" in proc.stdout


def test_a_resumed_run_continues_its_evaluations(eval_run, tmp_path):
    """On a copy of the run: resumed for 2 more rounds, eval.csv gains round 6 (no row twice), and the best
    evaluation so far is remembered (the latest checkpoint was written before the last evaluations finished, so it
    comes from the best checkpoint): a worse new evaluation leaves the best checkpoint alone."""
    source, _ = eval_run
    shutil.copytree(source / "runs", tmp_path / "runs")
    before = torch.load(tmp_path / "runs" / "t" / "model_t_best.pt", weights_only=True)
    torchrun(tmp_path, *EVAL, "--resume", "auto", rounds=6)
    rows = read_csv(tmp_path / "runs" / "t" / "eval.csv")
    assert [int(r["iteration"]) for r in rows] == [2, 4, 6]
    after = torch.load(tmp_path / "runs" / "t" / "model_t_best.pt", weights_only=True)
    sixth = float(rows[-1]["eval/episodic_return"])
    assert after["best_eval_return"] == max(before["best_eval_return"], sixth)
    assert after["evaluation"]["iteration"] == (6 if sixth > before["best_eval_return"] else before["iteration"])
