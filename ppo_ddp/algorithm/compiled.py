"""The PPO step compiled by torch.compile (inductor), or left eager with the reason why.

The functions compiled are ppo_ddp/algorithm/ppo_step.py's, unchanged: compilation is a way to run the one step, not a
second implementation of it. Each is traced as one graph (`fullgraph=True`: a graph break would fall back to
per-op dispatch silently) with static shapes, once per run, before the first round: a compiler error then
leaves the run eager with a warning instead of ending it mid-training.

Start-up: the first compile of a step (a config's network and mini-batch shape) took 22-25 s on the 2-core machine
(inductor writes and builds C++ on a CPU, Triton kernels on a GPU). Inductor's on-disk caches (the FX graph and
AOTAutograd caches, on by default, in TORCHINDUCTOR_CACHE_DIR or /tmp/torchinductor_<user>) make a second run of
the same config skip that build; dynamo's tracing is paid again by every process. The caches write each entry
to a temporary file and rename it, so ranks and runs that compile at once on one machine share them safely.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Optional

import torch
import torch._inductor.config


def compile_functions(
    functions: Sequence[Callable], warm_up: Callable[..., None], state: Sequence[torch.Tensor]
) -> tuple[list[Callable], Optional[str]]:
    """The functions compiled, each run once by `warm_up(*compiled)`, and None; or the functions themselves and
    the reason they could not be compiled. `state`: the tensors the warm-up changes, put back as they were."""
    problem = _unavailable()
    if problem is not None:
        return list(functions), problem
    saved = [t.clone() for t in state]
    # The step differentiates a leaf it makes (torch.autograd.grad): dynamo traces that into the graph only
    # with this switch, which is off by default; without it, fullgraph refuses.
    torch._dynamo.config.trace_autograd_ops = True
    # One small graph: the pool of compile workers inductor would start first costs more than it saves
    # (measured: 8.1 s against 5.9 s to load a cached step on the 2-core machine).
    torch._inductor.config.compile_threads = 1
    # The generated wrapper that calls the kernels in C++ rather than Python: the step is hundreds of small kernels
    # (a GRU's unroll, more), and Python's per-call cost was a fifth of the update (docs/benchmarks/throughput.md).
    torch._inductor.config.cpp_wrapper = True
    # A failing compile logs its tracebacks (pages of them) before it raises: the run says it in one line instead,
    # unless the user asked torch for its logs.
    quiet = not os.environ.get("TORCH_LOGS")
    if quiet:
        logging.disable(logging.CRITICAL)
    # Dynamo keeps the graphs of every step it compiled in this process, per function: a process that trains
    # several configs in turn (the Python API's train() in a loop, a test session) would reach its recompile limit
    # (8) at the ninth and fail. A process steps one learner at a time, so each compile starts from a clean cache
    # (inductor's on-disk caches stay: a config compiled before still loads fast).
    torch._dynamo.reset()
    try:
        parts = [torch.compile(f, fullgraph=True, dynamic=False) for f in functions]
        warm_up(*parts)  # the compile happens here, at the first call
        return parts, None
    except Exception as e:  # any compiler failure: the eager functions compute the same step
        torch._dynamo.reset()
        return list(functions), _describe(e)
    finally:
        if quiet:
            logging.disable(logging.NOTSET)
        with torch.no_grad():
            for t, s in zip(state, saved):
                t.copy_(s)


class Background:
    """`compile(minibatch)` on a thread of its own, started before the actors: while they start (imports, envs),
    the learner's main thread mostly waits (measured: 0.15 s of CPU in 3.7 s on the 2-core machine), and a cached
    step's compile (~4 s: dynamo's and inductor's imports, the trace) fits in that wait.

    Nothing else touches the learner until `finish()`: the compile's trial step changes the parameters and Adam's
    state and puts them back. A compile that raises is re-raised there; one that cannot work says why."""

    def __init__(self, compile: Callable[[int], Optional[str]], minibatch: int, device: torch.device) -> None:
        self.minibatch, self._device = minibatch, device
        self._outcome: tuple[Optional[str], Optional[BaseException]] = (None, None)
        self._started, self._seconds = time.time(), 0.0
        # daemon: a run that fails while starting exits without waiting for a compile it will not use
        self._thread = threading.Thread(target=self._run, args=(compile,), name="compile-ppo-step", daemon=True)
        self._thread.start()

    def _run(self, compile: Callable[[int], Optional[str]]) -> None:
        # The current CUDA device is per thread (the intra-op thread count is not: inductor sees the learner's,
        # builds its kernels for that many and keys its cache on it, tests/test_compiled.py checks).
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        try:
            self._outcome = (compile(self.minibatch), None)
        except BaseException as e:  # re-raised in the main thread by finish()
            self._outcome = (None, e)
        self._seconds = time.time() - self._started

    def finish(self, gather: Callable[[Optional[str]], Optional[list]], say: Optional[Callable[[str], None]]) -> None:
        """Wait for the compile (the first round needs it). `gather` brings every rank's outcome to rank 0, whose
        `say` reports it (None on the other ranks)."""
        if say is not None and self._thread.is_alive():
            say(starting(self.minibatch))
        self._thread.join()
        problem, error = self._outcome
        if error is not None:
            raise error
        problems = gather(problem)
        if say is not None and problems is not None:
            report(problems, self._seconds, say)


def _unavailable() -> Optional[str]:
    """Why torch.compile cannot run in this process at all, or None."""
    if torch._dynamo.config.disable:
        return "TORCH_COMPILE_DISABLE is set"
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile does not support this Python or platform"
    return None


def _describe(error: Exception) -> str:
    """One line: the error's type and the first line of its message (inductor's can run to pages)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = lines[0] if lines else ""
    return f"{type(error).__name__}: {message[:200]}" if message else type(error).__name__


def starting(minibatch: int) -> str:
    return f"compiling the PPO step for mini-batches of {minibatch} (~20 s for a new shape, a few once cached)"


def report(problems: Sequence[Optional[str]], seconds: float, say: Callable[[str], None]) -> None:
    """Rank 0: how every rank's compile went; a warning on stderr for each distinct reason a rank stayed eager."""
    for problem in dict.fromkeys(p for p in problems if p is not None):
        ranks = [str(rank) for rank, p in enumerate(problems) if p == problem]
        where = f" on rank(s) {', '.join(ranks)}" if len(problems) > 1 else ""
        print(f"train.py: warning: the PPO step did not compile{where} ({problem}); training eagerly, with a "
              f"slower update (--no-compile skips the attempt)", file=sys.stderr, flush=True)  # fmt: skip
    if not any(problems):
        say(f"compiled in {seconds:.1f} s")
