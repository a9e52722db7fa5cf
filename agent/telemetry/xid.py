"""XID errors: a dedicated thread blocks on NVML's event set and counts every XID.

NVML delivers XIDs as events (reference §4, fact 7): the thread waits on them so none is missed
between collection ticks, counts occurrences per (GPU, GPU instance, XID) for
``gpu_agent_xid_errors_total`` and remembers the last XID per GPU for dcgm-exporter's
``DCGM_FI_DEV_XID_ERRORS`` gauge. Event sets are not thread-safe, so only this thread touches it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from agent.errors import AgentError
from agent.gpu.readings import NodeReader, XidEvent, XidEvents
from agent.telemetry.stats import TelemetryStats

log = logging.getLogger(__name__)

__all__ = ["XidState", "XidWatcher", "xid_message"]

_WAIT_MS = 250  # how long one NVML event wait blocks; bounds how long stopping takes
_REOPEN_AFTER_S = 5.0

# The XIDs operators meet most, worded after NVIDIA's XID catalog; others are "Unknown XID".
_MESSAGES = {
    0: "No error",
    13: "Graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double-bit ECC error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapping recording failure",
    68: "NVDEC0 exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def xid_message(xid: int) -> str:
    """dcgm-exporter's ``err_msg`` for an XID number."""
    return _MESSAGES.get(xid, "Unknown XID")


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


class XidWatcher:
    """Runs :class:`XidEvents` on its own daemon thread; :meth:`state` copies the counts."""

    def __init__(
        self,
        open_events: Callable[[], XidEvents],
        stats: TelemetryStats,
        wait_ms: int = _WAIT_MS,
    ) -> None:
        self._open = open_events
        self._stats = stats
        self._wait_ms = wait_ms
        self._lock = threading.Lock()
        self._counts: Counter[tuple[int, int | None, int]] = Counter()
        self._last: dict[int, int] = {}
        self._unsupported: dict[int, str] = {}
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
            return XidState(
                dict(self._counts), dict(self._last), dict(self._unsupported), self._ready.is_set()
            )

    def record(self, event: XidEvent) -> None:
        with self._lock:
            self._counts[(event.gpu_index, event.gpu_instance_id, event.xid)] += 1
            self._last[event.gpu_index] = event.xid
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
            self._ready.set()
            try:
                self._pump(events)
            except AgentError as exc:
                self._failed("waiting for NVML events failed", exc)
            finally:
                events.close()

    def _pump(self, events: XidEvents) -> None:
        while not self._stop.is_set():
            event = events.wait(self._wait_ms)
            if event is not None:
                self.record(event)

    def _failed(self, what: str, exc: Exception) -> None:
        # The device plugin treats a broken event wait as fatal; we keep counting what we can
        # and reopen the set, which re-registers every GPU still answering.
        self._stats.error("xid")
        log.error("%s (%s); reopening in %.0f s", what, exc, _REOPEN_AFTER_S)
        self._ready.set()
        self._stop.wait(_REOPEN_AFTER_S)
