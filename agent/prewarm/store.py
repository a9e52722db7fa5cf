"""The content-addressed file cache: `CacheStore`, the one object the prewarm service uses.

It keeps the cache directory (agent/prewarm/cachedir.py: its layout, and never a file the agent
did not make) consistent with the index (agent/prewarm/index.py). Each reason to change has its
module beside this one: a running fetch's bytes (partial.py), the budget (budget.py), eviction
(eviction.py), squaring disk and index after a crash (reconcile.py). Here: what a ready item
stands on, and commit.

A fetch writes only under partial/. `CacheStore.commit` verifies the sha256, fsyncs, renames into
blobs/ and then links the name, so a final path never holds partial or unverified bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.prewarm import budget, eviction
from agent.prewarm import reconcile as reconciling
from agent.prewarm.budget import Usage
from agent.prewarm.cachedir import CacheDir, fsync_dir
from agent.prewarm.errors import DigestMismatch
from agent.prewarm.index import PrewarmIndex
from agent.prewarm.inuse import ProcScanner, file_id
from agent.prewarm.model import CacheItem, Layout
from agent.prewarm.partial import Partial

__all__ = ["CacheStore"]


class CacheStore(CacheDir):
    """Owns the cache directory and keeps it consistent with the index."""

    def __init__(
        self,
        root: Path,
        index: PrewarmIndex,
        budget_bytes: int,
        max_volume_share: float,
        statvfs: Callable[[Path], os.statvfs_result] = os.statvfs,
        scanner: ProcScanner | None = None,
        *,
        layout_of: Callable[[str], Layout],
    ) -> None:
        """``layout_of``: a stored kind's `Layout` (`kinds.layout_of`; the registry's kinds
        import this module, so it is given, never imported)."""
        self._layout_of = layout_of
        self._scanner = scanner or ProcScanner()
        self.index = index
        self.budget_bytes = budget_bytes
        self.max_volume_share = max_volume_share
        self.statvfs = statvfs
        super().__init__(root)

    # -- what an item stands on --------------------------------------------------------------

    def layout(self, item: CacheItem) -> Layout:
        """Where ``item``'s kind keeps a ready item."""
        return self._layout_of(item.kind)

    def blobs(self, item: CacheItem) -> dict[str, int]:
        """sha256 -> size of the blobs a ready file or group stands on ({} for others)."""
        return item.blobs(self.layout(item))

    def on_blob(self, sha256: str) -> list[CacheItem]:
        """The ready items that are the one blob ``sha256`` (every name on it)."""
        return [i for i in self.index.ready_with_sha256(sha256) if self.layout(i) is Layout.BLOB]

    # -- readiness and use --------------------------------------------------------------------

    def missing(self, item: CacheItem, verify_digest: bool = False) -> str | None:
        """Why a ready file or group is not what its row claims (None when it is): every blob
        on disk with its recorded size and, with ``verify_digest``, hashing to its sha256. A
        lost by-name link or model directory is only re-made."""
        blobs = self.blobs(item)
        if not blobs:
            return "no digest recorded"
        for sha, recorded in blobs.items():
            size = self.blob_size(sha)
            if size is None:
                return f"blob sha256:{sha} is missing from {self.blob_dir}"
            if size != recorded and (self.layout(item) is Layout.TREE or item.size is not None):
                return f"blob sha256:{sha} has {size} bytes, not {recorded}"
            if verify_digest and self.hash_blob(sha) != sha:
                return f"blob sha256:{sha} no longer hashes to its digest"
        if self.layout(item) is Layout.TREE:
            if not self._tree_intact(item):
                self.link_tree(item.name, item.id, [(p, s) for p, s, _ in item.members])
        elif os.path.realpath(self.name_path(item.name)) != os.path.realpath(
            self.blob_path(item.sha256 or "")
        ):
            self.link_name(item.name, item.sha256 or "")
        return None

    def _tree_intact(self, item: CacheItem) -> bool:
        tree = self.tree_path(item.id)
        if os.path.realpath(self.name_path(item.name)) != os.path.realpath(tree):
            return False
        return all(
            os.path.realpath(tree / path) == os.path.realpath(self.blob_path(sha))
            for path, sha, _ in item.members
        )

    def holders(self, sha256s: Iterable[str]) -> dict[str, set[int]]:
        """The pids on the node holding each blob open or mapped; blobs nobody holds are absent."""
        ids = {}
        for sha in set(sha256s):
            fid = file_id(self.blob_path(sha))
            if fid is not None:
                ids[fid] = sha
        return {ids[fid]: pids for fid, pids in self._scanner.holders(ids).items()}

    # -- budget and eviction (agent/prewarm/budget.py, agent/prewarm/eviction.py) -------------

    def usage(self, exclude: str | None = None) -> Usage:
        return budget.usage(self, exclude)

    def admit(self, item_id: str, total: int | None, on_disk: int = 0) -> int:
        """Make room for ``total`` bytes of ``item_id``; returns the byte limit of the fetch
        (`budget.admit` says when it is refused)."""
        return budget.admit(self, item_id, total, on_disk)

    def evict(self, sha256: str) -> list[str]:
        """Evict a blob and every ready file naming it; returns the item names."""
        return eviction.evict(self, sha256)

    def evict_group(self, item: CacheItem) -> None:
        eviction.evict_group(self, item)

    def discard_blob(self, sha256: str) -> list[str]:
        """Drop a blob that is not what its name claims, with every ready item on it."""
        return eviction.discard_blob(self, sha256)

    def discard_item(self, item: CacheItem) -> None:
        """Drop a ready item found not to be what it claims (a blob gone or wrong)."""
        eviction.discard_item(self, item)

    def reconcile(self) -> None:
        """Make disk and index agree after a crash (agent/prewarm/reconcile.py)."""
        reconciling.reconcile(self)

    # -- commit -------------------------------------------------------------------------------

    def partial(self, item_id: str) -> Partial:
        return Partial(self, item_id)

    def commit(self, item: CacheItem, partial: Partial) -> str:
        """Verify and move the partial to its blob path, link the name; return the sha256.

        On a digest mismatch the partial is deleted and nothing appears at a final path.
        """
        digest = self.commit_blob(partial, item.expected_sha256, item.name)
        self.link_name(item.name, digest)
        return digest

    def commit_blob(self, partial: Partial, expected: str | None, what: str) -> str:
        """Verify the partial against ``expected`` and move it to its blob path (no name)."""
        digest = partial.sha256()
        if expected and digest != expected:
            partial.close()
            self.discard_partial(partial.item_id)
            raise DigestMismatch(f"sha256 mismatch for {what}: expected {expected}, got {digest}")
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
