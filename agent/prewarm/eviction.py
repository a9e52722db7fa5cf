"""Eviction: what leaves the cache together, and removing it from the index and the disk.

A unit (`Unit`) is what goes at once: the ready files sharing one blob, or one ready group. An
item is marked evicted in the index inside the caller's transaction, then its links and the
blobs no ready item still stands on are deleted outside it. A blob a process on the node holds
open or mapped is never evicted on request (agent.prewarm.inuse).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.errors import Busy
from agent.prewarm.model import CacheItem, ItemState, Layout

if TYPE_CHECKING:
    from agent.prewarm.cache import Cache

__all__ = [
    "Unit",
    "discard_blob",
    "discard_item",
    "evict",
    "evict_group",
    "mark_evicted",
    "remove",
]

# The cache's one logger name, as before its modules were split: operators' filters keep it.
log = logging.getLogger("agent.prewarm.store")


@dataclass(slots=True)
class Unit:
    """What eviction removes together: the ready files sharing one blob, or one ready group."""

    items: list[CacheItem]
    blobs: dict[str, int]


def evict(store: Cache, sha256: str) -> list[str]:
    """Evict a blob and every ready file naming it; returns the item names.

    Refused (Busy, naming the pids) while a process holds the blob open or mapped; a group
    standing on the same blob keeps it.
    """
    _refuse_held(store, [sha256])
    with store.index.transaction():
        unit = mark_evicted(store, store.on_blob(sha256))
    remove(store, unit)
    return [i.name for i in unit.items]


def evict_group(store: Cache, item: CacheItem) -> None:
    """Evict a ready group: its model directory, and the blobs nothing else stands on."""
    _refuse_held(store, store.blobs(item))
    with store.index.transaction():
        unit = mark_evicted(store, [store.index.get(item.id)])
    remove(store, unit)


def discard_blob(store: Cache, sha256: str) -> list[str]:
    """Drop a blob that is not what its name claims (wrong size or digest, or gone), with
    every ready item standing on it; no in-use check, as its bytes are not the item's."""
    with store.index.transaction():
        unit = mark_evicted(store, _standing_on(store, sha256))
    remove(store, unit, force={sha256})
    return [i.name for i in unit.items]


def discard_item(store: Cache, item: CacheItem) -> None:
    """Drop a ready item found not to be what it claims (a blob gone or wrong): a file's
    blob goes with every name on it; a group loses its directory and blobs no one else uses."""
    if store.layout(item) is Layout.BLOB and item.sha256:
        discard_blob(store, item.sha256)
    elif store.layout(item) is Layout.TREE:
        with store.index.transaction():
            unit = mark_evicted(store, [store.index.get(item.id)])
        remove(store, unit)


def _refuse_held(store: Cache, sha256s: Iterable[str]) -> None:
    found = store.holders(sha256s)
    held = found.held
    pids = sorted({p for ps in held.values() for p in ps})
    if pids or found.cut:  # a cut scan holds every blob, by pids it may not name
        seen = [p for p in pids if p not in found.unsure]
        unsure = [p for p in pids if p in found.unsure]
        why = [f"open or mapped by process(es) {_listed(seen)}"] if seen else []
        if unsure:
            why.append(
                f"not ruled out for process(es) {_listed(unsure)}, whose memory maps are "
                "longer than the agent reads"
            )
        if found.cut:
            why.append(
                f"not ruled out for the processes the agent did not read: its scan stopped "
                f"({found.cut})"
            )
        raise Busy(
            f"blob(s) {', '.join(f'sha256:{s}' for s in sorted(held))} {'; '.join(why)}; "
            "not evicted",
            [str(p) for p in pids],
        )


def _listed(pids: Iterable[int]) -> str:
    return ", ".join(str(p) for p in pids)


def _standing_on(store: Cache, sha256: str) -> list[CacheItem]:
    return [i for i in store.index.items([ItemState.READY]) if sha256 in store.blobs(i)]


def mark_evicted(store: Cache, items: Iterable[CacheItem]) -> Unit:
    unit = Unit([], {})
    for item in items:
        if item.state is ItemState.READY:
            store.index.update(item.id, state=ItemState.EVICTED)
            unit.items.append(item)
            unit.blobs.update(store.blobs(item))
    return unit


def remove(store: Cache, unit: Unit, force: Iterable[str] = ()) -> None:
    """Delete the links and model directories of evicted items, and their blobs that no
    ready item still stands on (``force``: delete those blobs whatever stands on them)."""
    for item in unit.items:
        store.remove_link(item.name)
        if store.layout(item) is Layout.TREE:
            store.remove_tree(item.id)
    still = {sha for i in store.index.items([ItemState.READY]) for sha in store.blobs(i)}
    gone = [sha for sha in unit.blobs if sha not in still or sha in set(force)]
    for sha in gone:
        store.remove_blob(sha)
    log.info(
        "evicted %s (blobs %s)",
        ", ".join(i.name for i in unit.items) or "nothing",
        ", ".join(f"sha256:{s[:12]}" for s in gone) or "kept",
    )
