"""Rollout scheduling: which node starts when. Pure: no gRPC, no clock of its own.

A node being changed is unavailable, so at most ``max_unavailable`` nodes run at once (nodes
already down when the rollout starts count against that too). Once ``max_failures`` nodes have
failed the rollout halts: nothing new starts, running nodes finish. A node running longer than
the timeout is reported overdue, for the runner to cancel. A rollout can also be stopped with
a reason (a node turned unhealthy during it): it halts the same way.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.errors import FieldViolation, InvalidSpec

__all__ = ["NODE_TIMEOUT_MAX_S", "Limits", "NodeState", "Scheduler", "parse_max_unavailable"]

#: the longest a node may take (--node-timeout, the desired file's rollout.node_timeout_s)
NODE_TIMEOUT_MAX_S = 7 * 24 * 3600


class NodeState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    #: already as asked: nothing was done.
    UNCHANGED = "unchanged"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (NodeState.SUCCEEDED, NodeState.UNCHANGED, NodeState.FAILED)


@dataclass(frozen=True, slots=True)
class Limits:
    max_unavailable: int
    #: halt once this many nodes failed; 0 never halts.
    max_failures: int = 1
    node_timeout_s: float = 900.0


def parse_max_unavailable(text: str, total: int) -> int:
    """``3`` or ``10%`` of ``total`` nodes, rounded down but at least 1 (to make progress)."""
    raw = text.strip()
    try:
        if raw.endswith("%"):
            percent = float(raw[:-1])
            if not 0 < percent <= 100:
                raise ValueError(raw)
            return max(1, math.floor(total * percent / 100))
        count = int(raw)
        if count < 1:
            raise ValueError(raw)
        return count
    except ValueError:
        raise InvalidSpec(
            f"max-unavailable {text!r} is not a count >= 1 or a percentage in (0, 100]",
            [FieldViolation("max-unavailable", "a count such as 2, or a percentage such as 10%")],
        ) from None


class Scheduler:
    """The rollout's state machine over node names, in the order given."""

    def __init__(
        self,
        nodes: Sequence[str],
        limits: Limits,
        *,
        states: Mapping[str, NodeState] | None = None,
        already_unavailable: int = 0,
    ) -> None:
        self.limits = limits
        self.states: dict[str, NodeState] = {n: NodeState.PENDING for n in nodes}
        if states:
            self.states.update({n: s for n, s in states.items() if n in self.states})
        self._order = list(nodes)
        self._already_unavailable = already_unavailable
        self._started: dict[str, float] = {}
        self._stopped: str | None = None

    def _in(self, state: NodeState) -> list[str]:
        return [n for n in self._order if self.states[n] is state]

    @property
    def running(self) -> list[str]:
        return self._in(NodeState.RUNNING)

    @property
    def pending(self) -> list[str]:
        return self._in(NodeState.PENDING)

    @property
    def failed(self) -> list[str]:
        return self._in(NodeState.FAILED)

    @property
    def halted(self) -> bool:
        return self._stopped is not None or 0 < self.limits.max_failures <= len(self.failed)

    def stop(self, reason: str) -> None:
        """Halt as at max-failures (nothing new starts, running nodes finish), for ``reason``;
        the first reason given is kept."""
        if self._stopped is None:
            self._stopped = reason

    @property
    def done(self) -> bool:
        return not self.running and (self.halted or not self.pending)

    @property
    def capacity(self) -> int:
        return self.limits.max_unavailable - self._already_unavailable

    def start(self, now: float) -> list[str]:
        """Nodes to start now, marked running: as many as the budget leaves, in order."""
        if self.halted:
            return []
        free = self.capacity - len(self.running)
        chosen = self.pending[: max(0, free)]
        for node in chosen:
            self.states[node] = NodeState.RUNNING
            self._started[node] = now
        return chosen

    def finish(self, node: str, state: NodeState) -> None:
        if self.states.get(node) is not NodeState.RUNNING:
            raise ValueError(f"{node} is not running")
        if not state.finished:
            raise ValueError(f"{state} is not an end state")
        self.states[node] = state
        self._started.pop(node, None)

    def overdue(self, now: float) -> list[str]:
        limit = self.limits.node_timeout_s
        return [n for n, t in self._started.items() if now - t >= limit]

    def next_deadline(self) -> float | None:
        """When the earliest running node becomes overdue."""
        if not self._started:
            return None
        return min(self._started.values()) + self.limits.node_timeout_s

    def stuck_reason(self) -> str | None:
        """Why nothing can ever start, when the budget is spent before the rollout begins."""
        if self.pending and not self.halted and self.capacity <= 0:
            return (
                f"{self._already_unavailable} selected node(s) are already unavailable and "
                f"max-unavailable is {self.limits.max_unavailable}: no node may start"
            )
        return None

    def halt_reason(self) -> str | None:
        if not self.halted:
            return None
        if self._stopped is not None:
            return f"halted: {self._stopped}"
        return (
            f"halted after {len(self.failed)} failed node(s) "
            f"(max-failures {self.limits.max_failures}): {', '.join(self.failed)}"
        )
