"""List+watch caches of the Kubernetes API, shared: one per (resource, selector) per process.

`Informer` keeps one resource current as client-go's reflector does: list (paged) once, then
watch from the list's resourceVersion; every event moves the version, so a watch the server
ends resumes where it was, and only 410 Gone (the version was compacted away) lists again.
As the reflector's, the first list asks for ``resourceVersion=0`` (any version: the API
server's watch cache answers, not etcd, so 5,000 agents restarted together do not each read
etcd), a list after a watch's 410 for the version last seen (not older than it: the watch
cache again), and only a list after a list's own 410 for none (a consistent read).
Many readers share one informer through `InformerFactory` (client-go's shared informer
factory: many handlers on one list+watch), so an agent holds one watch of its Node and one of
its ResourceSlices however many features read them; readers read the cache, never GET beside
the watch.

Never a tight loop: a watch the server ends within a second with no event in it waits the
back-off below, as a failure does, without calling the cache stale; a 410
lists again at once only when the watch moved or lasted since the last such list (a server
whose every watch answers 410 while its lists succeed is backed off like a failure); 429
waits the server's Retry-After; every other failure (5xx, a refused connection, a restarting
API server) waits a jittered back-off doubling from ``backoff[0]`` to ``backoff[1]``, so a
fleet of agents does not come back in step. While a call fails the cache is kept and
`Informer.status` says it is stale and why. An exception that is not an AgentError (a bug, an
answer no check foresaw) is a failed call too, its traceback logged once until a good call:
the thread never ends while the status says current.

A resource the API server does not serve (``resolve_path`` answers None: discovery lists no
version of it, as the DRA API on a cluster without it) is not listed at all: the cache is
empty and current, `Informer.status` says not served, and discovery is asked again every
``UNSERVED_RECHECK_S`` (a list of an unserved path would 404 every back-off, forever).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from agent import safeyaml
from agent.errors import AgentError, NotFound, PermissionDenied
from agent.kube import PAGE_SIZE, Gone, dig
from agent.kube_discovery import UNSERVED_RECHECK_S

log = logging.getLogger(__name__)

__all__ = [
    "Informer",
    "InformerFactory",
    "Lister",
    "NodeWatch",
    "node_query",
    "retry_after_s",
    "retry_wait",
    "unexpected_error",
]

#: A watch asks the server to end it after this many seconds, times 1 to 2 (client-go's
#: reflector picks 5 to 10 minutes at random): the only request of a quiet cache.
WATCH_TIMEOUT_S = 300.0
#: First and longest wait after a failed call (doubling, jittered by +-50 %).
BACKOFF_S = (1.0, 30.0)
#: A Retry-After longer than this is not believed (a broken proxy): waited this long.
MAX_RETRY_AFTER_S = 300.0


class Lister(Protocol):
    """The two calls an informer makes (agent.kube.InClusterKubeClient)."""

    def list_all(
        self,
        path: str,
        query: Mapping[str, str] | None = None,
        page_size: int = ...,
        *,
        metadata_only: bool = ...,
    ) -> tuple[list[Any], str]: ...

    def watch(
        self,
        path: str,
        query: Mapping[str, str],
        resource_version: str,
        timeout_s: float,
        *,
        metadata_only: bool = ...,
    ) -> Iterator[tuple[str, Any]]: ...


def node_query(node: str) -> dict[str, str]:
    """The selector of one Node (as the GPU Operator's mig-manager watches its node)."""
    return {"fieldSelector": f"metadata.name={node}"}


class Informer:
    """One resource (``path`` with ``query``'s selectors) kept current by list+watch.

    ``healthy`` is False from a failed call until the next good one, so a reader can tell a
    stale cache from a current one; handlers (`add_handler`) are called from the watch thread
    after every list and every change (not for bookmarks). With ``metadata_only`` the list and
    watch ask for each object's metadata alone (client-go's metadata informer): a reader of
    labels is not sent every status change in full.
    """

    def __init__(
        self,
        client: Lister,
        path: str,
        query: Mapping[str, str] | None = None,
        *,
        page_size: int = PAGE_SIZE,
        watch_timeout_s: float = WATCH_TIMEOUT_S,
        on_change: Callable[[], object] | None = None,
        backoff: tuple[float, float] = BACKOFF_S,
        metadata_only: bool = False,
    ) -> None:
        self._client = client
        self.metadata_only = metadata_only
        self.path = path
        self._query = dict(query or {})
        self._page_size = page_size
        self._watch_timeout_s = watch_timeout_s
        self._backoff = backoff
        self._handlers: list[Callable[[], object]] = [on_change] if on_change else []
        self._lock = threading.Lock()
        self._objects: dict[str, Any] = {}
        #: key -> an object a delete of ours removed: no event as old as it brings it back
        self._deleted: dict[str, Any] = {}
        self.resource_version = ""
        #: the resourceVersion the next list asks for (client-go's relistResourceVersion):
        #: "0" at first, the last seen after a watch's 410, "" (a consistent read) after a list's
        self._list_from = "0"
        self.synced = threading.Event()
        self.healthy = False
        self.error = ""
        #: whether the last failure was the API refusing the agent (401/403: its RBAC), not
        #: the API server not answering; the doctor's fix depends on which
        self.denied = False
        self.stale_since: float | None = None
        #: calls made, for the counts a test or a metric wants
        self.lists = 0
        self.watches = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: whether a 410 may list again at once: not when no watch moved or lasted since the
        #: list the last 410 made (a server whose every watch answers 410 is backed off)
        self._relist_at_once = True
        self._resolve: Callable[[], str | None] | None = None
        self._resolver: Callable[[], str | None] | None = None  # `resolve_path`'s, kept
        self._forget_path: Callable[[], None] = lambda: None
        #: why the path is not listed: the API server does not serve it ("" while it does)
        self.unserved = ""
        #: an unexpected error's traceback was logged since the last good call
        self._traced = False

    @property
    def query(self) -> dict[str, str]:
        return dict(self._query)

    def add_handler(self, handler: Callable[[], object]) -> None:
        """Call ``handler`` after every change; at once when the cache is already listed."""
        with self._lock:
            self._handlers.append(handler)
        if self.synced.is_set():
            handler()

    def objects(self) -> list[Any]:
        with self._lock:
            return list(self._objects.values())

    def listed(self) -> list[Any] | None:
        """The objects, or None before the first list: not listed is unknown, not empty."""
        return self.objects() if self.synced.is_set() else None

    def assume(self, obj: object) -> None:
        """Put an object a write of ours returned into the cache before its watch event
        arrives (client-go's mutation cache), so a reader does not act on the old one; an
        older event for it is then ignored."""
        with self._lock:
            key = _key(obj)
            if _newer(obj, self._objects.get(key)):
                self._objects[key] = obj

    def assume_deleted(self, obj: object) -> None:
        """Drop an object a delete of ours removed before its watch event arrives; an event
        carrying it at that version or older (sent before the delete) is then ignored."""
        with self._lock:
            key = _key(obj)
            self._objects.pop(key, None)
            self._deleted[key] = obj

    def status(self) -> tuple[bool, str]:
        """(current, detail): False with why while the cache is the last answer kept."""
        what = f"{self.path} {','.join(self._query.values())}".strip()
        if self.unserved and self.healthy:
            return True, f"{what}: {self.unserved}"
        if not self.synced.is_set():
            return False, f"{what}: not listed yet{': ' + self.error if self.error else ''}"
        if not self.healthy:
            since = time.monotonic() - (self.stale_since or time.monotonic())
            return False, f"{what}: stale for {since:.0f}s (kept as last listed): {self.error}"
        return True, f"{what}: current ({len(self._objects)} object(s))"

    def resolve_path(
        self, resolve: Callable[[], str | None], forget: Callable[[], None] = lambda: None
    ) -> None:
        """Ask ``resolve`` for the path before the next list, until it answers (discovery
        that failed at the start: its AgentError is waited on as any failed call); None:
        the API server does not serve the resource, asked again every UNSERVED_RECHECK_S.
        A 404 at the path resolved (the API turned off later) calls ``forget`` (discovery's
        answer is stale) and resolves it again."""
        self._resolve = self._resolver = resolve
        self._forget_path = forget

    def relist(self) -> None:
        if self._resolve is not None and not self._resolved():
            return
        query = (
            dict(self._query, resourceVersion=self._list_from) if self._list_from else self._query
        )
        # From a version seen (after a watch's 410): unpaged, as client-go's reflector lists
        # then. A limit with a resourceVersion other than 0 asks for exactly that version,
        # from etcd, and a version compacted away answers 410 again, every back-off.
        pages = self._page_size if self._list_from in ("", "0") else 0
        items, version = self._client.list_all(
            self.path, query, pages, metadata_only=self.metadata_only
        )
        self.lists += 1
        with self._lock:
            self._objects = {_key(o): o for o in items}
            self._deleted.clear()
            self.resource_version = version
        self._good()
        self._changed()

    def _resolved(self) -> bool:
        """Whether the path is known; if not served, the cache is empty (no object of an
        unserved resource exists) and current, and nothing is asked for a while."""
        path = self._resolve() if self._resolve is not None else None
        if path is not None:
            self.path, self._resolve, self.unserved = path, None, ""
            return True
        with self._lock:
            self._objects, self._deleted = {}, {}
        self._good()  # not served is current, also after a re-check that failed once
        if not self.unserved:
            self.unserved = "not served by the API server (discovery asked again hourly)"
            self._changed()
        return False

    def watch_once(self) -> bool:
        """One watch, from the current version until the server ends it; whether any event
        (a bookmark too) came in it."""
        self.watches += 1
        timeout = self._watch_timeout_s * (1.0 + random.random())
        events = self._client.watch(
            self.path,
            self._query,
            self.resource_version,
            timeout,
            metadata_only=self.metadata_only,
        )
        self._good()  # the API server took the watch: the cache is current again
        moved = False
        for kind, obj in events:
            moved = self._relist_at_once = True  # a later 410 lists again at once
            version = str(dig(obj, "metadata", "resourceVersion") or "")
            changed = kind != "BOOKMARK"
            with self._lock:
                key = _key(obj)
                if kind in ("ADDED", "MODIFIED"):
                    gone = self._deleted.get(key)
                    changed = _newer(obj, self._objects.get(key)) and (
                        gone is None or _newer(obj, gone, strictly=True)
                    )
                    if changed:
                        self._objects[key] = obj
                        self._deleted.pop(key, None)
                elif kind == "DELETED":
                    self._objects.pop(key, None)
                    self._deleted.pop(key, None)
                if version:
                    self.resource_version = version
            self._good()
            if changed:
                self._changed()
        return moved

    def run(self) -> None:
        delay = self._backoff[0]
        while not self._stop.is_set():
            try:
                if not self.resource_version:
                    self.relist()
                    if not self.resource_version:  # not served: asked again in an hour
                        # jittered up (discovery's answer is kept that long): a fleet
                        # started together does not ask in step
                        self._stop.wait(UNSERVED_RECHECK_S * (1.0 + 0.5 * random.random()))
                        continue
                began = time.monotonic()
                if self.watch_once() or time.monotonic() - began >= 1.0:
                    # A watch that lasted worked: a 410 after it (a quiet resource's version
                    # compacted away) lists again at once.
                    delay, self._relist_at_once = self._backoff[0], True
                    continue
                # Taken and ended at once, empty (a proxy dropping watches): not spun on, and
                # not every second in step with the fleet: the jittered, doubling back-off.
                self._stop.wait(delay * (0.5 + random.random()))
                delay = min(self._backoff[1], delay * 2)
            except Gone as exc:
                # compacted: list again, at once the first time; from the version last seen
                # after a watch's 410, from none (etcd) after a list's
                self._list_from, self.resource_version = self.resource_version, ""
                if self._relist_at_once:
                    self._relist_at_once = False
                    continue
                delay = self._failed(exc, delay)  # 410 again before the watch moved: back off
            except NotFound as exc:
                if self._resolver is not None:  # the API gone under a running agent
                    self._forget_path()
                    self._resolve, self.resource_version = self._resolver, ""
                delay = self._failed(exc, delay)
            except AgentError as exc:
                delay = self._failed(exc, delay)
            except Exception as exc:  # a bug of ours, or an answer no check foresaw: the
                # thread must not end (the cache would say current, never change again)
                delay = self._failed(exc, delay, unexpected=True)

    def _failed(self, exc: Exception, delay: float, *, unexpected: bool = False) -> float:
        """Wait the server's Retry-After, else ``delay`` jittered by +-50 %; the next delay.
        ``unexpected`` (not an AgentError): logged with its traceback, once until a good call."""
        self._bad(unexpected_error(exc) if unexpected else str(exc))
        self.denied = isinstance(exc, PermissionDenied)
        wait = retry_wait(exc, delay)
        trace = unexpected and not self._traced
        self._traced = self._traced or trace
        log.warning(
            "%s: %s; again in %.1f s", self.path, self.error, wait, exc_info=exc if trace else None
        )
        self._stop.wait(wait)
        return min(self._backoff[1], delay * 2)

    @property
    def started(self) -> bool:
        """Whether a reader started the list+watch (a shared informer may be made and not)."""
        return self._thread is not None

    def start(self) -> Informer:
        """Start the list+watch thread once (a shared informer is started by each reader)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self.run, name=f"informer {self.path}", daemon=True
                )
                self._thread.start()
        return self

    def stop(self) -> None:
        """Stops after the watch in flight ends (the thread is a daemon: it never blocks exit)."""
        self._stop.set()

    def _changed(self) -> None:
        with self._lock:
            handlers = list(self._handlers)
        for handler in handlers:
            try:
                handler()
            except Exception:  # one reader's bug must not stop the others' cache
                log.exception("handler of %s failed", self.path)

    def _good(self) -> None:
        self.healthy, self.error, self.stale_since, self._traced = True, "", None, False
        self.denied = False
        self.synced.set()

    def _bad(self, error: str) -> None:
        if self.stale_since is None:
            self.stale_since = time.monotonic()
        self.healthy, self.error = False, error


class InformerFactory:
    """One shared `Informer` per (path, selectors): readers of the same resource share its
    list+watch and add their handlers (client-go's ``SharedInformerFactory.ForResource``)."""

    def __init__(
        self,
        client: Lister,
        *,
        watch_timeout_s: float = WATCH_TIMEOUT_S,
        backoff: tuple[float, float] = BACKOFF_S,
    ) -> None:
        self.client = client
        self._watch_timeout_s = watch_timeout_s
        self._backoff = backoff
        self._lock = threading.Lock()
        self._informers: dict[tuple[str, tuple[tuple[str, str], ...]], Informer] = {}

    def informer(self, path: str, query: Mapping[str, str] | None = None) -> Informer:
        key = (path, tuple(sorted((query or {}).items())))
        with self._lock:
            found = self._informers.get(key)
            if found is None:
                found = self._informers[key] = Informer(
                    self.client,
                    path,
                    query,
                    watch_timeout_s=self._watch_timeout_s,
                    backoff=self._backoff,
                )
            return found

    def node(self, node: str) -> Informer:
        """This agent's own Node."""
        return self.informer("/api/v1/nodes", node_query(node))

    def informers(self) -> list[Informer]:
        """Those started: one made and never read holds no watch."""
        with self._lock:
            return [i for i in self._informers.values() if i.started]

    def stop(self) -> None:
        with self._lock:
            made = list(self._informers.values())
        for informer in made:
            informer.stop()

    def stale(self) -> list[str]:
        """What each cache that is not current says (empty: every cache is current)."""
        return [detail for current, detail in (i.status() for i in self.informers()) if not current]


class NodeWatch:
    """This agent's own Node from its shared informer: ``labels``/``metadata`` are the cached
    ones while the watch is current, None while it is not."""

    def __init__(self, informer: Informer, node: str) -> None:
        self.node = node
        self.informer = informer

    def node_object(self) -> dict[str, Any] | None:
        for obj in self.informer.objects():
            if isinstance(obj, dict):
                return obj
        return None

    def labels(self) -> Mapping[str, str] | None:
        found = self.metadata()
        return None if found is None else found[0]

    def metadata(self) -> tuple[Mapping[str, str], Mapping[str, str]] | None:
        """(labels, annotations) from the watch; None while it is not current."""
        if not (self.informer.synced.is_set() and self.informer.healthy):
            return None
        obj = self.node_object()
        if obj is None:
            return None
        meta = obj.get("metadata")
        return _strings(dig(meta, "labels")), _strings(dig(meta, "annotations"))


def retry_wait(exc: Exception, delay: float) -> float:
    """How long to wait after ``exc``: the server's Retry-After (429, 503) when it gave one,
    else ``delay`` jittered by +-50 % so a fleet does not come back in step."""
    found = retry_after_s(exc)
    return found if found is not None else delay * (0.5 + random.random())


def retry_after_s(exc: Exception) -> float | None:
    """The server's Retry-After of ``exc`` (429, 503), capped at MAX_RETRY_AFTER_S; None."""
    found = getattr(exc, "retry_after_s", None)
    if isinstance(found, int | float) and found > 0:
        return min(float(found), MAX_RETRY_AFTER_S)
    return None


def unexpected_error(exc: BaseException) -> str:
    """What a loop says of an exception it did not expect (a bug): its type, and its text cut
    short (it may carry anything: it was never meant to be shown)."""
    return f"unexpected {type(exc).__name__}: {safeyaml.capped(str(exc)[:400], 200)}"


def _newer(obj: object, than: object, *, strictly: bool = False) -> bool:
    """Whether ``obj`` may replace ``than``: not when both carry integer resourceVersions and
    ``obj``'s is older (an event from before a write of ours we already assumed), nor, with
    ``strictly``, the same. Versions are compared as ASCII digit strings, never with ``int()``
    (``"²".isdigit()`` is True; 5,000 digits are a ValueError); any other is opaque: newer."""
    new, old = (
        _integer(dig(obj, "metadata", "resourceVersion")),
        _integer(dig(than, "metadata", "resourceVersion")),
    )
    if new is None or old is None:
        return True
    return new > old if strictly else new >= old


def _integer(version: object) -> tuple[int, str] | None:
    """A resourceVersion of ASCII digits as a sortable (length, digits), leading zeros off."""
    if not (isinstance(version, str) and version.isascii() and version.isdigit()):
        return None
    digits = version.lstrip("0") or "0"
    return len(digits), digits


def _key(obj: object) -> str:
    return f"{dig(obj, 'metadata', 'namespace') or ''}/{dig(obj, 'metadata', 'name') or ''}"


def _strings(found: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
