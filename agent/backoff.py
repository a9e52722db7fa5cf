"""Keyed retry back-off, jittered and doubling to a cap. Pure: the caller passes the time.

The coordinator's reconcile loop keys it by (kind, node); the agent by (kind, object) for the
writes beside its Node that the API server refuses (DeviceTaintRules, Events:
agent/health/publish.py), so a refusal is not sent again every pass. In the reconcile loop, a
node whose change failed is left out of the next passes for a while, doubling with every
failure in a row up to a cap: a node that cannot take the desired state (a GPU in use, a broken
plugin) is not sent the same change every interval, and its failures do not count against every
pass's max-failures. The node is retried at once when it succeeds, matches the desired state
again, or the desired change for it is a different one (the file was fixed).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Backoff", "BackoffPolicy", "Held", "Key"]

#: (kind, node): a node failing its MIG change may still take its sharing or prewarm.
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    #: the wait after the first failure
    base_s: float = 60.0
    #: the longest wait
    max_s: float = 1800.0
    #: each wait is shortened by up to this fraction at random, so that nodes which failed
    #: together spread out; 0 for none
    jitter: float = 0.0

    def delay(self, failures: int, draw: float) -> float:
        """The wait after ``failures`` failures in a row; ``draw`` is uniform in [0, 1)."""
        exponent = min(max(failures - 1, 0), 60)  # past any cap already; keeps the float small
        full = min(self.max_s, self.base_s * 2.0**exponent)
        return full * (1.0 - self.jitter * draw)


@dataclass(frozen=True, slots=True)
class Held:
    """A node's failures in a row at one change, and when it may be retried."""

    failures: int
    retry_at: float
    #: what was tried (a fingerprint of the change): another change is not held back
    change: str = ""
    detail: str = ""


@dataclass
class Backoff:
    policy: BackoffPolicy = field(default_factory=BackoffPolicy)
    #: uniform draws in [0, 1) for the jitter; injectable for tests
    draw: Callable[[], float] = random.random
    _held: dict[Key, Held] = field(default_factory=dict)

    def failed(
        self, key: Key, now: float, change: str = "", detail: str = "", at_least_s: float = 0.0
    ) -> Held:
        """``at_least_s``: the server's own wait (a 429's Retry-After), when longer."""
        before = self._held.get(key)
        failures = 1 if before is None or before.change != change else before.failures + 1
        wait = max(self.policy.delay(failures, self.draw()), at_least_s)
        held = Held(failures, now + wait, change, detail)
        self._held[key] = held
        return held

    def succeeded(self, key: Key) -> None:
        self._held.pop(key, None)

    def waiting(self, key: Key, now: float, change: str = "") -> Held | None:
        """The hold on ``key`` while ``change`` may not be retried yet; None when it may."""
        held = self._held.get(key)
        if held is None or held.change != change or held.retry_at <= now:
            return None
        return held

    def retain(self, keep: Callable[[Key], bool]) -> None:
        """Forget the keys ``keep`` refuses (nodes gone, or no longer under a rule)."""
        for key in [k for k in self._held if not keep(k)]:
            del self._held[key]

    def held(self) -> dict[Key, Held]:
        """Every node with failures in a row: waiting, or due for its retry."""
        return dict(self._held)
