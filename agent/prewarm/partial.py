"""A running fetch's bytes on disk: the partial file, hashed as it is written.

A `Partial` lives under the cache's partial/ (agent/prewarm/cachedir.py opens it, never
following a link) and survives a restart, so a fetch resumes from the bytes it has. The sha256
is computed on a side thread as the bytes arrive, and the file is flushed on another, so the
commit (agent/prewarm/store.py) finds the digest ready and little left to fsync.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import Conflict
from agent.prewarm import budget
from agent.prewarm.cachedir import CHUNK
from agent.prewarm.errors import DigestMismatch, DiskFull

if TYPE_CHECKING:
    from agent.prewarm.cache import Cache

__all__ = ["MemberPartial", "Partial"]
_HASH_BACKLOG = 32  # chunks queued for the hasher thread before the writer waits
_FLUSH_BYTES = 64 * 1024 * 1024


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


class Partial:
    """The temp file of one fetch; hashes as it appends and survives a restart for resume."""

    def __init__(self, store: Cache, item_id: str) -> None:
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
        while chunk := self._file.read(CHUNK):
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
        self.limit = budget.admit(self._store, self.item_id, total, on_disk=self.offset)

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

    def __init__(self, store: Cache, key: str, size: int) -> None:
        super().__init__(store, key)
        self.size = size

    def admit(self, total: int | None) -> None:
        if total is not None and total != self.size:
            raise DigestMismatch(
                f"the origin announced {total} bytes for a file listed with {self.size}"
            )
        self.limit = self.size

    def check_complete(self, path: str) -> None:
        """The fetch ended at the listed size: a body that ended short (a chunked answer has
        no length to check at its start) is not the file the listing named."""
        if self.offset != self.size:
            raise DigestMismatch(
                f"{path}: the origin sent {self.offset} bytes for a file listed with {self.size}"
            )
