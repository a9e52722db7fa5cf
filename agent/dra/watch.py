"""The effectful half of the allocation mode: keep the facts agent.dra.detect reads current.

Two list+watches (agent.kube_watch.Informer, the agent's shared ones): this node's ResourceSlices
(``fieldSelector=spec.nodeName=NODE``, every driver; the reader keeps the GPU driver's) and
this Node (``fieldSelector=metadata.name=NODE``, for ``status.allocatable``). Until each has
listed once the mode is ``unknown``; a watch that breaks later keeps the last facts (the mode
of a node does not change because the API server blinked) and the evidence says they are as
last seen. ``wait`` lets the republish check sleep until the slices change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from agent.dra.detect import NO_API, NodeFacts, detect
from agent.dra.mode import Allocation, AllocationMode
from agent.dra.slices import DriverSlices, read_slices
from agent.kube import InClusterKubeClient
from agent.kube_watch import Informer, node_query

__all__ = ["SLICES_PATH", "AllocationSource", "AllocationWatch"]

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class AllocationWatch:
    def __init__(
        self,
        client: InClusterKubeClient,
        node: str,
        driver: str,
        on_change: Callable[[], object] = lambda: None,
        *,
        slices: Informer | None = None,
        node_informer: Informer | None = None,
    ) -> None:
        """``slices`` and ``node_informer``: the agent's shared informers (agent/kube_edge.py);
        without them this watch makes its own."""
        self.node = node
        self.driver = driver
        #: called from a watch thread after every change (the composition root sets it)
        self.on_change = on_change
        self._changed = threading.Condition()
        #: changes seen of this node's slices (the republish check waits for one)
        self.slice_changes = 0
        own = slices is None or node_informer is None
        self._slices = slices or Informer(
            client, SLICES_PATH, {"fieldSelector": f"spec.nodeName={node}"}
        )
        self._node = node_informer or Informer(client, "/api/v1/nodes", node_query(node))
        #: informers made here (stopped here); shared ones are the edge's to stop
        self._own = (self._slices, self._node) if own else ()
        self._slices.add_handler(self._slices_changed)
        self._node.add_handler(self._notify)

    def start(self) -> None:
        self._slices.start()
        self._node.start()

    def stop(self) -> None:
        for informer in self._own:
            informer.stop()
        self._notify()

    def wait_synced(self, timeout_s: float) -> bool:
        """Until both watches have listed once, or one has failed (an API server that refuses
        is not waited for: the mode is unknown until it answers), at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        informers = (self._slices, self._node)

        def settled() -> bool:
            return any(i.error for i in informers) or all(i.synced.is_set() for i in informers)

        # A list wakes it (on_change); a failure sets no callback, so it is looked at every
        # 0.1 s; `stop` wakes it at once.
        with self._changed:
            while not settled() and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(min(0.1, left))
        return all(i.synced.is_set() for i in informers)

    def slices(self) -> DriverSlices | None:
        """The driver's slices on this node as last listed; None before the first list."""
        if not self._slices.synced.is_set():
            return None
        return read_slices(self._slices.objects(), self.driver, self.node)

    def current(self) -> Allocation:
        allocatable = capacity = None
        if self._node.synced.is_set():
            status = next(
                (o.get("status") for o in self._node.objects() if isinstance(o, dict)), None
            )
            status = status if isinstance(status, dict) else {}
            allocatable = _mapping(status.get("allocatable"))
            capacity = _mapping(status.get("capacity"))
        problem = self._slices.error or self._node.error
        denied = self._slices.denied if self._slices.error else self._node.denied
        facts = NodeFacts(self.driver, self.slices(), allocatable, capacity, problem, denied)
        found = detect(facts)
        if found.mode is not AllocationMode.UNKNOWN and problem:
            stale = f"{found.evidence}; as last seen, the API server is not answering: {problem}"
            return Allocation(found.mode, stale, found.driver)
        return found

    def wait(self, changes: int, timeout_s: float) -> int:
        """Until this node's slices changed past ``changes`` (or the watch stopped), at most
        ``timeout_s``; the count of changes now."""
        with self._changed:
            self._changed.wait_for(lambda: self.slice_changes > changes, timeout_s)
            return self.slice_changes

    def _slices_changed(self) -> None:
        with self._changed:
            self.slice_changes += 1
        self._notify()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()
        self.on_change()


def _mapping(value: object) -> dict[str, object]:
    return dict(value) if isinstance(value, dict) else {}


class AllocationSource:
    """The node's allocation mode as every part asks for it: the config's mode when
    ``dra.mode`` names one, else the watch's detection, else (no Kubernetes API) ``none``."""

    def __init__(self, configured: Allocation | None, watch: AllocationWatch | None) -> None:
        self.configured = configured
        self.watch = watch

    def current(self) -> Allocation:
        if self.configured is not None:
            return self.configured
        if self.watch is not None:
            return self.watch.current()
        return NO_API
