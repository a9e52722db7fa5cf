"""The node labels for cache affinity: ``gpu-agent.io/cache.<name>: ready`` for each item its
kind says earns one (`kinds.label_ready`), at most `DEFAULT_MAX` a Node, and their publisher.

Apart from the inventory's Prometheus series (agent/prewarm/inventory.py) because these ask the
kinds' registry, and the kinds' modules stand under the service that builds the inventory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.kube_node import Claim, NodeOwner
from agent.prewarm import kinds
from agent.prewarm.model import CacheItem
from agent.prewarm.naming import LABEL_PREFIX, label_key
from agent.tasks import Need, Task

log = logging.getLogger(__name__)

READY_VALUE = "ready"
#: The keys of the Node the cache labels own (agent/kube_node.py).
CLAIM = Claim("cache", label_prefixes=(LABEL_PREFIX,))
#: How often the labels are computed (local); the Node's owner writes only a change.
CHECK_S = 0.5
#: The cache labels a Node carries at most (``prewarm.max_node_labels``): every watcher of
#: Nodes receives each label with every change of the Node, so a cache of thousands of items
#: must not become thousands of labels.
DEFAULT_MAX = 64


def node_labels(items: Sequence[CacheItem], limit: int = DEFAULT_MAX) -> dict[str, str]:
    """``gpu-agent.io/cache.<name>: ready`` (see `label_key`) for every ready file, ready model
    and fully warm image, at most ``limit`` of them: pinned items first, then by name, so the
    same cache always earns the same labels."""
    ready = sorted((i for i in items if kinds.label_ready(i)), key=lambda i: (not i.pinned, i.name))
    return {label_key(i.name): READY_VALUE for i in ready[:limit]}


class CacheLabels(Collector):
    """The cache's labels on this Node (cache-affinity scheduling), stated to the Node's owner:
    it writes only a change, and retries a failed write. Past ``limit`` ready items the rest
    are withheld, said in a log line and ``gpu_agent_prewarm_node_labels{state="withheld"}``."""

    def __init__(
        self, owner: NodeOwner, items: Callable[[], Sequence[CacheItem]], limit: int = DEFAULT_MAX
    ) -> None:
        self._owner = owner
        self._items = items
        self._limit = limit
        self._counts = (0, 0)

    def sync(self) -> None:
        items = self._items()
        labels = node_labels(items, self._limit)
        counts = (len(labels), sum(1 for i in items if kinds.label_ready(i)) - len(labels))
        if counts[1] and counts != self._counts:
            log.warning(
                "%d ready cache items get no node label: prewarm.max_node_labels is %d",
                counts[1],
                self._limit,
            )
        self._counts = counts
        self._owner.part(CLAIM).set(labels=labels)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gpu_agent_prewarm_node_labels",
            "Ready cache items with a cache label on the Node (published) and without one, past "
            "prewarm.max_node_labels (withheld).",
            labels=["state"],
        )
        for state, n in zip(("published", "withheld"), self._counts, strict=True):
            family.add_metric([state], n)
        yield family

    def tasks(self) -> list[Task]:
        return [Task("cache-labels", self.sync, CHECK_S, needs=Need.KUBE)]
