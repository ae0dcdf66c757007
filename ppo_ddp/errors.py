"""The exceptions that several layers raise and others catch, at the bottom of the package so that catching one
imports nothing else: bad configuration, a checkpoint that cannot be used, an actor's failure, a non-finite update."""

from __future__ import annotations

from typing import Optional


class ConfigError(ValueError):
    """A config value a user must fix; the message names the field, the value and what is allowed."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable or not ours; the message says which and why."""


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
        return type(self), (
            self.message,
            self.rank,
            self.actor_id,
            self.traceback_text,
            self.exitcode,
            self.env_index,
            self.step,
        )


class NonFiniteError(FloatingPointError):
    """The update produced NaN/inf parameters or losses."""
