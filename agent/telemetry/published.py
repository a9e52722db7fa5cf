"""What /metrics serves besides the GPU snapshot: one immutable record per owner.

Each owner of agent state that has series (prewarm, MIG, health, driver, state dir, allocation
mode, DRA slices) registers the metric families it publishes, once; a family name registered
twice is refused, so two owners can never emit the same family. A record holds the owner's
families already encoded in both exposition formats, so the exporter only joins bytes.

Owners are read on the publication tick (`Published.refresh`, run off the event loop by the
agent), never on a scrape: whatever an owner's render touches (the state database, statfs of
the cache volume) happens there, and a record's version moves only when its bytes changed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.errors import AgentError, Conflict
from agent.telemetry.encode import encode

log = logging.getLogger(__name__)

__all__ = ["DuplicateFamily", "Published", "Record"]


def _is_database_error(exc: Exception) -> bool:
    """A state store error (sqlite3.Error), told by its module: the telemetry service alone
    never opens a database, so it does not import sqlite3 for this check."""
    return type(exc).__module__ == "sqlite3"


class DuplicateFamily(Conflict):
    """A metric family name that another owner (or the same one) registered already."""


@dataclass(frozen=True, slots=True)
class Record:
    """One owner's families as of its last change, encoded: ``text`` in the classic format,
    ``openmetrics`` in OpenMetrics without the closing ``# EOF``."""

    owner: str
    text: bytes
    openmetrics: bytes

    def body(self, openmetrics: bool) -> bytes:
        return self.openmetrics if openmetrics else self.text


class Published:
    """The latest record of every owner, a version that moves on every change, and the registry
    of family names. Thread-safe: owners publish from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: family name -> owner
        self._names: dict[str, str] = {}
        #: owner -> its latest record, in registration order
        self._records: dict[str, Record] = {}
        #: owners read on the publication tick
        self._polled: list[tuple[str, Collector]] = []
        self._version = 0

    def register(self, owner: str, names: Iterable[str]) -> None:
        """Claim family ``names`` for ``owner``; DuplicateFamily (changing nothing) when any is
        claimed already."""
        wanted = list(names)
        with self._lock:
            taken = [n for n in wanted if n in self._names]
            taken += [n for i, n in enumerate(wanted) if n in wanted[:i]]
            if taken:
                holders = ", ".join(f"{n} (by {self._names.get(n, owner)})" for n in taken)
                raise DuplicateFamily(f"{owner}: metric families registered already: {holders}")
            for name in wanted:
                self._names[name] = owner
            self._records.setdefault(owner, Record(owner, b"", b""))

    def poll(self, owner: str, collector: Collector) -> None:
        """Register ``collector``'s families for ``owner`` and read it on every `refresh`.
        Its families are found by collecting it once, now."""
        families = list(collector.collect())
        self.register(owner, (f.name for f in families))
        with self._lock:
            self._polled.append((owner, collector))
        self.publish(owner, families)

    def changed(self, owner: str) -> None:
        """``owner`` changed: read it now (on the caller's thread) and publish."""
        with self._lock:
            collectors = [c for o, c in self._polled if o == owner]
        for collector in collectors:
            self.publish(owner, list(collector.collect()))

    def publish(self, owner: str, families: Sequence[Metric]) -> bool:
        """Replace ``owner``'s record; True when its bytes changed. Refuses (AgentError) a family
        the owner did not register."""
        with self._lock:
            foreign = [f.name for f in families if self._names.get(f.name) != owner]
        if foreign:
            raise AgentError(f"{owner} publishes families it did not register: {foreign}")
        shown = [f for f in families if f.samples]
        record = Record(owner, encode(shown, False), encode(shown, True).removesuffix(b"# EOF\n"))
        with self._lock:
            if self._records.get(owner) == record:
                return False
            self._records[owner] = record
            self._version += 1
        return True

    def refresh(self) -> bool:
        """Read every polled owner and publish what changed; True when anything did. An owner
        that fails keeps its last record (logged); the others still publish."""
        with self._lock:
            polled = list(self._polled)
        changed = False
        for owner, collector in polled:
            try:
                changed |= self.publish(owner, list(collector.collect()))
            except Exception as exc:  # one owner's failure must not stale the others
                log.warning(
                    "metrics of %s not refreshed, serving the last ones: %s",
                    owner,
                    exc,
                    exc_info=not (isinstance(exc, AgentError | OSError) or _is_database_error(exc)),
                )
        return changed

    @property
    def version(self) -> int:
        return self._version

    def latest(self) -> tuple[int, tuple[Record, ...]]:
        """(version, every owner's record in registration order)."""
        with self._lock:
            return self._version, tuple(self._records.values())

    def owners(self) -> dict[str, str]:
        """Family name -> owner, for checks."""
        with self._lock:
            return dict(self._names)
