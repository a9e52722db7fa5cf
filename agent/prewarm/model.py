"""The records prewarm works with: requests in, cache items out. Plain frozen data, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


class ItemState(enum.StrEnum):
    """Where an item is in its life; only READY items are on disk at their final path."""

    QUEUED = "queued"
    FETCHING = "fetching"
    READY = "ready"
    FAILED = "failed"
    EVICTED = "evicted"


class ItemKind(enum.StrEnum):
    FILE = "file"
    IMAGE = "image"


@dataclass(frozen=True, slots=True)
class FileRequest:
    """Warm one file from an HTTP(S) origin into the content-addressed cache.

    ``header_files`` maps a header name to a file holding its value (a mounted Kubernetes
    secret), so tokens never pass through flags, the database or logs.
    """

    url: str
    name: str | None = None
    sha256: str | None = None
    pin: bool = False
    header_files: Mapping[str, Path] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ImageRequest:
    """Pull one image through the node's CRI so the kubelet finds it in place."""

    ref: str
    name: str | None = None
    runtime_handler: str | None = None
    pin: bool = False


@dataclass(frozen=True, slots=True)
class CacheItem:
    """One row of the inventory: a file or an image, whatever its state."""

    id: str
    kind: ItemKind
    name: str
    source: str
    state: ItemState
    pinned: bool = False
    size: int | None = None
    sha256: str | None = None
    expected_sha256: str | None = None
    fetched_bytes: int = 0
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    last_used: float | None = None
    hits: int = 0
    error: str | None = None
    warm_seconds: float | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def label_ready(self) -> bool:
        return self.state is ItemState.READY


@dataclass(frozen=True, slots=True)
class Progress:
    """A snapshot of one running fetch, for the terminal and the operation's metadata."""

    item_id: str
    done_bytes: int
    total_bytes: int | None
    rate_bps: float
    eta_s: float | None
