"""What the agent runs in the background, declared as data: each service says its periodic
work as :class:`Task` records (what, how often, what wakes it early, what it needs), and the
node's one runner (agent/node.py) starts those whose needs are met, each under one guard
(`agent.loops.every`). A feature's loop is then a row, not a block of the composition root."""

from __future__ import annotations

import enum
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

__all__ = ["Daemon", "Need", "Subscribe", "Task"]

#: Registers a callback the owner calls (on any thread) when the task's input changed.
Subscribe = Callable[[Callable[[], None]], None]


class Need(enum.Flag):
    """What a task needs to run; the runner starts a task only when it has all of them."""

    NONE = 0
    #: The agent itself, not embedded in another program (the CLI): cluster duties, the log.
    LISTENER = enum.auto()
    #: The Kubernetes edge (in a pod, not embedded): the task writes the Node or reads its watch.
    KUBE = enum.auto()
    #: A state dir that took writes at the start (it stays as it was found: agent/statedir.py).
    WRITABLE = enum.auto()
    #: Each pass runs only while the GPUs are attached; a pass while detached is skipped.
    DRIVER = enum.auto()


@dataclass(frozen=True, slots=True)
class Task:
    """One background loop: blocking ``work`` on a thread every ``period_s``, and at once when
    an owner it subscribed to through ``wakes`` tells a change."""

    name: str
    work: Callable[[], object]
    period_s: float
    wakes: tuple[Subscribe, ...] = ()
    needs: Need = Need.NONE
    #: The first pass comes a period after the start (the start already did the work once).
    wait_first: bool = False


@dataclass(frozen=True, slots=True)
class Daemon:
    """One background coroutine that keeps its own schedule (a probe with a back-off, a
    refresher of several periods); the runner starts it under the same guard as a task."""

    name: str
    run: Callable[[], Coroutine[Any, Any, None]]
    needs: Need = Need.NONE
