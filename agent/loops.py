"""Waking an asyncio loop from another thread (a watch, a sampler, a worker), when the loop may
have closed already: at shutdown a thread's last callback can come after the loop's end, and
nobody waits for it any more."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["call_soon_from_thread"]


def call_soon_from_thread(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any
) -> None:
    """Run ``callback(*args)`` on ``loop`` soon; dropped when the loop has closed."""
    if loop.is_closed():
        return
    with contextlib.suppress(RuntimeError):  # it closed between the check and the call
        loop.call_soon_threadsafe(callback, *args)
