"""One item's cancel token: whether its work should stop, and a wait that ends when it should.

Two things stop an item: the agent stopping (its event, set by `PrewarmService.stop`, seen at
once) and a user's cancel, which another process (the CLI's embedded agent) may have written to
the index; the index is read at most every ``every_s``. Every wait of a fetch (a retry's
back-off) waits on the token, so a stop never waits out a back-off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["CancelToken", "wait_cancelled"]

_PLAIN_EVERY_S = 0.05  # how often a plain cancel function is asked during a wait


class CancelToken:
    """Callable as a `CancelledFn` (True once the item should stop), with `wait`."""

    def __init__(
        self,
        event: threading.Event,
        elsewhere: Callable[[], bool],
        every_s: float,
        monotonic: Callable[[], float],
    ) -> None:
        self._event = event
        self._elsewhere = elsewhere
        self._every = every_s
        self._monotonic = monotonic
        self._checked = 0.0

    def __call__(self) -> bool:
        if self._event.is_set():
            return True
        now = self._monotonic()
        if now - self._checked < self._every:
            return False
        self._checked = now
        return self._elsewhere()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True as soon as the item should stop (a stop wakes
        it at once, a cancel written elsewhere within ``every_s``)."""
        deadline = self._monotonic() + timeout
        while not self():
            left = deadline - self._monotonic()
            if left <= 0:
                return False
            self._event.wait(min(left, self._every))
        return True


def wait_cancelled(cancelled: Callable[[], bool], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds unless ``cancelled``; True when it was. A plain function
    (a test's, a caller without a token) is asked on a fresh event's short waits."""
    if isinstance(cancelled, CancelToken):
        return cancelled.wait(timeout)
    return CancelToken(threading.Event(), cancelled, _PLAIN_EVERY_S, time.monotonic).wait(timeout)
