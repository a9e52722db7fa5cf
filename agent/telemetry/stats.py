"""The agent's own telemetry health: how long collecting and scraping take, and what failed."""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from dataclasses import dataclass

COLLECTION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SCRAPE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts (``le`` -> count, +Inf last) and the sum, as Prometheus wants."""

    buckets: tuple[tuple[float, int], ...]
    total: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1]


class _Distribution:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def histogram(self) -> Histogram:
        cumulative, running = [], 0
        for bound, count in zip((*self._bounds, float("inf")), self._counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return Histogram(tuple(cumulative), self._sum)


@dataclass(frozen=True, slots=True)
class SourceView:
    """One collection source (devices, gpm, attribution, kubelet...): how long its reads take
    and when it was last read (Unix time)."""

    source: str
    duration: Histogram
    last_at: float


@dataclass(frozen=True, slots=True)
class StatsView:
    collection: Histogram
    scrape: Histogram
    #: error kind -> occurrences since start
    errors: tuple[tuple[str, int], ...]
    sources: tuple[SourceView, ...] = ()
    #: times the /metrics body was encoded
    encodes: int = 0


class TelemetryStats:
    """Thread-safe counters written by the sampler, the pod watcher and scrapes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._collection = _Distribution(COLLECTION_BUCKETS)
        self._scrape = _Distribution(SCRAPE_BUCKETS)
        self._errors: Counter[str] = Counter()
        self._sources: dict[str, tuple[_Distribution, float]] = {}
        self._encodes = 0

    def observe_source(self, source: str, seconds: float, at: float | None = None) -> None:
        """One read of ``source`` that took ``seconds``, finished at Unix time ``at`` (now)."""
        at = time.time() if at is None else at
        with self._lock:
            entry = self._sources.get(source)
            distribution = entry[0] if entry is not None else _Distribution(COLLECTION_BUCKETS)
            distribution.observe(seconds)
            self._sources[source] = (distribution, at)

    def encoded(self) -> None:
        """The /metrics body was encoded once more."""
        with self._lock:
            self._encodes += 1

    def observe_collection(self, seconds: float) -> None:
        with self._lock:
            self._collection.observe(seconds)

    def observe_scrape(self, seconds: float) -> None:
        with self._lock:
            self._scrape.observe(seconds)

    def error(self, kind: str, count: int = 1) -> None:
        """Count a failure by kind: nvml, gpm, gpu_lost, kubelet, pod_mapping, dra_unresolved,
        xid, dcgm."""
        with self._lock:
            self._errors[kind] += count

    def view(self) -> StatsView:
        with self._lock:
            return StatsView(
                self._collection.histogram(),
                self._scrape.histogram(),
                tuple(sorted(self._errors.items())),
                tuple(
                    SourceView(name, d.histogram(), at)
                    for name, (d, at) in sorted(self._sources.items())
                ),
                self._encodes,
            )
