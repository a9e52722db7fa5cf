"""PrewarmService: the one entry point the CLI and the gRPC API call.

Requests become validated rows at once (`submit`); `run` does the work of one item in the
calling thread, and `start` runs queued items on a small worker pool. Progress reaches
subscribers (terminal, operation metadata, API streams) through callbacks and is saved in the
item's row. Items left fetching by a dead process are taken over and resume from their partial.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial

import psutil

from agent.clocks import start_from_wall
from agent.errors import (
    AgentError,
    Busy,
    Conflict,
    FieldViolation,
    InvalidSpec,
    StateUnavailable,
    check_each,
)
from agent.owner import Actor, check_may_undo, claimed_by
from agent.prewarm import kinds
from agent.prewarm.cancel import CancelToken, Stop
from agent.prewarm.fetch_http import CancelledFn, ProgressFn
from agent.prewarm.headers import HeaderDir
from agent.prewarm.index import PrewarmIndex
from agent.prewarm.inventory import Inventory
from agent.prewarm.model import CacheItem, ImagePull, ItemState, Layout, Progress
from agent.prewarm.naming import (
    DEFAULT_IGNORED_QUERY_PARAMS,
    check_name,
    default_name,
    qualified_name,
    source_identity,
)
from agent.prewarm.policy import UrlPolicy, redact_url
from agent.prewarm.ports import FileFetcher, ImagePuller, ImageWarmer
from agent.prewarm.progress import ProgressMeter
from agent.prewarm.retries import RetryClock
from agent.prewarm.source import (
    Failed,
    Outcome,
    Source,
    SourceRequest,
    Stopped,
    Target,
    without_retry,
)
from agent.prewarm.store import CacheStore
from agent.redact import redact_text
from agent.tasks import Need, Task

log = logging.getLogger(__name__)

#: Longest wait between a retry falling due and it starting.
RETRY_CHECK_S = 5.0
WRITABLE = Need.WRITABLE

_PUBLISH_S = 0.5
_SAVE_S = 1.0
Request = SourceRequest  # a request of any registered kind (agent/prewarm/kinds.py)


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True, slots=True)
class _Plan:
    """One request's effect, decided before anything is written: ``write`` runs inside the
    request's one transaction, ``after`` (links on disk, runtime pins) once it committed."""

    name: str
    write: Callable[[], CacheItem]
    after: Callable[[CacheItem], None] = lambda item: None


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
        self.retries = RetryClock(retry_initial_s, retry_max_s, clock, monotonic)
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
        #: Set by `stop`: a run that starts after it is cancelled at once.
        self._stopping = False
        self._futures: dict[str, Future[CacheItem]] = {}
        self._cancel_events: dict[str, Stop] = {}
        self._subscribers: list[ProgressCallback] = []
        self._lock = threading.Lock()
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
        check_each(requests, self._validate)
        plans = [self._plan_item(i, r, len(requests)) for i, r in enumerate(requests)]
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
        source = kinds.for_request(request)
        if request.name is not None:
            check_name(request.name)
        source.check(request)
        source.validate(request, self)

    def identity(self, url: str) -> str:
        """What makes two file URLs the same item: the URL without its signature parameters."""
        return source_identity(url, self._ignored_params)

    def _plan_item(self, i: int, request: Request, of: int) -> _Plan:
        try:
            return self._plan(request)
        except Conflict as exc:
            if of == 1:
                raise
            raise Conflict(f"items[{i}]: {exc}") from exc

    def _plan(self, request: Request) -> _Plan:
        source = kinds.for_request(request)
        target = source.target(request, self)
        name = request.name or self._free_name(target.pretty, target.identity, source.kind)
        existing = self.index.find_by_name(name)
        if existing is not None:
            return self._plan_again(existing, source, target, request.pin)
        item = CacheItem(
            id=_new_id(),
            kind=source.kind,
            name=name,
            source=target.source,
            state=ItemState.QUEUED,
            pinned=request.pin,
            expected_sha256=target.sha256,
            created_at=self._clock(),
            options=dict(target.options),
        )
        ready = source.shortcut(item, self)
        if ready is not None:
            return _Plan(
                name, partial(self.index.insert, ready), partial(source.after_ready, work=self)
            )
        return _Plan(name, partial(self.index.insert, item))

    def _free_name(self, pretty: str, identity: str, kind: str) -> str:
        """The default name, unless another source holds it: then one qualified by a hash."""
        base = default_name(pretty)
        holder = self.index.find_by_name(base)
        if holder is None or (holder.kind == kind and self._identity_of(holder) == identity):
            return base
        return qualified_name(base, identity)

    def _identity_of(self, item: CacheItem) -> str:
        return kinds.source_for(item.kind).identity(item, self)

    def _plan_again(self, item: CacheItem, source: Source, target: Target, pin: bool) -> _Plan:
        """The same name again: a hit when ready and verified, else a retry (a re-signed URL
        of the same identity takes the item over and resumes its partial)."""
        sha256 = target.sha256
        if item.kind != source.kind or self._identity_of(item) != target.identity:
            raise Conflict(
                f"a cache item named {item.name!r} already exists for another source; "
                "choose another name or prewarm delete it first"
            )
        if sha256 and item.expected_sha256 not in (None, sha256):
            raise Conflict(
                f"{item.name} was requested with sha256 {item.expected_sha256}, now with "
                f"{sha256} (field sha256); choose another name or prewarm delete it first"
            )
        pinned = item.pinned or pin
        if item.state is ItemState.READY:
            reason = source.unready(item, self, verify_digest=sha256 is not None)
            if reason is None and sha256 and item.sha256 != sha256:
                raise Conflict(
                    f"{item.name} is ready with sha256 {item.sha256}, not the requested {sha256} "
                    "(field sha256): the origin's content differs; nothing changed"
                )
            if (
                reason is None
                and source.ready(item)
                and not source.repull(item, target.options, self._clock())
            ):
                changes = {
                    "hits": item.hits + 1,
                    "last_used": self._clock(),
                    "pinned": pinned,
                    "source": target.source,  # the latest signature, for the next fetch
                    "expected_sha256": sha256 or item.expected_sha256,
                }
                # Pinned again on each pinned hit: a runtime that refused once may take it now.
                after = partial(source.pin_after_hit, work=self) if pinned else _nothing
                return _Plan(item.name, partial(self.index.update, item.id, **changes), after)
            if reason is not None:
                log.warning(
                    "%s is not what its row claims (%s); fetching it again", item.name, reason
                )
                source.discard(item, self)
        if item.state in (ItemState.FAILED, ItemState.EVICTED, ItemState.READY):
            # A ready image that is not fully warm (bootstrap-only, unknown) is warmed again:
            # Dragonfly may be there now, and a prefetch hint is used only once.
            changes = {
                "state": ItemState.QUEUED,
                "error": None,
                "pinned": pinned,
                "source": target.source,
                "options": dict(target.options),
                "expected_sha256": sha256 or item.expected_sha256,
                "fetched_bytes": 0,
                "started_at": None,
                "finished_at": None,
            }
            return _Plan(item.name, partial(self.index.update, item.id, **changes))
        changes = {"pinned": pinned}
        if item.state is ItemState.QUEUED:
            changes["source"] = target.source
        return _Plan(item.name, partial(self.index.update, item.id, **changes))

    def audit(self) -> list[CacheItem]:
        """Re-check every ready item: a file whose blob is gone or wrong, or an image the
        runtime no longer has (kubelet image GC), becomes evicted, so its label drops at the
        next publish; an image past its re-pull interval is queued. A runtime that cannot answer
        leaves its images as they are (unknown is not absent). Returns the items changed."""
        self.store.make_layout()  # a wiped cache dir: its items are then found gone, not fatal
        changed = []
        now = self._clock()
        for item in self.index.items([ItemState.READY]):
            source = kinds.source_for(item.kind)
            if source.due(item, now):
                changed.append(self.index.update(item.id, state=ItemState.QUEUED))
                continue
            reason = source.recheck(item, self)
            if reason is None:
                continue
            log.warning("audit: %s is not ready: %s", item.name, reason)
            source.discard(item, self)
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
        kinds.source_for(item.kind).pin(item, pinned, self)
        owner, role = claimed_by(by if pinned else None, item.owner, item.owner_role)
        return self.index.update(item.id, pinned=pinned, owner=owner, owner_role=role)

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
        return kinds.source_for(item.kind).evict(item, by, self)

    def delete(self, id_or_name: str, by: Actor | None = None) -> CacheItem:
        """Remove an item from the inventory: a ready one is evicted first (same refusals)
        unless other ready items stand on its blob (they keep it), a queued one loses its
        partial; a fetching one must be cancelled first."""
        item = self.index.find(id_or_name)
        check_may_undo(by, item.owner_role, item.name, "delete")
        if item.state is ItemState.FETCHING:
            raise Conflict(f"{item.name} is fetching; cancel it first")
        ready = item.state is ItemState.READY
        if ready and item.pinned:
            raise Conflict(f"{item.name} is pinned; unpin first")
        # Evicting a blob or an image evicts every name of it: other items on it keep it.
        if ready and not kinds.source_for(item.kind).sharing(item, self):
            self.evict(item.id, by)
        self.index.delete(item.id)
        self.store.discard_partial(item.id)
        if not any(i.name == item.name for i in self.index.items([ItemState.READY])):
            self.store.remove_link(item.name)
        return item

    def cancel(self, id_or_name: str, by: Actor | None = None) -> CacheItem:
        """Stop a queued or running item, or one waiting for its retry; the worker (maybe
        another process) sees it and stops."""
        item = self.index.find(id_or_name)
        check_may_undo(by, item.owner_role, item.name, "cancel")
        retrying = item.state is ItemState.FAILED and item.retry_at is not None
        if item.state not in (ItemState.QUEUED, ItemState.FETCHING) and not retrying:
            raise Conflict(
                f"{item.name} is {item.state.value}; only queued or fetching items, or failed "
                "ones waiting for a retry, cancel"
            )
        # The row first: a fetch told to stop reads it to tell a user's cancel (delete the
        # partial) from a shutdown (keep it to resume).
        updated = self.index.update(
            item.id,
            state=ItemState.FAILED,
            error="cancelled",
            finished_at=self._clock(),
            options=without_retry(item.options),
            fetched_bytes=0,  # its partial is dropped: nothing is kept to resume from
        )
        with self._lock:
            event = self._cancel_events.get(item.id)
        if event is not None:
            event.set()
        if item.state is ItemState.QUEUED or retrying:  # no worker holds its partial
            self.store.discard_partial(item.id)
        if retrying:  # as a final failure: a new request starts the time-to-warm clock again
            with self._lock:
                self._started.pop(item.id, None)
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
        self._stopping = False
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

    def tasks(self, audit_interval_s: float) -> list[Task]:
        """Failed items come back when their retry is due: the agent owns the queue, so a timer
        is all it takes (nothing else writes it). An audit records what it finds."""
        every = min(self.retries.initial_s, RETRY_CHECK_S)
        retries = Task("prewarm-retries", self.retry_due, every, needs=WRITABLE, wait_first=True)
        return [retries, Task("prewarm-audit", self.audit, audit_interval_s, needs=WRITABLE)]

    def retry_due(self) -> None:
        """Run the failed items whose retry is due, and those whose outcome the state store
        could not record (the agent calls this on a timer)."""
        for item_id in self._queue_due_retries():
            self.enqueue(item_id)

    def _queue_due_retries(self) -> list[str]:
        due = self.retries.due(self.index.items([ItemState.FAILED]))
        with self._lock:
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
            self._stopping = True  # a run registering its token from now on starts cancelled
            events = list(self._cancel_events.values())
        for event in events:
            event.set()  # also interrupts the calls each item's fetch holds on it
        if self._puller is not None:
            self._puller.interrupt()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(self, item_id: str) -> CacheItem:
        """Do one item's work now, in this thread; returns its final row (ready or failed)."""
        event = Stop()
        with self._lock:
            self._cancel_events[item_id] = event
            if self._stopping:
                event.set()
        try:
            item = self._claim(item_id)
            with self._lock:
                self._unrecorded.pop(item_id, None)
            if item.state is not ItemState.FETCHING:
                return item
            return self._record(item, self._outcome(item, event))
        except StateUnavailable as exc:
            return self._not_recorded(item_id, exc)
        finally:
            with self._lock:
                self._cancel_events.pop(item_id, None)

    def _outcome(self, item: CacheItem, event: Stop) -> Outcome:
        """The kind's run. One that raised (the cache dir wiped under it, a bug) fails the item,
        logged, worth a retry: never an item left fetching with its caller waiting forever."""
        try:
            return kinds.source_for(item.kind).run(item, event, self)
        except StateUnavailable:
            raise
        except Exception as exc:
            log.exception("prewarm of %s failed unexpectedly", item.name)
            return Failed(f"internal error: {type(exc).__name__}: {exc}", transient=True)

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

    def watchers(self, item: CacheItem, event: threading.Event) -> tuple[ProgressFn, CancelledFn]:
        """Progress (published, saved in the row) and cancellation checks for one item's fetch."""
        meter = ProgressMeter(item.id, self._monotonic)
        last = {"publish": 0.0, "save": 0.0}

        def progress(done: int, total: int | None, /, *, retrying: str = "") -> None:
            if retrying:
                meter.retrying(retrying)  # news at once: the bytes stopped, and why
            else:
                meter.update(done, total)
            now = self._monotonic()
            if retrying or now - last["publish"] >= _PUBLISH_S or done == total:
                last["publish"] = now
                self._publish(meter.snapshot())
            if now - last["save"] >= _SAVE_S:
                last["save"] = now
                with contextlib.suppress(StateUnavailable):  # a hint for resume: the
                    self.index.update(item.id, fetched_bytes=done)  # outcome write says

        def elsewhere() -> bool:  # a user's cancel, perhaps from another process
            return self.index.get(item.id).state is not ItemState.FETCHING

        cancelled = CancelToken(event, elsewhere, _PUBLISH_S, self._monotonic)
        return progress, cancelled

    def _record(self, item: CacheItem, outcome: Outcome) -> CacheItem:
        """Write a run's outcome into the item's row, released by this process: the one
        writer of a run's end, whatever the kind."""
        self.index.set_owner(item.id, None)
        if isinstance(outcome, Stopped):
            if self.index.get(item.id).state is not ItemState.FETCHING:
                self.store.discard_partial(item.id)  # a user's cancel: already failed
                return self.index.update(item.id, fetched_bytes=0)  # progress may have saved
            # Stopped by shutdown, not by a user: queued to resume from what it kept.
            resume = {"fetched_bytes": outcome.fetched_bytes, "options": outcome.options}
            return self.index.update(item.id, state=ItemState.QUEUED, **_given(resume))
        now = self._clock()
        if isinstance(outcome, Failed):
            return self._failed(item, outcome, now)
        changes = _given({"sha256": outcome.sha256, "fetched_bytes": outcome.fetched_bytes})
        return self.index.update(
            item.id,
            state=ItemState.READY,
            finished_at=now,
            last_used=now,
            error=None,
            warm_seconds=self._warm_seconds(item.id),
            size=outcome.size,
            options=without_retry(outcome.options),
            **changes,
        )

    def _failed(self, item: CacheItem, outcome: Failed, now: float) -> CacheItem:
        """A transient failure keeps its partials and is retried by the agent after a doubling
        delay; anything else loses them and waits for a new request."""
        options = without_retry(item.options if outcome.options is None else outcome.options)
        error = outcome.error
        if outcome.transient:
            attempts = item.attempts + 1
            retry_at, delay = self.retries.schedule(item.id, attempts, now)
            options.update(retry_at=retry_at, attempts=str(attempts))
            # An image's bytes are the runtime's to keep; a file's partial is ours to count.
            runtime = kinds.source_for(item.kind).layout is Layout.RUNTIME
            kept = "" if runtime else f", {outcome.kept} bytes kept"
            # When, not "in 30s": the row is read long after it was written.
            due = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + delay))
            error = f"{error} (retry due at {due}{kept})"
        else:
            self.store.discard_partial(item.id)
            with self._lock:
                self._started.pop(item.id, None)  # a new request starts the clock again
        log.warning(
            "prewarm of %s (%s) failed: %s", item.name, redact_url(item.source), redact_text(error)
        )
        return self.index.update(
            item.id,
            state=ItemState.FAILED,
            error=error,
            size=None,
            finished_at=now,
            options=options,
            fetched_bytes=outcome.kept if outcome.transient else 0,
        )

    def _publish(self, progress: Progress) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback(progress)

    # -- what a Source may use (agent/prewarm/source.py's Work) ------------------------------

    @property
    def fetcher(self) -> FileFetcher:
        return self._fetcher

    @property
    def lister(self) -> FileFetcher:
        return self._lister

    @property
    def puller(self) -> ImagePuller | None:
        return self._puller

    @property
    def warmer(self) -> ImageWarmer | None:
        return self._warmer

    @property
    def header_dirs(self) -> Sequence[HeaderDir]:
        return self._header_dirs

    @property
    def group_parallel(self) -> int:
        return self._group_parallel

    def now(self) -> float:
        return self._clock()


def _nothing(item: CacheItem) -> None:
    return None


def _alive(pid: int | None) -> bool:
    return pid is not None and psutil.pid_exists(pid)


def _new_id() -> str:
    return os.urandom(6).hex()


def _given(changes: Mapping[str, object]) -> dict[str, object]:
    """An outcome's changes to the row, less those it left unsaid (None: as it was)."""
    return {k: v for k, v in changes.items() if v is not None}
