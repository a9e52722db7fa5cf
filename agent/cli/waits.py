"""Waits a signal ends at once: a command's (or ``serve``'s) wait for the node's owner or for
the agent's next sample is an Event's wait, set by the signal, never a sleep to sit out."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stopped_by(*signals: signal.Signals) -> Iterator[threading.Event]:
    """An Event that ``signals`` set while the block runs (their handlers put back after).
    Off the main thread (tests invoke commands in threads) no handler can be set: the Event
    is then only the caller's."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in signals}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
