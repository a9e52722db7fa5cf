"""The health marks on the Node: labels, the GPUHealthy condition, an opt-in taint, Events.

The agent is the only writer of what it publishes here, so every pass puts all of it as the
marks say (someone else's change is put right) and keeps everything else on the Node (other
labels, other conditions, other taints). Planning is pure (`plan`, `taints_with`); the
`NodePublisher` does the writes, and with the API server away keeps what it has to publish and
its Events (bounded) until a pass gets through.

- labels: ``gpu-agent.io/health`` = the node's worst state (an instance that is not healthy
  makes the node degraded at least), ``gpu-agent.io/health.{healthy,degraded,failed}-gpus`` =
  how many GPUs are in each state;
- condition ``GPUHealthy`` in ``status.conditions``, by a strategic-merge PATCH of the Node's
  status subresource (conditions merge by ``type``, as the kubelet and node-problem-detector
  write theirs): True while every GPU and instance is healthy;
- taint ``gpu-agent.io/health=failed:NoSchedule`` while a GPU is failed, only with
  ``health.taint``; a merge PATCH of ``spec.taints`` with the Node's resourceVersion as a
  precondition (a list is replaced whole: the others are sent back as they were);
- on DRA nodes, DRA device taints (``device_taints``: agent/health/device_taints.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.errors import AgentError, Conflict
from agent.health.machine import Mark, State
from agent.health.monitor import HealthChange
from agent.health.store import Target

log = logging.getLogger(__name__)

__all__ = ["CONDITION", "LABEL", "NodePublisher", "Publication", "plan", "taints_with"]

LABEL = "gpu-agent.io/health"
COUNT_LABELS = {s: f"gpu-agent.io/health.{s.value}-gpus" for s in State}
CONDITION = "GPUHealthy"
TAINT_KEY = "gpu-agent.io/health"
TAINT_VALUE = "failed"
#: Events kept while the API server is away; older ones are dropped (and the drop is logged)
MAX_PENDING_EVENTS = 256
#: the condition's reason, and the Event's, per (worst) state
_REASONS = {s: f"Gpus{s.value.capitalize()}" for s in State}
_EVENT_REASONS = {s: f"Gpu{s.value.capitalize()}" for s in State}

Marks = Mapping[Target, tuple[int, Mark, str]]


@dataclass(frozen=True, slots=True)
class Publication:
    labels: Mapping[str, str]
    #: the condition's status ("True"/"False"), reason and message
    status: str
    reason: str
    message: str
    #: whether the agent's taint belongs on the Node (only asked for with health.taint)
    tainted: bool


def plan(marks: Marks) -> Publication:
    """What the Node should carry for ``marks`` (GPU targets count; instances make the node
    degraded at least)."""
    gpus = {t: v for t, v in marks.items() if t.gpu_instance is None}
    counts = dict.fromkeys(State, 0)
    for _, mark, _ in gpus.values():
        counts[mark.state] += 1
    worst = max((m.state for _, m, _ in gpus.values()), key=lambda s: s.rank, default=State.HEALTHY)
    if worst is State.HEALTHY and any(
        m.state is not State.HEALTHY for t, (_, m, _) in marks.items() if t.gpu_instance is not None
    ):
        worst = State.DEGRADED
    labels = {LABEL: worst.value} | {COUNT_LABELS[s]: str(n) for s, n in counts.items()}
    bad = [
        f"{_where(index, t)} {m.state.value}: {reason}"
        for t, (index, m, reason) in sorted(marks.items(), key=lambda kv: (kv[1][0], kv[0].order()))
        if m.state is not State.HEALTHY
    ]
    message = "; ".join(bad) if bad else f"{len(gpus)} GPU(s) healthy"
    return Publication(
        labels=labels,
        status="True" if worst is State.HEALTHY else "False",
        reason=_REASONS[worst],
        message=message[:1024],
        tainted=counts[State.FAILED] > 0,
    )


def taints_with(current: Sequence[Mapping[str, Any]], tainted: bool) -> list[dict[str, Any]] | None:
    """The Node's taints with the agent's taint put (or taken off); None when unchanged."""
    others = [dict(t) for t in current if t.get("key") != TAINT_KEY]
    ours = [t for t in current if t.get("key") == TAINT_KEY]
    want = {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"}
    if tainted and (len(ours) != 1 or {k: ours[0].get(k) for k in want} != want):
        return [*others, want]
    if not tainted and ours:
        return others
    return None


def event_message(change: HealthChange) -> str:
    where = _where(change.gpu_index, change.target)
    pods = ", ".join(change.mark.pods) or "none"
    if change.held:
        return f"{where} stays {change.mark.state.value}: {change.reason}; pods: {pods}"
    return (
        f"{where} ({change.target.gpu_uuid}) {change.before.value} -> "
        f"{change.mark.state.value}: {change.reason}; action: {change.mark.action}; pods: {pods}"
    )


def _where(index: int, target: Target) -> str:
    gpu = f"GPU {index}" if index >= 0 else f"GPU {target.gpu_uuid}"
    return gpu if target.gpu_instance is None else f"{gpu} GPU instance {target.gpu_instance}"


class NodeApi(Protocol):
    """The calls the publisher makes (agent.kube.InClusterKubeClient)."""

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> Any: ...

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None: ...

    def post_node_event(
        self, node: str, reason: str, message: str, component: str = ..., type_: str = ...
    ) -> None: ...


class NodePublisher:
    """One `sync` pass publishes what changed (and everything every ``resync_s``)."""

    def __init__(
        self,
        kube: NodeApi,
        node: str,
        marks: Callable[[], Marks],
        *,
        taint: bool,
        device_taints: Callable[[], None] | None = None,
        resync_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._node = node
        self._marks = marks
        self._taint = taint
        self._device_taints = device_taints
        self._resync_s = resync_s
        self._clock = clock
        self._lock = threading.Lock()
        self._events: deque[HealthChange] = deque()
        self._sent: Publication | None = None
        self._sent_at = 0.0
        #: the condition's status as last written, and when it last changed (RFC 3339)
        self._transition: tuple[str, str] | None = None
        self.wake: Callable[[], None] = lambda: None

    def on_change(self, change: HealthChange) -> None:
        """A listener of the monitor: the Event is sent with the next pass, which starts now."""
        with self._lock:
            if len(self._events) >= MAX_PENDING_EVENTS:
                dropped = self._events.popleft()
                log.warning("health Event dropped (API server away): %s", event_message(dropped))
            self._events.append(change)
        self.wake()

    def sync(self) -> None:
        """Publish; a failure leaves what is left for the next pass (logged, not raised)."""
        try:
            self._publish()
            self._send_events()
        except AgentError as exc:
            log.warning("publishing GPU health on Node %s failed, retrying: %s", self._node, exc)

    def _publish(self) -> None:
        want = plan(self._marks())
        now = self._clock()
        if want == self._sent and now - self._sent_at < self._resync_s:
            return
        self._kube.patch_node_labels(self._node, dict(want.labels))
        self._condition(want, now)
        if self._taint:
            self._taints(want.tainted)
        if self._device_taints is not None:
            self._device_taints()
        self._sent, self._sent_at = want, now

    def _condition(self, want: Publication, now: float) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        if self._transition is None:  # first pass: the Node says since when (an agent restart)
            self._transition = self._written_transition()
        if self._transition is None or self._transition[0] != want.status:
            self._transition = (want.status, stamp)
        since = self._transition[1]
        condition = {
            "type": CONDITION,
            "status": want.status,
            "reason": want.reason,
            "message": want.message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": since,
        }
        self._kube.request(
            "PATCH",
            f"/api/v1/nodes/{self._node}/status",
            body={"status": {"conditions": [condition]}},
            content_type="application/strategic-merge-patch+json",
        )

    def _written_transition(self) -> tuple[str, str] | None:
        node = self._kube.request("GET", f"/api/v1/nodes/{self._node}")
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") == CONDITION and condition.get("lastTransitionTime"):
                return str(condition.get("status")), str(condition["lastTransitionTime"])
        return None

    def _taints(self, tainted: bool) -> None:
        node = self._kube.request("GET", f"/api/v1/nodes/{self._node}")
        spec = node.get("spec") or {}
        taints = taints_with(spec.get("taints") or [], tainted)
        if taints is None:
            return
        version = (node.get("metadata") or {}).get("resourceVersion")
        try:
            self._kube.request(
                "PATCH",
                f"/api/v1/nodes/{self._node}",
                body={"metadata": {"resourceVersion": version}, "spec": {"taints": taints}},
                content_type="application/merge-patch+json",
            )
        except Conflict as exc:  # someone wrote the Node meanwhile: the next pass re-reads it
            raise AgentError(f"the Node changed while its taints were written: {exc}") from exc
        log.info("Node %s: taint %s %s", self._node, TAINT_KEY, "set" if tainted else "removed")

    def _send_events(self) -> None:
        while True:
            with self._lock:
                if not self._events:
                    return
                change = self._events[0]
            state = change.mark.state
            self._kube.post_node_event(
                self._node,
                "GpuHealthHeld" if change.held else _EVENT_REASONS[state],
                event_message(change),
                type_="Normal" if state is State.HEALTHY else "Warning",
            )
            with self._lock:
                if self._events and self._events[0] is change:
                    self._events.popleft()
