"""Idle tracking: seconds since a GPU or instance was last busier than a threshold.

A GPU nobody used for a day shows ``gpu_agent_idle_seconds > 86400``. Counting starts when the
agent first sees the entity. The last-busy times are kept in the state dir
(``telemetry-idle.json``, wall-clock seconds) and read back at start, so an agent restart (a
DaemonSet upgrade) does not push a 24 h reclaim signal back by 24 h: the time the agent was down
counts as idle, since nothing recorded a use in it. While the agent runs, idle seconds are
monotonic, and :class:`IdleClock` converts them to wall-clock times against the wall clock read
at start, so a clock step (NTP, an admin) neither adds nor removes idle seconds nor reaches the
file.
A saved time in the future (clock moved back while the agent was down) or an unreadable file
counts from now.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

from agent.durable import replace_file

log = logging.getLogger(__name__)

__all__ = ["IdleClock", "IdleStore", "IdleTracker"]

#: bounds what a corrupt or hostile file can make the agent hold
_MAX_ENTRIES = 4096
_MAX_BYTES = 1 << 20


class IdleTracker:
    def __init__(self, threshold_percent: float) -> None:
        self._threshold = threshold_percent
        self._last_busy: dict[Hashable, float] = {}

    def update(self, key: Hashable, utilization_percent: float | None, now: float) -> float | None:
        """Record this tick's utilisation; returns the idle seconds, or None while unknown.

        Unknown (an Ampere GPU in MIG mode without DCGM, a failed read) is not idle: counting
        on from the last reading would report a busy GPU idle. The last-busy time is kept."""
        if utilization_percent is None:
            return None
        if utilization_percent > self._threshold or key not in self._last_busy:
            self._last_busy[key] = now
        return now - self._last_busy[key]

    def retain(self, keys: Iterable[Hashable]) -> None:
        keep = set(keys)
        for key in [k for k in self._last_busy if k not in keep]:
            del self._last_busy[key]

    def export(self, name: Mapping[Any, str], now: float, wall: float) -> dict[str, float]:
        """Last-busy wall-clock times by ``name[key]`` (keys without a name are skipped)."""
        return {name[k]: wall - (now - t) for k, t in self._last_busy.items() if k in name}

    def restore(
        self, saved: Mapping[str, float], name: Mapping[Any, str], now: float, wall: float
    ) -> None:
        """Seed keys not seen yet from ``saved`` wall-clock times."""
        for key, label in name.items():
            at = saved.get(label)
            if at is not None and key not in self._last_busy:
                self._last_busy[key] = now - max(0.0, wall - at)


class IdleStore:
    """The JSON file the last-busy times live in; written whole and renamed into place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._failed: str | None = None  # the last save's error, said once until it changes

    def load(self) -> dict[str, float]:
        try:
            if self.path.stat().st_size > _MAX_BYTES:
                raise ValueError(f"larger than {_MAX_BYTES} bytes")
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s (idle times count from now): %s", self.path, exc)
            return {}
        out: dict[str, float] = {}
        for key, value in list(data.items())[:_MAX_ENTRIES]:
            if isinstance(key, str) and isinstance(value, int | float) and value == value:
                out[key] = float(value)
        return out

    def save(self, times: Mapping[str, float]) -> None:
        try:
            replace_file(self.path, json.dumps(dict(times), sort_keys=True).encode())
        except OSError as exc:
            why = exc.strerror or str(exc)  # not the temp file's name, new at each try
            if why != self._failed:  # a read-only state dir: once, not every 30 s
                log.warning("cannot save idle times to %s: %s", self.path, why)
            self._failed = why
        else:
            self._failed = None


class IdleClock:
    """Idle seconds of the entities seen, carried over restarts through an optional store.

    Monotonic ``now`` is mapped to the wall clock as ``wall0 + (now - mono0)``, both read once
    at start, so a clock step while the agent runs neither adds nor removes idle seconds, in
    this run or in the file the next one reads.
    """

    def __init__(
        self,
        threshold_percent: float,
        store: IdleStore | None,
        save_every_s: float,
        mono0: float,
        wall0: float,
    ) -> None:
        self._tracker = IdleTracker(threshold_percent)
        self._store = store
        self._save_every_s = save_every_s
        self._mono0, self._wall0 = mono0, wall0
        #: saved last-busy times not yet matched to an entity seen this run
        self._saved = store.load() if store is not None else {}
        self._saved_at: float | None = None
        self._names: dict[Hashable, str] = {}

    def seconds(
        self, key: Hashable, name: str, utilization: float | None, now: float
    ) -> float | None:
        """This tick's idle seconds of ``key`` (saved as ``name``); None while unknown."""
        saved = self._saved.pop(name, None)
        if saved is not None:  # first sight this run: carry on from the last run's figure
            self._tracker.restore({name: saved}, {key: name}, now, self._wall(now))
        return self._tracker.update(key, utilization, now)

    def retain(self, names: Mapping[Any, str], now: float) -> None:
        """Forget the entities not in ``names`` (this tick's), and save when due."""
        self._tracker.retain(names)
        self._names = dict(names)
        self.save(now)

    def save(self, now: float, *, force: bool = False) -> None:
        if self._store is None:
            return
        due = self._saved_at is None or now - self._saved_at >= self._save_every_s
        if force or due:
            times = self._tracker.export(self._names, now, self._wall(now))
            self._store.save({**self._saved, **times})  # keep GPUs not seen this run
            self._saved_at = now

    def _wall(self, now: float) -> float:
        return self._wall0 + (now - self._mono0)
