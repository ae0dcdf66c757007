"""Nothing lost (docs/reliability.md): stop signals, resume, elastic restarts, faults, two nodes, loopback.

End to end on CPU like tests/test_train.py: real torchrun (gloo), real actor processes, tiny rounds
(1 actor x 2 envs x 32 steps per rank). Every subprocess has a timeout, so a hang fails the test instead
of CI. Ranks dump their view of each round (PPO_DDP_DEBUG_DIR), which holds their pids for the signals.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
import yaml
from helpers import process_alive
from test_train import SMALL, read_csv

from ppo_ddp.configuration.config import Config

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
TIMEOUT = 180  # seconds for any one launch; a hang fails the test
# Seconds within which every rank must be gone after a fault: generous for a loaded machine, and still far
# below the 10-minute collective timeout a rank left waiting for a lost peer would run into.
FAULT_BOUND = 120.0
STEPS_PER_ROUND = 128  # 2 ranks x 1 actor x 2 envs x 32 steps
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


# ---------------------------------------------------------------------------------------------- helpers
class Launch:
    """A background launch (train.py or torchrun) with its output in files, so nothing blocks on a pipe."""

    def __init__(
        self, args: list[str], out_dir: Path, name: str, debug: Optional[Path] = None, new_session: bool = False
    ):
        env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
        # this checkout's package, and tests/ for the scripted envs (`scripted_env:...` ids)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(TESTS), env.get("PYTHONPATH")) if p)
        if debug is not None:
            env["PPO_DDP_DEBUG_DIR"] = str(debug)
        self.debug = debug
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = out_dir / f"{name}.out", out_dir / f"{name}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=new_session
            )
        self.started = time.monotonic()
        self.ended: Optional[float] = None

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in _process_tree(self.proc.pid):  # torchrun's workers sit in sessions of their own
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.proc.wait()
            pytest.fail(f"launch did not end within {timeout} s\n{self.output()}")
        self.ended = self.ended or time.monotonic()
        return rc

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def output(self) -> str:
        return f"stdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-6000:]}"

    def wait_for_dump(self, rank: int, iteration: int, timeout: float = TIMEOUT) -> dict:
        """This rank's dump of that round, once written; fails if the launch ends first."""
        path = self.debug / f"rank{rank}_iter{iteration}.pt"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                for _ in range(50):  # torch.save may still be writing it
                    try:
                        return torch.load(path, weights_only=True)
                    except Exception:
                        time.sleep(0.02)
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended (exit {self.proc.returncode}) before round {iteration}\n{self.output()}")
            time.sleep(0.01)
        pytest.fail(f"no dump of round {iteration} within {timeout} s\n{self.output()}")


def train_args(tmp_path: Path, run_name: Optional[str], rounds: int, *extra: str) -> list[str]:
    args = ["train.py", *SMALL, "--total-timesteps", str(steps_after(rounds)), "--runs-dir", str(tmp_path / "runs")]
    return args + (["--run-name", run_name] if run_name else []) + list(extra)


def steps_after(rounds: int) -> int:
    """global_step after that many training rounds of 2 ranks: round 0 (seeding the statistics) counts too."""
    return (rounds + 1) * STEPS_PER_ROUND


def torchrun(
    tmp_path: Path, run_name: Optional[str], rounds: int, *extra: str, launcher: tuple[str, ...] = ()
) -> list[str]:
    return [*TORCHRUN, "--standalone", "--nproc_per_node=2", *launcher, *train_args(tmp_path, run_name, rounds, *extra)]


def worker_exit_codes(text: str) -> list[int]:
    """The exit codes of the workers in torchrun's failure report."""
    return [int(c) for c in re.findall(r"^\s*exitcode\s+:\s*(-?\d+)", text, re.M)]


def dump(debug: Path, rank: int, iteration: int) -> dict:
    return torch.load(debug / f"rank{rank}_iter{iteration}.pt", weights_only=True)


def assert_same_state(a, b, what: str) -> None:
    """Nested dicts/lists of tensors and numbers, equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), what
    elif isinstance(a, dict):
        assert set(a) == set(b), what
        for k in a:
            assert_same_state(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{what}[{i}]")
    else:
        assert a == b, what


def tensorboard_steps(run_dir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


# ------------------------------------------------------------ 1-2: a stop signal on one rank, then resume
ROUNDS = 16  # the stop lands around round 4; the margin is for a slow machine
DETERMINISTIC = (
    "losses/policy_loss",
    "losses/value_loss",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/entropy",
    "charts/learning_rate",
    "charts/episodic_return",
    "charts/episodes",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """U: 16 rounds uninterrupted. I: the same, SIGTERM to rank 1 alone after its round-3 dump. R: I's printed
    resume command. U goes through `--resume auto` with no checkpoint yet, i.e. a fresh start."""
    tmp = tmp_path_factory.mktemp("resume")
    u = Launch(torchrun(tmp, "u", ROUNDS, "--resume", "auto"), tmp, "u", debug=tmp / "debug_u")
    assert u.wait() == 0, u.output()

    i = Launch(torchrun(tmp, "r", ROUNDS), tmp, "i", debug=tmp / "debug_i")
    victim = i.wait_for_dump(1, 3)["pid"]
    os.kill(victim, signal.SIGTERM)
    signalled = time.monotonic()
    i_rc = i.wait()

    line = next((text for text in i.stdout.splitlines() if text.startswith("stopped by")), None)
    assert line is not None, i.output()
    command = shlex.split(line.split("Resume with: ", 1)[1])
    assert command[:3] == ["torchrun", "--standalone", "--nproc_per_node=2"], command
    stopped = tmp / "stopped.pt"  # the resumed run overwrites the run's checkpoint
    stopped.write_bytes((tmp / "runs" / "r" / "model_r.pt").read_bytes())
    r = Launch([*TORCHRUN, *command[1:]], tmp, "r", debug=tmp / "debug_r")
    assert r.wait() == 0, r.output()
    return {
        "tmp": tmp,
        "u": u,
        "i": i,
        "i_rc": i_rc,
        "r": r,
        "stop_seconds": i.ended - signalled,
        "line": line,
        "stopped": torch.load(stopped, weights_only=True),
    }


def stopped_round(runs) -> int:
    return int(re.search(r"after round (\d+) of", runs["line"]).group(1))


def test_sigterm_to_one_rank_stops_every_rank_after_the_same_round(runs):
    i, k = runs["i"], stopped_round(runs)
    assert 3 <= k < ROUNDS, runs["line"]
    # both ranks stopped on their own, with the documented status; torchrun reports a failed group (1)
    assert runs["i_rc"] == 1 and sorted(worker_exit_codes(i.stderr)) == [143, 143], i.output()
    assert runs["stop_seconds"] < FAULT_BOUND
    assert i.stdout.count("stopped by SIGTERM") == 1  # one line, from rank 0
    assert "[rank" not in i.stderr, i.output()  # no worker traceback
    # the checkpoint holds the last completed round; the resume hint keeps every flag of the run
    state = runs["stopped"]
    assert state["iteration"] == k and state["global_step"] == steps_after(k)
    assert "--resume auto --run-name r" in runs["line"] and "--save-interval 2" in runs["line"]
    for rank in (0, 1):  # both ranks trained exactly k rounds
        assert (runs["tmp"] / "debug_i" / f"rank{rank}_iter{k}.pt").exists()
        assert not (runs["tmp"] / "debug_i" / f"rank{rank}_iter{k + 1}.pt").exists()


def test_checkpoint_at_the_stop_is_the_uninterrupted_state_exactly(runs):
    """Parameters, Adam moments, generators, actors' noise and statistics (count included) at round k are
    bit for bit those of the uninterrupted run at round k: everything a checkpoint can hold is restored."""
    tmp, k, state = runs["tmp"], stopped_round(runs), runs["stopped"]
    u0 = dump(tmp / "debug_u", 0, k)
    params = torch.cat([v.reshape(-1) for k_, v in state["actor"].items()])
    assert torch.equal(params, u0["params"])
    assert_same_state(state["obs_rms_state"], u0["obs_rms"], "obs_rms")
    assert state["obs_rms_state"]["count"] == steps_after(k)  # never multiplied by the world size
    assert len(state["rank_states"]) == 2
    for rank, saved in enumerate(state["rank_states"]):
        u = dump(tmp / "debug_u", rank, k)
        assert torch.equal(torch.cat([v.reshape(-1) for v in saved["actor"].values()]), u["params"])
        assert_same_state(saved["optimizer"], u["optimizer"], f"rank {rank} optimizer")
        assert_same_state(saved["generator"], u["generator"], f"rank {rank} generator")
        assert_same_state(saved["actor_noise"], u["actor_noise"], f"rank {rank} actor noise")


def test_resumed_run_continues_the_uninterrupted_one(runs):
    tmp, k = runs["tmp"], stopped_round(runs)
    u_rows, r_rows = read_csv(tmp / "runs" / "u" / "metrics.csv"), read_csv(tmp / "runs" / "r" / "metrics.csv")
    # metrics.csv appended: every round once, counters exact
    assert [int(r["iteration"]) for r in r_rows] == list(range(1, ROUNDS + 1))
    assert [int(r["global_step"]) for r in r_rows] == [steps_after(i) for i in range(1, ROUNDS + 1)]
    # the resumed run is the uninterrupted one, before the stop and after it: the actors continue their episodes
    # from the envs' state in the checkpoint (ppo_ddp/envs/state.py), so every logged number is the same
    for u, r in zip(u_rows, r_rows):
        assert [u[c] for c in DETERMINISTIC] == [r[c] for c in DETERMINISTIC], (u["iteration"], u, r)
    assert_same_state(
        dump(tmp / "debug_r", 0, k + 1)["frozen_obs_rms"],
        dump(tmp / "debug_u", 0, k + 1)["frozen_obs_rms"],
        "statistics the actors used in the first resumed round",
    )
    u_end, r_end = dump(tmp / "debug_u", 0, ROUNDS), dump(tmp / "debug_r", 0, ROUNDS)
    assert r_end["obs_rms"]["count"] == u_end["obs_rms"]["count"] == steps_after(ROUNDS)
    for rank in (0, 1):  # every rank's parameters, Adam moments and statistics at the end, bit for bit
        u_rank, r_rank = dump(tmp / "debug_u", rank, ROUNDS), dump(tmp / "debug_r", rank, ROUNDS)
        assert torch.equal(u_rank["params"], r_rank["params"]), f"rank {rank} parameters"
        assert_same_state(r_rank["optimizer"], u_rank["optimizer"], f"rank {rank} optimizer")
        assert_same_state(r_rank["obs_rms"], u_rank["obs_rms"], f"rank {rank} statistics")
    assert "the envs start new episodes" not in runs["r"].stdout, runs["r"].output()
    # ranks stay identical after the resume (param_sync_interval 1)
    assert torch.equal(r_end["params"], dump(tmp / "debug_r", 1, ROUNDS)["params"])
    # TensorBoard continues at the right step: no point twice, none missing
    assert tensorboard_steps(tmp / "runs" / "r", "charts/SPS") == [steps_after(i) for i in range(1, ROUNDS + 1)]
    assert f"resumed from {tmp / 'runs' / 'r' / 'model_r.pt'} at round {k}" in runs["r"].stdout


def test_resume_on_another_world_size(runs, tmp_path):
    """The 2-rank checkpoint on one learner: rank 0's state for everyone, said in a line, then training goes on."""
    k = stopped_round(runs)
    run = Launch(
        [
            sys.executable,
            *train_args(
                tmp_path,
                "w",
                0,
                "--total-timesteps",
                str(steps_after(k) + 64),
                "--resume",
                str(runs["tmp"] / "stopped.pt"),
            ),
        ],
        tmp_path,
        "w",
    )
    assert run.wait() == 0, run.output()
    assert "the checkpoint was written by 2 rank(s), this run has 1" in run.stdout, run.output()
    state = torch.load(tmp_path / "runs" / "w" / "model_w.pt", weights_only=True)
    assert state["global_step"] == steps_after(k) + 64 and len(state["rank_states"]) == 1


def test_learning_rate_follows_the_steps_across_resumes(runs, tmp_path):
    """The annealed rate of a round is lr0 * (1 - steps before it / total_timesteps) on every row: before the
    stop (2 ranks), after a resume on 1 rank (another round size), and after one with a larger total."""
    lr0 = Config().learning_rate

    def check(rows: list[dict[str, str]], total: int, step_before: int) -> None:
        for row in rows:
            assert float(row["charts/learning_rate"]) == pytest.approx(lr0 * (1 - step_before / total), rel=1e-6), row
            step_before = int(row["global_step"])

    k, total = stopped_round(runs), steps_after(ROUNDS)
    check(read_csv(runs["tmp"] / "runs" / "r" / "metrics.csv")[:k], total, STEPS_PER_ROUND)  # after round 0
    for name, run_total in (("one_rank", total), ("longer", total + 4 * 64)):
        run = Launch(
            [
                sys.executable,
                *train_args(
                    tmp_path, name, 0, "--total-timesteps", str(run_total), "--resume", str(runs["tmp"] / "stopped.pt")
                ),
            ],
            tmp_path,
            name,
        )
        assert run.wait() == 0, run.output()
        rows = read_csv(tmp_path / "runs" / name / "metrics.csv")
        assert int(rows[-1]["global_step"]) == run_total and len(rows) == (run_total - steps_after(k)) // 64
        check(rows, run_total, steps_after(k))


def test_learning_rate_of_the_command_line_wins_over_the_checkpoints(runs, tmp_path):
    k = stopped_round(runs)
    run = Launch(
        [
            sys.executable,
            *train_args(
                tmp_path,
                "lr",
                0,
                "--total-timesteps",
                str(steps_after(k) + 64),
                "--resume",
                str(runs["tmp"] / "stopped.pt"),
                "--no-anneal-lr",
                "--learning-rate",
                "0.001",
            ),
        ],
        tmp_path,
        "lr",
    )
    assert run.wait() == 0, run.output()
    assert float(read_csv(tmp_path / "runs" / "lr" / "metrics.csv")[-1]["charts/learning_rate"]) == 0.001
    assert "learning_rate 0.001 (this run's) replaces the checkpoint's" in run.stdout, run.output()


# ----------------------------------------------------------------------------------- Ctrl-C, twice
def test_ctrl_c_to_torchrun_stops_saves_and_exits_130(tmp_path):
    # What a terminal does: SIGINT to torchrun's process group; torchrun forwards it to its workers.
    run = Launch(torchrun(tmp_path, "c", 40), tmp_path, "c", debug=tmp_path / "debug", new_session=True)
    run.wait_for_dump(0, 2)
    os.killpg(run.proc.pid, signal.SIGINT)
    run.wait()
    assert sorted(worker_exit_codes(run.stderr)) in ([], [130, 130]), run.output()  # the report lists failures, if any
    line = next(text for text in run.stdout.splitlines() if text.startswith("stopped by SIGINT"))
    k = int(re.search(r"after round (\d+) of", line).group(1))
    assert torch.load(tmp_path / "runs" / "c" / "model_c.pt", weights_only=True)["iteration"] == k
    assert "stopping after this round" in run.stderr  # said once, by rank 0, when the signal arrived
    assert "[rank0]" not in run.stderr and "[rank1]" not in run.stderr  # no worker tracebacks


def test_second_ctrl_c_quits_at_once_and_leaves_whole_files(tmp_path):
    """python train.py whose round 3 hangs in an actor: the first Ctrl-C waits for a round that does not end,
    the second quits at once; the round-2 checkpoint stays whole, no actor or temp file is left."""
    run = Launch(
        [
            sys.executable,
            *train_args(
                tmp_path,
                "h",
                10,
                "--env-id",
                "scripted_env:ScriptedHangRank0-v0",
                "--seed",
                "7",
                "--actor-timeout",
                "600",
            ),
        ],
        tmp_path,
        "h",
        debug=tmp_path / "debug",
    )
    actors = run.wait_for_dump(0, 2)["actor_pids"]
    time.sleep(0.5)  # round 3 is hanging now
    run.proc.send_signal(signal.SIGINT)
    time.sleep(1.5)  # beyond the window in which a repeat counts as the same signal delivered twice
    assert run.proc.poll() is None, run.output()
    run.proc.send_signal(signal.SIGINT)
    rc = run.wait(timeout=120)  # at once: not after the hang's 600-s actor timeout
    assert rc == 130, run.output()
    assert "quit on a second SIGINT without saving; the latest is" in run.stderr and "(round 2)" in run.stderr
    assert "Traceback" not in run.stderr, run.output()
    run_dir = tmp_path / "runs" / "h"
    assert torch.load(run_dir / "model_h.pt", weights_only=True)["iteration"] == 2
    assert not list(run_dir.glob(".*.tmp"))
    deadline = time.monotonic() + 10
    while any(process_alive(p) for p in actors) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_alive(p) for p in actors), "actors left running"


# --------------------------------------------------------------------------- 3: elastic restart
def test_elastic_restart_after_sigkill_continues_from_the_last_checkpoint(tmp_path):
    # No --run-name: the restarted rank 0 must find the run the first attempt started.
    run = Launch(torchrun(tmp_path, None, 8, launcher=("--max-restarts=1",)), tmp_path, "e", debug=tmp_path / "debug")
    os.kill(run.wait_for_dump(1, 3)["pid"], signal.SIGKILL)
    assert run.wait() == 0, run.output()
    (run_dir,) = (tmp_path / "runs").iterdir()
    resumed = re.search(
        rf"resumed from .*model_{re.escape(run_dir.name)}\.pt at round (\d+), step \d+ \(restart 1", run.stdout
    )
    assert resumed and int(resumed.group(1)) % 2 == 0, run.output()  # the last save (every 2 rounds) before the kill
    rows = read_csv(run_dir / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, 9))  # rounds redone after the restart appear once
    assert tensorboard_steps(run_dir, "charts/SPS") == [steps_after(i) for i in range(1, 9)]
    assert torch.load(run_dir / f"model_{run_dir.name}.pt", weights_only=True)["iteration"] == 8
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["torchelastic_restart_count"] == 1 and saved["torchelastic_run_id"]


# -------------------------------------------------------------------------- 4: faults stop every rank
def test_rank_killed_without_restarts_stops_every_rank(tmp_path):
    run = Launch(torchrun(tmp_path, "k", 40), tmp_path, "k", debug=tmp_path / "debug")
    os.kill(run.wait_for_dump(1, 3)["pid"], signal.SIGKILL)
    killed = time.monotonic()
    assert run.wait() != 0
    assert run.ended - killed < FAULT_BOUND, run.output()
    assert "rank 0: lost contact with another rank" in run.stderr, run.output()
    assert sorted(worker_exit_codes(run.stderr)) == [-9, 1], run.output()
    assert torch.load(tmp_path / "runs" / "k" / "model_k.pt", weights_only=True)["iteration"] % 2 == 0  # a save round


FAULTS = {
    "actor exception": (
        "scripted_env:ScriptedRaiseRank1-v0",
        r"rank 1 actor 0 failed \(env 1, step 6, round 3\): EnvError: env 1 failed at step 6 of round 3: "
        r"RuntimeError: scripted failure at lifetime step 102",
    ),
    "non-finite reward": (
        "scripted_env:ScriptedNaNRewardRank1-v0",
        r"rank 1 actor 0 failed \(env 1, step 6, round 3\): EnvError: env 1 returned a non-finite reward "
        r"nan at step 6 of round 3",
    ),
    "actor killed": (None, r"rank 1 actor 0 \(pid \d+\) died unexpectedly, exit code -9 \(killed by SIGKILL\)"),
}
FAULTS["actor killed, overlapped rounds"] = FAULTS["actor killed"]  # killed while the learner updates, maybe
FAULTS["actor exception, overlapped rounds"] = FAULTS["actor exception"]  # round 3 fails during round 2's update


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_on_one_rank_stops_every_rank_and_keeps_the_last_checkpoint(fault, tmp_path):
    env_id, message = FAULTS[fault]
    extra = ["--env-id", env_id, "--seed", "7"] if env_id else []
    extra += ["--overlap"] if "overlapped" in fault else []
    run = Launch(torchrun(tmp_path, "f", 40, *extra), tmp_path, "f", debug=tmp_path / "debug")
    run.wait_for_dump(1, 2)
    if env_id is None:
        os.kill(run.wait_for_dump(1, 3)["actor_pids"][0], signal.SIGKILL)
    faulted = time.monotonic()  # the scripted faults come at round 3, a fraction of a second after round 2
    assert run.wait() == 1, run.output()
    assert run.ended - faulted < FAULT_BOUND
    assert sorted(worker_exit_codes(run.stderr)) == [1, 1], run.output()  # every rank, non-zero
    errors = [text for text in run.stderr.splitlines() if text.startswith("train.py: error:")]
    assert len(errors) == 1, run.output()  # one line for the user, from rank 0
    assert re.search(message, errors[0]), errors[0]
    kept = tmp_path / "runs" / "f" / "model_f.pt"
    assert f"(kept the last good checkpoint {kept}, round " in errors[0]
    state = torch.load(kept, weights_only=True)  # whole, and the state of a round that finished
    k = state["iteration"]
    assert k >= 2 and torch.equal(
        torch.cat([v.reshape(-1) for v in state["actor"].values()]), dump(run.debug, 0, k)["params"]
    )
    assert "[rank0]" not in run.stderr and "[rank1]" not in run.stderr
    if env_id is not None:  # the failing rank printed the actor's traceback, once
        assert run.stderr.count("--- traceback in actor process (rank 1 actor 0) ---") == 1
        assert k == 2


# ----------------------------------------------------------------------------------- 5: bad input
def fake_checkpoint(
    path: Path,
    env_id: str = "Hopper-v5",
    obs_dim: int = 11,
    act_dim: int = 3,
    hidden: tuple[int, ...] = (64, 64),
    policy_only: bool = False,
    per_tensor_adam: bool = False,
) -> Path:
    """A checkpoint as the trainer writes one, without training (cheap); per_tensor_adam: as before the
    learner's flat parameters (one Adam state per tensor)."""
    from ppo_ddp.configuration.config import Config, config_to_dict
    from ppo_ddp.models.flat import flatten_parameters_
    from ppo_ddp.models.mlp import ActorCritic
    from ppo_ddp.storage.checkpoint import save_checkpoint

    model = ActorCritic(obs_dim, act_dim, hidden)
    optimizer = torch.optim.Adam(model.parameters() if per_tensor_adam else [flatten_parameters_(model)])
    payload = {"actor": model.state_dict(), "obs_rms_state": None}
    if not policy_only:
        cfg = Config(env_id=env_id, hidden_sizes=hidden)
        payload.update(
            optimizer=optimizer.state_dict(),
            generator=torch.Generator().get_state(),
            iteration=3,
            global_step=384,
            best_return=1.0,
            config=config_to_dict(cfg),
            env_id=env_id,
            obs_dim=obs_dim,
            act_dim=act_dim,
            world_size=1,
            run_name="x",
        )
    save_checkpoint(path, payload)
    return path


def _corrupt(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"\x00 not a checkpoint " * 100)
    return path


def _truncated(tmp_path: Path) -> Path:
    path = fake_checkpoint(tmp_path / "whole.pt")
    cut = tmp_path / "truncated.pt"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return cut


def _pickled_object(tmp_path: Path) -> Path:
    path = tmp_path / "pickled.pt"
    torch.save({"actor": {}, "obs_rms_state": None, "x": Path("/")}, path)  # a class instance: refused by weights_only
    return path


def _plain_tensor(tmp_path: Path) -> Path:
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    return path


# (checkpoint maker, flags, the one line's pattern); run through main() in-process, as train.py would
CHECKPOINT_CASES = {
    "corrupt file": (_corrupt, [], r"checkpoint .*garbage\.pt: unreadable \(truncated, corrupt or not a torch file\)"),
    "truncated file": (
        _truncated,
        [],
        r"checkpoint .*truncated\.pt: unreadable \(truncated, corrupt or not a torch file\)",
    ),
    "pickled objects": (_pickled_object, [], r"checkpoint .*pickled\.pt: unreadable .*Unsupported global"),
    "not a ppo_ddp checkpoint": (_plain_tensor, [], r"checkpoint .*tensor\.pt: not a ppo_ddp checkpoint"),
    "another env": (
        lambda t: fake_checkpoint(t / "walker.pt", "Walker2d-v5", 17, 6),
        [],
        r"resume='.*walker\.pt': checkpoint is for Walker2d-v5 \(obs 17, act 6\), this run is Hopper-v5 \(obs 11, act 3\)",  # noqa: E501
    ),
    "another network shape": (
        lambda t: fake_checkpoint(t / "wide.pt", hidden=(32, 32)),
        [],
        r"resume='.*wide\.pt': checkpoint's network is hidden_sizes \[32, 32\], this run's is hidden_sizes \[64, 64\]$",
    ),
    "a shared trunk": (
        lambda t: fake_checkpoint(t / "separate.pt"),
        ["--shared-trunk"],
        r"resume='.*separate\.pt': checkpoint's network is shared_trunk False, this run's is shared_trunk True$",
    ),
    "another activation": (
        lambda t: fake_checkpoint(t / "tanh.pt"),
        ["--activation", "relu"],
        r"resume='.*tanh\.pt': checkpoint's network is activation tanh, this run's is activation relu$",
    ),
    "another distribution": (
        lambda t: fake_checkpoint(t / "gaussian.pt"),
        ["--distribution", "beta"],
        r"resume='.*gaussian\.pt': checkpoint's network is distribution gaussian, this run's is distribution beta$",
    ),
    "a GRU with a head": (
        lambda t: fake_checkpoint(t / "mlp.pt"),
        ["--policy", "gru", "--rnn-head-sizes", "64"],
        r"resume='.*mlp\.pt': checkpoint's network is policy mlp rnn_head_sizes \[\], this run's is policy gru "
        r"rnn_head_sizes \[64\]$",
    ),
    "policy-only file": (
        lambda t: fake_checkpoint(t / "policy.pt", policy_only=True),
        [],
        r"resume='.*policy\.pt': checkpoint has no 'optimizer' \(a policy-only file cannot resume training\)",
    ),
    "per-tensor Adam": (
        lambda t: fake_checkpoint(t / "old.pt", per_tensor_adam=True),
        [],
        r"resume='.*old\.pt': checkpoint's optimizer state has 13 parameter tensors, this learner steps one "
        r"flat tensor \(a checkpoint of an earlier ppo_ddp\): it can be evaluated but not resumed",
    ),
}


@pytest.fixture
def restore_signal_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_bad_checkpoint_is_one_line_and_exit_2(case, tmp_path, capsys, restore_signal_handlers):
    from ppo_ddp.configuration.loading import parse_config
    from ppo_ddp.runner.launch import main

    make, flags, message = CHECKPOINT_CASES[case]
    path = make(tmp_path)
    cfg = parse_config([*SMALL, "--resume", str(path), "--runs-dir", str(tmp_path / "runs"), *flags])
    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [text for text in err.splitlines() if text.strip()]
    assert len(lines) == 1, err
    assert re.fullmatch(r"train\.py: error: " + message + ".*", lines[0]), lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing started


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--resume", "auto"], "resume='auto': needs --run-name: the run whose latest checkpoint to continue"),
        (["--resume", "."], "resume='.': must be 'auto' or the path of an existing checkpoint file"),
        (["--run-name", "a/b"], "run_name='a/b': must be a folder name (not empty, no '/')"),
        (
            ["--env-id", "no_such_module:Env-v0"],
            "env_id='no_such_module:Env-v0': cannot import module 'no_such_module'",
        ),
    ],
)
def test_bad_resume_and_run_flags(argv, message, capsys):
    from ppo_ddp.configuration.loading import parse_config

    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_unwritable_runs_dir_is_one_line_and_exit_2(tmp_path, run_train):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run_train(*SMALL, "--total-timesteps", "64", "--runs-dir", str(blocker))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(
        rf"train\.py: error: runs_dir='{re.escape(str(blocker))}': cannot write the run folder "
        rf"{re.escape(str(blocker))}/\S+: Not a directory",
        lines[0],
    ), lines[0]


def test_corrupt_checkpoint_from_the_command_line(tmp_path, run_train):
    proc = run_train(*SMALL, "--resume", str(_corrupt(tmp_path)), "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("train.py: error: checkpoint ") and len(proc.stderr.strip().splitlines()) == 1, (
        proc.stderr
    )


def test_torchrun_topology_that_does_not_fit_is_one_line_per_node(tmp_path):
    # 3 actors are fine for one learner (validated before the launch) but do not split over the 2 that torchrun starts
    args = [
        "train.py",
        "--env-id",
        "Hopper-v5",
        "--num-actors",
        "3",
        "--envs-per-actor",
        "2",
        "--rollout-length",
        "32",
        "--num-minibatches",
        "4",
        "--total-timesteps",
        "256",
        "--runs-dir",
        str(tmp_path / "runs"),
    ]
    run = Launch([*TORCHRUN, "--standalone", "--nproc_per_node=2", *args], tmp_path, "t")
    assert run.wait() == 1  # torchrun's status for a failed group
    ours = [text for text in run.stderr.splitlines() if text.startswith("train.py: error:")]
    assert ours == [
        "train.py: error: num_actors=3 does not split evenly over num_gpus=2: give a multiple of 2, "
        "or set actors_per_gpu"
    ], run.output()
    assert 2 in worker_exit_codes(run.stderr) and not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------- 6: security
def test_every_torch_load_is_weights_only():
    import ast

    calls = []
    for path in [ROOT / "train.py", *(ROOT / "ppo_ddp").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
            ):
                flags = {k.arg: k.value for k in node.keywords}
                ok = isinstance(flags.get("weights_only"), ast.Constant) and flags["weights_only"].value is True
                calls.append((f"{path.name}:{node.lineno}", ok))
    assert calls, "no torch.load found: the scan is broken"
    assert all(ok for _, ok in calls), [c for c, ok in calls if not ok]


def _listening_sockets(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets in LISTEN state that these processes hold."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with_link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if with_link.startswith("socket:["):
                    inodes.add(with_link[8:-1])
        except OSError:
            continue
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addr = bytes.fromhex(fields[1].split(":")[0])
                # /proc prints each 32-bit word in host (little-endian) order
                addr = b"".join(addr[i : i + 4][::-1] for i in range(0, len(addr), 4))
                found.append(socket.inet_ntop(family, addr))
    return found


def _process_tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    return tree


def test_our_launch_of_several_learners_listens_on_loopback_only(tmp_path):
    # `python train.py --num-gpus 2` on a 2-GPU box takes this path; here on CPU.
    code = (
        "import sys; from ppo_ddp.configuration.topology import TrainingTopology; "
        "from ppo_ddp.runner.launch import launch_learners; "
        'launch_learners(TrainingTopology(2, 1, "cpu"), sys.argv[1:])'
    )
    run = Launch([sys.executable, "-c", code, *train_args(tmp_path, "l", 40)], tmp_path, "l", debug=tmp_path / "debug")
    run.wait_for_dump(1, 2)
    addresses = _listening_sockets(_process_tree(run.proc.pid))
    os.kill(run.proc.pid, signal.SIGINT)  # Ctrl-C to the launcher: forwarded, the learners save and stop
    rc = run.wait()
    assert addresses, "no listening socket found: the probe is broken"
    assert set(addresses) <= {"127.0.0.1", "::1"}, addresses
    assert rc == 130, run.output()
    assert "stopped by SIGINT" in run.stdout and "Resume with: python train.py" in run.stdout, run.output()


# ------------------------------------------------------------------------------------- 7: two nodes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_one_machine(tmp_path):
    """Two torchrun launches of one process each, meeting through a c10d rendezvous on 127.0.0.1."""
    port = _free_port()
    launcher = [
        *TORCHRUN,
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=two-nodes",
    ]
    args = train_args(tmp_path, "n", 4, "--obs-clip", "1e9")
    nodes = [Launch([*launcher, *args], tmp_path, f"node{n}", debug=tmp_path / "debug") for n in range(2)]
    for node in nodes:
        assert node.wait() == 0, node.output()
    rounds = [(dump(tmp_path / "debug", 0, i), dump(tmp_path / "debug", 1, i)) for i in range(0, 5)]  # 0: seeding
    a, b = rounds[0]
    assert (a["rank"], b["rank"], a["world_size"], b["world_size"]) == (0, 1, 2, 2)
    assert a["local_rank"] == b["local_rank"] == 0 and {a["node_rank"], b["node_rank"]} == {0, 1}
    seen = []
    for a, b in rounds:
        assert torch.equal(a["params"], b["params"])
        for d in (a, b):
            obs = d["obs"].reshape(-1, d["obs"].shape[-1]).double().numpy()
            frozen = d["frozen_obs_rms"]
            if frozen is not None:  # undo the actors' normalisation (obs_clip is huge: nothing was clipped)
                from ppo_ddp.models.normalization import EPSILON

                obs = obs * np.sqrt(frozen["var"].numpy() + EPSILON) + frozen["mean"].numpy()
            seen.append(obs)
        everything = np.concatenate(seen)
        assert_same_state(a["obs_rms"], b["obs_rms"], "statistics on both nodes")
        assert a["obs_rms"]["count"] == len(everything)
        np.testing.assert_allclose(a["obs_rms"]["mean"].numpy(), everything.mean(0), rtol=1e-4, atol=1e-5)
    saved = yaml.safe_load((tmp_path / "runs" / "n" / "config.yaml").read_text())
    assert saved["world_size"] == 2
    assert len(read_csv(tmp_path / "runs" / "n" / "metrics.csv")) == 4


def test_slurm_script_is_valid_bash():
    script = ROOT / "examples" / "slurm" / "train.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=10)
    text = script.read_text()
    for needed in (
        "srun",
        "torchrun",
        "--rdzv-backend=c10d",
        "--nnodes",
        "GPUS_PER_NODE",
        "--ntasks-per-node=1",
        "--resume auto",
        "--run-name",
    ):
        assert needed in text, needed
