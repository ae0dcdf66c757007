"""Actor processes that step gymnasium envs and write whole rollouts into shared memory (DESIGN.md steps 2-3).

The learner owns an `ActorPool`: one `SharedBuffers` block (layout in ppo_ddp/buffers.py) and
`num_actors` processes started with a spawn or forkserver context. Per round the learner publishes the
weights and the frozen statistics into shared memory and sends each actor a tiny ("round", k) message; the
actor writes rollout[a] in place and answers with a small `ActorReport`. Rollout data never goes through a
pipe.

Supervision: the learner waits on the actor pipes and the process sentinels together, with a bound of
`cfg.actor_timeout + ROUND_TIME_FACTOR * (slowest round so far)`. An exception in an actor comes back as
an `ActorError` carrying the actor's traceback; a dead actor is noticed at once through its sentinel; a
stuck one after the bound. Every error path closes the pool: actors are killed and joined, and the shared
memory is unlinked. Actors ignore SIGINT and SIGTERM (stopping is the learner's decision: torchrun and Slurm
signal a learner's whole process group, and an actor dying of that signal would turn a graceful stop into
an actor failure) and exit quietly when the learner goes away (EOF on their pipe).
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np
import torch

from ppo_ddp.buffers import ROLLOUT_FIELDS, BufferSpec, SharedBuffers
from ppo_ddp.config import Config
from ppo_ddp.envs import env_seed, make_env
from ppo_ddp.model import LOG_SQRT_2PI, ActorCritic, num_parameters, read_flat_parameters, write_flat_parameters
from ppo_ddp.normalization import DiscountedReturn, Moments, compute_batch_moments, normalize_obs, scale_reward
from ppo_ddp.rollout import compute_gae, prepare_action

ROUND_TIME_FACTOR = 2.0
"""A round may take this many times the slowest round so far, plus cfg.actor_timeout, before an actor counts as stuck."""
MIN_STARTUP_TIMEOUT = 60.0
"""Actors get max(cfg.actor_timeout, this) seconds from the pool's start to import, build their envs and report ready."""
CLOSE_TIMEOUT = 5.0
"""Seconds idle actors get to exit on a "close" message before they are killed."""
IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The learner's to handle (ppo_ddp/signals.py); actors and the forkserver ignore them from their start."""
FORKSERVER_PRELOAD = ["ppo_ddp.actors", "mujoco"]
"""Imported once in the forkserver, so each actor starts without re-importing torch, gymnasium and MuJoCo."""

_NOISE_SEED_KEY = 0x6E6F697365  # spawn key that separates the action-noise seeds from env_seed's


def noise_seed(seed: int, rank: int, actor: int) -> int:
    """Deterministic 64-bit seed of an actor's action-noise generator, distinct from every env seed."""
    state = np.random.SeedSequence([seed, rank, actor], spawn_key=(_NOISE_SEED_KEY,)).generate_state(1, np.uint64)
    return int(state[0])


@dataclass
class ActorReport:
    """What an actor says about one round (small: pickled through the pipe)."""

    actor_id: int
    episodes: int
    episode_return_sum: float
    episode_returns: list[float]
    episode_len_sum: int
    episode_lengths: list[int]
    obs_moments: Moments
    """Moments of the T*E raw observations the policy acted on this round (an increment, not history)."""
    return_moments: Optional[Moments]
    """Moments of this round's discounted returns G (None unless cfg.normalize_reward)."""
    steps: int
    noise_state: Optional[np.ndarray] = None
    """The action-noise generator's state after the round (uint8), for checkpoints: a resumed actor continues it.
    numpy, not a torch tensor: torch pickles tensors through pipes as shared memory and passed fds."""


class ActorError(RuntimeError):
    """An actor failed, died or got stuck; the message names rank and actor and carries the actor's traceback."""

    def __init__(
        self,
        message: str,
        rank: int,
        actor_id: int,
        traceback_text: str = "",
        exitcode: Optional[int] = None,
        env_index: Optional[int] = None,
        step: Optional[int] = None,
    ) -> None:
        full = message
        if traceback_text:
            full += f"\n\n--- traceback in actor process (rank {rank} actor {actor_id}) ---\n{traceback_text.rstrip()}"
        super().__init__(full)
        self.message = message
        self.rank = rank
        self.actor_id = actor_id
        self.traceback_text = traceback_text
        self.exitcode = exitcode
        self.env_index = env_index
        self.step = step

    def __reduce__(self):  # picklable (e.g. to be gathered from another rank) despite the extra fields
        return type(self), (self.message, self.rank, self.actor_id, self.traceback_text, self.exitcode, self.env_index, self.step)


class EnvError(RuntimeError):
    """Raised inside an actor: an env failed or returned non-finite data; knows which env and which step."""

    def __init__(self, message: str, env_index: int, step: Optional[int]) -> None:
        super().__init__(message)
        self.env_index = env_index
        self.step = step


# ================================================================================================ actor side
@dataclass(frozen=True)
class _ActorArgs:
    cfg: Config
    rank: int
    actor_id: int
    buffer_spec: BufferSpec
    shm_name: str
    noise_state: Optional[np.ndarray] = None


class PolicyKernel:
    """The actor-critic's forward pass in numpy, for the actor's per-step inference on a few observations.

    A 64x64 MLP on 1-16 rows costs far less in numpy than torch's per-op dispatch (about 3x on the 2-core
    benchmark machine), and this runs once per env step. The math is the model's own: `load(model)` takes
    the weights of the round from the CPU ActorCritic (filled by read_flat_parameters), the layers and
    activation are the model's, and tests check values and log-probs against model.value / model.evaluate.
    The first layers of the policy and the value MLP share one matmul (their inputs are the same).
    """

    _ACTIVATIONS = {
        "tanh": lambda h: np.tanh(h, out=h),
        "relu": lambda h: np.maximum(h, 0.0, out=h),
        "elu": lambda h: np.copyto(h, np.expm1(np.minimum(h, 0.0)), where=h < 0),
    }

    def __init__(self, model: ActorCritic, activation: str) -> None:
        self.activation = self._ACTIVATIONS[activation]
        self.load(model)

    def load(self, model: ActorCritic) -> None:
        def linears(seq: torch.nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
            return [(m.weight.detach().numpy().T.astype(np.float32, order="C"), m.bias.detach().numpy().astype(np.float32))
                    for m in seq if isinstance(m, torch.nn.Linear)]

        actor, critic = linears(model.actor_mean), linears(model.critic)
        self.width = actor[0][0].shape[1]
        self.first = (np.concatenate([actor[0][0], critic[0][0]], axis=1), np.concatenate([actor[0][1], critic[0][1]]))
        self.actor_rest, self.critic_rest = actor[1:], critic[1:]

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(action mean [N, act_dim], value [N]) for normalised float32 observations [N, obs_dim]."""
        h = obs @ self.first[0]
        h += self.first[1]
        self.activation(h)
        out = []
        for x, layers in ((h[:, :self.width], self.actor_rest), (h[:, self.width:], self.critic_rest)):
            for i, (w, b) in enumerate(layers):
                x = x @ w
                x += b
                if i < len(layers) - 1:
                    self.activation(x)
            out.append(x)
        return out[0], out[1][:, 0]


class Actor:
    """The state one actor process keeps across rounds: its envs, current observations, episode counters.

    `sample(k)` is DESIGN.md's Actor.sample: it writes rollout[actor_id] in the shared buffers and returns
    the round's ActorReport. It runs in the actor process; tests also drive it in-process.
    """

    def __init__(self, cfg: Config, rank: int, actor_id: int, buffers: SharedBuffers,
                 noise_state: Optional[np.ndarray] = None) -> None:
        spec = buffers.spec
        self.cfg, self.rank, self.actor_id, self.buffers = cfg, rank, actor_id, buffers
        T, E, D = cfg.rollout_length, cfg.envs_per_actor, spec.obs_dim
        if (spec.rollout_length, spec.envs_per_actor) != (T, E):
            raise ValueError(f"buffer holds [T={spec.rollout_length}, E={spec.envs_per_actor}], config asks for [T={T}, E={E}]")
        self.envs = []
        for _ in range(E):
            self.envs.append(make_env(cfg.env_id))
        space = self.envs[0].action_space
        obs_shape = self.envs[0].observation_space.shape
        if obs_shape != (D,) or space.shape != (spec.act_dim,):
            raise ValueError(f"{cfg.env_id}: observation shape {obs_shape}, action shape {space.shape}; "
                             f"the pool was built for ({D},) and ({spec.act_dim},)")
        self.action_low = np.asarray(space.low, dtype=np.float32)
        self.action_high = np.asarray(space.high, dtype=np.float32)
        self.model = ActorCritic(D, spec.act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init)
        self.model.requires_grad_(False)
        self.kernel = PolicyKernel(self.model, cfg.activation)
        self.generator = torch.Generator().manual_seed(noise_seed(cfg.seed, rank, actor_id))
        if noise_state is not None:  # resumed from a checkpoint: continue the noise where it stopped
            self.generator.set_state(torch.from_numpy(np.array(noise_state, dtype=np.uint8)))
        self.discounted = DiscountedReturn(E, cfg.gamma) if cfg.normalize_reward else None
        # persistent across rounds: raw[0] holds the observation each env is in when a round starts
        self.raw = np.zeros((T + 1, E, D), dtype=np.float64)
        self.started = False
        self.episode_return = [0.0] * E
        self.episode_length = [0] * E
        # scratch of one round
        self.rewards = np.zeros((T, E), dtype=np.float64)
        self.terminated = np.zeros((T, E), dtype=bool)
        self.truncated = np.zeros((T, E), dtype=bool)
        self.out = {name: buffers.arrays[name][actor_id] for name in ROLLOUT_FIELDS}  # this actor's slice

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):
                env.close()
        self.out = {}

    def _first_reset(self) -> None:
        for e, env in enumerate(self.envs):
            try:
                obs, _ = env.reset(seed=env_seed(self.cfg.seed, self.rank, self.actor_id, e))
            except Exception as exc:
                raise EnvError(f"env {e} failed in its first reset: {type(exc).__name__}: {exc}", e, None) from exc
            self.raw[0, e] = obs
            if not np.isfinite(self.raw[0, e]).all():
                raise EnvError(f"env {e} returned a non-finite observation from its first reset", e, None)
        self.started = True

    def _non_finite(self, t: int, round_k: int) -> EnvError:
        """The error for a step whose observations or rewards hold a non-finite value, naming the env."""
        for e in range(len(self.envs)):
            if not np.isfinite(self.rewards[t, e]):
                return EnvError(f"env {e} returned a non-finite reward {self.rewards[t, e]} at step {t} of round {round_k}", e, t)
            bad = np.flatnonzero(~np.isfinite(self.raw[t + 1, e]))
            if bad.size:
                return EnvError(f"env {e} returned a non-finite observation at step {t} of round {round_k} "
                                f"(entries {bad.tolist()})", e, t)
        raise AssertionError("_non_finite called on finite data")

    def sample(self, round_k: int) -> ActorReport:
        """One round: T steps of every env with the published weights and frozen statistics → rollout[a]."""
        cfg, envs, raw, out = self.cfg, self.envs, self.raw, self.out
        T, E = cfg.rollout_length, len(envs)
        read_flat_parameters(self.model, self.buffers.weights)
        self.kernel.load(self.model)
        obs_rms, ret_rms = self.buffers.read_stats()
        if not cfg.normalize_obs:
            obs_rms = None
        if not cfg.normalize_reward:
            ret_rms = None
        if not self.started:
            self._first_reset()

        # The round's Gaussian noise in one draw; the policy's std is state-independent, so the log-prob
        # of action = mean + noise * std is sum(-noise^2 / 2 - log_std - log sqrt(2 pi)), known up front.
        log_std = self.model.actor_logstd.numpy().astype(np.float32)
        std = np.exp(log_std)
        noise = torch.randn((T, E, log_std.size), generator=self.generator).numpy()
        out["logp"][:] = (-0.5 * noise * noise - log_std - np.float32(LOG_SQRT_2PI)).sum(-1)

        kernel, clip, low, high = self.kernel, cfg.obs_clip, self.action_low, self.action_high
        obs_out, act_out, val_out = out["obs"], out["actions"], out["values"]
        rewards, terminated, truncated = self.rewards, self.terminated, self.truncated
        terminated.fill(False)
        truncated.fill(False)
        ep_ret, ep_len = self.episode_return, self.episode_length
        episode_returns: list[float] = []
        episode_lengths: list[int] = []
        finals: list[tuple[int, int, np.ndarray]] = []  # (step, env, raw final observation) of ended episodes

        for t in range(T):
            obs_t = obs_out[t]
            obs_t[:] = normalize_obs(raw[t], obs_rms, clip)
            mean, val_out[t] = kernel(obs_t)
            action = act_out[t]
            np.multiply(noise[t], std, out=action)
            action += mean
            _, env_action = prepare_action(action, low, high)
            next_raw, rew_t = raw[t + 1], rewards[t]
            e = -1
            try:
                for e, env in enumerate(envs):
                    obs, reward, term, trunc, _ = env.step(env_action[e])
                    rew_t[e] = reward
                    ep_ret[e] += reward
                    ep_len[e] += 1
                    if term or trunc:
                        terminated[t, e] = term
                        truncated[t, e] = trunc
                        final = np.array(obs, dtype=np.float64)  # a copy: the env may reuse its array
                        if not np.isfinite(final).all():
                            raise EnvError(f"env {e} returned a non-finite final observation at step {t} of round {round_k}", e, t)
                        finals.append((t, e, final))
                        episode_returns.append(float(ep_ret[e]))
                        episode_lengths.append(ep_len[e])
                        ep_ret[e], ep_len[e] = 0.0, 0
                        obs, _ = env.reset()
                    next_raw[e] = obs  # a copy into the actor's own array
            except EnvError:
                raise
            except Exception as exc:
                raise EnvError(f"env {e} failed at step {t} of round {round_k}: {type(exc).__name__}: {exc}", e, t) from exc
            if not (np.isfinite(next_raw).all() and np.isfinite(rew_t).all()):
                raise self._non_finite(t, round_k)

        # next_values[t] = V(observation after step t, before any reset)
        next_values = out["next_values"]
        next_values[:-1] = val_out[1:]
        next_values[-1] = kernel(normalize_obs(raw[T], obs_rms, clip))[1]
        if finals:
            final_values = kernel(normalize_obs(np.stack([f[2] for f in finals]), obs_rms, clip))[1]
            next_values[[f[0] for f in finals], [f[1] for f in finals]] = final_values

        out["rewards"][:] = rewards  # raw rewards (float32); GAE sees them scaled by the frozen return std
        return_moments = None
        if self.discounted is not None:
            ended = terminated | truncated
            discounted = np.empty((T, E), dtype=np.float64)
            for t in range(T):
                discounted[t] = self.discounted.update(rewards[t], ended[t])
            return_moments = compute_batch_moments(discounted.reshape(-1))
        advantages, returns = compute_gae(
            torch.from_numpy(scale_reward(out["rewards"], ret_rms, cfg.reward_clip)),
            torch.from_numpy(val_out),
            torch.from_numpy(next_values),
            torch.from_numpy(terminated),
            torch.from_numpy(truncated),
            cfg.gamma,
            cfg.gae_lambda,
        )
        out["advantages"][:] = advantages.numpy()
        out["returns"][:] = returns.numpy()
        out["terminated"][:] = terminated
        out["truncated"][:] = truncated

        obs_moments = compute_batch_moments(raw[:T].reshape(T * E, -1))
        raw[0] = raw[T]
        return ActorReport(
            actor_id=self.actor_id,
            episodes=len(episode_returns),
            episode_return_sum=float(sum(episode_returns)),
            episode_returns=episode_returns,
            episode_len_sum=int(sum(episode_lengths)),
            episode_lengths=episode_lengths,
            obs_moments=obs_moments,
            return_moments=return_moments,
            steps=T * E,
            noise_state=self.generator.get_state().numpy(),
        )


def _send(conn: mp.connection.Connection, msg: Any) -> bool:
    try:
        conn.send(msg)
        return True
    except (OSError, EOFError):  # the learner is gone
        return False


def _error_message(exc: BaseException, round_k: Optional[int]) -> tuple:
    return ("error", {
        "summary": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
        "env_index": getattr(exc, "env_index", None),
        "step": getattr(exc, "step", None),
        "round": round_k,
    })


def _actor_main(conn: mp.connection.Connection, args: _ActorArgs) -> None:
    """Entry point of an actor process: build, report ready, then serve rounds until "close" or EOF."""
    for sig in IGNORED_SIGNALS:  # Ctrl-C and SIGTERM are the learner's; it closes the pool
        signal.signal(sig, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the learner asks for a stack dump of a stuck actor
    torch.set_num_threads(1)
    buffers: Optional[SharedBuffers] = None
    actor: Optional[Actor] = None
    try:
        try:
            buffers = SharedBuffers.attach(args.buffer_spec, args.shm_name)
            actor = Actor(args.cfg, args.rank, args.actor_id, buffers, args.noise_state)
        except BaseException as exc:
            _send(conn, _error_message(exc, None))
            return
        if not _send(conn, ("ready",)):
            return
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the learner died: exit quietly
                return
            if msg[0] != "round":
                return
            try:
                report = actor.sample(msg[1])
            except BaseException as exc:
                _send(conn, _error_message(exc, msg[1]))
                return
            if not _send(conn, ("done", msg[1], report)):
                return
    finally:
        if actor is not None:
            actor.close()
        if buffers is not None:
            buffers.close()
        conn.close()


# ============================================================================================== learner side
def _context(method: str) -> mp.context.BaseContext:
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""Set for the actor processes at their start: an actor is one core's worth of work, and a math library's
worker threads would compete with the other actors (torch.set_num_threads cannot reach numpy's OpenBLAS)."""


@contextlib.contextmanager
def _child_start_state() -> Iterator[None]:
    """Start children (and the forkserver) with SIGINT and SIGTERM ignored and single-threaded math libraries.

    Ignored signals stay ignored across exec, so an actor ignores them from its first instruction, not only
    once _actor_main runs; so does the forkserver, whose death would look like the death of every actor.
    The learner's own handlers and environment are restored on exit.
    """
    saved_env = {k: os.environ.get(k) for k in SINGLE_THREAD_ENV}
    os.environ.update(SINGLE_THREAD_ENV)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in IGNORED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _describe_exit(exitcode: Optional[int]) -> str:
    if exitcode is None:
        return "exit code unknown"
    if exitcode < 0:
        try:
            return f"exit code {exitcode} (killed by {signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    return f"exit code {exitcode}"


class ActorPool:
    """`num_actors` actor processes of one learner (rank) and the shared memory they write into.

    Use as a context manager (or call close()); `collect` runs one round and returns the actors' reports,
    sorted by actor id; the rollout is then in `buffers` ([A, T, E, ...] tensors, see ppo_ddp/buffers.py).
    """

    def __init__(self, cfg: Config, rank: int, num_actors: int, obs_dim: int, act_dim: int, pin_memory: bool,
                 noise_states: Optional[list[Any]] = None, first_round: int = 1) -> None:
        """noise_states: each actor's action-noise generator state (uint8 tensor or array) to continue from, or None.
        first_round: the number of the first `collect` in the trainer's count (messages name rounds by it)."""
        self.cfg, self.rank, self.num_actors = cfg, rank, num_actors
        if noise_states is not None and len(noise_states) != num_actors:
            raise ValueError(f"{len(noise_states)} noise states for {num_actors} actors")
        self.round_seconds = 0.0
        self.buffers: Optional[SharedBuffers] = None
        self._procs: list[mp.process.BaseProcess] = []
        self._conns: list[mp.connection.Connection] = []
        self._ready = [False] * num_actors
        self._round = first_round - 1
        self._slowest_round = 0.0
        self._closed = False
        self._started_at = time.monotonic()
        try:
            with torch.random.fork_rng(devices=[]):  # the parameter count must not consume the learner's RNG
                probe = ActorCritic(obs_dim, act_dim, cfg.hidden_sizes, cfg.activation, cfg.log_std_init)
            spec = BufferSpec(num_actors, cfg.rollout_length, cfg.envs_per_actor, obs_dim, act_dim, num_parameters(probe))
            self.buffers = SharedBuffers.create(spec)
            if pin_memory:
                self.buffers.pin()
            ctx = _context(cfg.mp_start_method)
            with _child_start_state():
                for a in range(num_actors):
                    parent_conn, child_conn = ctx.Pipe(duplex=True)
                    self._conns.append(parent_conn)
                    proc = ctx.Process(
                        target=_actor_main,
                        args=(child_conn, _ActorArgs(cfg, rank, a, spec, self.buffers.name,
                                                     np.asarray(noise_states[a], dtype=np.uint8) if noise_states is not None else None)),
                        name=f"ppo-actor-r{rank}-a{a}",
                        daemon=True,
                    )
                    proc.start()
                    self._procs.append(proc)
                    child_conn.close()
        except BaseException:
            self._shutdown(graceful=False)
            raise

    # ---- context manager ------------------------------------------------------------------------------
    def __enter__(self) -> "ActorPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self._shutdown(graceful=False)

    @property
    def pids(self) -> list[Optional[int]]:
        return [p.pid for p in self._procs]

    # ---- one round ------------------------------------------------------------------------------------
    def collect(self, model: torch.nn.Module, obs_rms: Optional[Moments], ret_rms: Optional[Moments]) -> list[ActorReport]:
        """Publish weights and frozen statistics, run one round on every actor, return their reports.

        The model may live on any device; its parameters are copied to the shared float32 vector. Any
        failure (an actor's exception, death, timeout; also Ctrl-C here) closes the pool and raises.
        """
        if self._closed:
            raise RuntimeError("ActorPool.collect on a closed pool")
        start = time.monotonic()
        try:
            buffers = self.buffers
            n = num_parameters(model)
            if n != buffers.spec.num_params:
                raise ValueError(f"model has {n} parameters, the pool was built for {buffers.spec.num_params}")
            if buffers.pinned:
                torch.cuda.synchronize()  # no asynchronous copy out of the rollout may still be reading it
            write_flat_parameters(model, buffers.weights)
            buffers.write_stats(obs_rms, ret_rms)
            buffers.fill_sentinel()
            if not all(self._ready):
                bound = max(self.cfg.actor_timeout, MIN_STARTUP_TIMEOUT)
                self._await("ready", self._started_at + bound, f"start within {bound:.0f} s")
            self._round += 1
            for a in range(self.num_actors):
                self._send(a, ("round", self._round))
            round_start = time.monotonic()
            bound = self.cfg.actor_timeout + ROUND_TIME_FACTOR * self._slowest_round
            reports = self._await("done", round_start + bound,
                                  f"finish round {self._round} within {bound:.1f} s (actor_timeout {self.cfg.actor_timeout:g} s "
                                  f"+ {ROUND_TIME_FACTOR:g} x slowest round so far {self._slowest_round:.2f} s)")
            self._slowest_round = max(self._slowest_round, time.monotonic() - round_start)
        except BaseException:
            self._shutdown(graceful=False)
            raise
        self.round_seconds = time.monotonic() - start
        return [reports[a] for a in range(self.num_actors)]

    def _send(self, a: int, msg: Any) -> None:
        try:
            self._conns[a].send(msg)
        except OSError:
            raise self._gone_error(a) from None

    def _await(self, kind: str, deadline: float, what: str) -> dict[int, Any]:
        """Wait for a `kind` message from every actor; raise ActorError on an error, a death or the deadline."""
        pending = set(range(self.num_actors)) if kind == "done" else {a for a in range(self.num_actors) if not self._ready[a]}
        results: dict[int, Any] = {}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._stuck_error(sorted(pending), what)
            conn_of = {self._conns[a]: a for a in pending}
            sentinel_of = {self._procs[a].sentinel: a for a in pending}
            ready = mp.connection.wait(list(conn_of) + list(sentinel_of), timeout=remaining)
            # messages first: an actor that raised sends its traceback and then exits
            for obj in ready:
                if obj in conn_of:
                    a = conn_of[obj]
                    results[a] = self._receive(a, kind)
                    pending.discard(a)
            for obj in ready:
                if obj in sentinel_of and sentinel_of[obj] in pending:
                    raise self._gone_error(sentinel_of[obj])
        return results

    def _receive(self, a: int, kind: str) -> Any:
        try:
            msg = self._conns[a].recv()
        except (EOFError, OSError):
            raise self._gone_error(a) from None
        if msg[0] == "error":
            raise self._actor_error(a, msg[1])
        if msg[0] != kind or (kind == "done" and msg[1] != self._round):
            raise ActorError(f"rank {self.rank} actor {a}: unexpected message {msg[0]!r} while waiting for {kind!r}",
                             rank=self.rank, actor_id=a)
        if kind == "ready":
            self._ready[a] = True
            return None
        return msg[2]

    def _actor_error(self, a: int, info: dict[str, Any]) -> ActorError:
        where = []
        if info.get("env_index") is not None:
            where.append(f"env {info['env_index']}")
        if info.get("step") is not None:
            where.append(f"step {info['step']}")
        where.append(f"round {info['round']}" if info.get("round") is not None else "during start-up")
        return ActorError(
            f"rank {self.rank} actor {a} failed ({', '.join(where)}): {info['summary']}",
            rank=self.rank, actor_id=a, traceback_text=info["traceback"],
            env_index=info.get("env_index"), step=info.get("step"),
        )

    def _gone_error(self, a: int) -> ActorError:
        """The actor's process ended or its pipe broke: its last message if it left one, else how it died."""
        conn, proc = self._conns[a], self._procs[a]
        with contextlib.suppress(Exception):
            if conn.poll(0):
                msg = conn.recv()
                if msg[0] == "error":
                    return self._actor_error(a, msg[1])
        proc.join(timeout=1.0)
        return ActorError(
            f"rank {self.rank} actor {a} (pid {proc.pid}) died unexpectedly, {_describe_exit(proc.exitcode)}",
            rank=self.rank, actor_id=a, exitcode=proc.exitcode,
        )

    def _stuck_error(self, actors: list[int], what: str) -> ActorError:
        for a in actors:  # a Python stack of where each stuck actor hangs, on its stderr (faulthandler)
            with contextlib.suppress(Exception):
                if self._procs[a].pid is not None:
                    os.kill(self._procs[a].pid, signal.SIGUSR1)
        time.sleep(0.2)
        names = ", ".join(str(a) for a in actors)
        return ActorError(
            f"rank {self.rank} actor{'s' if len(actors) > 1 else ''} {names} did not {what}; "
            f"stuck or far slower than expected (their Python stacks were dumped to stderr)",
            rank=self.rank, actor_id=actors[0],
        )

    # ---- shutdown -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the actors (politely, then kill), join them and unlink the shared memory. Idempotent."""
        self._shutdown(graceful=True)

    def _shutdown(self, graceful: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if graceful:
                for conn in self._conns:
                    with contextlib.suppress(Exception):
                        conn.send(("close",))
                deadline = time.monotonic() + CLOSE_TIMEOUT
                for proc in self._procs:
                    proc.join(timeout=max(0.0, deadline - time.monotonic()))
            # SIGKILL, not SIGTERM: actors ignore SIGTERM, and hold nothing that needs a clean exit (the learner
            # owns the shared memory).
            for proc in self._procs:
                if proc.is_alive():
                    proc.kill()
            for proc in self._procs:
                proc.join(timeout=5.0)
        finally:
            for conn in self._conns:
                with contextlib.suppress(Exception):
                    conn.close()
            if self.buffers is not None:
                self.buffers.close()
