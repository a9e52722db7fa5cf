"""The inventory as others see it: Prometheus series (the node labels are
agent/prewarm/labels.py's).

They are a pure rendering of one `Inventory` snapshot; the collector never touches the disk or
the network on a scrape (it calls the supplier, which reads the index).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.prewarm.budget import Usage
from agent.prewarm.model import CacheItem, ImagePull, ItemState, Warmth

#: the states of gpu_agent_prewarm_item_state (an agent's items are never UNKNOWN)
_COUNTED_STATES = tuple(s for s in ItemState if s is not ItemState.UNKNOWN)


@dataclass(frozen=True, slots=True)
class Inventory:
    items: Sequence[CacheItem]
    usage: Usage
    pulls: Sequence[ImagePull]


class PrewarmCollector(Collector):
    """``gpu_agent_prewarm_*`` series from the latest inventory."""

    def __init__(self, inventory: Callable[[], Inventory]) -> None:
        self._inventory = inventory

    def collect(self) -> Iterator[Metric]:
        inv = self._inventory()
        labels = ["kind", "name"]
        state = GaugeMetricFamily(
            "gpu_agent_prewarm_item_state",
            "1 for the state each cache item is in.",
            labels=[*labels, "state"],
        )
        size = GaugeMetricFamily(
            "gpu_agent_prewarm_item_size_bytes", "Bytes of a cache item.", labels=labels
        )
        hits = CounterMetricFamily(
            "gpu_agent_prewarm_item_hits",
            "Requests for an item that found it ready in the cache.",
            labels=labels,
        )
        last_used = GaugeMetricFamily(
            "gpu_agent_prewarm_item_last_used_timestamp_seconds",
            "When an item was last requested or warmed (Unix time).",
            labels=labels,
        )
        warm = GaugeMetricFamily(
            "gpu_agent_prewarm_item_warm_seconds",
            "Seconds from the start of the fetch (or pull) to ready.",
            labels=labels,
        )
        for item in inv.items:
            key = [str(item.kind), item.name]
            for s in _COUNTED_STATES:
                state.add_metric([*key, s.value], 1.0 if item.state is s else 0.0)
            if item.size is not None:
                size.add_metric(key, float(item.size))
            hits.add_metric(key, float(item.hits))
            if item.last_used is not None:
                last_used.add_metric(key, item.last_used)
            if item.warm_seconds is not None and item.state is ItemState.READY:
                warm.add_metric(key, item.warm_seconds)
        yield from (state, size, hits, last_used, warm)
        yield from _image_warmth(inv.items)

        cache = GaugeMetricFamily(
            "gpu_agent_prewarm_cache_bytes",
            "File cache bytes by kind: used (ready blobs), reserved (running fetches), pinned, "
            "capacity (min of budget and volume share).",
            labels=["kind"],
        )
        u = inv.usage
        for kind, value in (
            ("used", u.used_bytes),
            ("reserved", u.reserved_bytes),
            ("pinned", u.pinned_bytes),
            ("capacity", u.capacity_bytes),
        ):
            cache.add_metric([kind], float(value))
        yield cache

        pull = GaugeMetricFamily(
            "gpu_agent_prewarm_image_pull_seconds",
            "Duration of the latest CRI pull of an image, cold (absent before) or warm.",
            labels=["image", "cold"],
        )
        latest: dict[tuple[str, str], float] = {}
        for p in inv.pulls:  # the index keeps none of an image no item names
            latest[(p.ref, "true" if p.cold else "false")] = p.seconds
        for (ref, cold), seconds in sorted(latest.items()):
            pull.add_metric([ref, cold], seconds)
        yield pull


def _image_warmth(items: Sequence[CacheItem]) -> Iterator[Metric]:
    """How warm each image is (prewarm.md §2.7: a Nydus pull alone warms only the bootstrap)."""
    ratio = GaugeMetricFamily(
        "gpu_agent_prewarm_image_warm_ratio",
        "Share of an image's layer bytes that are warm (pulled, or data blobs in the node's "
        "Dragonfly cache); 1 when fully warm.",
        labels=["name"],
    )
    warmth = GaugeMetricFamily(
        "gpu_agent_prewarm_image_warmth",
        "1 for the warmth an image is at: full, partial, bootstrap-only or unknown.",
        labels=["name", "warmth"],
    )
    blobs = GaugeMetricFamily(
        "gpu_agent_prewarm_image_blobs",
        "An image's layer blobs: total, and warm.",
        labels=["name", "kind"],
    )
    data = GaugeMetricFamily(
        "gpu_agent_prewarm_image_bytes",
        "An image's layer bytes (compressed, as in the manifest): total, and warm.",
        labels=["name", "kind"],
    )
    for item in items:
        w = item.image_warmth
        if w is None:
            continue
        for word in Warmth:
            warmth.add_metric([item.name, word.value], 1.0 if w.warmth is word else 0.0)
        if w.ratio is None:
            continue
        ratio.add_metric([item.name], w.ratio)
        blobs.add_metric([item.name, "total"], float(w.blobs_total))
        blobs.add_metric([item.name, "warm"], float(w.blobs_warm))
        data.add_metric([item.name, "total"], float(w.bytes_total))
        data.add_metric([item.name, "warm"], float(w.bytes_warm))
    yield from (ratio, warmth, blobs, data)
