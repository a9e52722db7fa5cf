"""Rollouts and GPU health: nodes with a failed GPU are left out, a node that turns unhealthy
stops the rollout.

Before a rollout starts, the selected nodes whose agent reports a failed GPU (or a failed MIG
instance) are skipped, named with the verdict; degraded nodes go ahead and are named. Each
node's change is gated: its agent is asked again just before and just after the change, and a
failed GPU found then ends the node failed; with ``on_unhealthy`` ``stop`` (the default) it
also halts the rollout as max-failures would (nothing new starts, running nodes finish).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.health import GpuMark
from agent.coordinator.fleet.inventory import NodeView, node_view
from agent.coordinator.rollout.execute import NodeAction, NodeResult, Notes
from agent.coordinator.rollout.schedule import NodeState

__all__ = [
    "HealthGate",
    "degraded_detail",
    "failed_detail",
    "unhealthy_nodes",
    "unread_detail",
    "unread_nodes",
]


def failed_detail(marks: Sequence[GpuMark]) -> str:
    """``GPU 2 failed: XID 79 (...) (action reset-gpu)``, each failed GPU, ``; ``-joined."""
    return "; ".join(m.describe() for m in marks)


def degraded_detail(view: NodeView) -> str:
    return "; ".join(m.describe() for m in view.degraded_gpus)


def unread_detail(view: NodeView) -> str:
    """Why a node's GPUs were not read (its driver not ready), in words; '' when they were."""
    return f"GPUs not read: {view.gpus_unread}" if view.gpus_unread else ""


def unhealthy_nodes(views: Sequence[NodeView]) -> dict[str, str]:
    """Answering nodes with a failed GPU or instance -> what failed, in words; and those whose
    GPUs were not read (driver not ready, e.g. mid-upgrade) -> why: no GPU change can be made
    there until the driver is back, as on a failed GPU. Which is which: `unread_nodes`."""
    return {
        v.name: failed_detail(v.failed_gpus) if v.failed_gpus else unread_detail(v)
        for v in views
        if v.failed_gpus or v.gpus_unread
    }


def unread_nodes(views: Sequence[NodeView]) -> frozenset[str]:
    """Of `unhealthy_nodes`, those held back only because their GPUs were not read (the driver
    not ready), not for a failed GPU: said apart, as a wait rather than a fault."""
    return frozenset(v.name for v in views if v.gpus_unread and not v.failed_gpus)


class HealthGate:
    """Wraps a rollout's per-node action: a node with a failed GPU just before or just after
    its change ends failed, and with ``on_unhealthy`` ``stop`` halts the rollout."""

    def __init__(
        self, inner: NodeAction, fleet: Fleet, targets: Mapping[str, Target], on_unhealthy: str
    ) -> None:
        self._inner = inner
        self._fleet = fleet
        self._targets = targets
        self._stop = on_unhealthy == "stop"

    async def __call__(self, node: str, notes: Notes) -> NodeResult:
        failed = await self._failed(node)
        if failed:
            return self._unhealthy(node, f"not changed: {failed}")
        result = await self._inner(node, notes)
        failed = await self._failed(node)
        if failed:
            done = f"{result.state.value}: {result.detail}" if result.detail else result.state.value
            return self._unhealthy(node, f"{done}; then {failed}")
        return result

    def _unhealthy(self, node: str, detail: str) -> NodeResult:
        stop = f"{node} turned unhealthy during the rollout ({detail})" if self._stop else ""
        return NodeResult(NodeState.FAILED, detail, stop)

    async def _failed(self, node: str) -> str:
        """What failed on the node now, in words; '' when nothing. An agent that does not
        answer fails the node, as any call of its change would."""
        target = self._targets[node]
        view = node_view(target, await self._fleet.client(target).node())
        return failed_detail(view.failed_gpus)
