"""The content-addressed file cache on disk, and its budget.

Layout under the cache directory::

    blobs/sha256/<hex>      verified content, read-only; the only files pods should read
    by-name/<name>          symlink to a blob (a file) or to trees/<id> (a group), the stable
                            path a pod mounts
    trees/<id>/<path>       a group's model directory: relative symlinks to its blobs
    partial/<id>.part       bytes of a running fetch, with <id>.json (resume validators);
                            <id>.dfpart: dfdaemon's task file hard-linked in (dragonfly_output)
    quarantine/             whatever the agent found in its place and did not make (below)

Anything that can write the cache's host path is not trusted, so the cache never follows a link
it did not make: files are opened with O_NOFOLLOW relative to a directory opened with
O_NOFOLLOW, a blob or partial must be a regular file (a partial also singly linked, as a hard
link to a file outside would be truncated with it), and a subdirectory must be a directory.
Anything else found in their place is moved into quarantine/ (renamed, never followed or
deleted) and logged; the item is then fetched again. Cleanup deletes only inside these
directories, opened the same way.

A fetch writes only under partial/. `CacheStore.commit` verifies the sha256, fsyncs, renames into
blobs/ and then links the name, so a final path never holds partial or unverified bytes.
The budget counts the cache alone (distinct ready blobs plus sizes reserved by running fetches),
capped by ``max_volume_share`` of the volume, and evicts least recently used unpinned blobs
that no process on the node holds open or mapped (agent.prewarm.inuse).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import Busy, Conflict
from agent.prewarm.errors import DigestMismatch, DiskFull, FetchFailed
from agent.prewarm.index import PrewarmIndex
from agent.prewarm.inuse import ProcScanner, file_id
from agent.prewarm.model import CacheItem, ItemKind, ItemState, Layout

log = logging.getLogger(__name__)

_CHUNK = 4 * 1024 * 1024
_HASH_BACKLOG = 32  # chunks queued for the hasher thread before the writer waits
_FLUSH_BYTES = 64 * 1024 * 1024
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class _Flusher:
    """fdatasync on its own thread every ``_FLUSH_BYTES`` of a fetch, so the disk writes while the
    network reads and the fsync before the rename finds almost nothing left.

    Measured on this project's VM (BENCHMARKS.md, prewarm vs curl): sync_file_range only starts
    writeback into the host's cache, and the final fsync of 2 GiB still took 0.65 s; a flush per
    64 MiB on a side thread took it under 0.1 s without slowing the writes (256 MiB did as well
    for one big file, but left a model's 128 MiB shards one whole flush each at the end). One
    flush at a time: a request while one runs is folded into the next.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prewarm-flush")
        self._running: Future[None] | None = None
        self._flushed_at = 0

    def wrote(self, offset: int) -> None:
        """``offset`` bytes are written; flush if a step has passed and none runs."""
        if offset - self._flushed_at < _FLUSH_BYTES:
            return
        if self._running is not None and not self._running.done():
            return
        self._flushed_at = offset
        self._running = self._pool.submit(self._flush)

    def _flush(self) -> None:
        with contextlib.suppress(OSError):  # advisory: the final fsync reports what is wrong
            os.fdatasync(self._fd)

    def reset(self, offset: int) -> None:
        self._flushed_at = offset

    def wait(self) -> None:
        """Until the flush in flight, if any, has ended."""
        if self._running is not None:
            self._running.result()

    def close(self) -> None:
        """Wait for the flush in flight (the caller fsyncs or closes the file next)."""
        self._pool.shutdown(wait=True)


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
        self.restarted: str | None = None  # why `restart` dropped the bytes, if it was said
        self._file = os.fdopen(store.open_partial(self.path.name), "r+b", buffering=0)
        self.offset = self._rehash()
        self._flusher = _Flusher(self._file.fileno())
        self._flusher.reset(self.offset)

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
            data = json.loads(self._store.read_partial(self._meta_path.name))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def save_validators(self, data: dict[str, Any]) -> None:
        self._store.write_partial(self._meta_path.name, json.dumps(data).encode())

    def admit(self, total: int | None) -> None:
        """Reserve ``total`` bytes in the budget (evicting if needed) before any body byte."""
        self.limit = self._store.admit(self.item_id, total, on_disk=self.offset)

    def restart(self, reason: str | None = None) -> None:
        """Drop the bytes so far: the origin cannot resume or its content changed (``reason``,
        kept in `restarted` for the item's record)."""
        self.restarted = reason or self.restarted
        self._file.seek(0)
        self._file.truncate()
        self._hash.close()
        self._hash = _Hasher()
        self._sequential = True
        self.offset = 0
        self._flusher.reset(0)

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
        self._flusher.wrote(self.offset)

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        """Write a piece at its offset (pieces from a P2P peer arrive in any order)."""
        if self.limit is not None and offset + len(data) > self.limit:
            raise Conflict(f"piece at {offset} passes the {self.limit} bytes admitted")
        self._write(data, offset)
        self._sequential = False
        self.offset = max(self.offset, offset + len(data))
        self._flusher.wrote(self.offset)

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

    @property
    def link_path(self) -> Path:
        """``<id>.dfpart`` beside the partial: where dfdaemon hard-links its task file."""
        return self.path.with_suffix(".dfpart")

    def adopt_link(self) -> None:
        """Make the file dfdaemon linked at `link_path` this partial (same inode, no copy),
        then hash it from the start; `CacheStore.commit` verifies and renames it as any other.

        It is opened read-only: dfdaemon owns the inode too, and nothing here writes it."""
        self._store.check_link(self.link_path.name)  # before this partial lets go of its file
        self._hash.close()
        self._flusher.close()  # before its file descriptor is closed (and its number reused)
        self._file.close()
        fd = self._store.adopt_partial(self.link_path.name, self.path.name)
        self._file = os.fdopen(fd, "rb", buffering=0)
        self._hash = _Hasher()
        self._sequential = True
        self.offset = self._rehash()
        self._flusher = _Flusher(self._file.fileno())
        self._flusher.reset(self.offset)

    def sha256(self) -> str:
        if not self._sequential:
            self._hash.close()
            self._hash = _Hasher()
            self._sequential = True
            self._rehash()
        return self._hash.hexdigest()

    def sync(self) -> None:
        self._flusher.wait()  # the flush in flight first: fsync then finds little left
        os.fsync(self._file.fileno())

    def seal(self) -> None:
        """Read-only from now on (the mode of a blob), set on the open file, not a path."""
        os.fchmod(self._file.fileno(), 0o444)

    def close(self) -> None:
        self._hash.close()
        self._flusher.close()  # before its file descriptor is closed (and its number reused)
        self._file.close()


class MemberPartial(Partial):
    """The partial of one file of a group: admitted with its group (which holds the budget),
    so here only bounded by the size the listing gave."""

    def __init__(self, store: CacheStore, key: str, size: int) -> None:
        super().__init__(store, key)
        self.size = size

    def admit(self, total: int | None) -> None:
        if total is not None and total != self.size:
            raise DigestMismatch(
                f"the origin announced {total} bytes for a file listed with {self.size}"
            )
        self.limit = self.size


@dataclass(slots=True)
class _Unit:
    """What eviction removes together: the ready files sharing one blob, or one ready group."""

    items: list[CacheItem]
    blobs: dict[str, int]


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
        *,
        layout_of: Callable[[str], Layout],
    ) -> None:
        """``layout_of``: a stored kind's `Layout` (`kinds.layout_of`; the registry's kinds
        import this module, so it is given, never imported)."""
        self.root = root
        self._layout_of = layout_of
        self._scanner = scanner or ProcScanner()
        self.index = index
        self.budget_bytes = budget_bytes
        self.max_volume_share = max_volume_share
        self._statvfs = statvfs
        self.blob_dir = root / "blobs" / "sha256"
        self.partial_dir = root / "partial"
        self.name_dir = root / "by-name"
        self.tree_dir = root / "trees"
        self.quarantine_dir = root / "quarantine"
        root.mkdir(parents=True, exist_ok=True)  # the root may be a link: the operator's choice
        _real_dir(self.quarantine_dir, None)
        for d in (root / "blobs", self.blob_dir, self.partial_dir, self.name_dir, self.tree_dir):
            _real_dir(d, self.quarantine_dir)

    # -- files the agent made, and nothing else ------------------------------------------------

    @contextlib.contextmanager
    def _dir(self, path: Path) -> Iterator[int]:
        """A cache subdirectory's fd; opening fails (ELOOP, ENOTDIR) if it is not a directory."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
        try:
            yield fd
        finally:
            os.close(fd)

    def _quarantine(self, dir_fd: int, name: str, where: Path, why: str) -> None:
        """Move ``where/name`` (whatever it is) into quarantine/ without following it; logged."""
        moved = f"{where.name}-{name}-{time.time_ns()}"
        with self._dir(self.quarantine_dir) as qfd:
            os.rename(name, moved, src_dir_fd=dir_fd, dst_dir_fd=qfd)
        log.warning(
            "cache: %s is %s, not a file the agent made; moved to %s unread",
            where / name,
            why,
            self.quarantine_dir / moved,
        )

    def _foreign(self, dir_fd: int, name: str, single: bool) -> str | None:
        """Why ``name`` in the directory is not a file the agent made (None: it is, or is
        absent): not a regular file, or (``single``) a hard link to a file elsewhere too."""
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return _not_ours(info, single)

    def _checked(self, dir_fd: int, name: str, where: Path, single: bool) -> None:
        why = self._foreign(dir_fd, name, single)
        if why is not None:
            self._quarantine(dir_fd, name, where, why)

    def open_partial(self, name: str) -> int:
        """partial/<name> opened read-write (made 0600 if absent); anything not the agent's
        there goes to quarantine first."""
        with self._dir(self.partial_dir) as dfd:
            self._checked(dfd, name, self.partial_dir, single=True)
            fd = os.open(name, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600, dir_fd=dfd)
            why = _not_ours(os.fstat(fd), single=True)  # swapped in since the check
            if why is not None:
                os.close(fd)
                raise FetchFailed(f"cache: {self.partial_dir / name} is {why}; not written")
            return fd

    def read_partial(self, name: str) -> bytes:
        with self._dir(self.partial_dir) as dfd:
            self._checked(dfd, name, self.partial_dir, single=True)
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dfd)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def write_partial(self, name: str, data: bytes) -> None:
        """partial/<name> replaced atomically by ``data`` (through a fresh <name>.tmp)."""
        tmp = name + ".tmp"
        with self._dir(self.partial_dir) as dfd:
            self._checked(dfd, tmp, self.partial_dir, single=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dfd)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)

    def check_link(self, link: str) -> None:
        """That dfdaemon left a regular file at partial/<link> (FileNotFoundError: nothing)."""
        with self._dir(self.partial_dir) as dfd:
            info = os.stat(link, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            raise FetchFailed(
                f"dfdaemon left something other than a file at {self.partial_dir / link}"
            )

    def adopt_partial(self, link: str, name: str) -> int:
        """dfdaemon's hard link partial/<link> renamed to partial/<name>, opened read-only."""
        with self._dir(self.partial_dir) as dfd:
            self.check_link(link)  # still: the rename below must not take a link in
            os.replace(link, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dfd)

    def blob_size(self, sha256: str) -> int | None:
        """The size of the blob on disk; None when absent or not a file the agent made (then
        it is quarantined, and the item is not served from it)."""
        with self._dir(self.blob_dir) as dfd:
            try:
                info = os.stat(sha256, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            why = _not_ours(info, single=False)
            if why is not None:
                self._quarantine(dfd, sha256, self.blob_dir, why)
                return None
            return info.st_size

    def _hash_blob(self, sha256: str) -> str:
        with self._dir(self.blob_dir) as dfd:
            fd = os.open(sha256, os.O_RDONLY | _NOFOLLOW, dir_fd=dfd)
        digest = hashlib.sha256()
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def _sweep(self, path: Path, keep: set[str], kind: int) -> None:
        """Delete the entries of a cache subdirectory not in ``keep``; an entry that is not of
        ``kind`` (S_IFREG, S_IFLNK, S_IFDIR: what the agent makes there) is quarantined."""
        with self._dir(path) as dfd:
            for entry in list(os.scandir(dfd)):
                info = entry.stat(follow_symlinks=False)
                if stat.S_IFMT(info.st_mode) != kind:
                    self._quarantine(dfd, entry.name, path, _kind_name(info.st_mode))
                elif entry.name in keep:
                    continue
                elif kind == stat.S_IFDIR:
                    shutil.rmtree(entry.name, dir_fd=dfd)  # fd-based: follows no link inside
                else:
                    os.unlink(entry.name, dir_fd=dfd)

    def blob_path(self, sha256: str) -> Path:
        return self.blob_dir / sha256

    def name_path(self, name: str) -> Path:
        return self.name_dir / name

    def tree_path(self, item_id: str) -> Path:
        return self.tree_dir / item_id

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
            if verify_digest and self._hash_blob(sha) != sha:
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

    def discard_blob(self, sha256: str) -> list[str]:
        """Drop a blob that is not what its name claims (wrong size or digest, or gone), with
        every ready item standing on it; no in-use check, as its bytes are not the item's."""
        with self.index.transaction():
            unit = self._mark_evicted(self._standing_on(sha256))
        self._remove(unit, force={sha256})
        return [i.name for i in unit.items]

    def remove_link(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.name_path(name).unlink()

    # -- budget -------------------------------------------------------------------------------

    def usage(self, exclude: str | None = None) -> Usage:
        items = self.index.items()
        ready: dict[str, int] = {}
        pinned: dict[str, int] = {}
        for item in items:
            if item.state is ItemState.READY:
                ready.update(self.blobs(item))
                if item.pinned:
                    pinned.update(self.blobs(item))
        reserved = sum(
            i.size or 0
            for i in items
            if self.layout(i) is not Layout.RUNTIME
            and i.state is ItemState.FETCHING
            and i.id != exclude
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
        unpinned item no process holds, or when the volume lacks the free space. With ``total``
        unknown (a chunked response) the limit is what fits now without evicting.
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
            freed = sum(sum(u.blobs.values()) for u in victims)
            if need > 0 and freed < need:
                raise Conflict(
                    f"item needs {total} bytes; the cache holds {use.used_bytes} "
                    f"({use.pinned_bytes} pinned) and {use.reserved_bytes} reserved by running "
                    f"fetches, capacity {use.capacity_bytes}; unpin or evict items first "
                    "(items in use are not evicted)"
                )
            st = self._statvfs(self.root)
            free = st.f_bavail * st.f_frsize + freed
            if total - on_disk > free:
                raise Conflict(
                    f"item needs {total - on_disk} more bytes but the cache volume has {free} free"
                )
            evicted = [self._mark_evicted(u.items) for u in victims]
            self.index.update(item_id, size=total)
        for unit in evicted:
            self._remove(unit)
        return total

    def _units(self) -> list[_Unit]:
        by_sha: dict[str, _Unit] = {}
        units: list[_Unit] = []
        for item in self.index.items([ItemState.READY]):
            if self.layout(item) is Layout.BLOB and item.sha256:
                unit = by_sha.setdefault(item.sha256, _Unit([], dict(self.blobs(item))))
                if not unit.items:
                    units.append(unit)
                unit.items.append(item)
            elif self.layout(item) is Layout.TREE:
                units.append(_Unit([item], self.blobs(item)))
        return units

    def _victims(self, need: int) -> list[_Unit]:
        """Least recently used units, unpinned and held by no process, whose blobs (those no
        other unit stands on) add up to ``need`` (or all of them)."""
        units = self._units()
        held = self.holders(sha for u in units for sha in u.blobs)

        def last_use(unit: _Unit) -> float:
            return max((i.last_used or i.finished_at or 0.0) for i in unit.items)

        chosen: list[_Unit] = []
        freed = 0
        for unit in sorted(units, key=last_use):
            if freed >= need:
                break
            if any(i.pinned for i in unit.items) or any(sha in held for sha in unit.blobs):
                continue
            others = {sha for u in units if u is not unit for sha in u.blobs}
            own = {sha: size for sha, size in unit.blobs.items() if sha not in others}
            chosen.append(_Unit(unit.items, own))
            freed += sum(own.values())
        return chosen

    # -- commit and eviction ------------------------------------------------------------------

    def partial(self, item_id: str) -> Partial:
        return Partial(self, item_id)

    def partial_size(self, item_id: str) -> int:
        """Bytes on disk in an item's partial(s) (a group's: all its files')."""
        total = 0
        with self._dir(self.partial_dir) as dfd:
            for entry in os.scandir(dfd):
                if entry.name.startswith(f"{item_id}.") and entry.name.endswith("part"):
                    with contextlib.suppress(FileNotFoundError):
                        info = entry.stat(follow_symlinks=False)
                        total += info.st_size if stat.S_ISREG(info.st_mode) else 0
        return total

    def discard_partial(self, item_id: str) -> None:
        """Delete an item's partial and validators (a group's: every member's); what is not a
        file the agent made goes to quarantine instead."""
        with self._dir(self.partial_dir) as dfd:
            for entry in list(os.scandir(dfd)):
                if not entry.name.startswith(f"{item_id}."):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    why = _not_ours(entry.stat(follow_symlinks=False), single=False)
                    if why is not None:
                        self._quarantine(dfd, entry.name, self.partial_dir, why)
                    else:
                        os.unlink(entry.name, dir_fd=dfd)

    def discard_item(self, item: CacheItem) -> None:
        """Drop a ready item found not to be what it claims (a blob gone or wrong): a file's
        blob goes with every name on it; a group loses its directory and blobs no one else uses."""
        if self.layout(item) is Layout.BLOB and item.sha256:
            self.discard_blob(item.sha256)
        elif self.layout(item) is Layout.TREE:
            with self.index.transaction():
                unit = self._mark_evicted([self.index.get(item.id)])
            self._remove(unit)

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
            with self._dir(self.partial_dir) as pfd, self._dir(self.blob_dir) as bfd:
                os.replace(partial.path.name, digest, src_dir_fd=pfd, dst_dir_fd=bfd)
            _fsync_dir(self.blob_dir)
        else:
            partial.close()
        self.discard_partial(partial.item_id)
        return digest

    def link_name(self, name: str, sha256: str) -> None:
        """Point by-name/<name> at the blob, replacing any old link atomically."""
        self._relink(name, Path("..", "blobs", "sha256", sha256))

    def link_tree(self, name: str, item_id: str, files: Iterable[tuple[str, str]]) -> None:
        """Lay a group out as a model directory, trees/<id>/<path> -> its blob (relative links,
        so the cache can be mounted anywhere), then point by-name/<name> at it atomically."""
        tree = self.tree_path(item_id)
        tmp = self.tree_dir / f".{item_id}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for path, sha in files:
            link = tmp / path
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(self.blob_path(sha), link.parent), link)
        shutil.rmtree(tree, ignore_errors=True)
        os.replace(tmp, tree)
        _fsync_dir(self.tree_dir)
        self._relink(name, Path("..", "trees", item_id))

    def _relink(self, name: str, target: Path) -> None:
        tmp = self.name_dir / f".{name}.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(target, tmp)
        os.replace(tmp, self.name_path(name))
        _fsync_dir(self.name_dir)

    def evict(self, sha256: str) -> list[str]:
        """Evict a blob and every ready file naming it; returns the item names.

        Refused (Busy, naming the pids) while a process holds the blob open or mapped; a group
        standing on the same blob keeps it.
        """
        self._refuse_held([sha256])
        with self.index.transaction():
            unit = self._mark_evicted(self.on_blob(sha256))
        self._remove(unit)
        return [i.name for i in unit.items]

    def evict_group(self, item: CacheItem) -> None:
        """Evict a ready group: its model directory, and the blobs nothing else stands on."""
        self._refuse_held(self.blobs(item))
        with self.index.transaction():
            unit = self._mark_evicted([self.index.get(item.id)])
        self._remove(unit)

    def _refuse_held(self, sha256s: Iterable[str]) -> None:
        held = self.holders(sha256s)
        pids = sorted({p for ps in held.values() for p in ps})
        if pids:
            listed = ", ".join(str(p) for p in pids)
            raise Busy(
                f"blob(s) {', '.join(f'sha256:{s}' for s in sorted(held))} open or mapped by "
                f"process(es) {listed}; not evicted",
                [str(p) for p in pids],
            )

    def _standing_on(self, sha256: str) -> list[CacheItem]:
        return [i for i in self.index.items([ItemState.READY]) if sha256 in self.blobs(i)]

    def _mark_evicted(self, items: Iterable[CacheItem]) -> _Unit:
        unit = _Unit([], {})
        for item in items:
            if item.state is ItemState.READY:
                self.index.update(item.id, state=ItemState.EVICTED)
                unit.items.append(item)
                unit.blobs.update(self.blobs(item))
        return unit

    def _remove(self, unit: _Unit, force: Iterable[str] = ()) -> None:
        """Delete the links and model directories of evicted items, and their blobs that no
        ready item still stands on (``force``: delete those blobs whatever stands on them)."""
        for item in unit.items:
            self.remove_link(item.name)
            if self.layout(item) is Layout.TREE:
                shutil.rmtree(self.tree_path(item.id), ignore_errors=True)
        still = {sha for i in self.index.items([ItemState.READY]) for sha in self.blobs(i)}
        gone = [sha for sha in unit.blobs if sha not in still or sha in set(force)]
        for sha in gone:
            with contextlib.suppress(FileNotFoundError):
                self.blob_path(sha).unlink()
        log.info(
            "evicted %s (blobs %s)",
            ", ".join(i.name for i in unit.items) or "nothing",
            ", ".join(f"sha256:{s[:12]}" for s in gone) or "kept",
        )

    def reconcile(self) -> None:
        """Make disk and index agree after a crash: the index says what is ready.

        Blobs no ready item stands on, model directories of no ready group and partials of
        items no longer fetching (or waiting for a retry) are deleted; a ready item whose blob
        is gone becomes evicted.
        """
        items = self.index.items()
        for item in items:
            if item.state is ItemState.READY and self.blobs(item):
                if any(self.blob_size(sha) is None for sha in self.blobs(item)):
                    self.index.update(item.id, state=ItemState.EVICTED)
                else:
                    self.missing(item)  # re-makes a lost link or model directory
        self._adopt_orphans(items)
        items = self.index.items()
        ready = [i for i in items if i.state is ItemState.READY]
        wanted = {sha for i in ready for sha in self.blobs(i)}
        self._sweep(self.blob_dir, wanted, stat.S_IFREG)
        trees = {i.id for i in ready if self.layout(i) is Layout.TREE}
        self._sweep(self.tree_dir, trees, stat.S_IFDIR)
        active = {i.id for i in items if i.state in (ItemState.QUEUED, ItemState.FETCHING)}
        active |= {i.id for i in items if i.state is ItemState.FAILED and i.retry_at is not None}
        with self._dir(self.partial_dir) as dfd:
            names = set(os.listdir(dfd))
        self._sweep(
            self.partial_dir, {n for n in names if n.split(".", 1)[0] in active}, stat.S_IFREG
        )
        self._sweep(self.name_dir, {i.name for i in ready}, stat.S_IFLNK)

    def _adopt_orphans(self, items: list[CacheItem]) -> None:
        """Blobs no index row knows (the index was lost: a corrupt state database started anew)
        are never deleted unseen: one that verifies and that a by-name link points at becomes a
        ready file of that name again (its source and pin are not known); any other is moved to
        quarantine/ for a person, with a log line."""
        known = {sha for i in items for sha in (*self.blobs(i), i.sha256, i.expected_sha256) if sha}
        known |= {sha for i in items for _, sha, _ in i.members}
        orphans = {b.name: b for b in self.blob_dir.iterdir() if b.name not in known}
        if not orphans:
            return
        names = {i.name for i in items}
        for link in sorted(self.name_dir.iterdir()):
            if link.name in names or not link.is_symlink():
                continue
            target = Path(os.readlink(link))
            sha = target.name
            if target.parent.name != "sha256" or sha not in orphans:
                continue
            blob = orphans[sha]
            size = self.blob_size(sha)  # not a regular file the agent made: quarantined
            if size is None or self._hash_blob(sha) != sha:
                continue  # damaged or planted: kept aside below, never served
            mtime = os.stat(blob, follow_symlinks=False).st_mtime
            self.index.insert(
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
        with self._dir(self.blob_dir) as dfd:
            left = [sha for sha in sorted(orphans) if self._foreign(dfd, sha, single=False) is None]
            for sha in left:
                with contextlib.suppress(FileNotFoundError):  # quarantined above as not the agent's
                    self._quarantine(dfd, sha, self.blob_dir, "a blob no index row or name knows")
        if left:
            log.warning(
                "%d cache file(s) with no index row and no name were moved to %s (not deleted; "
                "remove them once looked at): %s",
                len(left),
                self.quarantine_dir,
                ", ".join(left),
            )


ADOPTED_SOURCE = "adopted: found in the cache with no index row"
"""``source`` of a ready item rebuilt from a blob and its by-name link (`_adopt_orphans`)."""


def _not_ours(info: os.stat_result, single: bool) -> str | None:
    """Why a file is not one the agent made (None: it may be): a link or anything but a regular
    file, or (``single``) a file with another name elsewhere."""
    if not stat.S_ISREG(info.st_mode):
        return _kind_name(info.st_mode)
    if single and info.st_nlink > 1:
        return f"a file with {info.st_nlink} hard links"
    return None


def _kind_name(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def _real_dir(path: Path, quarantine: Path | None) -> None:
    """``path`` as a directory of its own: a link or file in its place is moved into
    ``quarantine`` (None: it is the quarantine, and the link is removed) unfollowed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        path.mkdir(mode=0o755)
        return
    if stat.S_ISDIR(info.st_mode):
        return
    if quarantine is None:
        os.unlink(path)  # removes the link itself
        log.warning("cache: %s was %s; removed, unread", path, _kind_name(info.st_mode))
    else:
        moved = quarantine / f"{path.name}-{time.time_ns()}"
        os.rename(path, moved)
        log.warning(
            "cache: %s is %s, not a directory the agent made; moved to %s unread",
            path,
            _kind_name(info.st_mode),
            moved,
        )
    path.mkdir(mode=0o755)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
