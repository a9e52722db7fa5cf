"""The records prewarm works with: requests in, cache items out. Plain frozen data, no I/O."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.prewarm.fields import arg


class ItemState(enum.StrEnum):
    """Where an item is in its life; only READY items are on disk at their final path."""

    QUEUED = "queued"
    FETCHING = "fetching"
    READY = "ready"
    FAILED = "failed"
    EVICTED = "evicted"
    #: a state a newer agent sent that this client does not know: read from the wire only,
    #: never stored nor counted by an agent
    UNKNOWN = "unknown"


class PullPolicy(enum.StrEnum):
    """When a ready image is pulled again: never while present, on every request, or (with
    ``repull_hours``) once the last pull is older than that (a moving tag)."""

    IF_NOT_PRESENT = "IfNotPresent"
    ALWAYS = "Always"


class ItemKind(enum.StrEnum):
    """The built-in source kinds (agent/prewarm/kinds.py registers one `Source` each); a
    kind registered beyond these is its own string."""

    FILE = "file"
    IMAGE = "image"
    GROUP = "group"  # a model: the files of a repo snapshot, warmed and labelled as one


def item_kind(value: str) -> str:
    """A stored kind: the built-in's enum member, or the registered kind's own string."""
    try:
        return ItemKind(value)
    except ValueError:
        return value


class Layout(enum.Enum):
    """Where a ready item's bytes are: one blob of the cache (with a by-name link), a
    directory of blob links (a model), or outside the cache in the node's runtime (an image)."""

    BLOB = "blob"
    TREE = "tree"
    RUNTIME = "runtime"


@dataclass(frozen=True, slots=True)
class FileRequest:
    """Warm one file from an HTTP(S) origin into the content-addressed cache.

    ``header_files`` maps a header name to a file holding its value (a mounted Kubernetes
    secret), so tokens never pass through flags, the database or logs.
    """

    url: str = arg(fleet="File to fetch (https://, or http:// where allowed).", source=True)
    sha256: str | None = arg(
        "Expected sha256; the item fails on a mismatch.",
        default=None,
        fleet="Expected sha256 of the file.",
        metavar="HEX",
    )
    name: str | None = arg(
        "Item name (default: from the URL); the node label and by-name path.", default=None
    )
    pin: bool = arg("Never evict this item.", default=False)
    header_files: Mapping[str, Path] = arg(
        "Send header NAME with the value read from FILE (a mounted secret), which must lie in "
        "a prewarm.header_dirs directory bound to the URL's origin. Repeatable.",
        default={},
    )


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """Warm a model repo snapshot (Hugging Face style) as one item: every file matching
    ``include`` (all when empty), laid out as the model directory under by-name/<name>/."""

    repo: str = arg(
        fleet="Model repo snapshot to warm as one item.",
        metavar="REPO",
        source=True,
        manifest="model",
    )
    revision: str = arg(
        "Branch, tag or commit.",
        default="main",
        fleet="The model's branch, tag or commit (default main).",
    )
    endpoint: str = arg(
        "Hub serving the repo (/api/models/... and /<repo>/resolve/...).",
        default="https://huggingface.co",
        fleet="Hub serving the model (/api/models/... and /<repo>/resolve/...); default "
        "huggingface.co.",
    )
    include: Sequence[str] = arg(
        "Only files matching GLOB (repeatable); all files without it.",
        default=(),
        fleet="Only the model's files matching GLOB (repeatable); all files without it.",
        metavar="GLOB",
    )
    name: str | None = arg(
        "Item name (default: the repo's name); the label and by-name dir.", default=None
    )
    pin: bool = arg("Never evict this model.", default=False)
    header_files: Mapping[str, Path] = arg("As for file.", default={})


@dataclass(frozen=True, slots=True)
class ImageRequest:
    """Pull one image through the node's CRI so the kubelet finds it in place."""

    ref: str = arg(fleet="Container image to pull instead.", source=True, manifest="image")
    runtime_handler: str | None = arg(
        "CRI runtime handler, e.g. nydus for a lazy snapshotter.",
        default=None,
        fleet="CRI runtime handler, e.g. nydus.",
    )
    name: str | None = arg("Item name (default: from the reference).", default=None)
    pin: bool = arg("Never evict; pinned in containerd too.", default=False)
    pull_policy: PullPolicy = arg(
        "Pull a ready image again only when absent, or on every request.",
        default=PullPolicy.IF_NOT_PRESENT,
    )
    repull_hours: float | None = arg(
        "Pull again (a moving tag) once the last pull is this many hours old.", default=None
    )


class Warmth(enum.StrEnum):
    """How much of an image's layer data is on the node (or in its Dragonfly cache).

    ``full``: every layer (a plain image after its pull, or a Nydus image whose data blobs were
    all warmed); ``bootstrap-only``: a Nydus image whose pull fetched only its metadata layer;
    ``partial``: some Nydus data blobs warmed; ``unknown``: the manifest could not be read.
    """

    FULL = "full"
    PARTIAL = "partial"
    BOOTSTRAP_ONLY = "bootstrap-only"
    UNKNOWN = "unknown"


_WARMTH_KEYS = ("blobs_total", "blobs_warm", "bytes_total", "bytes_warm")


@dataclass(frozen=True, slots=True)
class ImageWarmth:
    """An image's warmth; kept in the item's options (strings) under the field names."""

    warmth: Warmth
    lazy: bool = False  # a Nydus image: its data is fetched on first read, not at pull
    blobs_total: int = 0
    blobs_warm: int = 0
    bytes_total: int = 0
    bytes_warm: int = 0

    @property
    def ratio(self) -> float | None:
        """Warm share of the layer bytes (1.0 when the image has none); None when unknown."""
        if self.warmth is Warmth.UNKNOWN:
            return None
        return self.bytes_warm / self.bytes_total if self.bytes_total else 1.0

    def to_options(self) -> dict[str, str]:
        out = {"warmth": self.warmth.value}
        if self.warmth is not Warmth.UNKNOWN:
            out["image_format"] = "nydus" if self.lazy else "oci"
            out.update({k: str(getattr(self, k)) for k in _WARMTH_KEYS})
        return out

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ImageWarmth | None:
        try:
            warmth = Warmth(options["warmth"])
            counts = {k: int(options.get(k, "0")) for k in _WARMTH_KEYS}
        except (KeyError, ValueError):
            return None
        return cls(warmth, options.get("image_format") == "nydus", **counts)


@dataclass(frozen=True, slots=True)
class CacheItem:
    """One row of the inventory: a file or an image, whatever its state."""

    id: str
    kind: str  # an ItemKind, or a kind registered beyond them
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
    owner: str | None = None  # who submitted or pinned it (agent/owner.py); not shown to readers
    owner_role: str | None = None  # the role it acted under

    def blobs(self, layout: Layout) -> dict[str, int]:
        """sha256 -> size of the blobs a ready file or group stands on ({} for others), laid
        out as its kind's ``layout`` says (`kinds.layout_of`; the records know no kinds)."""
        if layout is Layout.BLOB:
            return {self.sha256: self.size or 0} if self.sha256 else {}
        if layout is Layout.TREE:
            return {sha: size for _, sha, size in self.members}
        return {}

    @property
    def members(self) -> list[tuple[str, str, int]]:
        """A ready group's files: (path in the model directory, sha256, size)."""
        raw = self.options.get("members")
        if not raw:
            return []
        return [(str(p), str(s), int(n)) for p, s, n in json.loads(raw)]

    @property
    def retry_at(self) -> float | None:
        """When the agent retries an item that failed for a transient reason (None: no retry)."""
        value = self.options.get("retry_at")
        return float(value) if value else None

    @property
    def attempts(self) -> int:
        """Runs of this item that failed in a row (reset by a success)."""
        return int(self.options.get("attempts", "0"))

    @property
    def image_warmth(self) -> ImageWarmth | None:
        """How warm an image is; None for files and for images not warmed yet."""
        if self.kind is not ItemKind.IMAGE:
            return None
        return ImageWarmth.from_options(self.options)


@dataclass(frozen=True, slots=True)
class Progress:
    """A snapshot of one running fetch, for the terminal and the operation's metadata."""

    item_id: str
    done_bytes: int
    total_bytes: int | None
    rate_bps: float
    eta_s: float | None
    #: while the fetch waits to resume after a transient failure: the attempt, the wait and
    #: why ("" while bytes flow); the rate is then 0 and the ETA unknown
    retrying: str = ""


@dataclass(frozen=True, slots=True)
class ImagePull:
    """One CRI pull: ``cold`` when the image was absent before it."""

    ref: str
    cold: bool
    seconds: float
    at: float
