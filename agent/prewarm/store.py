"""The content-addressed file cache on disk, and its budget.

Layout under the cache directory::

    blobs/sha256/<hex>      verified content, read-only; the only files pods should read
    by-name/<name>          symlink to a blob, the stable path a pod mounts
    partial/<id>.part       bytes of a running fetch, with <id>.json (resume validators)

A fetch writes only under partial/. `CacheStore.commit` verifies the sha256, fsyncs, renames into
blobs/ and then links the name, so a final path never holds partial or unverified bytes.
The budget counts the cache alone (distinct ready blobs plus sizes reserved by running fetches),
capped by ``max_volume_share`` of the volume, and evicts least recently used unpinned blobs
that no process on the node holds open or mapped (agent.prewarm.inuse).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import Busy, Conflict
from agent.prewarm.errors import DigestMismatch, DiskFull
from agent.prewarm.index import PrewarmIndex
from agent.prewarm.inuse import ProcScanner, file_id
from agent.prewarm.model import CacheItem, ItemKind, ItemState

log = logging.getLogger(__name__)

_CHUNK = 4 * 1024 * 1024
_HASH_BACKLOG = 32  # chunks queued for the hasher thread before the writer waits
_WRITEBACK_BYTES = 32 * 1024 * 1024


def _load_sync_file_range() -> Callable[[int, int, int], None]:
    """Linux sync_file_range(SYNC_FILE_RANGE_WRITE): start writeback without waiting for it.

    Starting writeback as bytes arrive lets the disk work while the network does, so the fsync
    before the rename finds little left to flush (it took 1.7 s of a 3 s 1 GiB fetch without).
    Elsewhere it is a no-op and fsync does all the work.
    """
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return lambda fd, offset, length: None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    write_flag = 2  # SYNC_FILE_RANGE_WRITE

    def start_writeback(fd: int, offset: int, length: int) -> None:
        fn(fd, offset, length, write_flag)  # advisory: a failure only leaves work for fsync

    return start_writeback


_start_writeback = _load_sync_file_range()


class _Hasher:
    """sha256 on its own thread, in write order, so hashing overlaps the network read.

    hashlib releases the GIL on large updates, so this runs in parallel with the socket reads.
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prewarm-sha256")
        self._pending: deque[Future[None]] = deque()

    def update(self, data: bytes) -> None:
        self._pending.append(self._pool.submit(self._hash.update, data))
        while len(self._pending) > _HASH_BACKLOG:
            self._pending.popleft().result()

    def hexdigest(self) -> str:
        while self._pending:
            self._pending.popleft().result()
        return self._hash.hexdigest()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True, slots=True)
class Usage:
    """Bytes the cache holds and may hold; ``capacity`` = min(budget, share * volume)."""

    used_bytes: int
    reserved_bytes: int
    pinned_bytes: int
    capacity_bytes: int
    budget_bytes: int
    volume_bytes: int


class Partial:
    """The temp file of one fetch; hashes as it appends and survives a restart for resume."""

    def __init__(self, store: CacheStore, item_id: str) -> None:
        self._store = store
        self.item_id = item_id
        self.path = store.partial_dir / f"{item_id}.part"
        self._meta_path = store.partial_dir / f"{item_id}.json"
        self._hash = _Hasher()
        self._sequential = True
        self.limit: int | None = None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._file = os.fdopen(fd, "r+b", buffering=0)
        self.offset = self._rehash()
        self._written_back = self.offset

    def _rehash(self) -> int:
        # hashlib state cannot be saved, so a resumed fetch re-reads what it already has: a
        # local read at disk speed instead of a download from zero.
        self._file.seek(0)
        done = 0
        while chunk := self._file.read(_CHUNK):
            self._hash.update(chunk)
            done += len(chunk)
        return done

    @property
    def validators(self) -> dict[str, Any]:
        """What the origin said about the bytes so far (ETag, Last-Modified, total)."""
        try:
            data = json.loads(self._meta_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def save_validators(self, data: dict[str, Any]) -> None:
        tmp = self._meta_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._meta_path)

    def admit(self, total: int | None) -> None:
        """Reserve ``total`` bytes in the budget (evicting if needed) before any body byte."""
        self.limit = self._store.admit(self.item_id, total, on_disk=self.offset)

    def restart(self) -> None:
        """Drop the bytes so far: the origin cannot resume or its content changed."""
        self._file.seek(0)
        self._file.truncate()
        self._hash.close()
        self._hash = _Hasher()
        self._sequential = True
        self.offset = 0
        self._written_back = 0

    def write(self, data: bytes | memoryview) -> None:
        """Append; raises when the bytes would pass the admitted size or the disk is full."""
        if self.limit is not None and self.offset + len(data) > self.limit:
            raise Conflict(
                f"origin sent more than the {self.limit} bytes admitted for this item; refusing"
            )
        chunk = bytes(data)  # the caller reuses its buffer; the hasher needs its own copy
        self._write(chunk, self.offset)
        self._hash.update(chunk)
        self.offset += len(chunk)
        if self.offset - self._written_back >= _WRITEBACK_BYTES:
            _start_writeback(
                self._file.fileno(), self._written_back, self.offset - self._written_back
            )
            self._written_back = self.offset

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        """Write a piece at its offset (pieces from a P2P peer arrive in any order)."""
        if self.limit is not None and offset + len(data) > self.limit:
            raise Conflict(f"piece at {offset} passes the {self.limit} bytes admitted")
        self._write(data, offset)
        self._sequential = False
        self.offset = max(self.offset, offset + len(data))

    def _write(self, data: bytes | memoryview, offset: int) -> None:
        try:
            view = memoryview(data)
            while view:
                written = os.pwrite(self._file.fileno(), view, offset)
                view, offset = view[written:], offset + written
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"cache volume full while writing ({self._store.root})") from exc
            raise

    def sha256(self) -> str:
        if not self._sequential:
            self._hash.close()
            self._hash = _Hasher()
            self._sequential = True
            self._rehash()
        return self._hash.hexdigest()

    def sync(self) -> None:
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._hash.close()
        self._file.close()


class CacheStore:
    """Owns the cache directory and keeps it consistent with the index."""

    def __init__(
        self,
        root: Path,
        index: PrewarmIndex,
        budget_bytes: int,
        max_volume_share: float,
        statvfs: Callable[[Path], os.statvfs_result] = os.statvfs,
        scanner: ProcScanner | None = None,
    ) -> None:
        self.root = root
        self._scanner = scanner or ProcScanner()
        self.index = index
        self.budget_bytes = budget_bytes
        self.max_volume_share = max_volume_share
        self._statvfs = statvfs
        self.blob_dir = root / "blobs" / "sha256"
        self.partial_dir = root / "partial"
        self.name_dir = root / "by-name"
        for d in (self.blob_dir, self.partial_dir, self.name_dir):
            d.mkdir(parents=True, exist_ok=True)

    def blob_path(self, sha256: str) -> Path:
        return self.blob_dir / sha256

    def name_path(self, name: str) -> Path:
        return self.name_dir / name

    # -- readiness and use --------------------------------------------------------------------

    def missing(self, item: CacheItem, verify_digest: bool = False) -> str | None:
        """Why a ready file is not what its row claims (None when it is): the blob must be on
        disk with the recorded size and, with ``verify_digest``, hash to its sha256. A lost
        by-name link is only re-made."""
        if not item.sha256:
            return "no digest recorded"
        blob = self.blob_path(item.sha256)
        try:
            size = blob.stat().st_size
        except FileNotFoundError:
            return f"blob sha256:{item.sha256} is missing from {self.blob_dir}"
        if item.size is not None and size != item.size:
            return f"blob sha256:{item.sha256} has {size} bytes, not {item.size}"
        if verify_digest and _hash_file(blob) != item.sha256:
            return f"blob sha256:{item.sha256} no longer hashes to its digest"
        if os.path.realpath(self.name_path(item.name)) != os.path.realpath(blob):
            self.link_name(item.name, item.sha256)
        return None

    def holders(self, sha256s: Iterable[str]) -> dict[str, set[int]]:
        """The pids on the node holding each blob open or mapped; blobs nobody holds are absent."""
        ids = {}
        for sha in set(sha256s):
            fid = file_id(self.blob_path(sha))
            if fid is not None:
                ids[fid] = sha
        return {ids[fid]: pids for fid, pids in self._scanner.holders(ids).items()}

    def discard_blob(self, sha256: str) -> list[str]:
        """Drop a blob that is not what its name claims (wrong size or digest, or gone), with
        every ready item naming it; no in-use check, as its bytes are not the item's."""
        with self.index.transaction():
            _, names = self._mark_evicted(sha256)
        self._remove_blob(sha256, names)
        return names

    def remove_link(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.name_path(name).unlink()

    # -- budget -------------------------------------------------------------------------------

    def usage(self, exclude: str | None = None) -> Usage:
        files = [i for i in self.index.items() if i.kind is ItemKind.FILE]
        ready: dict[str, int] = {}
        pinned: dict[str, int] = {}
        for item in files:
            if item.state is ItemState.READY and item.sha256 and item.size is not None:
                ready[item.sha256] = item.size
                if item.pinned:
                    pinned[item.sha256] = item.size
        reserved = sum(
            i.size or 0 for i in files if i.state is ItemState.FETCHING and i.id != exclude
        )
        st = self._statvfs(self.root)
        volume = st.f_blocks * st.f_frsize
        return Usage(
            used_bytes=sum(ready.values()),
            reserved_bytes=reserved,
            pinned_bytes=sum(pinned.values()),
            capacity_bytes=min(self.budget_bytes, int(volume * self.max_volume_share)),
            budget_bytes=self.budget_bytes,
            volume_bytes=volume,
        )

    def admit(self, item_id: str, total: int | None, on_disk: int = 0) -> int:
        """Make room for ``total`` bytes of ``item_id``; returns the byte limit of the fetch.

        Raises Conflict, naming the numbers, when the item cannot fit even after evicting every
        unpinned blob, or when the volume lacks the free space. With ``total`` unknown (a
        chunked response) the limit is what fits now without evicting.
        """
        with self.index.transaction():
            use = self.usage(exclude=item_id)
            taken = use.used_bytes + use.reserved_bytes
            if total is None:
                limit = max(use.capacity_bytes - taken, 0)
                self.index.update(item_id, size=None)
                return limit
            if total > use.capacity_bytes:
                raise Conflict(
                    f"item needs {total} bytes but the cache capacity is {use.capacity_bytes} "
                    f"(budget {use.budget_bytes}, {self.max_volume_share:g} of the "
                    f"{use.volume_bytes}-byte volume)"
                )
            need = taken + total - use.capacity_bytes
            victims = self._victims(need) if need > 0 else []
            if need > 0 and sum(size for _, size in victims) < need:
                raise Conflict(
                    f"item needs {total} bytes; the cache holds {use.used_bytes} "
                    f"({use.pinned_bytes} pinned) and {use.reserved_bytes} reserved by running "
                    f"fetches, capacity {use.capacity_bytes}; unpin or evict items first"
                )
            st = self._statvfs(self.root)
            free = st.f_bavail * st.f_frsize + sum(size for _, size in victims)
            if total - on_disk > free:
                raise Conflict(
                    f"item needs {total - on_disk} more bytes but the cache volume has {free} free"
                )
            evicted = [self._mark_evicted(sha) for sha, _ in victims]
            self.index.update(item_id, size=total)
        for sha, names in evicted:
            self._remove_blob(sha, names)
        return total

    def _victims(self, need: int) -> list[tuple[str, int]]:
        """Least recently used unpinned blobs whose sizes add up to ``need`` (or all of them)."""
        groups: dict[str, list[CacheItem]] = {}
        for item in self.index.items([ItemState.READY]):
            if item.kind is ItemKind.FILE and item.sha256:
                groups.setdefault(item.sha256, []).append(item)
        held = self.holders(groups)

        def last_use(items: list[CacheItem]) -> float:
            return max((i.last_used or i.finished_at or 0.0) for i in items)

        chosen: list[tuple[str, int]] = []
        freed = 0
        for sha, items in sorted(groups.items(), key=lambda kv: last_use(kv[1])):
            if freed >= need:
                break
            if any(i.pinned for i in items) or sha in held:
                continue
            size = items[0].size or 0
            chosen.append((sha, size))
            freed += size
        return chosen

    # -- commit and eviction ------------------------------------------------------------------

    def partial(self, item_id: str) -> Partial:
        return Partial(self, item_id)

    def discard_partial(self, item_id: str) -> None:
        for suffix in (".part", ".json", ".json.tmp"):
            with contextlib.suppress(FileNotFoundError):
                (self.partial_dir / f"{item_id}{suffix}").unlink()

    def commit(self, item: CacheItem, partial: Partial) -> str:
        """Verify and move the partial to its blob path, link the name; return the sha256.

        On a digest mismatch the partial is deleted and nothing appears at a final path.
        """
        digest = partial.sha256()
        if item.expected_sha256 and digest != item.expected_sha256:
            partial.close()
            self.discard_partial(item.id)
            raise DigestMismatch(
                f"sha256 mismatch for {item.name}: expected {item.expected_sha256}, got {digest}"
            )
        partial.sync()
        partial.close()
        blob = self.blob_path(digest)
        if blob.exists():
            partial.path.unlink()
        else:
            os.chmod(partial.path, 0o444)
            os.replace(partial.path, blob)
            _fsync_dir(self.blob_dir)
        self.discard_partial(item.id)
        self.link_name(item.name, digest)
        return digest

    def link_name(self, name: str, sha256: str) -> None:
        """Point by-name/<name> at the blob, replacing any old link atomically."""
        tmp = self.name_dir / f".{name}.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(Path("..", "blobs", "sha256", sha256), tmp)
        os.replace(tmp, self.name_path(name))
        _fsync_dir(self.name_dir)

    def evict(self, sha256: str) -> list[str]:
        """Evict a blob and every ready item naming it; returns the item names.

        Refused (Busy, naming the pids) while a process holds the blob open or mapped.
        """
        pids = self.holders([sha256]).get(sha256)
        if pids:
            listed = ", ".join(str(p) for p in sorted(pids))
            raise Busy(
                f"blob sha256:{sha256} is open or mapped by process(es) {listed}; not evicted",
                [str(p) for p in sorted(pids)],
            )
        with self.index.transaction():
            _, names = self._mark_evicted(sha256)
        self._remove_blob(sha256, names)
        return names

    def _mark_evicted(self, sha256: str) -> tuple[str, list[str]]:
        names = []
        for item in self.index.ready_with_digest(sha256):
            self.index.update(item.id, state=ItemState.EVICTED)
            names.append(item.name)
        return sha256, names

    def _remove_blob(self, sha256: str, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                self.name_path(name).unlink()
        with contextlib.suppress(FileNotFoundError):
            self.blob_path(sha256).unlink()
        log.info("evicted blob sha256:%s (%s)", sha256, ", ".join(names))

    def reconcile(self) -> None:
        """Make disk and index agree after a crash: the index says what is ready.

        Blobs no ready item names and partials of items no longer fetching are deleted; a ready
        item whose blob is gone becomes evicted.
        """
        items = self.index.items()
        wanted = {i.sha256 for i in items if i.state is ItemState.READY and i.sha256}
        for item in items:
            if item.state is ItemState.READY and item.sha256:
                if not self.blob_path(item.sha256).exists():
                    self.index.update(item.id, state=ItemState.EVICTED)
                elif not self.name_path(item.name).is_symlink():
                    self.link_name(item.name, item.sha256)
        for blob in self.blob_dir.iterdir():
            if blob.name not in wanted:
                blob.unlink()
        active = {i.id for i in items if i.state in (ItemState.QUEUED, ItemState.FETCHING)}
        active |= {i.id for i in items if i.state is ItemState.FAILED and i.retry_at is not None}
        for path in self.partial_dir.iterdir():
            if path.name.split(".", 1)[0] not in active:
                path.unlink()
        ready_names = {i.name for i in items if i.state is ItemState.READY}
        for link in self.name_dir.iterdir():
            if link.name not in ready_names:
                link.unlink()


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
