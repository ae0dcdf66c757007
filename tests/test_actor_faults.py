"""Supervising the actors: an actor's exception, start-up failure, non-finite output, death or hang is one error
in the learner, Ctrl-C leaves one traceback and no orphans, and actors exit when their learner dies. Every pool is
checked to leave no process and no shared-memory segment behind."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # actors inherit sys.path, so they can import scripted_env too
    sys.path.insert(0, str(TESTS_DIR))

import scripted_env  # noqa: E402
from helpers import process_alive  # noqa: E402
from pools import SCRIPTED, assert_released, make_cfg, make_model  # noqa: E402

from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.sampling.pool import ActorError, ActorPool  # noqa: E402


# ---------------------------------------------------------------------------------------------- supervision
def _collect_expecting_error(cfg: Config, rounds: int = 1) -> tuple[ActorError, float, ActorPool]:
    pool = ActorPool(cfg, rank=0, num_actors=cfg.actors_per_gpu, obs_dim=3, act_dim=2, pin_memory=False)
    model = make_model(cfg, 3, 2, seed=0)
    with pool:
        for _ in range(rounds - 1):
            pool.collect(model, None, None)
        start = time.monotonic()
        with pytest.raises(ActorError) as info:
            pool.collect(model, None, None)
        elapsed = time.monotonic() - start
        assert_released(pool)  # closed by the error itself, before the with block ends
    return info.value, elapsed, pool


def test_actor_exception_carries_traceback():
    cfg = make_cfg("scripted_env:ScriptedRaise-v0", seed=scripted_env.FAILURE_SEED)
    err, _, pool = _collect_expecting_error(cfg)
    text = str(err)
    assert "rank 0 actor 1" in text and "env 1" in text and "step 5" in text
    assert "scripted failure at lifetime step 5" in text
    assert "Traceback (most recent call last)" in text and "scripted_env.py" in text
    assert (err.rank, err.actor_id, err.env_index, err.step) == (0, 1, 1, 5)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == text and (again.actor_id, again.env_index, again.step) == (1, 1, 5)
    with pytest.raises(RuntimeError, match="closed"):
        pool.collect(make_model(cfg, 3, 2, seed=0), None, None)
    pool.close()  # idempotent


def test_actor_start_up_failure_is_an_error():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    pool = ActorPool(
        make_cfg("scripted_env:NoSuchEnv-v0"), rank=2, num_actors=2, obs_dim=3, act_dim=2, pin_memory=False
    )
    assert torch.equal(torch.rand(3), expected), "creating a pool must not consume the learner's RNG"
    with pool, pytest.raises(ActorError) as info:
        pool.collect(make_model(pool.cfg, 3, 2, seed=0), None, None)
    assert "rank 2 actor" in str(info.value) and "during start-up" in str(info.value) and "NoSuchEnv" in str(info.value)
    assert_released(pool)


@pytest.mark.parametrize(
    "env_id,what",
    [
        ("scripted_env:ScriptedNaNObs-v0", "non-finite observation"),
        ("scripted_env:ScriptedNaNReward-v0", "non-finite reward"),
    ],
)
def test_non_finite_env_output_is_an_error(env_id, what):
    err, _, _ = _collect_expecting_error(make_cfg(env_id, seed=scripted_env.FAILURE_SEED))
    assert what in str(err) and "rank 0 actor 1" in str(err)
    assert (err.actor_id, err.env_index, err.step) == (1, 1, 4)


def test_killed_actor_detected_at_once():
    cfg = make_cfg(  # ~0.5 s per round; a timeout far beyond it, so noticing by the timeout would show
        "scripted_env:ScriptedSlow-v0", rollout_length=25, envs_per_actor=1, actor_timeout=600.0
    )
    pool = ActorPool(cfg, rank=0, num_actors=2, obs_dim=3, act_dim=2, pin_memory=False)
    model = make_model(cfg, 3, 2, seed=0)
    with pool:
        pool.collect(model, None, None)
        victim = pool.pids[1]
        killer = threading.Timer(0.2, os.kill, (victim, signal.SIGKILL))
        killer.start()
        start = time.monotonic()
        with pytest.raises(ActorError) as info:
            pool.collect(model, None, None)
        elapsed = time.monotonic() - start
        killer.join()
        assert_released(pool)
    assert elapsed < 60, f"a dead actor took {elapsed:.1f} s to notice (its timeout is {cfg.actor_timeout} s)"
    assert "actor 1" in str(info.value) and "SIGKILL" in str(info.value) and info.value.exitcode == -signal.SIGKILL


def test_stuck_actor_times_out():
    cfg = make_cfg("scripted_env:ScriptedHang-v0", seed=scripted_env.FAILURE_SEED, actor_timeout=1.0)
    err, elapsed, _ = _collect_expecting_error(cfg)
    assert 1.0 <= elapsed < 60, elapsed  # not before its 1-s timeout, and soon after it
    assert "actor 1 did not finish round 1" in str(err) and err.actor_id == 1


def test_actors_ignore_sigint():
    cfg = make_cfg(SCRIPTED)
    model = make_model(cfg, 3, 2, seed=0)
    with ActorPool(cfg, rank=0, num_actors=2, obs_dim=3, act_dim=2, pin_memory=False) as pool:
        pool.collect(model, None, None)
        for pid in pool.pids:
            os.kill(pid, signal.SIGINT)
        time.sleep(0.2)
        pool.collect(model, None, None)  # every actor still serves
        assert all(p.is_alive() for p in pool._procs)
    assert_released(pool)


def test_actors_exit_when_learner_dies(tmp_path):
    """A learner killed without closing its pool: its actors see EOF on their pipe and exit by themselves."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path[:0] = [{str(TESTS_DIR.parent)!r}, {str(TESTS_DIR)!r}]
        from ppo_ddp.sampling.pool import ActorPool
        from ppo_ddp.configuration.config import Config
        from ppo_ddp.models.mlp import ActorCritic
        if __name__ == "__main__":
            cfg = Config(env_id={SCRIPTED!r}, actors_per_gpu=2, envs_per_actor=1, rollout_length=4, num_minibatches=1)
            pool = ActorPool(cfg, 0, 2, 3, 2, False)
            pool.collect(ActorCritic(3, 2), None, None)
            print(*pool.pids, flush=True)
            os.kill(os.getpid(), 9)
    """)
    stderr = tmp_path / "learner.err"
    with open(stderr, "w") as err:  # actors inherit the learner's stdout: read one line, never wait for EOF
        learner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=err, text=True)
        pids = [int(p) for p in learner.stdout.readline().split()]
        learner.wait(timeout=60)
        learner.stdout.close()
    assert len(pids) == 2, stderr.read_text()

    deadline = time.monotonic() + 10
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_alive(p) for p in pids), "actors outlived their learner"


def test_ctrl_c_gives_one_traceback_and_no_orphans(tmp_path):
    """Ctrl-C (SIGINT to the whole foreground process group) while the learner trains and its actors wait:
    the learner raises KeyboardInterrupt and closes its pool; the actors print nothing and are gone."""
    script = textwrap.dedent(f"""
        import faulthandler, signal, sys, time
        # A terminal job starts with Ctrl-C's default action. A child of a non-interactive shell's background
        # job (`pytest ... &`, as CI may run) inherits SIGINT *ignored*, and Python then installs no
        # KeyboardInterrupt handler: this script, standing in for a user's own loop, sets what a terminal gives.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks where a slow exit hangs
        sys.path[:0] = [{str(TESTS_DIR.parent)!r}, {str(TESTS_DIR)!r}]
        from ppo_ddp.sampling.pool import ActorPool
        from ppo_ddp.configuration.config import Config
        from ppo_ddp.models.mlp import ActorCritic
        if __name__ == "__main__":
            cfg = Config(env_id="scripted_env:ScriptedSlow-v0", actors_per_gpu=2, envs_per_actor=1, rollout_length=10,
                         num_minibatches=1)
            model = ActorCritic(3, 2)
            with ActorPool(cfg, 0, 2, 3, 2, False) as pool:
                while True:
                    pool.collect(model, None, None)
                    print(*pool.pids, flush=True)
                    time.sleep(2.0)  # "training": the actors wait for the next round
    """)
    stderr = tmp_path / "learner.err"
    with open(stderr, "w") as err:
        learner = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
        )  # its own process group, like a terminal job
        pids = [int(p) for p in learner.stdout.readline().split()]
        time.sleep(0.1)
        os.killpg(learner.pid, signal.SIGINT)
        try:
            learner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"learner alive 30 s after SIGINT\n{_where_it_hangs(learner.pid, stderr)}")
        finally:
            learner.stdout.close()
    text = stderr.read_text()
    assert len(pids) == 2, text
    assert text.count("Traceback") == 1 and text.rstrip().endswith("KeyboardInterrupt"), text
    assert all(not os.path.exists(f"/proc/{pid}") for pid in pids), "actors left running after Ctrl-C"


def _where_it_hangs(pid: int, stderr: Path) -> str:
    """A process (with faulthandler on SIGUSR1) that outlived its deadline: its signal dispositions, its
    Python stack and its session's processes; then the session is killed so that nothing is left behind."""
    with open(f"/proc/{pid}/status") as f:
        dispositions = "".join(line for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    ps = subprocess.run(
        ["ps", "-s", str(pid), "-o", "pid,ppid,stat,wchan:30,etime,args"], capture_output=True, text=True
    )
    os.killpg(pid, signal.SIGKILL)
    return f"{dispositions}{ps.stdout}--- its stderr (a stack dump last) ---\n{stderr.read_text()}"
