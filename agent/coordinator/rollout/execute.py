"""Run a rollout: the scheduler decides, per-node actions act, the record remembers.

The loop starts what the scheduler allows, waits for the first node to finish or the first
deadline, and writes every change to the record before going on. Interrupted (Ctrl-C, SIGTERM),
it leaves running nodes as running in the record, to be re-attached by a resume.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.coordinator.rollout.record import RolloutRecord
from agent.coordinator.rollout.schedule import NodeState, Scheduler
from agent.errors import AgentError, Conflict

__all__ = ["NodeAction", "NodeResult", "Notes", "Report", "run_rollout"]


@dataclass(frozen=True, slots=True)
class NodeResult:
    state: NodeState
    detail: str = ""
    #: why the whole rollout must halt now (nothing new starts, running nodes finish);
    #: empty: only this node's state counts (max-failures decides)
    stop: str = ""


class Notes(Protocol):
    """What an action tells the runner while it works, and what the runner tells it."""

    #: set before the runner cancels an overdue node: the action then cancels the agent's
    #: operation too. An interrupted rollout (Ctrl-C) leaves the operation running instead,
    #: for a resume to re-attach to.
    timed_out: bool

    def operation(self, name: str) -> None:
        """The agent's operation doing the work (kept in the record, for re-attaching)."""

    def progress(self, text: str) -> None:
        """How far it got, in words."""


class NodeAction(Protocol):
    async def __call__(self, node: str, notes: Notes) -> NodeResult:
        """Change one node and follow it to the end; AgentError means the node failed.

        Cancelled (the node ran past its timeout), it asks the agent to cancel its operation.
        """
        ...


#: (node, state, detail): called at every node start, progress and end.
Report = Callable[[str, NodeState, str], None]


class _Notes:
    def __init__(self, record: RolloutRecord, node: str, report: Report) -> None:
        self.timed_out = False
        self._record = record
        self._node = node
        self._report = report

    def operation(self, name: str) -> None:
        self._record.nodes[self._node].operation = name
        self._record.save()

    def progress(self, text: str) -> None:
        self._record.nodes[self._node].detail = text
        self._report(self._node, NodeState.RUNNING, text)


async def run_rollout(
    record: RolloutRecord,
    scheduler: Scheduler,
    action: NodeAction,
    *,
    report: Report = lambda node, state, detail: None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> None:
    tasks: dict[asyncio.Task[NodeResult], tuple[str, _Notes]] = {}

    def finish(node: str, result: NodeResult) -> None:
        scheduler.finish(node, result.state)
        if result.stop:
            scheduler.stop(result.stop)
        rec = record.nodes[node]
        rec.state, rec.detail, rec.finished = result.state.value, result.detail, wall()
        record.halted = scheduler.halt_reason()
        record.save()
        report(node, result.state, result.detail)

    try:
        while True:
            for node in scheduler.start(clock()):
                rec = record.nodes[node]
                rec.state, rec.started, rec.detail = NodeState.RUNNING.value, wall(), ""
                record.save()
                report(node, NodeState.RUNNING, "started")
                notes = _Notes(record, node, report)
                tasks[asyncio.create_task(action(node, notes))] = (node, notes)
            if scheduler.done:
                break
            stuck = scheduler.stuck_reason()
            if stuck is not None:
                raise Conflict(stuck)
            deadline = scheduler.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - clock())
            finished, _ = await asyncio.wait(
                tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for task in finished:
                finish(tasks.pop(task)[0], _result(task))
            for node in scheduler.overdue(clock()):
                task = next(t for t, (n, _) in tasks.items() if n == node)
                tasks.pop(task)[1].timed_out = True
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                limit = scheduler.limits.node_timeout_s
                finish(node, NodeResult(NodeState.FAILED, f"timed out after {limit:g} s"))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        record.save()


def _result(task: asyncio.Task[NodeResult]) -> NodeResult:
    try:
        return task.result()
    except AgentError as exc:
        # A refusal's message counts its problems; each is in its violations, said here.
        found = "; ".join(map(str, getattr(exc, "violations", ())))
        return NodeResult(NodeState.FAILED, f"{exc}: {found}" if found else str(exc))
