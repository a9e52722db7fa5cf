"""Reclaimable GPUs, marked on the agent's own Node for a cost job or an autoscaler to act on.

A GPU is reclaimable when it has been under ``telemetry.idle_threshold_percent`` for at least
``telemetry.idle_reclaim_after_s`` (default 24 h) and runs no process. The agent then sets the
annotation ``gpu-agent.io/reclaimable=<GPU indices>`` (comma-separated, ascending) on its Node
and posts an Event ``GpusReclaimable``; when the set changes the annotation follows, and when
no GPU is reclaimable any more (one is used again) the annotation is removed with an Event
``GpusInUse``. A node whose labels match ``telemetry.reclaim_exclude_selector`` (say
``pool=inference``: a serving pool idles by design) is never marked. Unknown idle time (no
telemetry yet, a GPU that stopped answering) is not idle: such a GPU is never marked, nor
one whose process list was not read in the latest sample ("no process" would be a guess). Nor is a
GPU with a failed health mark (on it or one of its instances): it idles because it is broken,
and it is not capacity to hand back but a repair (docs/health.md).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.types import GpuLayout
from agent.health.machine import State
from agent.kube_node import Claim
from agent.tasks import Need, Subscribe, Task

if TYPE_CHECKING:
    from agent.api.inventory import NodeInventory
    from agent.config import AgentConfig
    from agent.health.monitor import HealthMonitor
    from agent.kube_edge import KubeEdge
    from agent.kube_watch import Informer
    from agent.telemetry.service import TelemetryService

__all__ = [
    "ANNOTATION",
    "ExcludeSelector",
    "ReclaimMarker",
    "reclaim_marker",
    "reclaim_tasks",
    "reclaimable",
]

#: How often the reclaimable-GPU mark is recomputed (it moves in hours; the write is rare).
RECLAIM_S = 60.0

log = logging.getLogger(__name__)

ANNOTATION = "gpu-agent.io/reclaimable"


def reclaimable(
    layouts: Sequence[GpuLayout],
    idle_by_uuid: Mapping[str, float],
    after_s: float,
    failed: Collection[str] = (),
) -> tuple[int, ...]:
    """Indices of GPUs idle at least ``after_s`` with no process, none of them in ``failed``
    (UUIDs of the GPUs a failed health mark is on) (pure)."""
    return tuple(
        sorted(
            layout.gpu.index
            for layout in layouts
            if not layout.processes
            and layout.gpu.uuid not in failed
            and (idle := idle_by_uuid.get(layout.gpu.uuid)) is not None
            and idle >= after_s
        )
    )


@dataclass(frozen=True, slots=True)
class ExcludeSelector:
    """``key=value,key!=value`` over node labels; empty excludes nothing."""

    terms: tuple[tuple[str, str, bool], ...] = ()

    @classmethod
    def parse(cls, text: str) -> ExcludeSelector:
        terms = []
        for raw in (t.strip() for t in text.split(",") if t.strip()):
            negate = "!=" in raw
            key, sep, value = raw.partition("!=" if negate else "=")
            if not sep or not key.strip():
                raise InvalidSpec(
                    f"telemetry.reclaim_exclude_selector term {raw!r} is not key=value",
                    [FieldViolation("telemetry.reclaim_exclude_selector", "key=value,key!=value")],
                )
            terms.append((key.strip(), value.strip(), negate))
        return cls(tuple(terms))

    def matches(self, labels: Mapping[str, str]) -> bool:
        if not self.terms:
            return False
        return all((labels.get(k) == v) != negate for k, v, negate in self.terms)


class NodeMarks(Protocol):
    """The writes the marker makes on its Node (agent.kube.InClusterKubeClient)."""

    def patch_node_annotations(self, node: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch annotations; None removes one."""
        ...

    def post_node_event(self, node: str, reason: str, message: str) -> None:
        """A Normal Event on the Node."""
        ...


#: (labels, annotations) of the Node now
#: The Node's (labels, annotations); None while they are not known (its watch not listed).
Metadata = Callable[[], tuple[Mapping[str, str], Mapping[str, str]] | None]


class ReclaimMarker:
    """One pass: compute the reclaimable GPUs, and mark the Node when that changed."""

    def __init__(
        self,
        kube: NodeMarks,
        node: str,
        metadata: Metadata,
        layouts: Callable[[], Sequence[GpuLayout]],
        idle: Callable[[], Mapping[str, float] | None],
        after_s: float,
        exclude: ExcludeSelector,
        failed: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``failed``: UUIDs of the GPUs a failed health mark is on now."""
        self._kube = kube
        self._failed = failed
        self._node = node
        self._metadata = metadata
        self._layouts = layouts
        self._idle = idle
        self._after_s = after_s
        self._exclude = exclude
        #: the mark the last Event said (None: not known yet; the Node's at the first pass)
        self._said: str | None = None

    def mark(self) -> tuple[int, ...] | None:
        """The GPUs marked now; None when idle time is not known yet (nothing changed)."""
        idle = self._idle()
        if idle is None:
            return None
        found = self._metadata()
        if found is None:  # the Node not listed yet: the pass waits for it (`reclaim_tasks`)
            return None
        labels, annotations = found
        gpus = (
            ()
            if self._exclude.matches(labels)
            else reclaimable(self._layouts(), idle, self._after_s, self._failed())
        )
        value = ",".join(str(i) for i in gpus)
        current = annotations.get(ANNOTATION) or ""
        if self._said is None:
            self._said = current  # an earlier agent's mark was said by it
        if current != value:
            self._kube.patch_node_annotations(self._node, {ANNOTATION: value or None})
        if self._said == value:
            return gpus
        # Said apart from the write: one retried by the Node's owner still gets its Event.
        hours = self._after_s / 3600
        if gpus:
            message = f"GPU(s) {value} idle for {hours:g} h or more with no process: reclaimable"
            self._kube.post_node_event(self._node, "GpusReclaimable", message)
        else:
            self._kube.post_node_event(
                self._node, "GpusInUse", f"GPU(s) {self._said} are in use again (or excluded)"
            )
        self._said = value
        log.info("node %s: %s=%s", self._node, ANNOTATION, value or "(removed)")
        return gpus


#: The key of the Node the mark owns.
CLAIM = Claim("reclaim", annotation_keys=frozenset({ANNOTATION}))


class _OwnedMarks:
    """The marker's writes through the Node's owner (the annotation) and the client (Events)."""

    def __init__(self, edge: KubeEdge) -> None:
        self._edge = edge
        self._part = edge.owner.part(CLAIM)

    def patch_node_annotations(self, node: str, annotations: Mapping[str, str | None]) -> None:
        self._part.set(annotations={k: v for k, v in annotations.items() if v is not None})
        self._edge.owner.sync()

    def post_node_event(self, node: str, reason: str, message: str) -> None:
        self._edge.client.post_node_event(node, reason, message)


def reclaim_marker(
    edge: KubeEdge,
    config: AgentConfig,
    inventory: NodeInventory,
    telemetry: TelemetryService,
    health: HealthMonitor,
) -> ReclaimMarker:
    """The marker the agent runs: metadata from its Node's watch (no GET; a pass waits while
    the Node was never listed), layouts from the inventory, idle seconds from the latest
    telemetry snapshot, failed GPUs from the health marks; the annotation written by the Node's
    owner."""
    node = config.node_name

    def metadata() -> tuple[Mapping[str, str], Mapping[str, str]] | None:
        obj = edge.owner.node_object()
        if obj is None:
            log.debug("the Node %s is not listed yet: no reclaim mark this pass", node)
            return None
        meta = obj.get("metadata") or {}
        return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})

    def idle() -> Mapping[str, float] | None:
        snapshot = telemetry.latest()
        return None if snapshot is None else snapshot.gpu_idle_seconds()

    settings = config.telemetry
    return ReclaimMarker(
        _OwnedMarks(edge),
        node,
        metadata,
        inventory.layouts,  # a GPU whose process list is unknown is not idle capacity
        idle,
        settings.idle_reclaim_after_s,
        ExcludeSelector.parse(settings.reclaim_exclude_selector or ""),
        lambda: {t.gpu_uuid for t, m in health.marks().items() if m.state is State.FAILED},
    )


def reclaim_tasks(
    edge: KubeEdge | None,
    config: AgentConfig,
    inventory: NodeInventory,
    telemetry: TelemetryService,
    health: HealthMonitor,
) -> list[Task]:
    """The marking pass, when idle reclaim is on; its marker (and its claim on the Node) is made
    at the first pass, once the runner started it."""
    if edge is None or config.telemetry.idle_reclaim_after_s <= 0:
        return []
    marker = functools.cache(lambda: reclaim_marker(edge, config, inventory, telemetry, health))
    # A pass before the Node's watch listed marks nothing; its first list wakes the next one
    # (not RECLAIM_S later).
    listed = _first_list(edge.node_informer())
    return [Task("reclaim", lambda: marker().mark(), RECLAIM_S, (listed,), Need.KUBE)]


def _first_list(informer: Informer) -> Subscribe:
    """Wake a task once, at ``informer``'s first list (not at all when it has listed)."""

    def subscribe(wake: Callable[[], None]) -> None:
        if informer.synced.is_set():
            return
        woke = threading.Event()

        def once() -> None:
            if not woke.is_set():
                woke.set()
                wake()

        informer.add_handler(once)

    return subscribe
