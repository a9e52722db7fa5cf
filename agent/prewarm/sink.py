"""Where a fetcher puts the bytes it receives.

A file fetch writes into a `Partial` (the cache's temp file). Warming a Nydus data blob keeps the
bytes out of our cache: they only have to pass through dfdaemon, which keeps them, so the
`DigestSink` counts and hashes them and throws them away. Both satisfy `Sink`, the interface
the fetchers (`HttpFetcher`, `DragonflyFetcher`) write to. A Partial is also a `LinkSink`:
dfdaemon can hard-link its own copy of the bytes into the partial directory instead of
streaming them (prewarm.dragonfly_output: hard-link).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agent.prewarm.errors import DigestMismatch, FetchFailed

# Pieces from P2P peers arrive in any order; the hash needs them in order, so the ones ahead of
# the next expected offset wait here. dfdaemon downloads a bounded number of pieces at once, so
# the gap stays small; a peer that opens a larger one fails the blob instead of filling memory.
MAX_PENDING_BYTES = 512 * 1024 * 1024


class Sink(Protocol):
    """What a fetcher needs from the thing it writes into (see `agent.prewarm.partial.Partial`)."""

    offset: int
    limit: int | None
    #: why the bytes were last dropped by `restart` (an object changed at the origin), if said
    restarted: str | None

    @property
    def validators(self) -> dict[str, Any]: ...

    def save_validators(self, data: dict[str, Any]) -> None: ...

    def admit(self, total: int | None) -> None: ...

    def restart(self, reason: str | None = None) -> None: ...

    def write(self, data: bytes | memoryview) -> None: ...

    def write_at(self, offset: int, data: bytes | memoryview) -> None: ...


@runtime_checkable
class LinkSink(Sink, Protocol):
    """A Sink backed by a file in the cache's partial directory, so another process on the same
    filesystem (dfdaemon) can hard-link its copy of the bytes in rather than send them."""

    @property
    def link_path(self) -> Path:
        """Where the link may be made; nothing is there until it is."""
        ...

    def adopt_link(self) -> None:
        """Take the file at `link_path` as the bytes so far (read and hashed again, so it is
        verified as fetched bytes are); FileNotFoundError when no link was made."""
        ...


class DigestSink:
    """Counts and sha256-hashes a stream, keeps nothing; `verify` checks the expected digest.

    ``size`` (from the manifest's descriptor) bounds the body: a source sending more is refused
    mid-stream rather than after the fact.
    """

    def __init__(self, expected_sha256: str, size: int | None = None) -> None:
        self.expected_sha256 = expected_sha256
        self.size = size
        self.offset = 0
        self.limit: int | None = size
        self.restarted: str | None = None
        self._validators: dict[str, Any] = {}
        self._hash = hashlib.sha256()
        self._pending: dict[int, bytes] = {}
        self._pending_bytes = 0

    @property
    def validators(self) -> dict[str, Any]:
        return dict(self._validators)

    def save_validators(self, data: dict[str, Any]) -> None:
        self._validators = dict(data)

    def admit(self, total: int | None) -> None:
        if total is not None and self.size is not None and total != self.size:
            raise DigestMismatch(
                f"the source announced {total} bytes for a blob of {self.size} bytes "
                f"(sha256:{self.expected_sha256})"
            )
        self.limit = total if total is not None else self.size

    def restart(self, reason: str | None = None) -> None:
        self.restarted = reason or self.restarted
        self.offset = 0
        self._hash = hashlib.sha256()
        self._pending.clear()
        self._pending_bytes = 0

    def write(self, data: bytes | memoryview) -> None:
        self._check_bound(self.offset, len(data))
        self._hash.update(data)
        self.offset += len(data)

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        self._check_bound(offset, len(data))
        if offset < self.offset:
            return  # a piece delivered twice
        self._pending[offset] = bytes(data)
        self._pending_bytes += len(data)
        while self.offset in self._pending:
            chunk = self._pending.pop(self.offset)
            self._pending_bytes -= len(chunk)
            self._hash.update(chunk)
            self.offset += len(chunk)
        if self._pending_bytes > MAX_PENDING_BYTES:
            raise FetchFailed(
                f"more than {MAX_PENDING_BYTES} bytes of pieces arrived ahead of offset "
                f"{self.offset}; refusing to buffer them"
            )

    def _check_bound(self, offset: int, length: int) -> None:
        if self.limit is not None and offset + length > self.limit:
            raise DigestMismatch(
                f"the source sent more than the {self.limit} bytes of blob "
                f"sha256:{self.expected_sha256}"
            )

    def verify(self) -> int:
        """The blob's size once every byte arrived and hashed to the expected digest."""
        if self._pending:
            raise FetchFailed(f"pieces missing before offset {min(self._pending)} of the blob")
        if self.size is not None and self.offset != self.size:
            raise DigestMismatch(
                f"blob sha256:{self.expected_sha256}: got {self.offset} bytes, "
                f"the manifest says {self.size}"
            )
        actual = self._hash.hexdigest()
        if actual != self.expected_sha256:
            raise DigestMismatch(
                f"blob sha256:{self.expected_sha256}: the bytes hash to sha256:{actual}"
            )
        return self.offset
