"""XID errors: a dedicated thread blocks on NVML's event set and counts every XID; the XID
reader puts the counts into each tick.

NVML delivers XIDs as events (reference §4, fact 7): the thread waits on them so none is missed
between collection ticks, counts occurrences per (GPU, GPU instance, XID) for
``gpu_agent_xid_errors_total`` and remembers the last XID per GPU for dcgm-exporter's
``DCGM_FI_DEV_XID_ERRORS`` gauge. Event sets are not thread-safe, so only this thread touches it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from agent.errors import AgentError
from agent.gpu.readings import GpuIdentity, MigLayout, NodeReader
from agent.gpu.xid_events import XidEvent, XidEvents
from agent.tables import packaged_rows
from agent.telemetry.attribution import profile_of
from agent.telemetry.reader import Degraded, Frame, Part, Reader
from agent.telemetry.snapshot import Entity, InstanceIdentity, Snapshot, XidCount
from agent.telemetry.stats import TelemetryStats
from dcgm.fields import Field, XidWindow
from dcgm.fields import XidEvents as XidEventsField

log = logging.getLogger(__name__)

__all__ = ["XidReader", "XidState", "XidWatcher", "xid_counts", "xid_message", "xid_recent"]

_WAIT_MS = 250  # how long one NVML event wait blocks; bounds how long stopping takes
#: dcgm-exporter's --xid-count-window-size default (300000 ms)
WINDOW_S = 300.0
#: occurrences kept for the window; an XID storm beyond it still counts in the totals
_RECENT_MAX = 10_000
_REOPEN_AFTER_S = 5.0

#: dcgm-exporter's err_msg for an XID outside the catalog
UNKNOWN_XID = "Unknown Error"


@functools.cache
def _messages() -> dict[int, str]:
    """XID -> its NVIDIA XID catalog name (``dcgm/xid-messages.tsv``, dcgm-exporter's table)."""
    return {int(n): message for n, message in packaged_rows("dcgm", "xid-messages.tsv", cells=2)}


def xid_message(xid: int) -> str:
    """dcgm-exporter's ``err_msg`` for an XID number."""
    return _messages().get(xid, UNKNOWN_XID)


@dataclass(frozen=True, slots=True)
class XidState:
    #: (GPU index, GPU instance id or None, XID) -> occurrences since the agent started
    counts: dict[tuple[int, int | None, int], int]
    #: GPU index -> last XID seen (absent: none yet)
    last: dict[int, int]
    #: GPU index -> why it cannot deliver XIDs
    unsupported: dict[int, str]
    #: False until the event set is registered (the first XIDs may not be seen yet)
    ready: bool
    #: (GPU index, XID) -> occurrences within the last ``WINDOW_S`` (DCGM_EXP_XID_ERRORS_COUNT)
    recent: dict[tuple[int, int], int] = field(default_factory=dict)
    #: why the event set is broken now (XIDs may be missed); None while it is open
    broken: str | None = None
    #: (GPU index, XID) -> occurrences on GPU instances since destroyed: part of the GPU's
    #: total, in no published series (see :meth:`XidWatcher.retire_gone`)
    retired: dict[tuple[int, int], int] = field(default_factory=dict)
    #: of ``unsupported``, the GPUs that did not answer when they were registered: registered
    #: into the open set once they answer (:meth:`XidWatcher.on_snapshot`)
    unreachable: frozenset[int] = frozenset()
    #: ``counts``' keys -> when (Unix time) the first of them came: a rule tells a series new
    #: since then from one it missed for a while (a Prometheus restart, a new replica)
    first_seen: dict[tuple[int, int | None, int], float] = field(default_factory=dict)

    def totals(self) -> dict[tuple[int, int | None, int], int]:
        """:attr:`counts` with the retired ones under their GPU (None): every XID since the
        agent started, once."""
        merged = dict(self.counts)
        for (gpu, code), n in self.retired.items():
            merged[(gpu, None, code)] = merged.get((gpu, None, code), 0) + n
        return merged


class XidWatcher:
    """Runs :class:`XidEvents` on its own daemon thread; :meth:`state` copies the counts."""

    def __init__(
        self,
        open_events: Callable[[], XidEvents],
        stats: TelemetryStats,
        wait_ms: int = _WAIT_MS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._open = open_events
        self._clock = clock
        self._wall = wall
        #: (when, GPU index, XID) of recent occurrences, oldest first
        self._recent: deque[tuple[float, int, int]] = deque(maxlen=_RECENT_MAX)
        self._stats = stats
        self._wait_ms = wait_ms
        self._lock = threading.Lock()
        self._counts: Counter[tuple[int, int | None, int]] = Counter()
        #: when each count last grew (this watcher's clock)
        self._counted_at: dict[tuple[int, int | None, int], float] = {}
        #: when each count began (Unix time)
        self._first_at: dict[tuple[int, int | None, int], float] = {}
        self._retired: Counter[tuple[int, int]] = Counter()
        self._last: dict[int, int] = {}
        self._unsupported: dict[int, str] = {}
        #: why the event set is broken now (XIDs may be missed); None while it is open
        self._broken: str | None = None
        #: GPUs that did not answer when the event set was opened (none of their XIDs come)
        self._unreachable: frozenset[int] = frozenset()
        self._ready = threading.Event()
        self._stop = threading.Event()
        #: set when an unreachable GPU answers: the thread registers ``_back`` into its set
        self._register = threading.Event()
        self._back: frozenset[int] = frozenset()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[XidEvent], None]] = []

    @classmethod
    def for_reader(cls, reader: NodeReader, stats: TelemetryStats) -> XidWatcher:
        return cls(lambda: XidEvents(reader), stats)

    def start(self, ready_timeout_s: float = 10.0) -> None:
        """Start the thread and wait until events are registered (XIDs after this are counted)."""
        self._thread = threading.Thread(target=self._run, name="gpu-agent-xid", daemon=True)
        self._thread.start()
        self._ready.wait(ready_timeout_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def state(self) -> XidState:
        with self._lock:
            since = self._clock() - WINDOW_S
            while self._recent and self._recent[0][0] < since:
                self._recent.popleft()
            recent: Counter[tuple[int, int]] = Counter((g, x) for _, g, x in self._recent)
            return XidState(
                dict(self._counts),
                dict(self._last),
                dict(self._unsupported),
                self._ready.is_set(),
                dict(recent),
                self._broken,
                dict(self._retired),
                self._unreachable,
                dict(self._first_at),
            )

    def retire_gone(self, layouts: Mapping[int, MigLayout], read_after: float) -> None:
        """Retire the counts of GPU instances missing from ``layouts`` (read after
        ``read_after``, this watcher's clock) whose last XID came before that read: the instance
        was destroyed, its series goes. Folded into the GPU's series they would show there as
        new XIDs; kept, a later instance with the same id would inherit them."""
        with self._lock:
            for key in [k for k in self._counts if k[1] is not None]:
                gpu, gi, code = key
                layout = layouts.get(gpu)
                if layout is None or any(i.id == gi for i in layout.instances):
                    continue  # not read this tick, or alive
                if self._counted_at.get(key, 0.0) >= read_after:
                    continue  # may be an instance made after the layout was read
                self._retired[(gpu, code)] += self._counts.pop(key)
                self._counted_at.pop(key, None)
                self._first_at.pop(key, None)

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """A GPU that answers this tick but could not be registered (lost at start or at its
        registration, or held in a reset) is registered now, into the open set; until then its
        XIDs reach neither the counters nor the health marks. Tried again each tick it answers."""
        listed = (g.gpu.index for g in snapshot.gpus if g.up is not False)  # not lost
        back = self._unreachable.intersection(listed)
        if back and not self._register.is_set():
            self._back = back
            self._register.set()

    def listen(self, listener: Callable[[XidEvent], None]) -> None:
        """Also hand every XID to ``listener`` (on this thread; it must not block)."""
        self._listeners.append(listener)

    def record(self, event: XidEvent) -> None:
        with self._lock:
            key = (event.gpu_index, event.gpu_instance_id, event.xid)
            now = self._clock()
            self._counts[key] += 1
            self._counted_at[key] = now
            self._first_at.setdefault(key, self._wall())
            self._last[event.gpu_index] = event.xid
            self._recent.append((now, event.gpu_index, event.xid))
        for listener in self._listeners:
            listener(event)
        log.warning(
            "XID %d (%s) on GPU %d%s",
            event.xid,
            xid_message(event.xid),
            event.gpu_index,
            "" if event.gpu_instance_id is None else f" GPU instance {event.gpu_instance_id}",
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._open()
            except AgentError as exc:
                self._failed("cannot open the NVML event set", exc)
                continue
            with self._lock:
                self._unsupported = dict(events.unsupported)
                self._unreachable = events.unreachable
                self._broken = None
            self._ready.set()
            try:
                self._pump(events)
            except AgentError as exc:
                self._failed("waiting for NVML events failed", exc)
            finally:
                events.close()

    def _pump(self, events: XidEvents) -> None:
        while not self._stop.is_set():
            if self._register.is_set():
                self._register_back(events)
            event = events.wait(self._wait_ms)
            if event is not None:
                self.record(event)

    def _register_back(self, events: XidEvents) -> None:
        """Register the GPUs that answer again into the open set (this thread owns it)."""
        done = [i for i in sorted(self._back) if events.register(i)]
        with self._lock:
            self._unsupported = dict(events.unsupported)
            self._unreachable = events.unreachable
        # Cleared once the state says who is left, so no tick asks again for a GPU just done.
        self._register.clear()
        if done:
            log.info("GPU %s answers again: its XID events are registered", _indices(done))

    def _failed(self, what: str, exc: Exception) -> None:
        # The device plugin treats a broken event wait as fatal; we keep counting what we can
        # and reopen the set, which re-registers every GPU still answering.
        self._stats.error("xid")
        log.error("%s (%s); reopening in %.0f s", what, exc, _REOPEN_AFTER_S)
        with self._lock:
            self._broken = f"{what}: {exc}"
        self._ready.set()
        self._stop.wait(_REOPEN_AFTER_S)


def _indices(gpus: Collection[int]) -> str:
    return ", ".join(str(i) for i in sorted(gpus))


def xid_counts(
    gpus: tuple[GpuIdentity, ...], layouts: Mapping[int, MigLayout], xid: XidState
) -> tuple[XidCount, ...]:
    """The snapshot's XID counters: per GPU or live GPU instance and XID. An instance missing
    from the layout has no row: its XIDs happened there, not on the GPU as a whole."""
    rows: list[XidCount] = []
    for key, count in sorted(xid.counts.items(), key=_xid_order):
        gpu, gi, code = key
        first = xid.first_seen.get(key)
        if gi is None:
            rows.append(XidCount(Entity(gpus[gpu]), code, count, first))
            continue
        profile = profile_of(layouts.get(gpu), gi)
        if profile is not None:
            instance = Entity(gpus[gpu], InstanceIdentity(gi, profile))
            rows.append(XidCount(instance, code, count, first))
    return tuple(rows)


def xid_recent(gpus: tuple[GpuIdentity, ...], xid: XidState) -> tuple[XidCount, ...]:
    """XIDs per GPU within the window (dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT)."""
    return tuple(
        XidCount(Entity(gpus[gpu]), code, count)
        for (gpu, code), count in sorted(xid.recent.items())
        if gpu < len(gpus)
    )


def _xid_order(item: tuple[tuple[int, int | None, int], int]) -> tuple[int, int, int]:
    (gpu, gi, code), _count = item
    return gpu, -1 if gi is None else gi, code


_XID_FIELD = 230  # DCGM_FI_DEV_XID_ERRORS: the last XID per GPU


class XidReader(Reader):
    """The XID reader: the last XID per GPU (``DCGM_FI_DEV_XID_ERRORS``), the counts since start
    and within the window, as the counters select. While the event set is broken, XIDs may be
    missed: the reader fails, so no count is published that could be short."""

    name = "xid"
    after_attribution = False

    def __init__(self, watcher: XidWatcher | None, fields: Sequence[Field]) -> None:
        self._watcher = watcher
        self._last = next((f for f in fields if f.id == _XID_FIELD), None)
        self._counts = any(isinstance(f.source, XidEventsField) for f in fields)
        self._window = any(isinstance(f.source, XidWindow) for f in fields)

    def read(self, frame: Frame) -> Part:
        part = Part()
        if self._watcher is None:
            if self._last is not None:
                reason = "XID events are not watched"
                part.unsupported.extend((i, self._last.id, reason) for i in frame.layouts)
            return part
        self._watcher.retire_gone(frame.layouts, frame.now)
        xid = self._watcher.state()
        if xid.broken is not None:
            raise Degraded(xid.broken)
        if not xid.ready:  # XIDs before the registration are not seen: a 0 could be short
            raise Degraded("XID events are not registered yet (the NVML event set is opening)")
        for index in frame.layouts:
            if self._last is None:
                break
            if index in xid.unreachable:
                continue  # answers now, registered at the set's next opening: neither 0 nor "no"
            if index in xid.unsupported:
                part.unsupported.append((index, self._last.id, xid.unsupported[index]))
            else:
                part.value((index, None), _XID_FIELD, float(xid.last.get(index, 0)))
        if self._counts:
            part.xids = xid_counts(frame.gpus, frame.layouts, xid)
        if self._window:
            part.xid_recent = xid_recent(frame.gpus, xid)
        return part
