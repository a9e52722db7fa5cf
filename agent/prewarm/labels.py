"""The node labels for cache affinity: ``gpu-agent.io/cache.<name>: ready`` for each item its
kind says earns one (`kinds.label_ready`), and the Node merge patch that publishes them.

Apart from the inventory's Prometheus series (agent/prewarm/inventory.py) because these ask the
kinds' registry, and the kinds' modules stand under the service that builds the inventory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.kube_node import Claim, NodeOwner
from agent.prewarm import kinds
from agent.prewarm.model import CacheItem
from agent.prewarm.naming import LABEL_PREFIX, label_key
from agent.tasks import Need, Task

READY_VALUE = "ready"
#: The keys of the Node the cache labels own (agent/kube_node.py).
CLAIM = Claim("cache", label_prefixes=(LABEL_PREFIX,))
#: How often the labels are computed (local); the Node's owner writes only a change.
CHECK_S = 0.5


def node_labels(items: Sequence[CacheItem]) -> dict[str, str]:
    """``gpu-agent.io/cache.<name>: ready`` (see `label_key`) for every ready file, ready model
    and fully warm image."""
    return {label_key(i.name): READY_VALUE for i in items if kinds.label_ready(i)}


def label_patch(current: Mapping[str, str], items: Sequence[CacheItem]) -> dict[str, Any]:
    """A JSON merge patch of the Node that sets ready labels and removes our stale ones.

    Only keys under ``gpu-agent.io/cache.`` are touched; ``None`` deletes a label. Empty when the
    node already matches, so the publisher can skip the API call.
    """
    wanted = node_labels(items)
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    for key in current:
        if key.startswith(LABEL_PREFIX) and key not in wanted:
            changes[key] = None
    return {"metadata": {"labels": changes}} if changes else {}


class CacheLabels:
    """The cache's labels on this Node (cache-affinity scheduling), stated to the Node's owner:
    it writes only a change, and retries a failed write."""

    def __init__(self, owner: NodeOwner, items: Callable[[], Sequence[CacheItem]]) -> None:
        self._owner = owner
        self._items = items

    def sync(self) -> None:
        self._owner.part(CLAIM).set(labels=node_labels(self._items()))

    def tasks(self) -> list[Task]:
        return [Task("cache-labels", self.sync, CHECK_S, needs=Need.KUBE)]
