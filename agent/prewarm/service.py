"""PrewarmService: the one entry point the CLI and the gRPC API call.

Requests become validated rows at once (`submit`); `run` does the work of one item in the
calling thread, and `start` runs queued items on a small worker pool. Progress reaches
subscribers (terminal, operation metadata, API streams) through callbacks and is saved in the
item's row. Items left fetching by a dead process are taken over and resume from their partial.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Protocol

import psutil

from agent.clocks import deadline_from_wall, start_from_wall
from agent.errors import (
    AgentError,
    Busy,
    Conflict,
    FieldViolation,
    InvalidSpec,
    StateUnavailable,
)
from agent.owner import Actor, check_may_undo, claimed_by
from agent.prewarm.docker_auth import registry_host
from agent.prewarm.errors import Cancelled, FetchFailed, ImageWarmFailed
from agent.prewarm.fetch_http import CancelledFn, FetchInfo, FetchSpec, ProgressFn
from agent.prewarm.group import Member, check_include, check_repo, list_group, listing_url
from agent.prewarm.headers import HeaderDir, check_header_name, read_header_files
from agent.prewarm.index import ImagePull, PrewarmIndex
from agent.prewarm.inventory import Inventory
from agent.prewarm.model import (
    CacheItem,
    FileRequest,
    GroupRequest,
    ImageRequest,
    ImageWarmth,
    ItemKind,
    ItemState,
    Progress,
    PullPolicy,
    Warmth,
)
from agent.prewarm.naming import (
    DEFAULT_IGNORED_QUERY_PARAMS,
    check_name,
    default_name,
    qualified_name,
    source_identity,
)
from agent.prewarm.policy import UrlPolicy, redact_url
from agent.prewarm.progress import ProgressMeter
from agent.prewarm.sink import Sink
from agent.prewarm.store import CacheStore, MemberPartial, Partial

log = logging.getLogger(__name__)

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PUBLISH_S = 0.5
_SAVE_S = 1.0
_HEADER_PREFIX = "header:"
# Options an image request sets; the rest are results of the last run and are replaced.
_REQUEST_OPTIONS = ("runtime_handler", "pull_policy", "repull_hours")
_RETRY_OPTIONS = ("retry_at", "attempts")
_MAX_REPULL_H = 24 * 365
Request = FileRequest | ImageRequest | GroupRequest

ProgressCallback = Callable[[Progress], None]


class FileFetcher(Protocol):
    """Moves one URL's bytes into a Sink (direct HTTP, Dragonfly proxy or dfdaemon gRPC)."""

    @property
    def mode(self) -> str: ...

    def fetch(
        self, spec: FetchSpec, partial: Sink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo: ...

    def interrupt(self) -> None:
        """Unblock fetches waiting on the network; each then sees that it is cancelled."""


@dataclass(frozen=True, slots=True)
class PullResult:
    image_ref: str
    size: int | None
    cold: bool
    seconds: float


class ImagePuller(Protocol):
    """Pulls, checks, pins and removes images in the node's runtime (CRI)."""

    def pull(self, ref: str, runtime_handler: str | None) -> PullResult: ...

    def interrupt(self) -> None:
        """Cancel pulls in flight; each raises Cancelled."""

    def present(self, ref: str) -> bool:
        """Whether the runtime has ``ref``; raises AgentError when it cannot say."""
        ...

    def set_pinned(self, ref: str, pinned: bool) -> None: ...

    def remove(self, ref: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Plan:
    """One request's effect, decided before anything is written: ``write`` runs inside the
    request's one transaction, ``after`` (links on disk, runtime pins) once it committed."""

    name: str
    write: Callable[[], CacheItem]
    after: Callable[[CacheItem], None] = lambda item: None


@dataclass(frozen=True, slots=True)
class WarmResult:
    warmth: ImageWarmth
    notes: Mapping[str, str] = field(default_factory=dict)  # facts for the item's options


class ImageWarmer(Protocol):
    """After the pull: warms what it left cold (a Nydus image's data) and says how warm the
    image is; raises ImageWarmFailed with the warmth reached when a blob cannot be warmed."""

    def warm(
        self,
        ref: str,
        runtime_handler: str | None,
        progress: ProgressFn,
        cancelled: CancelledFn,
    ) -> WarmResult: ...


class PrewarmService:
    def __init__(
        self,
        index: PrewarmIndex,
        store: CacheStore,
        policy: UrlPolicy,
        fetcher: FileFetcher,
        puller: ImagePuller | None = None,
        warmer: ImageWarmer | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        workers: int = 2,
        header_dirs: Sequence[HeaderDir] = (),
        ignored_query_params: Sequence[str] = DEFAULT_IGNORED_QUERY_PARAMS,
        retry_initial_s: float = 30.0,
        retry_max_s: float = 3600.0,
        lister: FileFetcher | None = None,
        group_parallel: int = 8,
    ) -> None:
        self.index = index
        self._lister = lister or fetcher
        self._group_parallel = group_parallel
        self._ignored_params = tuple(ignored_query_params)
        self._retry_initial = retry_initial_s
        self._retry_max = retry_max_s
        self._header_dirs = tuple(header_dirs)
        self.store = store
        self.policy = policy
        self._fetcher = fetcher
        self._puller = puller
        self._warmer = warmer
        self._clock = clock
        self._monotonic = monotonic
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[str, Future[CacheItem]] = {}
        self._cancel_events: dict[str, threading.Event] = {}
        self._subscribers: list[ProgressCallback] = []
        self._lock = threading.Lock()
        #: retries scheduled in this process: item id -> (the stored wall-clock retry_at, the
        #: monotonic deadline it stands for); the wall clock only says when across a restart
        self._retry_due: dict[str, tuple[float, float]] = {}
        #: monotonic start of items being warmed, for their time-to-warm
        self._started: dict[str, float] = {}
        #: items whose outcome the state store refused to record (its disk full or read-only):
        #: item id -> why; shown as failed with that reason and run again by `retry_due`
        self._unrecorded: dict[str, str] = {}

    # -- requests -----------------------------------------------------------------------------

    def submit(self, request: Request, by: Actor | None = None) -> CacheItem:
        """Validate and record a request; returns the item (already ready on a cache hit)."""
        return self.submit_all([request], by)[0]

    def submit_all(self, requests: Sequence[Request], by: Actor | None = None) -> list[CacheItem]:
        """Validate and plan every request, then record them all in one transaction: a bad
        manifest, or one item of it that conflicts, changes nothing. ``by`` (None: the agent
        itself) becomes the owner of new items, and of old ones it outranks (agent/owner.py)."""
        for request in requests:
            self._validate(request)
        plans = [self._plan(r) for r in requests]
        seen: dict[str, int] = {}
        for i, plan in enumerate(plans):
            if plan.name in seen:
                raise InvalidSpec(
                    f"items {seen[plan.name]} and {i} would both be named {plan.name!r}",
                    [FieldViolation(f"items[{i}].name", "a name no other item of the request has")],
                )
            seen[plan.name] = i
        with self.index.transaction():
            items = [self._claim_for(plan.write(), by) for plan in plans]
        for plan, item in zip(plans, items, strict=True):
            plan.after(item)
        return items

    def _claim_for(self, item: CacheItem, by: Actor | None) -> CacheItem:
        owner, role = claimed_by(by, item.owner, item.owner_role)
        if (owner, role) == (item.owner, item.owner_role):
            return item
        return self.index.update(item.id, owner=owner, owner_role=role)

    def _validate(self, request: Request) -> None:
        if request.name is not None:
            check_name(request.name)
        if isinstance(request, FileRequest):
            self.policy.check(request.url)
            if request.sha256 is not None and not _SHA256.fullmatch(request.sha256):
                raise InvalidSpec(
                    "sha256 must be 64 lowercase hex digits",
                    [FieldViolation("sha256", "64 characters 0-9 a-f")],
                )
            for header in request.header_files:
                check_header_name(header)
            read_header_files(
                request.header_files, self._header_dirs, request.url
            )  # fail now, not minutes later
            return
        if isinstance(request, GroupRequest):
            check_repo(request.repo, request.revision)
            listing = listing_url(request.endpoint, request.repo, request.revision)
            self.policy.check(listing)
            check_include(request.include)
            for header in request.header_files:
                check_header_name(header)
            read_header_files(request.header_files, self._header_dirs, listing)
            return
        if not request.ref or any(c.isspace() for c in request.ref):
            raise InvalidSpec(
                "image reference is empty or has spaces",
                [FieldViolation("image", "e.g. registry.example.com/repo:tag")],
            )
        self.policy.check_registry(registry_host(request.ref))
        if request.repull_hours is not None and not 0 < request.repull_hours <= _MAX_REPULL_H:
            raise InvalidSpec(
                f"repull_hours must be > 0 and <= {_MAX_REPULL_H}",
                [FieldViolation("repull_hours", f"hours, 0 < h <= {_MAX_REPULL_H}")],
            )

    def identity(self, url: str) -> str:
        """What makes two file URLs the same item: the URL without its signature parameters."""
        return source_identity(url, self._ignored_params)

    def _plan(self, request: Request) -> _Plan:
        if isinstance(request, FileRequest):
            return self._plan_file(request)
        if isinstance(request, GroupRequest):
            return self._plan_group(request)
        return self._plan_image(request)

    def _free_name(self, source: str, identity: str, kind: ItemKind) -> str:
        """The default name, unless another source holds it: then one qualified by a hash."""
        base = default_name(source)
        holder = self.index.find_by_name(base)
        if holder is None or (holder.kind is kind and self._identity_of(holder) == identity):
            return base
        return qualified_name(base, identity)

    def _identity_of(self, item: CacheItem) -> str:
        return self.identity(item.source) if item.kind is ItemKind.FILE else item.source

    def _plan_group(self, request: GroupRequest) -> _Plan:
        # The file selection is part of what the item is: other globs are another source.
        source = listing_url(request.endpoint, request.repo, request.revision)
        if request.include:
            source += "#include=" + ",".join(request.include)
        pretty = (
            request.repo if request.revision == "main" else f"{request.repo}:{request.revision}"
        )
        name = request.name or self._free_name(pretty, source, ItemKind.GROUP)
        options = {f"{_HEADER_PREFIX}{k}": str(v) for k, v in request.header_files.items()}
        options.update(
            repo=request.repo,
            revision=request.revision,
            endpoint=request.endpoint,
            include=json.dumps(list(request.include)),
        )
        existing = self.index.find_by_name(name)
        if existing is not None:
            return self._plan_again(existing, source, source, None, request, options)
        item = CacheItem(
            id=_new_id(),
            kind=ItemKind.GROUP,
            name=name,
            source=source,
            state=ItemState.QUEUED,
            pinned=request.pin,
            created_at=self._clock(),
            options=options,
        )
        return _Plan(name, partial(self.index.insert, item))

    def _plan_file(self, request: FileRequest) -> _Plan:
        identity = self.identity(request.url)
        name = request.name or self._free_name(request.url, identity, ItemKind.FILE)
        options = {f"{_HEADER_PREFIX}{k}": str(v) for k, v in request.header_files.items()}
        existing = self.index.find_by_name(name)
        if existing is not None:
            return self._plan_again(
                existing, request.url, identity, request.sha256, request, options
            )
        now = self._clock()
        item = CacheItem(
            id=_new_id(),
            kind=ItemKind.FILE,
            name=name,
            source=request.url,
            state=ItemState.QUEUED,
            pinned=request.pin,
            expected_sha256=request.sha256,
            created_at=now,
            options=options,
        )
        size = self.store.blob_size(request.sha256) if request.sha256 else None
        if size is not None:
            # Same content under another name: link it, no fetch, once the bytes still hash right.
            ready = replace(
                item,
                state=ItemState.READY,
                sha256=request.sha256,
                size=size,
                finished_at=now,
                last_used=now,
                warm_seconds=0.0,
            )
            if self.store.missing(ready, verify_digest=True) is None:
                return _Plan(name, partial(self.index.insert, ready), self._link)
        return _Plan(name, partial(self.index.insert, item))

    def _link(self, item: CacheItem) -> None:
        if item.sha256:
            self.store.link_name(item.name, item.sha256)

    def _plan_image(self, request: ImageRequest) -> _Plan:
        name = request.name or self._free_name(request.ref, request.ref, ItemKind.IMAGE)
        options = {"pull_policy": request.pull_policy.value}
        if request.runtime_handler:
            options["runtime_handler"] = request.runtime_handler
        if request.repull_hours is not None:
            options["repull_hours"] = f"{request.repull_hours:g}"
        existing = self.index.find_by_name(name)
        if existing is not None:
            return self._plan_again(existing, request.ref, request.ref, None, request, options)
        item = CacheItem(
            id=_new_id(),
            kind=ItemKind.IMAGE,
            name=name,
            source=request.ref,
            state=ItemState.QUEUED,
            pinned=request.pin,
            created_at=self._clock(),
            options=options,
        )
        return _Plan(name, partial(self.index.insert, item))

    def _plan_again(
        self,
        item: CacheItem,
        source: str,
        identity: str,
        sha256: str | None,
        request: Request,
        options: dict[str, str],
    ) -> _Plan:
        """The same name again: a hit when ready and verified, else a retry (a re-signed URL
        of the same identity takes the item over and resumes its partial)."""
        kind = _KINDS[type(request)]
        if item.kind is not kind or self._identity_of(item) != identity:
            raise Conflict(
                f"a cache item named {item.name!r} already exists for another source; "
                "choose another --name"
            )
        if sha256 and item.expected_sha256 not in (None, sha256):
            raise Conflict(
                f"{item.name} was requested with sha256 {item.expected_sha256}, now with "
                f"{sha256} (field sha256); choose another --name or prewarm delete it first"
            )
        pinned = item.pinned or request.pin
        if item.state is ItemState.READY:
            reason = self._unready(item, verify_digest=sha256 is not None)
            if reason is None and sha256 and item.sha256 != sha256:
                raise Conflict(
                    f"{item.name} is ready with sha256 {item.sha256}, not the requested {sha256} "
                    "(field sha256): the origin's content differs; nothing changed"
                )
            if reason is None and item.label_ready and not self._repull(item, options):
                changes = {
                    "hits": item.hits + 1,
                    "last_used": self._clock(),
                    "pinned": pinned,
                    "source": source,  # the latest signature, for the next fetch
                    "expected_sha256": sha256 or item.expected_sha256,
                }
                pin_now = kind is ItemKind.IMAGE and pinned and not item.pinned
                after = self._pin_in_runtime if pin_now else _nothing
                return _Plan(item.name, partial(self.index.update, item.id, **changes), after)
            if reason is not None:
                log.warning(
                    "%s is not what its row claims (%s); fetching it again", item.name, reason
                )
                if kind is not ItemKind.IMAGE:
                    self.store.discard_item(item)
        if item.state in (ItemState.FAILED, ItemState.EVICTED, ItemState.READY):
            # A ready image that is not fully warm (bootstrap-only, unknown) is warmed again:
            # Dragonfly may be there now, and a prefetch hint is used only once.
            changes = {
                "state": ItemState.QUEUED,
                "error": None,
                "pinned": pinned,
                "source": source,
                "options": options,
                "expected_sha256": sha256 or item.expected_sha256,
                "fetched_bytes": 0,
                "started_at": None,
                "finished_at": None,
            }
            return _Plan(item.name, partial(self.index.update, item.id, **changes))
        changes = {"pinned": pinned}
        if item.state is ItemState.QUEUED:
            changes["source"] = source
        return _Plan(item.name, partial(self.index.update, item.id, **changes))

    def _repull(self, item: CacheItem, options: Mapping[str, str]) -> bool:
        """Whether a ready image is pulled again under the request's pull policy."""
        if item.kind is not ItemKind.IMAGE:
            return False
        if options.get("pull_policy") == PullPolicy.ALWAYS.value:
            return True
        return _repull_due(options, item.finished_at, self._clock())

    def _unready(self, item: CacheItem, verify_digest: bool = False) -> str | None:
        """Why a ready item is not there (None when it is): a file's blob on disk with its size
        (and digest when asked), an image in the CRI. A CRI that cannot answer is a reason."""
        if item.kind is not ItemKind.IMAGE:
            return self.store.missing(item, verify_digest)
        if self._puller is None:
            return "no image puller (CRI) is configured"
        try:
            present = self._puller.present(item.source)
        except AgentError as exc:
            return f"cannot check the runtime: {exc}"
        return None if present else f"image {item.source} is no longer in the runtime"

    def audit(self) -> list[CacheItem]:
        """Re-check every ready item: a file whose blob is gone or wrong, or an image the
        runtime no longer has (kubelet image GC), becomes evicted, so its label drops at the
        next publish; an image past its re-pull interval is queued. A runtime that cannot answer
        leaves its images as they are (unknown is not absent). Returns the items changed."""
        changed = []
        now = self._clock()
        for item in self.index.items([ItemState.READY]):
            if item.kind is ItemKind.IMAGE and _repull_due(item.options, item.finished_at, now):
                changed.append(self.index.update(item.id, state=ItemState.QUEUED))
                continue
            if item.kind is ItemKind.IMAGE and self._puller is not None:
                try:
                    present = self._puller.present(item.source)
                except AgentError as exc:
                    log.warning("audit cannot check image %s: %s", item.name, exc)
                    continue
                reason = None if present else f"image {item.source} is no longer in the runtime"
            else:
                reason = self._unready(item)
            if reason is None:
                continue
            log.warning("audit: %s is not ready: %s", item.name, reason)
            if item.kind is not ItemKind.IMAGE:
                self.store.discard_item(item)
            with self.index.transaction():
                # A request may have queued it again meanwhile: leave that alone.
                if self.index.get(item.id).state not in (ItemState.READY, ItemState.EVICTED):
                    continue
                changed.append(self.index.update(item.id, state=ItemState.EVICTED, error=reason))
        return changed

    # -- inventory ----------------------------------------------------------------------------

    def items(self) -> list[CacheItem]:
        return [self._shown(i) for i in self.index.items()]

    def get(self, id_or_name: str) -> CacheItem:
        return self._shown(self.index.find(id_or_name))

    def _shown(self, item: CacheItem) -> CacheItem:
        """The row, or for an item whose outcome could not be recorded, failed with why."""
        with self._lock:
            why = self._unrecorded.get(item.id)
        if why is None or item.state not in (ItemState.FETCHING, ItemState.QUEUED):
            return item
        return replace(item, state=ItemState.FAILED, error=why)

    def pulls(self) -> list[ImagePull]:
        return self.index.pulls()

    def inventory(self) -> Inventory:
        """One consistent read for metrics and node labels."""
        return Inventory(self.items(), self.store.usage(), self.index.pulls())

    def pin(self, id_or_name: str, pinned: bool = True, by: Actor | None = None) -> CacheItem:
        """Keep an item out of eviction; a ready image is also pinned in containerd. Pinning
        claims the item for ``by`` when it outranks the owner; unpinning needs that rank."""
        item = self.index.find(id_or_name)
        if not pinned:
            check_may_undo(by, item.owner_role, item.name, "unpin")
        if item.kind is ItemKind.IMAGE and item.state is ItemState.READY and self._puller:
            self._puller.set_pinned(item.source, pinned)
        owner, role = claimed_by(by if pinned else None, item.owner, item.owner_role)
        return self.index.update(item.id, pinned=pinned, owner=owner, owner_role=role)

    def _pin_in_runtime(self, item: CacheItem) -> None:
        if self._puller is None:
            return
        try:
            self._puller.set_pinned(item.source, True)
        except AgentError as exc:
            log.warning("cannot pin image %s in the runtime: %s", item.name, exc)

    def evict(self, id_or_name: str, by: Actor | None = None) -> CacheItem:
        """Remove a ready item: a file from disk (and other names sharing its blob), an image
        from the runtime. Pinned items and blobs a process holds are refused; an item already
        evicted (e.g. an image the kubelet removed) is returned as it is."""
        item = self.index.find(id_or_name)
        if item.state is ItemState.EVICTED:
            return item
        check_may_undo(by, item.owner_role, item.name, "evict")
        if item.state is not ItemState.READY:
            raise Conflict(f"{item.name} is {item.state.value}; only ready items can be evicted")
        if item.kind is ItemKind.IMAGE:
            if item.pinned:
                raise Conflict(f"{item.name} is pinned; unpin first")
            if self._puller is not None:
                self._puller.remove(item.source)
            return self.index.update(item.id, state=ItemState.EVICTED)
        if item.kind is ItemKind.GROUP:
            if item.pinned:
                raise Conflict(f"{item.name} is pinned; unpin first")
            self.store.evict_group(item)
            return self.index.get(item.id)
        assert item.sha256 is not None
        sharing = self.index.ready_with_digest(item.sha256)
        for other in sharing:  # evicting the blob evicts every name on it
            check_may_undo(by, other.owner_role, other.name, "evict")
        pinned = [i.name for i in sharing if i.pinned]
        if pinned:
            raise Conflict(
                f"{item.name} shares its blob with pinned {', '.join(pinned)}; unpin first"
            )
        self.store.evict(item.sha256)
        return self.index.get(item.id)

    def delete(self, id_or_name: str, by: Actor | None = None) -> CacheItem:
        """Remove an item from the inventory: a ready one is evicted first (same refusals), a
        queued one loses its partial; a fetching one must be cancelled first."""
        item = self.index.find(id_or_name)
        check_may_undo(by, item.owner_role, item.name, "delete")
        if item.state is ItemState.FETCHING:
            raise Conflict(f"{item.name} is fetching; cancel it first")
        if item.state is ItemState.READY:
            self.evict(item.id, by)
        self.index.delete(item.id)
        self.store.discard_partial(item.id)
        if not any(i.name == item.name for i in self.index.items([ItemState.READY])):
            self.store.remove_link(item.name)
        return item

    def cancel(self, id_or_name: str, by: Actor | None = None) -> CacheItem:
        """Stop a queued or running item; the worker (maybe another process) sees it and stops."""
        item = self.index.find(id_or_name)
        check_may_undo(by, item.owner_role, item.name, "cancel")
        if item.state not in (ItemState.QUEUED, ItemState.FETCHING):
            raise Conflict(
                f"{item.name} is {item.state.value}; only queued or fetching items cancel"
            )
        with self._lock:
            event = self._cancel_events.get(item.id)
        if event is not None:
            event.set()
        updated = self.index.update(
            item.id,
            state=ItemState.FAILED,
            error="cancelled",
            finished_at=self._clock(),
            options=_without_retry(item.options),
        )
        if item.state is ItemState.QUEUED:
            self.store.discard_partial(item.id)
        return updated

    def subscribe(self, callback: ProgressCallback) -> Callable[[], None]:
        """Call ``callback`` with every published Progress; returns the unsubscribe function."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.remove(callback)

        return unsubscribe

    # -- work ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Clean up after a crash, then run queued items and take over orphaned fetches."""
        self.store.reconcile()
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="prewarm")
        self.schedule_pending()

    def schedule_pending(self) -> None:
        """Run queued items, fetches whose process died, and failed items due for a retry."""
        again = set(self._queue_due_retries())
        for item in self.index.items([ItemState.QUEUED, ItemState.FETCHING]):
            if (
                item.state is ItemState.QUEUED
                or item.id in again
                or not _alive(self.index.owner(item.id))
            ):
                self.enqueue(item.id)

    def retry_due(self) -> None:
        """Run the failed items whose retry is due, and those whose outcome the state store
        could not record (the agent calls this on a timer)."""
        for item_id in self._queue_due_retries():
            self.enqueue(item_id)

    def _queue_due_retries(self) -> list[str]:
        wall, mono = self._clock(), self._monotonic()
        due = []
        failed = [i for i in self.index.items([ItemState.FAILED]) if i.retry_at is not None]
        with self._lock:
            for item in failed:
                assert item.retry_at is not None
                known = self._retry_due.get(item.id)
                if known is None or known[0] != item.retry_at:  # set before this process, or by
                    deadline = deadline_from_wall(  # another one (the CLI's embedded agent)
                        item.retry_at,
                        wall_now=wall,
                        mono_now=mono,
                        bound_s=self._retry_delay(item.attempts),
                    )
                    known = self._retry_due[item.id] = (item.retry_at, deadline)
                if known[1] <= mono:
                    due.append(item)
            waiting = {i.id for i in failed} - {i.id for i in due}
            self._retry_due = {k: v for k, v in self._retry_due.items() if k in waiting}
            unrecorded = list(self._unrecorded)
        if unrecorded:  # those deleted meanwhile are gone
            live = {i.id for i in self.index.items([ItemState.QUEUED, ItemState.FETCHING])}
            with self._lock:
                for gone in [i for i in unrecorded if i not in live]:
                    self._unrecorded.pop(gone, None)
            unrecorded = [i for i in unrecorded if i in live]
        for item in due:
            log.info("retrying %s (attempt %d): %s", item.name, item.attempts + 1, item.error)
            self.index.update(item.id, state=ItemState.QUEUED)
        return [item.id for item in due] + unrecorded

    def _retry_delay(self, attempts: int) -> float:
        """The wait before retry number ``attempts``: doubling from the first, up to the cap."""
        return min(self._retry_initial * 2 ** (max(attempts, 1) - 1), self._retry_max)

    def enqueue(self, item_id: str) -> Future[CacheItem]:
        if self._pool is None:
            raise AgentError("prewarm service is not started")
        with self._lock:
            future = self._futures.get(item_id)
            if future is None or future.done():
                future = self._pool.submit(self.run, item_id)
                self._futures[item_id] = future
        return future

    def wait(self, item_id: str, timeout: float | None = None) -> CacheItem:
        with self._lock:
            future = self._futures.get(item_id)
        if future is not None:
            future.exception(timeout)
        return self._shown(self.index.get(item_id))

    def stop(self) -> None:
        """Stop workers; running fetches are cancelled and keep their partials for resume."""
        with self._lock:
            events = list(self._cancel_events.values())
        for event in events:
            event.set()
        self._fetcher.interrupt()
        if self._puller is not None:
            self._puller.interrupt()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(self, item_id: str) -> CacheItem:
        """Do one item's work now, in this thread; returns its final row (ready or failed)."""
        event = threading.Event()
        with self._lock:
            self._cancel_events[item_id] = event
        try:
            item = self._claim(item_id)
            with self._lock:
                self._unrecorded.pop(item_id, None)
            if item.state is not ItemState.FETCHING:
                return item
            if item.kind is ItemKind.FILE:
                return self._run_file(item, event)
            if item.kind is ItemKind.GROUP:
                return self._run_group(item, event)
            return self._run_image(item, event)
        except StateUnavailable as exc:
            return self._not_recorded(item_id, exc)
        finally:
            with self._lock:
                self._cancel_events.pop(item_id, None)

    def _not_recorded(self, item_id: str, exc: StateUnavailable) -> CacheItem:
        """The state store refused to record how the item's run went: nothing is lost that a
        new run cannot redo, so the item shows failed with the store's reason and `retry_due`
        runs it again until the store takes the outcome."""
        why = f"{exc}; the outcome was not recorded and it runs again once it can be"
        with self._lock:
            self._unrecorded[item_id] = why
        log.error("prewarm of item %s: %s", item_id, why)
        return self._shown(self.index.get(item_id))

    def _claim(self, item_id: str) -> CacheItem:
        with self.index.transaction():
            item = self.index.get(item_id)
            owner = self.index.owner(item_id)
            if item.state is ItemState.FETCHING and owner != os.getpid() and _alive(owner):
                raise Busy(f"{item.name} is being fetched by process {owner}", [str(owner)])
            if item.state not in (ItemState.QUEUED, ItemState.FETCHING):
                return item
            self.index.set_owner(item_id, os.getpid())
            wall, mono = self._clock(), self._monotonic()
            with self._lock:
                if item.started_at is None:
                    self._started[item_id] = mono
                elif item_id not in self._started:  # started by an earlier process
                    self._started[item_id] = start_from_wall(
                        item.started_at, wall_now=wall, mono_now=mono
                    )
            return self.index.update(
                item_id, state=ItemState.FETCHING, started_at=item.started_at or wall
            )

    def _warm_seconds(self, item_id: str) -> float:
        """Monotonic seconds from the item's first run to now (retries included)."""
        mono = self._monotonic()
        with self._lock:
            return max(0.0, mono - self._started.pop(item_id, mono))

    def _watchers(self, item: CacheItem, event: threading.Event) -> tuple[ProgressFn, CancelledFn]:
        """Progress (published, saved in the row) and cancellation checks for one item's fetch."""
        meter = ProgressMeter(item.id, self._monotonic)
        last = {"publish": 0.0, "save": 0.0, "check": 0.0}

        def progress(done: int, total: int | None) -> None:
            meter.update(done, total)
            now = self._monotonic()
            if now - last["publish"] >= _PUBLISH_S or done == total:
                last["publish"] = now
                self._publish(meter.snapshot())
            if now - last["save"] >= _SAVE_S:
                last["save"] = now
                with contextlib.suppress(StateUnavailable):  # a hint for resume: the
                    self.index.update(item.id, fetched_bytes=done)  # outcome write says

        def cancelled() -> bool:
            if event.is_set():
                return True
            now = self._monotonic()
            if now - last["check"] < _PUBLISH_S:
                return False
            last["check"] = now
            return self.index.get(item.id).state is not ItemState.FETCHING  # cancelled elsewhere

        return progress, cancelled

    def _run_file(self, item: CacheItem, event: threading.Event) -> CacheItem:
        partial = self.store.partial(item.id)
        if partial.offset:
            log.info("resuming %s from %d bytes on disk", item.name, partial.offset)
        progress, cancelled = self._watchers(item, event)
        try:
            headers = read_header_files(_header_files(item), self._header_dirs, item.source)
            spec = FetchSpec(
                item.source, headers, item.expected_sha256, resume_key=self.identity(item.source)
            )
            info = self._fetcher.fetch(spec, partial, progress, cancelled)
            size = partial.offset
            digest = self.store.commit(item, partial)
        except Cancelled:
            partial.close()
            if self.index.get(item.id).state is ItemState.FETCHING:
                # Stopped by shutdown, not by a user: keep the partial and resume later.
                self.index.update(item.id, state=ItemState.QUEUED, fetched_bytes=partial.offset)
                self.index.set_owner(item.id, None)
            else:
                self.store.discard_partial(item.id)
            return self.index.get(item.id)
        except FetchFailed as exc:
            return self._fail(item, partial, str(exc), transient=exc.transient)
        except StateUnavailable:
            partial.close()
            raise
        except AgentError as exc:
            return self._fail(item, partial, str(exc))
        except Exception as exc:
            log.exception("prewarm of %s failed unexpectedly", item.name)
            return self._fail(item, partial, f"internal error: {type(exc).__name__}: {exc}")
        now = self._clock()
        options = _without_retry(item.options)
        if info.dragonfly_task_id:
            options["dragonfly_task_id"] = info.dragonfly_task_id
        options.pop("dragonfly_output", None)  # this run's, not one before a config change
        if info.dragonfly_output:
            options["dragonfly_output"] = info.dragonfly_output
        options["via"] = self._fetcher.mode
        self.index.set_owner(item.id, None)
        done = self.index.update(
            item.id,
            state=ItemState.READY,
            sha256=digest,
            size=size,
            fetched_bytes=size,
            finished_at=now,
            last_used=now,
            error=None,
            options=options,
            warm_seconds=self._warm_seconds(item.id),
        )
        log.info(
            "prewarmed %s (%d bytes, sha256 %s) via %s", item.name, size, digest, self._fetcher.mode
        )
        return done

    def _fail(
        self,
        item: CacheItem,
        partials: Partial | Sequence[Partial],
        error: str,
        transient: bool = False,
        kept: int | None = None,
    ) -> CacheItem:
        """Fail the item; a transient failure keeps its partial(s) and is retried by the agent
        after a doubling delay, anything else loses them and waits for a new request."""
        parts = [partials] if isinstance(partials, Partial) else list(partials)
        for part in parts:
            part.close()
        if kept is None:
            kept = sum(part.offset for part in parts)
        self.index.set_owner(item.id, None)
        now = self._clock()
        options = _without_retry(item.options)
        if transient:
            attempts = item.attempts + 1
            delay = self._retry_delay(attempts)
            retry_at = f"{now + delay:.3f}"
            options.update(retry_at=retry_at, attempts=str(attempts))
            with self._lock:
                self._retry_due[item.id] = (float(retry_at), self._monotonic() + delay)
            error = f"{error} (retrying in {delay:.0f}s, {kept} bytes kept)"
        else:
            self.store.discard_partial(item.id)
            with self._lock:
                self._started.pop(item.id, None)  # a new request starts the clock again
        log.warning("prewarm of %s (%s) failed: %s", item.name, redact_url(item.source), error)
        return self.index.update(
            item.id,
            state=ItemState.FAILED,
            error=error,
            size=None,
            finished_at=now,
            options=options,
            fetched_bytes=kept if transient else 0,
        )

    def _run_group(self, item: CacheItem, event: threading.Event) -> CacheItem:
        """List the snapshot, admit its total size, fetch and commit the missing files in
        parallel (each resumable on its own), then lay out the model directory."""
        progress, cancelled = self._watchers(item, event)
        opts = item.options
        # Files of this snapshot already committed by an earlier, failed run: url -> sha256.
        fetched: dict[str, str] = json.loads(opts.get("fetched", "{}"))
        try:
            headers = read_header_files(
                _header_files(item),
                self._header_dirs,
                listing_url(opts["endpoint"], opts["repo"], opts["revision"]),
            )
            listing = list_group(
                self._lister,
                opts["endpoint"],
                opts["repo"],
                opts["revision"],
                json.loads(opts.get("include", "[]")),
                headers,
                cancelled,
            )
            have: dict[str, str] = {}
            for m in listing.members:
                sha = m.sha256 or fetched.get(m.url)
                if sha and self.store.blob_size(sha) == m.size:
                    have[m.path] = sha
            todo = [m for m in listing.members if m.path not in have]
            on_disk = sum(self.store.partial_size(_member_key(item.id, m.path)) for m in todo)
            self.store.admit(item.id, listing.total, on_disk=on_disk)
            self._fetch_members(
                item, todo, have, fetched, headers, listing.total, progress, cancelled
            )
            files = [(m.path, have[m.path], m.size) for m in listing.members]
            self.store.link_tree(item.name, item.id, [(p, sha) for p, sha, _ in files])
        except Cancelled:
            if self.index.get(item.id).state is ItemState.FETCHING:
                self.index.update(
                    item.id,
                    state=ItemState.QUEUED,
                    options={**opts, "fetched": json.dumps(fetched)},
                )
                self.index.set_owner(item.id, None)
            else:
                self.store.discard_partial(item.id)
            return self.index.get(item.id)
        except StateUnavailable:
            raise
        except Exception as exc:
            transient = isinstance(exc, FetchFailed) and exc.transient
            if not isinstance(exc, AgentError):
                log.exception("prewarm of model %s failed unexpectedly", item.name)
            error = str(exc) if isinstance(exc, AgentError) else f"internal error: {exc!r}"
            kept = {k: v for k, v in opts.items() if k != "fetched"}
            if transient:
                kept["fetched"] = json.dumps(fetched)
            item = self.index.update(item.id, options=kept)
            return self._fail(
                item, [], error, transient=transient, kept=self.store.partial_size(item.id)
            )
        now = self._clock()
        options = {k: v for k, v in _without_retry(opts).items() if k != "fetched"}
        options.update(commit=listing.commit, members=json.dumps(files), via=self._fetcher.mode)
        self.index.set_owner(item.id, None)
        done = self.index.update(
            item.id,
            state=ItemState.READY,
            size=listing.total,
            fetched_bytes=listing.total,
            finished_at=now,
            last_used=now,
            error=None,
            options=options,
            warm_seconds=self._warm_seconds(item.id),
        )
        log.info("prewarmed model %s (%d files, %d bytes)", item.name, len(files), listing.total)
        return done

    def _fetch_members(
        self,
        item: CacheItem,
        todo: Sequence[Member],
        have: dict[str, str],
        fetched: dict[str, str],
        headers: Mapping[str, str],
        total: int,
        progress: ProgressFn,
        cancelled: CancelledFn,
    ) -> None:
        """Fetch and commit the files of a group, at most ``group_parallel`` at once (so at
        most that many partials are open); raise the first failure once all ended. Files that
        made it are recorded in ``have`` and ``fetched``, so a retry does not fetch them again."""
        lock = threading.Lock()
        offsets = {m.path: 0 for m in todo}
        done_before = total - sum(m.size for m in todo)

        def one(m: Member) -> None:
            part = MemberPartial(self.store, _member_key(item.id, m.path), m.size)
            try:

                def report(done: int, _: int | None) -> None:
                    with lock:
                        offsets[m.path] = done
                        progress(done_before + sum(offsets.values()), total)

                spec = FetchSpec(m.url, headers, m.sha256, resume_key=self.identity(m.url))
                self._fetcher.fetch(spec, part, report, cancelled)
                sha = self.store.commit_blob(part, m.sha256, f"{item.name}/{m.path}")
            finally:
                part.close()
            with lock:
                have[m.path] = sha
                fetched[m.url] = sha

        if not todo:
            return
        with ThreadPoolExecutor(min(self._group_parallel, len(todo))) as pool:
            errors = [f.exception() for f in [pool.submit(one, m) for m in todo]]
        failures = [e for e in errors if e is not None]
        if failures:
            # A shutdown first, then a failure worth a retry, then the rest.
            failures.sort(
                key=lambda e: (
                    not isinstance(e, Cancelled),
                    not (isinstance(e, FetchFailed) and e.transient),
                )
            )
            raise failures[0]

    def _run_image(self, item: CacheItem, event: threading.Event) -> CacheItem:
        if self._puller is None:
            return self._fail_image(item, "no image puller (CRI) is configured", {})
        handler = item.options.get("runtime_handler")
        try:
            # Checked again as it goes to the CRI: the registry's DNS may have moved since.
            self.policy.check_registry(registry_host(item.source))
            result = self._puller.pull(item.source, handler)
        except Cancelled:
            return self._requeue_if_stopped(item)
        except AgentError as exc:
            return self._fail_image(item, str(exc), {})
        self.index.record_pull(ImagePull(item.source, result.cold, result.seconds, self._clock()))
        options = {k: v for k, v in item.options.items() if k in _REQUEST_OPTIONS}
        options["image_ref"] = result.image_ref
        if self._warmer is not None:
            progress, cancelled = self._watchers(item, event)
            try:
                warm = self._warmer.warm(item.source, handler, progress, cancelled)
            except Cancelled:
                return self._requeue_if_stopped(item)  # dfdaemon keeps what it has
            except ImageWarmFailed as exc:
                return self._fail_image(item, str(exc), {**options, **exc.warmth.to_options()})
            except AgentError as exc:
                # Pulled, but its layers could not be read: say so rather than guess.
                log.warning("cannot tell how warm %s is: %s", item.name, exc)
                unknown = ImageWarmth(Warmth.UNKNOWN)
                options.update(unknown.to_options(), warmth_error=str(exc))
            else:
                options.update(warm.notes)
                options.update(warm.warmth.to_options())
        if item.pinned and self._puller is not None:
            try:
                self._puller.set_pinned(item.source, True)
            except AgentError as exc:
                log.warning("cannot pin image %s in the runtime: %s", item.name, exc)
                options["pin_error"] = str(exc)
        now = self._clock()
        self.index.set_owner(item.id, None)
        done = self.index.update(
            item.id,
            state=ItemState.READY,
            size=result.size,
            finished_at=now,
            last_used=now,
            warm_seconds=self._warm_seconds(item.id),
            options=options,
            error=None,
        )
        warmth = done.image_warmth
        log.info(
            "prewarmed image %s (%s)", item.name, warmth.warmth if warmth else "warmth not known"
        )
        return done

    def _requeue_if_stopped(self, item: CacheItem) -> CacheItem:
        """After a Cancelled image step: stopped by shutdown, so queue it for the next start
        (still FETCHING); or cancelled by a user, already failed."""
        if self.index.get(item.id).state is ItemState.FETCHING:
            self.index.set_owner(item.id, None)
            return self.index.update(item.id, state=ItemState.QUEUED)
        return self.index.get(item.id)

    def _fail_image(self, item: CacheItem, error: str, options: Mapping[str, str]) -> CacheItem:
        self.index.set_owner(item.id, None)
        log.warning("prewarm of image %s failed: %s", item.name, error)
        changes: dict[str, object] = {"options": options} if options else {}
        return self.index.update(
            item.id, state=ItemState.FAILED, error=error, finished_at=self._clock(), **changes
        )

    def _publish(self, progress: Progress) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback(progress)


def _header_files(item: CacheItem) -> dict[str, Path]:
    return {
        k[len(_HEADER_PREFIX) :]: Path(v)
        for k, v in item.options.items()
        if k.startswith(_HEADER_PREFIX)
    }


_KINDS: dict[type, ItemKind] = {
    FileRequest: ItemKind.FILE,
    ImageRequest: ItemKind.IMAGE,
    GroupRequest: ItemKind.GROUP,
}


def _member_key(item_id: str, path: str) -> str:
    """A group file's partial: named by its path, so a retry resumes the same file."""
    return f"{item_id}.{hashlib.sha256(path.encode()).hexdigest()[:16]}"


def _nothing(item: CacheItem) -> None:
    return None


def _without_retry(options: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in options.items() if k not in _RETRY_OPTIONS}


def _repull_due(options: Mapping[str, str], pulled_at: float | None, now: float) -> bool:
    """Whether an image's ``repull_hours`` have passed since its last pull."""
    hours = options.get("repull_hours")
    if not hours or pulled_at is None:
        return False
    return now - pulled_at >= float(hours) * 3600


def _alive(pid: int | None) -> bool:
    return pid is not None and psutil.pid_exists(pid)


def _new_id() -> str:
    return os.urandom(6).hex()
