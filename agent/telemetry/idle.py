"""Idle tracking: seconds since a GPU or instance was last busier than a threshold.

A GPU nobody used for a day shows ``gpu_agent_idle_seconds > 86400``. Counting starts when this
agent first reads the entity's utilisation: what happened while no agent watched (the agent
down for a restart or an upgrade, the driver detached) is unknown, and a GPU busy meanwhile
must not read as idle, so the time before is never counted (a reclaim alert fires late after a
restart, never on a GPU that was used). The same holds for a tick whose utilisation could not
be read: it ends the idle run, and the next idle reading counts from itself. Idle seconds are
monotonic: a clock step (NTP, an admin) neither adds nor removes any.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

__all__ = ["IdleTracker"]


class IdleTracker:
    def __init__(self, threshold_percent: float) -> None:
        self._threshold = threshold_percent
        self._last_busy: dict[Hashable, float] = {}

    def update(self, key: Hashable, utilization_percent: float | None, now: float) -> float | None:
        """Record this tick's utilisation (``now``: monotonic seconds); returns the idle
        seconds, or None while unknown.

        Unknown (an Ampere GPU in MIG mode without DCGM, a failed read) is not idle, and
        neither is the time until the next reading: the GPU may have been busy all through the
        gap, so the idle run ends here and counting starts again at the next reading."""
        if utilization_percent is None:
            self._last_busy.pop(key, None)
            return None
        if utilization_percent > self._threshold or key not in self._last_busy:
            self._last_busy[key] = now
        return now - self._last_busy[key]

    def retain(self, keys: Iterable[Hashable]) -> None:
        keep = set(keys)
        for key in [k for k in self._last_busy if k not in keep]:
            del self._last_busy[key]
