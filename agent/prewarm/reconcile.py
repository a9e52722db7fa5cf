"""Reconcile: make the cache directory and the index agree after a crash or a lost index.

The index says what is ready. What is on disk and no row stands on is deleted, except blobs no
row knows at all (the index was lost): those are adopted back or kept aside, never deleted
unseen.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from agent.prewarm.model import CacheItem, ItemKind, ItemState, Layout

if TYPE_CHECKING:
    from agent.prewarm.cache import Cache

__all__ = ["ADOPTED_SOURCE", "reconcile"]

# The cache's one logger name, as before its modules were split: operators' filters keep it.
log = logging.getLogger("agent.prewarm.store")

ADOPTED_SOURCE = "adopted: found in the cache with no index row"
"""``source`` of a ready item rebuilt from a blob and its by-name link (`_adopt_orphans`)."""


def reconcile(store: Cache) -> None:
    """Make disk and index agree after a crash: the index says what is ready.

    Blobs no ready item stands on, model directories of no ready group and partials of
    items no longer fetching (or waiting for a retry) are deleted; a ready item whose blob
    is gone becomes evicted.
    """
    items = store.index.items()
    for item in items:
        if item.state is ItemState.READY and store.blobs(item):
            if any(store.blob_size(sha) is None for sha in store.blobs(item)):
                store.index.update(item.id, state=ItemState.EVICTED)
            else:
                store.missing(item)  # re-makes a lost link or model directory
    _adopt_orphans(store, items)
    items = store.index.items()
    ready = [i for i in items if i.state is ItemState.READY]
    wanted = {sha for i in ready for sha in store.blobs(i)}
    store.sweep(store.blob_dir, wanted, stat.S_IFREG)
    trees = {i.id for i in ready if store.layout(i) is Layout.TREE}
    store.sweep(store.tree_dir, trees, stat.S_IFDIR)
    active = {i.id for i in items if i.state in (ItemState.QUEUED, ItemState.FETCHING)}
    active |= {i.id for i in items if i.state is ItemState.FAILED and i.retry_at is not None}
    with store.open_dir(store.partial_dir) as dfd:
        names = set(os.listdir(dfd))
    store.sweep(store.partial_dir, {n for n in names if n.split(".", 1)[0] in active}, stat.S_IFREG)
    store.sweep(store.name_dir, {i.name for i in ready}, stat.S_IFLNK)


def _adopt_orphans(store: Cache, items: list[CacheItem]) -> None:
    """Blobs no index row knows (the index was lost: a corrupt state database started anew)
    are never deleted unseen: one that verifies and that a by-name link points at becomes a
    ready file of that name again (its source and pin are not known); any other is moved to
    quarantine/ for a person, with a log line."""
    known = {sha for i in items for sha in (*store.blobs(i), i.sha256, i.expected_sha256) if sha}
    known |= {sha for i in items for _, sha, _ in i.members}
    orphans = {b.name: b for b in store.blob_dir.iterdir() if b.name not in known}
    if not orphans:
        return
    names = {i.name for i in items}
    for link in sorted(store.name_dir.iterdir()):
        if link.name in names or not link.is_symlink():
            continue
        target = Path(os.readlink(link))
        sha = target.name
        if target.parent.name != "sha256" or sha not in orphans:
            continue
        blob = orphans[sha]
        size = store.blob_size(sha)  # not a regular file the agent made: quarantined
        if size is None or store.hash_blob(sha) != sha:
            continue  # damaged or planted: kept aside below, never served
        mtime = os.stat(blob, follow_symlinks=False).st_mtime
        store.index.insert(
            CacheItem(
                id=os.urandom(6).hex(),
                kind=ItemKind.FILE,
                name=link.name,
                source=ADOPTED_SOURCE,
                state=ItemState.READY,
                size=size,
                sha256=sha,
                expected_sha256=sha,
                fetched_bytes=size,
                created_at=mtime,
                finished_at=mtime,
            )
        )
        names.add(link.name)
        del orphans[sha]
        log.warning(
            "cache file %s had no index row: adopted as ready item %r (sha256 %s); its "
            "source and pin were lost, pin it again if it must stay",
            blob,
            link.name,
            sha,
        )
    with store.open_dir(store.blob_dir) as dfd:
        left = [sha for sha in sorted(orphans) if store.foreign(dfd, sha, single=False) is None]
        for sha in left:
            with contextlib.suppress(FileNotFoundError):  # quarantined above as not the agent's
                store.quarantine(dfd, sha, store.blob_dir, "a blob no index row or name knows")
    if left:
        log.warning(
            "%d cache file(s) with no index row and no name were moved to %s (not deleted; "
            "remove them once looked at): %s",
            len(left),
            store.quarantine_dir,
            ", ".join(left),
        )
