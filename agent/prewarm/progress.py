"""Byte progress with a rate over a sliding window and an ETA; clock injected for tests."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from agent.prewarm.model import Progress

_WINDOW_S = 5.0


class ProgressMeter:
    """Feed it (done, total) as bytes arrive; read `Progress` snapshots."""

    def __init__(self, item_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._item_id = item_id
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()
        self._done = 0
        self._total: int | None = None
        self._retrying = ""

    def retrying(self, note: str) -> None:
        """The fetch waits to resume: no rate (the last one is stale) until bytes flow."""
        self._retrying = note
        self._samples.clear()

    def update(self, done: int, total: int | None) -> None:
        now = self._clock()
        self._retrying = ""
        if done < self._done:  # a restart from zero: the old samples say nothing about the rate
            self._samples.clear()
        self._done, self._total = done, total
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > _WINDOW_S:
            self._samples.popleft()

    def snapshot(self) -> Progress:
        rate = 0.0
        if len(self._samples) >= 2:
            (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
            if t1 > t0:
                rate = (b1 - b0) / (t1 - t0)
        eta = None
        if self._total is not None and rate > 0:
            eta = max(self._total - self._done, 0) / rate
        return Progress(self._item_id, self._done, self._total, rate, eta, self._retrying)
