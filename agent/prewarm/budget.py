"""The cache's budget: how many bytes it holds and may hold, and making room for a fetch.

The budget counts the cache alone (distinct ready blobs plus sizes reserved by running
fetches), capped by ``max_volume_share`` of the volume. A fetch is admitted before its first
body byte; room is made by evicting the least recently used unpinned units that no process on
the node holds open or mapped (agent/prewarm/eviction.py, agent.prewarm.inuse).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.errors import Conflict
from agent.prewarm.eviction import Unit, mark_evicted, remove
from agent.prewarm.model import ItemState, Layout

if TYPE_CHECKING:
    from agent.prewarm.cache import Cache

__all__ = ["Usage", "admit", "usage"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Bytes the cache holds and may hold; ``capacity`` = min(budget, share * volume)."""

    used_bytes: int
    reserved_bytes: int
    pinned_bytes: int
    capacity_bytes: int
    budget_bytes: int
    volume_bytes: int


def usage(store: Cache, exclude: str | None = None) -> Usage:
    items = store.index.items()
    ready: dict[str, int] = {}
    pinned: dict[str, int] = {}
    for item in items:
        if item.state is ItemState.READY:
            ready.update(store.blobs(item))
            if item.pinned:
                pinned.update(store.blobs(item))
    reserved = sum(
        i.size or 0
        for i in items
        if store.layout(i) is not Layout.RUNTIME
        and i.state is ItemState.FETCHING
        and i.id != exclude
    )
    st = store.statvfs(store.root)
    volume = st.f_blocks * st.f_frsize
    return Usage(
        used_bytes=sum(ready.values()),
        reserved_bytes=reserved,
        pinned_bytes=sum(pinned.values()),
        capacity_bytes=min(store.budget_bytes, int(volume * store.max_volume_share)),
        budget_bytes=store.budget_bytes,
        volume_bytes=volume,
    )


def admit(store: Cache, item_id: str, total: int | None, on_disk: int = 0) -> int:
    """Make room for ``total`` bytes of ``item_id``; returns the byte limit of the fetch.

    Raises Conflict, naming the numbers, when the item cannot fit even after evicting every
    unpinned item no process holds, or when the volume lacks the free space. With ``total``
    unknown (a chunked response) the limit is what fits now without evicting.
    """
    with store.index.transaction():
        use = usage(store, exclude=item_id)
        taken = use.used_bytes + use.reserved_bytes
        if total is None:
            limit = max(use.capacity_bytes - taken, 0)
            store.index.update(item_id, size=None)
            return limit
        if total > use.capacity_bytes:
            raise Conflict(
                f"item needs {total} bytes but the cache capacity is {use.capacity_bytes} "
                f"(budget {use.budget_bytes}, {store.max_volume_share:g} of the "
                f"{use.volume_bytes}-byte volume)"
            )
        need = taken + total - use.capacity_bytes
        victims, cut = _victims(store, need) if need > 0 else ([], "")
        freed = sum(sum(u.blobs.values()) for u in victims)
        if need > 0 and freed < need:
            # A cut scan held every blob: that, not the items, is what to fix.
            unsure = f"; no item was evicted: the in-use scan stopped ({cut})" if cut else ""
            raise Conflict(
                f"item needs {total} bytes; the cache holds {use.used_bytes} "
                f"({use.pinned_bytes} pinned) and {use.reserved_bytes} reserved by running "
                f"fetches, capacity {use.capacity_bytes}; unpin or evict items first "
                f"(items in use are not evicted){unsure}"
            )
        st = store.statvfs(store.root)
        free = st.f_bavail * st.f_frsize + freed
        if total - on_disk > free:
            raise Conflict(
                f"item needs {total - on_disk} more bytes but the cache volume has {free} free"
            )
        evicted = [mark_evicted(store, u.items) for u in victims]
        store.index.update(item_id, size=total)
    for unit in evicted:
        remove(store, unit)
    return total


def _units(store: Cache) -> list[Unit]:
    by_sha: dict[str, Unit] = {}
    units: list[Unit] = []
    for item in store.index.items([ItemState.READY]):
        if store.layout(item) is Layout.BLOB and item.sha256:
            unit = by_sha.setdefault(item.sha256, Unit([], dict(store.blobs(item))))
            if not unit.items:
                units.append(unit)
            unit.items.append(item)
        elif store.layout(item) is Layout.TREE:
            units.append(Unit([item], store.blobs(item)))
    return units


def _victims(store: Cache, need: int) -> tuple[list[Unit], str]:
    """Least recently used units, unpinned and held by no process, whose blobs (those no
    other unit stands on) add up to ``need`` (or all of them); and why the in-use scan
    stopped ("" when it read every process)."""
    units = _units(store)
    found = store.holders(sha for u in units for sha in u.blobs)
    held = found.held

    def last_use(unit: Unit) -> float:
        return max((i.last_used or i.finished_at or 0.0) for i in unit.items)

    chosen: list[Unit] = []
    freed = 0
    for unit in sorted(units, key=last_use):
        if freed >= need:
            break
        if any(i.pinned for i in unit.items) or any(sha in held for sha in unit.blobs):
            continue
        others = {sha for u in units if u is not unit for sha in u.blobs}
        own = {sha: size for sha, size in unit.blobs.items() if sha not in others}
        chosen.append(Unit(unit.items, own))
        freed += sum(own.values())
    return chosen, found.cut
