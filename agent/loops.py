"""Waking an asyncio loop from another thread (a watch, a sampler, a worker), when the loop may
have closed already: at shutdown a thread's last callback can come after the loop's end, and
nobody waits for it any more. What a loop says when the process runs out of descriptors or
memory (`exhaustion`, `ExhaustionLog`). And the two loops the node's tasks run in: `every` (a
periodic pass that survives a failed one) and `restarting` (a long task restarted after
exhaustion)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from agent.errors import AgentError

__all__ = [
    "ExhaustionLog",
    "call_soon_from_thread",
    "close",
    "every",
    "exhaustion",
    "log_stuck",
    "restarting",
]

log = logging.getLogger("agent.node")  # the agent's lines, as before they moved here


def call_soon_from_thread(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any
) -> None:
    """Run ``callback(*args)`` on ``loop`` soon; dropped when the loop has closed."""
    if loop.is_closed():
        return
    with contextlib.suppress(RuntimeError):  # it closed between the check and the call
        loop.call_soon_threadsafe(callback, *args)


_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_EXHAUSTION_LOG_S = 60.0


def exhaustion(exc: BaseException) -> str | None:
    """What ran out, when ``exc`` is the process running out of descriptors or memory."""
    if isinstance(exc, MemoryError):
        return "out of memory"
    if isinstance(exc, OSError) and exc.errno in _EXHAUSTED:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            return f"out of file descriptors ({exc.strerror}; the limit is {limit})"
        return f"out of memory ({exc.strerror})"
    return None


class ExhaustionLog:
    """The loop's exception handler: a listener out of descriptors (asyncio pauses its accepts
    and retries) is one line per minute saying what ran out and what to raise, instead of a
    traceback per refused accept; everything else goes to asyncio's default handler."""

    def __init__(self) -> None:
        self._last = -_EXHAUSTION_LOG_S
        self._count = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        what = exhaustion(context.get("exception") or Exception())
        if what is None:
            loop.default_exception_handler(context)
            return
        self._count += 1
        now = time.monotonic()
        if now - self._last < _EXHAUSTION_LOG_S:
            return
        self._last = now
        log.error(
            "%s: %s (%d time(s) since the last line); new connections wait until some close. "
            "Raise the limit (ulimit -n, LimitNOFILE=, the container's nofile) or find who "
            "holds the connections",
            context.get("message", "the agent"),
            what,
            self._count,
        )
        self._count = 0


async def every(
    name: str,
    period_s: float,
    work: Callable[[], object],
    wake: asyncio.Event | None = None,
    *,
    wait_first: bool = False,
) -> None:
    """Run blocking ``work`` in a thread every ``period_s``, and at once when ``wake`` is set;
    a failed pass is logged and retried (the API server or a GPU may be briefly away), it does
    not stop the agent. ``wait_first``: the first pass comes a period after the start (it
    already ran once before serving)."""
    if wait_first:
        await asyncio.sleep(period_s)
    while True:
        try:
            await asyncio.to_thread(work)
        except (AgentError, OSError, MemoryError):
            log.exception("periodic %s failed; retrying in %.0fs", name, period_s)
        if wake is None:
            await asyncio.sleep(period_s)
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), period_s)
        wake.clear()


_RESTART_MAX_S = 60.0


async def restarting(name: str, start: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``start()``; when it fails because the process ran out of file descriptors or
    memory, log one line and start it again after a back-off (1 s, doubling to 60 s): load to
    shed, not a reason to stop the agent. Any other failure ends it as before."""
    delay = 1.0
    while True:
        try:
            await start()
            return
        except (OSError, MemoryError) as exc:
            what = exhaustion(exc)
            if what is None:
                raise
            log.warning("background task %s: %s; retrying in %.0fs", name, what, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, _RESTART_MAX_S)


async def close(stack: contextlib.AsyncExitStack) -> None:
    """The agent's shutdown: unwinds in reverse start order (a part that failed to start has
    nothing to stop), then the threads that blocking calls ran on: inside the deadline, so one
    stuck call is seen and named (`log_stuck`) rather than holding up the exit with no word."""
    await stack.aclose()
    await asyncio.get_running_loop().shutdown_default_executor()


def log_stuck(current: asyncio.Task[Any] | None) -> None:
    """Name what kept the shutdown from ending: asyncio tasks, then threads with their frame."""
    tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in tasks:
        suspended = task.get_stack(limit=4)
        where = " < ".join(
            f"{f.f_code.co_name} ({f.f_code.co_filename}:{f.f_lineno})" for f in suspended
        )
        log.error("still running at shutdown: task %s in %s", task.get_name(), where or "?")
    frames = sys._current_frames()
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread is threading.current_thread():
            continue
        frame = frames.get(thread.ident or -1)
        stack = traceback.extract_stack(frame, limit=3) if frame else []
        where = " < ".join(f"{f.name} ({f.filename}:{f.lineno})" for f in reversed(stack))
        log.error("still running at shutdown: thread %s in %s", thread.name, where or "?")
