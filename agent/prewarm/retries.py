"""When a failed item is tried again: after a delay doubling from the first up to a cap.

The item's row keeps the wall-clock time (``retry_at``), so a retry survives a restart; this
process waits on monotonic deadlines, so a clock step neither rushes nor stalls it. A time set
by another process (the CLI's embedded agent) or before this one started is turned into a
deadline bounded by its delay.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agent.clocks import deadline_from_wall
from agent.prewarm.model import CacheItem

__all__ = ["RetryClock"]


@dataclass(eq=False)
class RetryClock:
    initial_s: float
    max_s: float
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    #: item id -> (the stored wall-clock retry_at, the monotonic deadline it stands for)
    _due: dict[str, tuple[float, float]] = field(default_factory=dict, init=False, repr=False)

    def delay(self, attempts: int) -> float:
        """The wait before retry number ``attempts``: doubling from the first, up to the cap."""
        return min(self.initial_s * 2 ** (max(attempts, 1) - 1), self.max_s)

    def schedule(self, item_id: str, attempts: int, now: float) -> tuple[str, float]:
        """The ``retry_at`` to store for the item's retry number ``attempts`` failed at ``now``
        (wall clock), and its delay."""
        delay = self.delay(attempts)
        retry_at = f"{now + delay:.3f}"
        with self._lock:
            self._due[item_id] = (float(retry_at), self.monotonic() + delay)
        return retry_at, delay

    def due(self, failed: Sequence[CacheItem]) -> list[CacheItem]:
        """The failed items whose retry is due now; the others are remembered, the rest
        (retried, deleted, asked again) forgotten."""
        wall, mono = self.clock(), self.monotonic()
        due = []
        with self._lock:
            for item in failed:
                if item.retry_at is None:
                    continue
                known = self._due.get(item.id)
                if known is None or known[0] != item.retry_at:  # set elsewhere, or before
                    deadline = deadline_from_wall(
                        item.retry_at,
                        wall_now=wall,
                        mono_now=mono,
                        bound_s=self.delay(item.attempts),
                    )
                    known = self._due[item.id] = (item.retry_at, deadline)
                if known[1] <= mono:
                    due.append(item)
            waiting = {i.id for i in failed if i.retry_at is not None} - {i.id for i in due}
            self._due = {k: v for k, v in self._due.items() if k in waiting}
        return due
