"""The health marks on the Node: labels, the GPUHealthy condition, an opt-in taint, Events.

The agent's Node owner (agent/kube_node.py) is the only writer of what it publishes here: the
publisher states the marks, the owner writes what differs from the watched Node, once (someone
else's change to these keys is put right when the watch shows it), and keeps everything else on
the Node (other labels, other conditions, other taints). Planning is pure (`plan`,
`taints_with`); with the API server away the owner retries and the publisher keeps its Events
(bounded) until a pass gets through, backing off (`EVENT_RETRY`, at least a 429's Retry-After)
rather than posting every pass; an Event the server refuses for good (a 4xx: RBAC, a webhook) is
dropped, said once, and never holds the later ones back.

- labels: ``gpu-agent.io/health`` = the node's worst state (an instance that is not healthy
  makes the node degraded at least), ``gpu-agent.io/health.{healthy,degraded,failed}-gpus`` =
  how many GPUs are in each state; ``unknown`` and no counts (condition ``Unknown``) while no
  GPU has been read yet, and while the driver is detached (the marks are kept for its
  return, but nothing is checked meanwhile), the taints below then left as they are;
  ``unknown`` with the counts of the judged GPUs while one has no verdict yet (first seen
  while its health readings fail) and no judged one is worse than healthy;
- condition ``GPUHealthy`` in ``status.conditions``, by a strategic-merge PATCH of the Node's
  status subresource (conditions merge by ``type``, as the kubelet and node-problem-detector
  write theirs): True while every GPU and instance is healthy; written when its status, reason
  or message changes (its heartbeat time is that write's);
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from agent.backoff import Backoff, BackoffPolicy
from agent.errors import AgentError
from agent.health.device_taints import DeviceTaints
from agent.health.machine import Mark, State
from agent.health.monitor import HealthChange, HealthMonitor
from agent.health.store import Target
from agent.kube import refused_for_good
from agent.kube_edge import KubeEdge
from agent.kube_node import Claim, NodeOwner
from agent.kube_watch import retry_after_s
from agent.tasks import Need, Task

log = logging.getLogger(__name__)

__all__ = ["CLAIM", "CONDITION", "LABEL", "NodePublisher", "Publication", "plan", "unchecked"]

LABEL = "gpu-agent.io/health"
COUNT_LABELS = {s: f"gpu-agent.io/health.{s.value}-gpus" for s in State}
CONDITION = "GPUHealthy"
#: How often the marks are stated to the Node's owner (local; a change wakes the pass).
PUBLISH_S = 10.0
TAINT_KEY = "gpu-agent.io/health"
TAINT_VALUE = "failed"
#: Events kept while the API server is away; older ones are dropped (and the drop is logged)
MAX_PENDING_EVENTS = 256
#: The wait before Events are posted again after the server did not take one (5xx, 429, no
#: answer): doubling, each shortened by up to half at random so that a fleet spreads out.
EVENT_RETRY = BackoffPolicy(base_s=10.0, max_s=300.0, jitter=0.5)
_EVENTS = ("events", "")
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


#: Before any GPU was read: the label says unknown, the condition Unknown, no count; the
#: taints are left as they are (`NodePublisher._publish`).
UNCHECKED = Publication(
    labels={LABEL: "unknown"},
    status="Unknown",
    reason="GpusNotChecked",
    message="no GPU read yet (the NVIDIA driver not ready since the agent started)",
    tainted=False,
)


def plan(
    marks: Marks, driver_away: str | None = None, unjudged: Mapping[int, str] | None = None
) -> Publication:
    """What the Node should carry for ``marks`` (GPU targets count; instances make the node
    degraded at least); ``driver_away``: why the GPUs are not read now (None while they are);
    ``unjudged``: GPU index -> why, for GPUs with no verdict yet (their readings fail): with
    them the node is not known healthy, only known not to be."""
    gpus = {t: v for t, v in marks.items() if t.gpu_instance is None}
    if not gpus:  # no GPU read yet (the driver away since the start): unknown is not healthy
        return UNCHECKED
    if driver_away is not None:  # the marks are as last read; nothing is checked meanwhile
        return unchecked(marks, driver_away)
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
    if unjudged:
        said = "; ".join(
            f"GPU {i} not judged yet: health readings fail ({why})"
            for i, why in sorted(unjudged.items())
        )
        message = f"{message}; {said}"
        if worst is State.HEALTHY:  # the taints then stay as they are (`NodePublisher`)
            return Publication(
                labels=labels | {LABEL: "unknown"},
                status="Unknown",
                reason="GpusNotChecked",
                message=message[:1024],
                tainted=False,
            )
    return Publication(
        labels=labels,
        status="True" if worst is State.HEALTHY else "False",
        reason=_REASONS[worst],
        message=message[:1024],
        tainted=counts[State.FAILED] > 0,
    )


def unchecked(marks: Marks, driver_away: str) -> Publication:
    """While the driver is detached: unknown, with why and the marks kept for its return."""
    kept = [
        f"{_where(index, t)} {m.state.value}"
        for t, (index, m, _) in sorted(marks.items(), key=lambda kv: (kv[1][0], kv[0].order()))
        if m.state is not State.HEALTHY
    ]
    said = f"; kept for its return: {', '.join(kept)}" if kept else ""
    return Publication(
        labels={LABEL: "unknown"},
        status="Unknown",
        reason="DriverNotReady",
        message=f"GPU health is not checked while the NVIDIA driver is not ready: "
        f"{driver_away}{said}"[:1024],
        tainted=False,
    )


def event_message(change: HealthChange) -> str:
    where = _where(change.gpu_index, change.target)
    pods = ", ".join(change.mark.pods) or "none"
    if change.held:
        return f"{where} stays {change.mark.state.value}: {change.reason}; pods: {pods}"
    return (
        f"{where} ({change.target.known_uuid or 'UUID unknown'}) {change.before.value} -> "
        f"{change.mark.state.value}: {change.reason}; action: {change.mark.action}; pods: {pods}"
    )


def _where(index: int, target: Target) -> str:
    gpu = f"GPU {index}" if index >= 0 else f"GPU {target.known_uuid or '(index unknown)'}"
    return gpu if target.gpu_instance is None else f"{gpu} GPU instance {target.gpu_instance}"


class EventApi(Protocol):
    """The call the publisher makes itself (agent.kube.InClusterKubeClient); the Node's marks
    are written by its owner (agent/kube_node.py)."""

    def post_node_event(
        self, node: str, reason: str, message: str, component: str = ..., type_: str = ...
    ) -> None: ...


#: The keys of the Node the health marks own.
CLAIM = Claim(
    "health",
    label_keys=frozenset({LABEL}),
    label_prefixes=(f"{LABEL}.",),
    condition=CONDITION,
    taint=TAINT_KEY,
)


class NodePublisher:
    """One `sync` pass states the marks to the Node's owner (which writes what differs, once)
    and sends the Events; nothing is re-written while the marks stay as they are."""

    def __init__(
        self,
        kube: EventApi,
        owner: NodeOwner,
        marks: Callable[[], Marks],
        *,
        taint: bool,
        device_taints: Callable[[], None] | None = None,
        driver_away: Callable[[], str | None] = lambda: None,
        unjudged: Callable[[], Mapping[int, str]] = dict,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._node = owner.node
        self._part = owner.part(CLAIM)
        self._marks = marks
        self._taint = taint
        self._device_taints = device_taints
        #: why the GPUs are not read now (the driver detached); None while they are
        self._driver_away = driver_away
        #: GPU index -> why, for GPUs with no verdict yet (`HealthMonitor.unjudged`)
        self._unjudged = unjudged
        self._lock = threading.Lock()
        self._events: deque[HealthChange] = deque()
        self._clock = clock
        self._retry = Backoff(EVENT_RETRY)
        #: why the last Event was not taken ("" once one is): `refused`
        self._refused = ""
        self.wake: Callable[[], None] = lambda: None

    def on_change(self, change: HealthChange) -> None:
        """A listener of the monitor: the Event is sent with the next pass, which starts now."""
        with self._lock:
            if len(self._events) >= MAX_PENDING_EVENTS:
                dropped = self._events.popleft()
                log.warning("health Event dropped (API server away): %s", event_message(dropped))
            self._events.append(change)
        self.wake()

    def tasks(self) -> list[Task]:
        def woken_by(wake: Callable[[], None]) -> None:
            self.wake = wake

        return [Task("health", self.sync, PUBLISH_S, wakes=(woken_by,), needs=Need.LISTENER)]

    def sync(self) -> None:
        """Publish; a failure leaves what is left for the next pass (logged, not raised)."""
        try:
            self._publish()
            self._send_events()
        except AgentError as exc:
            log.warning("publishing GPU health on Node %s failed, retrying: %s", self._node, exc)

    def _publish(self) -> None:
        want = plan(self._marks(), self._driver_away(), self._unjudged())
        condition = {"status": want.status, "reason": want.reason, "message": want.message}
        taint = (
            {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"}
            if self._taint and want.tainted
            else None
        )
        if want.status == "Unknown":
            # No GPU read (now): the taints (the Node's, the devices') stay as they are, since
            # lifting an earlier agent's on no evidence gives a broken GPU pods again.
            self._part.set(labels=want.labels, condition=condition)
            return
        # The owner writes what differs from the Node (none of it when nothing changed).
        self._part.set(labels=want.labels, condition=condition, taint=taint)
        if self._device_taints is not None:
            # Every pass, not only when the marks change: the devices come from the slices,
            # which may appear later; the pass sends nothing when the rules are as wanted.
            self._device_taints()

    def refused(self) -> str:
        """Why the last health Event was not taken ("" once one is): GetNode's word of it."""
        return self._refused

    def _send_events(self) -> None:
        """Post the Events in order; one refused for good is dropped (it would be refused
        again), any other failure holds all of them back (`EVENT_RETRY`)."""
        while not self._retry.waiting(_EVENTS, self._clock()):
            with self._lock:
                if not self._events:
                    return
                change = self._events[0]
            state = change.mark.state
            reason = "GpuHealthHeld" if change.held else _EVENT_REASONS[state]
            try:
                self._kube.post_node_event(
                    self._node,
                    reason,
                    event_message(change),
                    type_="Normal" if state is State.HEALTHY else "Warning",
                )
            except AgentError as exc:
                if not refused_for_good(exc):
                    self._held_back(exc)
                    return
                self._refused = f"health Event {reason} refused, dropped: {exc}"
                log.warning("%s (%s)", self._refused, event_message(change))
            else:
                self._retry.succeeded(_EVENTS)
                self._refused = ""
            with self._lock:
                if self._events and self._events[0] is change:
                    self._events.popleft()

    def _held_back(self, exc: AgentError) -> None:
        now = self._clock()
        wait = retry_after_s(exc) or 0.0
        held = self._retry.failed(_EVENTS, now, detail=str(exc), at_least_s=wait)
        self._refused = (
            f"{len(self._events)} health Event(s) not posted, again in "
            f"{held.retry_at - now:.0f}s: {exc}"
        )
        if held.failures == 1:  # said once, not every pass
            log.warning("%s", self._refused)


def build_publisher(
    edge: KubeEdge | None,
    node: str,
    health: HealthMonitor,
    *,
    taint: bool,
    driver_away: Callable[[], str | None] = lambda: None,
) -> NodePublisher | None:
    """In a pod, the health marks stated to the Node's owner, and the DRA device taints;
    ``driver_away`` says why the GPUs are not read now (None while they are)."""
    if edge is None:
        return None
    rules = DeviceTaints(
        edge.client.request,
        node,
        health.shown,
        health.device_uuids,
        slices=edge.slices().listed,
        rules=lambda: edge.apis.path("devicetaintrules"),
    )
    publisher = NodePublisher(
        edge.client,
        edge.owner,
        health.shown,
        taint=taint,
        device_taints=rules.sync,
        driver_away=driver_away,
        unjudged=health.unjudged,
    )
    health.subscribe(publisher.on_change)
    edge.refusals += [rules.refused, publisher.refused]
    return publisher
