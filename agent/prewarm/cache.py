"""The cache as its parts see it: `Cache`, the directory with its index and what items stand on.

The parts of the store (partial.py, budget.py, eviction.py, reconcile.py) work on a `Cache`;
`CacheStore` (store.py) is a `Cache` that composes them, so they never import it and the
arrows run one way: store -> parts -> this module -> cachedir.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.prewarm.cachedir import CacheDir
from agent.prewarm.index import PrewarmIndex
from agent.prewarm.inuse import ProcScanner, file_id
from agent.prewarm.model import CacheItem, Layout

__all__ = ["Cache"]


@dataclass(frozen=True, slots=True)
class BlobHolders:
    """``held``: blob sha256 -> the pids holding it open or mapped. ``unsure``: the pids whose
    maps were too long to read whole, in ``held`` for every blob not ruled out. ``cut``: why
    the scan stopped before reading every process (`Holders.cut`); then every blob is held."""

    held: dict[str, set[int]] = field(default_factory=dict)
    unsure: frozenset[int] = frozenset()
    cut: str = ""


class Cache(CacheDir):
    """The cache directory kept consistent with the index: what a ready item stands on."""

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
        import the store, so it is given, never imported)."""
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

    def holders(self, sha256s: Iterable[str]) -> BlobHolders:
        """The pids on the node holding each blob open or mapped (blobs nobody holds are
        absent), and those not ruled out (`Holders.unsure`), counted as holding."""
        ids = {}
        for sha in set(sha256s):
            fid = file_id(self.blob_path(sha))
            if fid is not None:
                ids[fid] = sha
        found = self._scanner.holders(ids)
        held = {ids[fid]: pids for fid, pids in found.held.items()}
        return BlobHolders(held, found.unsure, found.cut)
