"""The one interface a prewarm source kind implements, and what it may use of the service.

A kind (an HTTP file, a model repo snapshot, a container image, ...) is one `Source`: it
validates its requests, says what item a request names (`target`: source, resume identity,
options), does the item's work and says how it went (`run` returns a `Ready`, `Failed` or
`Stopped` outcome: the service alone writes the item's row), checks a ready item is still
there (`unready`, `recheck`), says when it is worth a node label (`ready`), how readers see
its source (`describe`) and how it leaves the node (`discard`, `evict`, `pin`).
`PrewarmService` holds everything that is the same for every kind (naming, the one
transaction of a request, retries, claims, workers) and asks the kind's `Source` for the
rest; `agent/prewarm/kinds.py` is the one registry keyed by kind. A new kind is one module,
``source_<kind>.py``, with its request dataclass and its `Source` (named ``SOURCE``); see
docs/architecture.md.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from agent.errors import Conflict
from agent.owner import Actor, check_may_undo
from agent.prewarm.headers import HeaderDir
from agent.prewarm.model import CacheItem, ItemState, Layout
from agent.prewarm.policy import UrlPolicy, redact_url

if TYPE_CHECKING:
    from agent.prewarm.fetch_http import CancelledFn, ProgressFn
    from agent.prewarm.index import PrewarmIndex
    from agent.prewarm.ports import FileFetcher, ImagePuller, ImageWarmer
    from agent.prewarm.store import CacheStore
    from agent.prewarm.target import TargetSchema


class SourceRequest(Protocol):
    """What every kind's request has: the item name asked for (None: derived) and the pin."""

    @property
    def name(self) -> str | None: ...

    @property
    def pin(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Target:
    """The item a request names, decided before anything is written.

    ``source`` is stored as the item's source (the URL to fetch, the image reference);
    ``identity`` is what makes two requests the same item (a URL without its signature);
    ``pretty`` is what the default name derives from; ``options`` are the request's settings
    kept in the item's row; ``sha256`` the content the request pins, if any.
    """

    source: str
    identity: str
    pretty: str
    options: Mapping[str, str] = field(default_factory=dict)
    sha256: str | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """What the item a request names shows every reader, told without the node: its source
    as `Source.describe` shows it and the sha256 the request pins (None: any). A coordinator
    compares it with a node's item of the same name (agent/coordinator/rollout/targets.py)."""

    shown: str
    sha256: str | None = None


class Work(Protocol):
    """What a `Source` may use of the service that runs it (the service itself)."""

    index: PrewarmIndex
    store: CacheStore
    policy: UrlPolicy

    @property
    def fetcher(self) -> FileFetcher: ...

    @property
    def lister(self) -> FileFetcher: ...

    @property
    def puller(self) -> ImagePuller | None: ...

    @property
    def warmer(self) -> ImageWarmer | None: ...

    @property
    def header_dirs(self) -> Sequence[HeaderDir]: ...

    @property
    def group_parallel(self) -> int: ...

    def now(self) -> float:
        """The wall clock, for the row's timestamps."""
        ...

    def identity(self, url: str) -> str:
        """A URL without the query parameters that only sign it (the resume key)."""
        ...

    def watchers(self, item: CacheItem, event: threading.Event) -> tuple[ProgressFn, CancelledFn]:
        """Progress reporting and cancellation checks for one item's run."""
        ...


@dataclass(frozen=True, slots=True)
class Ready:
    """A run's success: the ready item's size and options (the whole set: the service
    drops the retry schedule), its blob's digest and the bytes fetched when the kind has them."""

    size: int | None
    options: Mapping[str, str]
    sha256: str | None = None
    fetched_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """A run's failure. ``transient``: worth a retry, so its ``kept`` bytes stay for it;
    anything else loses its partials. ``options`` replace the item's (None: kept as they are)."""

    error: str
    transient: bool = False
    kept: int = 0
    options: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Stopped:
    """Cancelled mid-run. Stopped by a shutdown, the item is queued again from this resume
    point (its bytes on disk, its options); cancelled by a user, its partials go."""

    fetched_bytes: int | None = None
    options: Mapping[str, str] | None = None


#: what `Source.run` returns; the service alone writes it into the item's row
Outcome = Ready | Failed | Stopped


class Source(abc.ABC):
    """One prewarm source kind. The defaults fit a kind whose ready item is bytes in the
    content-addressed cache (`Layout.BLOB`); a kind overrides what differs."""

    #: the item kind stored in the index and shown by the API, CLI and metrics
    kind: ClassVar[str]
    #: the request dataclass of this kind (what `PrewarmService.submit` takes)
    request_type: ClassVar[type]
    #: where a ready item's bytes live: one blob, a directory of blobs, or the node's runtime
    layout: ClassVar[Layout] = Layout.BLOB
    #: its target as manifests, the API and desired files write it (None: in-process only)
    schema: ClassVar[TargetSchema | None] = None
    #: what a ready item's names share on the node, as `evict`'s refusal names it
    shared_as: ClassVar[str] = "blob"

    def check(self, request: SourceRequest) -> None:
        """Refuse a bad request by its own rules (InvalidSpec naming the field), needing
        nothing of the node: the coordinator runs it too, before any node is asked."""
        return None  # a hook: nothing to do for most kinds

    def validate(self, request: SourceRequest, work: Work) -> None:
        """Refuse a request by what needs the node (its URL policy, header files, the
        runtime) before anything is written; `check` has passed."""
        return None  # a hook: nothing to do for most kinds

    @abc.abstractmethod
    def target(self, request: SourceRequest, work: Work) -> Target:
        """The item ``request`` names."""

    def identity(self, item: CacheItem, work: Work) -> str:
        """What makes a stored item the same as a new request's ``Target.identity``."""
        return item.source

    def shortcut(self, item: CacheItem, work: Work) -> CacheItem | None:
        """A queued new item already satisfied without a run (the same content under another
        name), ready; None to run it."""
        return None

    def after_ready(self, item: CacheItem, work: Work) -> None:
        """Once a `shortcut` item is recorded: what it needs on disk (a by-name link)."""
        return None  # a hook: nothing to do for most kinds

    @abc.abstractmethod
    def run(self, item: CacheItem, event: threading.Event, work: Work) -> Outcome:
        """Do the item's work (it is FETCHING and claimed) and say how it went; the service
        writes the row. Partials are closed before it returns."""

    def ready(self, item: CacheItem) -> bool:
        """Worth a ``cache.<name>=ready`` node label."""
        return item.state is ItemState.READY

    def unready(self, item: CacheItem, work: Work, verify_digest: bool = False) -> str | None:
        """Why a ready item is not there (None when it is); ``verify_digest`` hashes bytes."""
        return work.store.missing(item, verify_digest)

    def recheck(self, item: CacheItem, work: Work) -> str | None:
        """The audit's check of a ready item: why it is gone (None: there, or not known)."""
        return self.unready(item, work)

    def due(self, item: CacheItem, now: float) -> bool:
        """Whether a ready item is to be fetched again by the audit (a moving tag's interval)."""
        return False

    def repull(self, item: CacheItem, options: Mapping[str, str], now: float) -> bool:
        """Whether a new request with ``options`` runs a ready item again instead of a hit."""
        return False

    def discard(self, item: CacheItem, work: Work) -> None:
        """Drop what a ready item found not to be what it claims left in the cache."""
        work.store.discard_item(item)

    def sharing(self, item: CacheItem, work: Work) -> list[CacheItem]:
        """The other ready items standing on what ``item`` is on the node (the default: the
        other names of its blob): evicting it evicts them, deleting it leaves it to them."""
        if item.sha256 is None or work.store.layout(item) is not Layout.BLOB:
            return []
        return [i for i in work.store.on_blob(item.sha256) if i.id != item.id]

    def evict(self, item: CacheItem, by: Actor | None, work: Work) -> CacheItem:
        """Remove a ready item from the node; returns its row. Removing what it stands on
        removes every name `sharing` it, so each must be the caller's to evict and none
        pinned; then `remove` does the kind's part."""
        others = self.sharing(item, work)
        for other in others:  # evicting the blob or image evicts every name on it
            check_may_undo(by, other.owner_role, other.name, "evict")
        if item.pinned:
            raise Conflict(f"{item.name} is pinned; unpin first")
        pinned = [i.name for i in others if i.pinned]
        if pinned:
            raise Conflict(
                f"{item.name} shares its {self.shared_as} with pinned {', '.join(pinned)}; "
                "unpin first"
            )
        return self.remove(item, others, work)

    def remove(self, item: CacheItem, others: list[CacheItem], work: Work) -> CacheItem:
        """`evict`'s own part, its checks passed: take ``item`` and the ``others`` on it off
        the node; returns its row. The default deletes the blob, and the store marks every
        name on it evicted; a blob a process holds is refused by the store."""
        assert item.sha256 is not None
        work.store.evict(item.sha256)
        return work.index.get(item.id)

    def pin(self, item: CacheItem, pinned: bool, work: Work) -> None:
        """Pin or unpin a ready item where it lives, beyond the cache's own pin (the runtime)."""
        return None  # a hook: nothing to do for most kinds

    def pin_after_hit(self, item: CacheItem, work: Work) -> None:
        """A hit of a pinned item: pin it where it lives (again: an earlier pin may have
        failed), keeping what fails where readers see it."""
        return None  # a hook: nothing to do for most kinds

    def describe(self, item: CacheItem) -> str:
        """The item's source as readers see it: no signature or user info."""
        return redact_url(item.source)

    def claim(self, request: SourceRequest) -> Claim | None:
        """The `Claim` of ``request``'s item: its source as `describe` will show it (the
        `Target.source` of `target`, which may need the node). None when the kind cannot tell
        it without the node: then only the item name is compared."""
        return None


_RETRY_OPTIONS = ("retry_at", "attempts")


def without_retry(options: Mapping[str, str]) -> dict[str, str]:
    """An item's options less the retry schedule of its last failure."""
    return {k: v for k, v in options.items() if k not in _RETRY_OPTIONS}
