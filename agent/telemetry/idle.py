"""Idle tracking: seconds since a GPU or instance was last busier than a threshold.

A GPU nobody used for a day shows ``gpu_agent_idle_seconds > 86400``. Counting starts when the
agent first sees the entity, so after an agent restart the figure restarts from 0.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable


class IdleTracker:
    def __init__(self, threshold_percent: float) -> None:
        self._threshold = threshold_percent
        self._last_busy: dict[Hashable, float] = {}

    def update(self, key: Hashable, utilization_percent: float | None, now: float) -> float | None:
        """Record this tick's utilisation; returns the idle seconds, or None while unknown."""
        if utilization_percent is None:
            last = self._last_busy.get(key)
            return None if last is None else now - last
        if utilization_percent > self._threshold or key not in self._last_busy:
            self._last_busy[key] = now
        return now - self._last_busy[key]

    def retain(self, keys: Iterable[Hashable]) -> None:
        keep = set(keys)
        for key in [k for k in self._last_busy if k not in keep]:
            del self._last_busy[key]
