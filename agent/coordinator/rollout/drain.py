"""`fleet apply mig --drain`: make room for a MIG change that must destroy busy instances.

For a node whose plan is blocked by processes: cordon it (no new pod lands), evict the pods
the agent attributes to the blocked GPUs through the Eviction API (the API server enforces
PodDisruptionBudgets: a 429 is retried after its Retry-After, else after a jittered wait from
5 s, kubectl drain's, doubling to 30 s, until the node's timeout), wait until
the plan is no longer blocked (the processes are gone), apply, and uncordon, whatever
happened, unless the node was cordoned before. A blocking process no pod owns is not
drained: the node fails, named, with nothing evicted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.rollout.actions import mig_config
from agent.coordinator.rollout.execute import NodeAction, NodeResult, Notes
from agent.coordinator.rollout.record import RolloutRecord
from agent.coordinator.rollout.schedule import NodeState
from agent.errors import Busy, NotFound
from agent.kube_watch import retry_wait

__all__ = ["EVICT_RETRY_S", "Drain", "DrainApi", "evict"]

#: The first and longest wait after a refused eviction with no Retry-After (kubectl drain
#: waits 5 s), each jittered by +-50 %.
EVICT_RETRY_S = (5.0, 30.0)


class DrainApi(Protocol):
    """The Kubernetes calls a drain makes (agent.coordinator.kube.KubeLister); blocking."""

    def cordon(self, node: str) -> bool:
        """Mark it unschedulable; True when it already was."""
        ...

    def uncordon(self, node: str) -> None: ...

    def evict(self, namespace: str, pod: str) -> None:
        """Busy while a PodDisruptionBudget forbids it; NotFound when the pod is gone."""
        ...


class Drain:
    """Wraps a rollout's MIG action with cordon, evictions and uncordon."""

    def __init__(
        self,
        inner: NodeAction,
        fleet: Fleet,
        targets: Mapping[str, Target],
        record: RolloutRecord,
        kube: DrainApi,
        *,
        poll_s: float = 1.0,
    ) -> None:
        self._inner = inner
        self._fleet = fleet
        self._targets = targets
        self._record = record
        self._kube = kube
        self._poll_s = poll_s

    async def __call__(self, node: str, notes: Notes) -> NodeResult:
        blocked = await self._blocked(node)
        if not blocked:
            return await self._inner(node, notes)
        pods = await self._fleet.client(self._targets[node]).pods_on(blocked)
        if not pods:
            gpus = ", ".join(str(g) for g in blocked)
            return NodeResult(
                NodeState.FAILED,
                f"not applied: GPU {gpus} busy with processes no pod owns; not drained",
            )
        was_cordoned = await asyncio.to_thread(self._kube.cordon, node)
        try:
            names = ", ".join(f"{ns}/{name}" for ns, name in sorted(pods))
            notes.progress(f"cordoned; evicting {names}")
            for namespace, pod in sorted(pods):
                await evict(self._kube, namespace, pod, notes.progress)
            notes.progress(f"evicted {names}; waiting for their processes to end")
            while await self._blocked(node):
                await asyncio.sleep(self._poll_s)
            return await self._inner(node, notes)
        finally:
            if not was_cordoned:
                # Even when cancelled (the node's timeout): the node must not stay cordoned.
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.to_thread(self._kube.uncordon, node))

    async def _blocked(self, node: str) -> list[int]:
        text, name = mig_config(self._record, node)
        plan = await self._fleet.client(self._targets[node]).plan_mig(text, name)
        return [g.gpu_index for g in plan.gpus if g.status == "blocked"]


async def evict(
    kube: DrainApi,
    namespace: str,
    pod: str,
    progress: Callable[[str], None],
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Evict one pod through the Eviction API until it is allowed or the pod is gone. A
    PodDisruptionBudget's 429 is retried after its Retry-After, else after EVICT_RETRY_S
    (jittered, doubling), and said through ``progress``: it was retried every second."""
    delay = EVICT_RETRY_S[0]
    while True:
        try:
            await asyncio.to_thread(kube.evict, namespace, pod)
            return
        except NotFound:
            return  # already gone
        except Busy as exc:  # a PodDisruptionBudget says not now
            wait = retry_wait(exc, delay)
            progress(f"eviction of {namespace}/{pod} refused for now: {exc}; again in {wait:.0f}s")
            await sleep(wait)
            delay = min(EVICT_RETRY_S[1], delay * 2)
