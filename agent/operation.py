"""An operation as the agent stores it and its API answers it: the record, its states, and the
error of a kind that runs one at a time. Apart from the store (agent/state/), which needs SQLite,
so that the wire layer and the clients read operations without loading it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.errors import Busy

__all__ = ["DONE_STATES", "INTERRUPTED", "OPERATION_STATES", "AlreadyRunning", "Operation"]

OPERATION_STATES = ("pending", "running", "succeeded", "failed", "cancelled")
DONE_STATES = frozenset({"succeeded", "failed", "cancelled"})
INTERRUPTED = "Interrupted"
"""``error["type"]`` of operations the agent stopped in the middle of (see
`Operations.mark_interrupted_operations`)."""


class AlreadyRunning(Busy):
    """An operation of a kind that runs one at a time is in the way; ``running`` is it."""

    def __init__(self, running: Operation) -> None:
        super().__init__(f"{running.kind} operation {running.id} is running")
        self.running = running


@dataclass(frozen=True, slots=True)
class Operation:
    """A long-running piece of work (google.longrunning style) as stored.

    ``error`` is ``{"type": ..., "message": ...}`` where type names an ``agent.errors`` class or
    is `INTERRUPTED`. Times are epoch seconds.
    """

    id: str
    kind: str
    state: str
    request_id: str | None
    request: dict[str, Any]
    metadata: dict[str, Any]
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    created_at: float
    updated_at: float
    cancel_requested: bool
    owner: str | None = None  # the identity that started it (agent/owner.py)
    owner_role: str | None = None  # the role it acted under

    @property
    def done(self) -> bool:
        return self.state in DONE_STATES
