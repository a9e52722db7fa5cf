"""One item's cancel token: whether its work should stop, a wait that ends when it should, and
the blocking calls the stop must end.

Two things stop an item: the agent stopping (its `Stop`, set by `PrewarmService.stop`, seen at
once) and a user's cancel, which another process (the CLI's embedded agent) may have written to
the index; the index is read at most every ``every_s``. Every wait of a fetch (a retry's
back-off) waits on the token, so a stop never waits out a back-off. A call blocked on a peer
(a connect, a TLS handshake, a read, a gRPC stream) is held by the token (`hold`) while it runs, so
setting the `Stop` interrupts it at once; a call nothing can interrupt (``getaddrinfo``) runs
`abandonable`, on a thread the fetch stops waiting for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from agent.prewarm.errors import Cancelled

__all__ = ["CancelToken", "Stop", "abandonable", "hold", "never", "release", "wait_cancelled"]

_PLAIN_EVERY_S = 0.05  # how often a plain cancel function is asked during a wait
_T = TypeVar("_T")
Interrupt = Callable[[], None]


def never() -> bool:
    """The token of a caller with nothing that stops it (a submit's check, a test)."""
    return False


class Stop(threading.Event):
    """An item's stop event; setting it also calls the interrupts of the calls held on it."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._held: set[Interrupt] = set()

    def set(self) -> None:
        with self._lock:
            super().set()
            held = list(self._held)
        for interrupt in held:
            interrupt()

    def hold(self, interrupt: Interrupt) -> None:
        with self._lock:
            self._held.add(interrupt)
            stopped = self.is_set()
        if stopped:  # set before this call could be reached
            interrupt()

    def release(self, interrupt: Interrupt) -> None:
        with self._lock:
            self._held.discard(interrupt)


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

    @property
    def stop(self) -> Stop | None:
        return self._event if isinstance(self._event, Stop) else None

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


def hold(cancelled: Callable[[], bool], interrupt: Interrupt) -> None:
    """Have the item's stop call ``interrupt`` until `release`; nothing for a plain function
    (a test's, a caller without a token), which only polls."""
    stop = cancelled.stop if isinstance(cancelled, CancelToken) else None
    if stop is not None:
        stop.hold(interrupt)


def release(cancelled: Callable[[], bool], interrupt: Interrupt) -> None:
    stop = cancelled.stop if isinstance(cancelled, CancelToken) else None
    if stop is not None:
        stop.release(interrupt)


def wait_cancelled(cancelled: Callable[[], bool], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds unless ``cancelled``; True when it was. A plain function
    (a test's, a caller without a token) is asked on a fresh event's short waits."""
    if isinstance(cancelled, CancelToken):
        return cancelled.wait(timeout)
    return CancelToken(threading.Event(), cancelled, _PLAIN_EVERY_S, time.monotonic).wait(timeout)


def abandonable(call: Callable[[], _T], cancelled: Callable[[], bool], deadline_s: float) -> _T:
    """``call()`` on a daemon thread, waited for until it returns, the item stops (Cancelled)
    or ``deadline_s`` passes (TimeoutError). For a call nothing can interrupt: its thread is
    left behind, ends when the call does, and never holds up the agent's exit."""
    done = threading.Event()
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the waiting thread
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="abandonable", daemon=True).start()
    deadline = time.monotonic() + deadline_s
    while not done.wait(min(_PLAIN_EVERY_S, max(0.0, deadline - time.monotonic()))):
        if cancelled():
            raise Cancelled("cancelled")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no answer within {deadline_s:.0f}s")
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]
