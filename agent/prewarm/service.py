"""PrewarmService: the one entry point the CLI and the gRPC API call.

Requests become validated rows at once (`submit`); `run` does the work of one item in the
calling thread, and `start` runs queued items on a small worker pool. Progress reaches
subscribers (terminal, operation metadata, API streams) through callbacks and is saved in the
item's row. Items left fetching by a dead process are taken over and resume from their partial.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from agent.errors import AgentError, Busy, Conflict, FieldViolation, InvalidSpec
from agent.prewarm.errors import Cancelled, ImageWarmFailed
from agent.prewarm.fetch_http import CancelledFn, FetchInfo, FetchSpec, ProgressFn
from agent.prewarm.headers import check_header_name, read_header_files
from agent.prewarm.index import ImagePull, PrewarmIndex
from agent.prewarm.inventory import Inventory
from agent.prewarm.model import (
    CacheItem,
    FileRequest,
    ImageRequest,
    ImageWarmth,
    ItemKind,
    ItemState,
    Progress,
    Warmth,
)
from agent.prewarm.naming import check_name, default_name
from agent.prewarm.policy import UrlPolicy, redact_url
from agent.prewarm.progress import ProgressMeter
from agent.prewarm.sink import Sink
from agent.prewarm.store import CacheStore, Partial

log = logging.getLogger(__name__)

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PUBLISH_S = 0.5
_SAVE_S = 1.0
_HEADER_PREFIX = "header:"
# Options an image request sets; the rest are results of the last run and are replaced.
_REQUEST_OPTIONS = ("runtime_handler",)

ProgressCallback = Callable[[Progress], None]


class FileFetcher(Protocol):
    """Moves one URL's bytes into a Sink (direct HTTP, Dragonfly proxy or dfdaemon gRPC)."""

    @property
    def mode(self) -> str: ...

    def fetch(
        self, spec: FetchSpec, partial: Sink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo: ...


@dataclass(frozen=True, slots=True)
class PullResult:
    image_ref: str
    size: int | None
    cold: bool
    seconds: float


class ImagePuller(Protocol):
    """Pulls an image into the node's runtime (CRI) and says how warm it is."""

    def pull(self, ref: str, runtime_handler: str | None) -> PullResult: ...


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
        header_dirs: Sequence[Path] = (),
    ) -> None:
        self.index = index
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

    # -- requests -----------------------------------------------------------------------------

    def submit(self, request: FileRequest | ImageRequest) -> CacheItem:
        """Validate and record a request; returns the item (already ready on a cache hit)."""
        if isinstance(request, FileRequest):
            return self._submit_file(request)
        return self._submit_image(request)

    def submit_all(self, requests: Sequence[FileRequest | ImageRequest]) -> list[CacheItem]:
        """Validate every request first, so a bad manifest changes nothing: each on its own,
        then its name against the others' and the items already recorded."""
        for request in requests:
            self._validate(request)
        self._check_names(requests)
        return [self.submit(r) for r in requests]

    def _check_names(self, requests: Sequence[FileRequest | ImageRequest]) -> None:
        """The `_resubmit` conflict, found before the first insert: a name that another source
        holds, in the index or earlier in ``requests``."""
        taken: dict[str, tuple[str, str | None]] = {}
        for request in requests:
            if isinstance(request, FileRequest):
                source, sha256 = request.url, request.sha256
            else:
                source, sha256 = request.ref, None
            name = request.name or default_name(source)
            if name not in taken:
                existing = self.index.find_by_name(name)
                if existing is not None:
                    taken[name] = (existing.source, existing.expected_sha256)
            held = taken.setdefault(name, (source, sha256))
            if held[0] != source or (sha256 and held[1] not in (None, sha256)):
                raise Conflict(
                    f"a cache item named {name!r} already exists for another source; "
                    "choose another --name"
                )

    def _validate(self, request: FileRequest | ImageRequest) -> None:
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
                request.header_files, self._header_dirs
            )  # fail now, not minutes later
        elif not request.ref or any(c.isspace() for c in request.ref):
            raise InvalidSpec(
                "image reference is empty or has spaces",
                [FieldViolation("image", "e.g. registry.example.com/repo:tag")],
            )

    def _submit_file(self, request: FileRequest) -> CacheItem:
        self._validate(request)
        name = request.name or default_name(request.url)
        options = {f"{_HEADER_PREFIX}{k}": str(v) for k, v in request.header_files.items()}
        existing = self.index.find_by_name(name)
        if existing is not None:
            return self._resubmit(existing, request.url, request.sha256, request.pin, options)
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
        if request.sha256 and self.store.blob_path(request.sha256).exists():
            # Same content under another name: link it, no fetch.
            self.index.insert(item)
            self.store.link_name(name, request.sha256)
            size = self.store.blob_path(request.sha256).stat().st_size
            return self.index.update(
                item.id,
                state=ItemState.READY,
                sha256=request.sha256,
                size=size,
                fetched_bytes=0,
                finished_at=now,
                last_used=now,
                warm_seconds=0.0,
            )
        return self.index.insert(item)

    def _submit_image(self, request: ImageRequest) -> CacheItem:
        self._validate(request)
        name = request.name or default_name(request.ref)
        options = {"runtime_handler": request.runtime_handler} if request.runtime_handler else {}
        existing = self.index.find_by_name(name)
        if existing is not None:
            return self._resubmit(existing, request.ref, None, request.pin, options)
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
        return self.index.insert(item)

    def _resubmit(
        self, item: CacheItem, source: str, sha256: str | None, pin: bool, options: dict[str, str]
    ) -> CacheItem:
        """The same name again: a hit when ready, a retry when failed or evicted."""
        if item.source != source or (sha256 and item.expected_sha256 not in (None, sha256)):
            raise Conflict(
                f"a cache item named {item.name!r} already exists for another source; "
                "choose another --name"
            )
        pinned = item.pinned or pin
        if item.state is ItemState.READY and item.label_ready:
            now = self._clock()
            return self.index.update(item.id, hits=item.hits + 1, last_used=now, pinned=pinned)
        if item.state in (ItemState.FAILED, ItemState.EVICTED, ItemState.READY):
            # A ready image that is not fully warm (bootstrap-only, unknown) is warmed again:
            # Dragonfly may be there now, and a prefetch hint is used only once.
            return self.index.update(
                item.id,
                state=ItemState.QUEUED,
                error=None,
                pinned=pinned,
                options=options,
                expected_sha256=sha256 or item.expected_sha256,
                fetched_bytes=0,
                started_at=None,
                finished_at=None,
            )
        return self.index.update(item.id, pinned=pinned)

    # -- inventory ----------------------------------------------------------------------------

    def items(self) -> list[CacheItem]:
        return self.index.items()

    def get(self, id_or_name: str) -> CacheItem:
        return self.index.find(id_or_name)

    def pulls(self) -> list[ImagePull]:
        return self.index.pulls()

    def inventory(self) -> Inventory:
        """One consistent read for metrics and node labels."""
        return Inventory(self.index.items(), self.store.usage(), self.index.pulls())

    def pin(self, id_or_name: str, pinned: bool = True) -> CacheItem:
        item = self.index.find(id_or_name)
        return self.index.update(item.id, pinned=pinned)

    def evict(self, id_or_name: str) -> CacheItem:
        """Remove a ready file from disk (and other names sharing its blob); pinned is refused."""
        item = self.index.find(id_or_name)
        if item.kind is not ItemKind.FILE or item.state is not ItemState.READY or not item.sha256:
            raise Conflict(f"{item.name} is {item.state.value}; only ready files can be evicted")
        sharing = self.index.ready_with_digest(item.sha256)
        pinned = [i.name for i in sharing if i.pinned]
        if pinned:
            raise Conflict(
                f"{item.name} shares its blob with pinned {', '.join(pinned)}; unpin first"
            )
        self.store.evict(item.sha256)
        return self.index.get(item.id)

    def cancel(self, id_or_name: str) -> CacheItem:
        """Stop a queued or running item; the worker (maybe another process) sees it and stops."""
        item = self.index.find(id_or_name)
        if item.state not in (ItemState.QUEUED, ItemState.FETCHING):
            raise Conflict(
                f"{item.name} is {item.state.value}; only queued or fetching items cancel"
            )
        with self._lock:
            event = self._cancel_events.get(item.id)
        if event is not None:
            event.set()
        updated = self.index.update(
            item.id, state=ItemState.FAILED, error="cancelled", finished_at=self._clock()
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
        for item in self.index.items([ItemState.QUEUED, ItemState.FETCHING]):
            if item.state is ItemState.QUEUED or not _alive(self.index.owner(item.id)):
                self.enqueue(item.id)

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
        return self.index.get(item_id)

    def stop(self) -> None:
        """Stop workers; running fetches are cancelled and keep their partials for resume."""
        with self._lock:
            events = list(self._cancel_events.values())
        for event in events:
            event.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(self, item_id: str) -> CacheItem:
        """Do one item's work now, in this thread; returns its final row (ready or failed)."""
        item = self._claim(item_id)
        if item.state is not ItemState.FETCHING:
            return item
        event = threading.Event()
        with self._lock:
            self._cancel_events[item.id] = event
        try:
            if item.kind is ItemKind.FILE:
                return self._run_file(item, event)
            return self._run_image(item, event)
        finally:
            with self._lock:
                self._cancel_events.pop(item.id, None)

    def _claim(self, item_id: str) -> CacheItem:
        with self.index.transaction():
            item = self.index.get(item_id)
            owner = self.index.owner(item_id)
            if item.state is ItemState.FETCHING and owner != os.getpid() and _alive(owner):
                raise Busy(f"{item.name} is being fetched by process {owner}", [str(owner)])
            if item.state not in (ItemState.QUEUED, ItemState.FETCHING):
                return item
            self.index.set_owner(item_id, os.getpid())
            return self.index.update(
                item_id, state=ItemState.FETCHING, started_at=item.started_at or self._clock()
            )

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
                self.index.update(item.id, fetched_bytes=done)

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
            headers = read_header_files(_header_files(item), self._header_dirs)
            spec = FetchSpec(item.source, headers, item.expected_sha256)
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
        except AgentError as exc:
            return self._fail(item, partial, str(exc))
        except Exception as exc:
            log.exception("prewarm of %s failed unexpectedly", item.name)
            return self._fail(item, partial, f"internal error: {type(exc).__name__}: {exc}")
        now = self._clock()
        options = dict(item.options)
        if info.dragonfly_task_id:
            options["dragonfly_task_id"] = info.dragonfly_task_id
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
            warm_seconds=now - (item.started_at or now),
        )
        log.info(
            "prewarmed %s (%d bytes, sha256 %s) via %s", item.name, size, digest, self._fetcher.mode
        )
        return done

    def _fail(self, item: CacheItem, partial: Partial, error: str) -> CacheItem:
        partial.close()
        self.store.discard_partial(item.id)
        self.index.set_owner(item.id, None)
        log.warning("prewarm of %s (%s) failed: %s", item.name, redact_url(item.source), error)
        return self.index.update(
            item.id, state=ItemState.FAILED, error=error, size=None, finished_at=self._clock()
        )

    def _run_image(self, item: CacheItem, event: threading.Event) -> CacheItem:
        if self._puller is None:
            return self._fail_image(item, "no image puller (CRI) is configured", {})
        handler = item.options.get("runtime_handler")
        try:
            result = self._puller.pull(item.source, handler)
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
                if self.index.get(item.id).state is ItemState.FETCHING:
                    # Stopped by shutdown: warm again later (dfdaemon keeps what it has).
                    self.index.set_owner(item.id, None)
                    return self.index.update(item.id, state=ItemState.QUEUED)
                return self.index.get(item.id)
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
        now = self._clock()
        self.index.set_owner(item.id, None)
        done = self.index.update(
            item.id,
            state=ItemState.READY,
            size=result.size,
            finished_at=now,
            last_used=now,
            warm_seconds=now - (item.started_at or now),
            options=options,
            error=None,
        )
        warmth = done.image_warmth
        log.info(
            "prewarmed image %s (%s)", item.name, warmth.warmth if warmth else "warmth not known"
        )
        return done

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


def _alive(pid: int | None) -> bool:
    return pid is not None and psutil.pid_exists(pid)


def _new_id() -> str:
    return os.urandom(6).hex()
