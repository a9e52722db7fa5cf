"""The content-addressed file cache: `CacheStore`, the one object the prewarm service uses.

It keeps the cache directory (agent/prewarm/cachedir.py: its layout, and never a file the agent
did not make) consistent with the index (agent/prewarm/index.py). It is a `Cache`
(agent/prewarm/cache.py: what a ready item stands on) that composes the parts, each with its
reason to change: a running fetch's bytes (partial.py), the budget (budget.py), eviction
(eviction.py), squaring disk and index after a crash (reconcile.py). The parts work on the
`Cache` and never import this module. Here: commit.

A fetch writes only under partial/. `CacheStore.commit` verifies the sha256, fsyncs, renames into
blobs/ and then links the name, so a final path never holds partial or unverified bytes.
"""

from __future__ import annotations

import os

from agent.durable import fsync_dir
from agent.prewarm import budget, eviction
from agent.prewarm import reconcile as reconciling
from agent.prewarm.budget import Usage
from agent.prewarm.cache import Cache
from agent.prewarm.errors import DigestMismatch
from agent.prewarm.model import CacheItem
from agent.prewarm.partial import Partial

__all__ = ["CacheStore"]


class CacheStore(Cache):
    """Owns the cache directory and keeps it consistent with the index."""

    # -- budget and eviction (agent/prewarm/budget.py, agent/prewarm/eviction.py) -------------

    def usage(self, exclude: str | None = None) -> Usage:
        self.make_layout()  # the volume's size is read from the root: it must be there
        return budget.usage(self, exclude)

    def admit(self, item_id: str, total: int | None, on_disk: int = 0) -> int:
        """Make room for ``total`` bytes of ``item_id``; returns the byte limit of the fetch
        (`budget.admit` says when it is refused)."""
        self.make_layout()
        return budget.admit(self, item_id, total, on_disk)

    def evict(self, sha256: str) -> list[str]:
        """Evict a blob and every ready file naming it; returns the item names."""
        return eviction.evict(self, sha256)

    def evict_group(self, item: CacheItem) -> None:
        eviction.evict_group(self, item)

    def discard_item(self, item: CacheItem) -> None:
        """Drop a ready item found not to be what it claims (a blob gone or wrong)."""
        eviction.discard_item(self, item)

    def reconcile(self) -> None:
        """Make disk and index agree after a crash (agent/prewarm/reconcile.py)."""
        reconciling.reconcile(self)

    # -- commit -------------------------------------------------------------------------------

    def partial(self, item_id: str) -> Partial:
        self.make_layout()  # a fetch starts in partial/, made again if a wipe took it
        return Partial(self, item_id)

    def commit(self, item: CacheItem, partial: Partial) -> str:
        """Verify and move the partial to its blob path, link the name; return the sha256.

        On a digest mismatch the partial is deleted and nothing appears at a final path.
        """
        digest = self.commit_blob(partial, item.expected_sha256)
        self.link_name(item.name, digest)
        return digest

    def commit_blob(self, partial: Partial, expected: str | None, member: str = "") -> str:
        """Verify the partial against ``expected`` and move it to its blob path (no name).
        A mismatch names the ``member`` of a group; an item's own name is its row's already."""
        digest = partial.sha256()
        if expected and digest != expected:
            partial.close()
            self.discard_partial(partial.item_id)
            of = f" for {member}" if member else ""
            raise DigestMismatch(f"sha256 mismatch{of}: expected {expected}, got {digest}")
        partial.sync()
        if self.blob_size(digest) is None:  # absent, or a planted link now in quarantine
            partial.seal()
            partial.close()
            with self.open_dir(self.partial_dir) as pfd, self.open_dir(self.blob_dir) as bfd:
                os.replace(partial.path.name, digest, src_dir_fd=pfd, dst_dir_fd=bfd)
            fsync_dir(self.blob_dir)
        else:
            partial.close()
        self.discard_partial(partial.item_id)
        return digest
