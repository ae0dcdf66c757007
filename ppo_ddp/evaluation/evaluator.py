"""Evaluation while training: rank 0's evaluator process plays the current policy on envs of its own.

Every cfg.eval_interval rounds (and after the last one) the trainer hands `Evaluator.submit` the round's
rank-averaged policy (a state_dict, sent to the process as flat parameters) and the observation statistics of that
round. The evaluator process runs cfg.eval_episodes deterministic episodes (the action mean) on one env seeded apart
from the training envs (the same episode seeds at every evaluation, so evaluations compare) and sends back their
returns and lengths. With cfg.capture_video it plays the first episode on an env that renders, writes it to the
videos folder (ppo_ddp/envs/video.py) and sends back a preview; it checks at its start that it can render, so a run
that cannot refuses before its first round. Training does
not wait for it: `poll` collects finished evaluations at the end of later rounds, and they are logged against the
global step of the round they evaluated. One evaluation runs at a time; a request that comes while one runs waits,
and a newer request replaces a waiting one (the replaced one is counted, never silently lost).

`play_episodes` is the episode loop that `python -m ppo_ddp.evaluate` uses too.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ppo_ddp.configuration.config import Config
from ppo_ddp.envs.make import make_env, make_video_env
from ppo_ddp.envs.video import INSTALL_HINT, EpisodeVideo, render_problem
from ppo_ddp.errors import ConfigError
from ppo_ddp.evaluation.policy import EnvPolicy
from ppo_ddp.models.factory import make_model
from ppo_ddp.models.flat import num_parameters, read_flat_parameters, write_flat_parameters
from ppo_ddp.models.mlp import ActorCritic
from ppo_ddp.models.normalization import Moments
from ppo_ddp.sampling.children import CLOSE_TIMEOUT, child_start_state, describe_exit, mp_context

EVAL_FINISH_TIMEOUT = 600.0
"""Seconds the end of a run waits for the evaluations still running."""
RENDER_CHECK_TIMEOUT = 120.0
"""Seconds the start of a run that records videos waits for the evaluator's first render."""
_EVAL_SEED_KEY = 0x6576616C  # spawn key that separates evaluation seeds from the training envs'


def eval_seed(seed: int) -> int:
    """The first episode seed of every evaluation of a run (episode i uses this + i)."""
    return int(np.random.SeedSequence([seed], spawn_key=(_EVAL_SEED_KEY,)).generate_state(1)[0] % (2**31 - 1000))


def play_episodes(
    env: Any,
    model: ActorCritic,
    obs_rms: Optional[Moments],
    obs_clip: float,
    episodes: int,
    seed: int,
    deterministic: bool = True,
) -> list[tuple[float, int]]:
    """(undiscounted return, length) of `episodes` episodes, the statistics frozen; episode i reset with seed + i.
    The policy acts through EnvPolicy (normalise, act, clip to the bounds), as an exported one does."""
    policy = EnvPolicy(model, obs_rms, obs_clip, env.action_space.low, env.action_space.high)
    generator = torch.Generator().manual_seed(seed)
    out = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, length, done = 0.0, 0, False
        state = policy.initial_state(1)  # a recurrent policy's memory starts empty with every episode
        while not done:
            with torch.inference_mode():
                action, state = policy.act(torch.as_tensor(obs).unsqueeze(0), state, deterministic, generator)
            obs, reward, terminated, truncated, _ = env.step(action[0].numpy())
            total, length = total + float(reward), length + 1
            done = terminated or truncated
        out.append((total, length))
    return out


def evaluator_main(
    conn: mp.connection.Connection, cfg: Config, dims: tuple[int, int, int], video_dir: Optional[Path]
) -> None:
    """The evaluator process: ("eval", request id, flat parameters, obs statistics state, video path) in, results
    out. With a video_dir it first says whether it can render: ("ready", None or the reason it cannot)."""
    torch.set_num_threads(1)
    env = make_env(cfg.env_id, **cfg.env_kwargs)
    model = make_model(cfg, *dims, (env.action_space.low, env.action_space.high))
    model.requires_grad_(False)
    recorder = None
    try:
        if video_dir is not None:
            recorder = EpisodeVideo(make_video_env(cfg.env_id, **cfg.env_kwargs))
            problem = render_problem(recorder)
            conn.send(("ready", problem))
            if problem is not None:
                return
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the learner is gone
                return
            if msg[0] == "close":
                return
            _, request, flat, obs_state, video_path = msg
            start = time.monotonic()
            read_flat_parameters(model, torch.from_numpy(flat))
            obs_rms = Moments.from_state(obs_state) if obs_state is not None else None
            seed, episodes, video = eval_seed(cfg.seed), [], None
            if recorder is not None:  # the first episode, rendered (rendering does not change the simulation)
                recorder.record_next(Path(video_path))
                episodes = play_episodes(recorder, model, obs_rms, cfg.obs_clip, 1, seed)
                video = (str(video_path), *recorder.take_preview())
            rest = cfg.eval_episodes - len(episodes)
            episodes += play_episodes(env, model, obs_rms, cfg.obs_clip, rest, seed + len(episodes))
            conn.send(("result", request, episodes, time.monotonic() - start, video))
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        env.close()
        if recorder is not None:
            recorder.close()


class EvaluatorError(RuntimeError):
    """The evaluator process failed or died; the message says how."""


@dataclass
class Evaluation:
    """One evaluated policy: the round it comes from and what it scored, the video of its first episode (the mp4's
    path, a shrunken preview and the preview's frame rate) when recorded; `keep` is the caller's (the checkpoint
    states of that round, for the best checkpoint)."""

    iteration: int
    global_step: int
    episodes: list[tuple[float, int]] = field(default_factory=list)
    seconds: float = 0.0
    video: Optional[tuple[str, np.ndarray, float]] = None
    keep: Any = None

    def metrics(self) -> dict[str, float]:
        returns = [r for r, _ in self.episodes]
        return {
            "eval/episodic_return": float(np.mean(returns)),
            "eval/episodic_return_std": float(np.std(returns)),
            "eval/episodic_length": float(np.mean([n for _, n in self.episodes])),
            "eval/seconds": self.seconds,
        }


class Evaluator:
    """Rank 0's evaluator process (a context manager); see the module docstring."""

    def __init__(self, cfg: Config, dims: tuple[int, int, int], video_dir: Optional[Path] = None) -> None:
        """dims: (obs_dim, act_dim, critic_dim) of the run's network."""
        with torch.random.fork_rng(devices=[]):  # a CPU copy to flatten policies with; not from the learner's RNG
            self._probe = make_model(cfg, *dims)
        ctx = mp_context(cfg.mp_start_method)
        self._conn, child = ctx.Pipe(duplex=True)
        with child_start_state():
            self._proc = ctx.Process(
                target=evaluator_main, args=(child, cfg, dims, video_dir), name="ppo-evaluator", daemon=True
            )
            self._proc.start()
        child.close()
        self._running: Optional[Evaluation] = None
        self._waiting: Optional[tuple[Evaluation, np.ndarray, Optional[dict[str, Any]]]] = None
        self.replaced = 0
        """Requests replaced by a newer one before they ran (evaluation slower than eval_interval rounds)."""
        self.video_dir = video_dir
        if video_dir is not None:
            self._await_renderer()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def submit(self, request: Evaluation, policy: dict[str, torch.Tensor], obs_rms: Optional[Moments]) -> None:
        """Evaluate a policy (an ActorCritic state_dict) with these observation statistics when the process is free."""
        self._probe.load_state_dict(policy)
        flat = np.empty(num_parameters(self._probe), dtype=np.float32)
        write_flat_parameters(self._probe, torch.from_numpy(flat))
        self._waiting, replaced = (request, flat, obs_rms.to_state() if obs_rms else None), self._waiting
        self.replaced += replaced is not None
        self._start_waiting()

    def poll(self, timeout: float = 0.0) -> list[Evaluation]:
        """Evaluations finished since the last call (waiting up to timeout for one); starts a waiting request."""
        done = []
        if self._running is not None and self._conn.poll(timeout):
            done.append(self._receive())
        self._start_waiting()
        return done

    def finish(self, timeout: float) -> list[Evaluation]:
        """Every outstanding evaluation, waiting up to timeout seconds in all (the end of a run)."""
        deadline, done = time.monotonic() + timeout, []
        while self._running is not None and time.monotonic() < deadline:
            done += self.poll(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        return done

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(CLOSE_TIMEOUT)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()

    def _await_renderer(self) -> None:
        """A run that records videos and cannot render stops here, before its first round: ConfigError (exit 2)."""
        problem = None
        if not self._conn.poll(RENDER_CHECK_TIMEOUT):
            problem = f"the evaluator did not render a frame within {RENDER_CHECK_TIMEOUT:.0f} s"
        else:
            try:
                problem = self._conn.recv()[1]  # ("ready", reason or None), or ("error", reason, traceback)
            except (EOFError, OSError):  # a GL library that crashes the process instead of raising
                self._proc.join(5.0)
                problem = f"rendering killed the evaluator ({describe_exit(self._proc.exitcode)}); {INSTALL_HINT}"
        if problem is not None:
            self.close()
            raise ConfigError(f"capture_video=True: {problem}")

    def _start_waiting(self) -> None:
        if self._running is not None or self._waiting is None:
            return
        request, flat, obs_state = self._waiting
        self._waiting = None
        try:
            video = self.video_dir / f"eval_{request.global_step:09d}.mp4" if self.video_dir is not None else None
            self._conn.send(("eval", request.iteration, flat, obs_state, video))
        except (BrokenPipeError, OSError):
            raise self._gone() from None
        self._running = request

    def _receive(self) -> Evaluation:
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            raise self._gone() from None
        if msg[0] == "error":
            raise EvaluatorError(f"the evaluator failed: {msg[1]}\n{msg[2]}")
        _, request, episodes, seconds, video = msg
        done, self._running = self._running, None
        assert done is not None and done.iteration == request, (done, request)
        done.episodes, done.seconds, done.video = [(float(r), int(n)) for r, n in episodes], float(seconds), video
        return done

    def _gone(self) -> EvaluatorError:
        self._proc.join(1.0)
        return EvaluatorError(f"the evaluator process died ({describe_exit(self._proc.exitcode)})")
