"""Who owns the node's state: one process at a time, the running agent or a CLI's embedded one.

A held file lock (agent/lockfile.py) on ``<state_dir>/agent.lock``, for the owner's whole life:
``serve`` holds it while it runs, and a CLI command with no agent running holds it while its
embedded agent does the command's work. A process that must wait can say for whom, and
``serve`` records the socket it serves on, so a command that finds no agent on its own socket
can tell a ``serve`` elsewhere (which never lets go of the node) from one that is starting.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.errors import StateUnavailable
from agent.lockfile import HolderLock
from agent.statedir import Unwritable

LOCK_FILE = "agent.lock"
SERVE_ROLE = "gpu-agent serve"
"""The role ``serve`` holds the node's ownership as."""
_POLL_S = 0.1


class NodeOwnership:
    def __init__(self, state_dir: Path) -> None:
        self._lock = HolderLock(state_dir / LOCK_FILE)
        self.path = self._lock.path
        self.state_dir = state_dir

    def try_acquire(self, role: str, socket: Path | None = None) -> bool:
        """Take ownership if nobody has it; False (and nothing held) if someone does. A holder
        that serves the API names its ``socket`` (recorded with its symbolic links resolved).

        `StateUnavailable` naming the state dir when its lock file cannot be made (read-only,
        full, not ours)."""
        record: dict[str, object] = {"role": role, "pid": os.getpid(), "since": time.time()}
        if socket is not None:
            record["socket"] = os.path.realpath(socket)
        try:
            return self._lock.try_acquire(record)
        except OSError as exc:
            raise StateUnavailable(str(Unwritable.of(self.state_dir, exc))) from exc

    def holder_pid(self, role: str) -> int | None:
        """The pid of the holder when it holds the node as ``role``; None otherwise."""
        return self.serving(role)[0]

    def _held_as(self, role: str) -> dict[str, object] | None:
        """The holder's record when it holds the node as ``role``."""
        record = self._lock.holder()
        return record if record is not None and record.get("role") == role else None

    def serving(self, role: str) -> tuple[int | None, str | None]:
        """The pid of the holder and the socket it recorded (None: none recorded) when it
        holds the node as ``role``; two Nones otherwise."""
        record = self._held_as(role)
        if record is None:
            return None, None
        pid, socket = record.get("pid"), record.get("socket")
        return (pid if isinstance(pid, int) else None), (
            socket if isinstance(socket, str) else None
        )

    def mark_serving(self) -> None:
        """Record that the API serves now: a command that then finds no agent on the recorded
        socket knows the holder is not starting (its socket file was removed, or it hangs)."""
        self._lock.note(serving=True)

    def says_serving(self, role: str) -> bool:
        """Whether the holder holds the node as ``role`` and recorded that its API serves."""
        record = self._held_as(role)
        return record is not None and record.get("serving") is True

    def acquire(
        self,
        role: str,
        waiting: Callable[[str], None],
        stop: threading.Event,
        socket: Path | None = None,
    ) -> bool:
        """Take ownership, waiting for the holder (``waiting(holder)`` is called once if so)
        until ``stop`` is set; True once held, False when stopped first."""
        told = False
        while not self.try_acquire(role, socket):
            if not told:
                waiting(self.holder() or "another gpu-agent process (starting)")
                told = True
            if stop.wait(_POLL_S):
                return False
        return True

    def release(self) -> None:
        self._lock.release()

    def holder(self) -> str | None:
        """Who holds it, e.g. ``gpu-agent serve (pid 42)``; None when not known."""
        record = self._lock.holder()
        return None if record is None else f"{record.get('role')} (pid {record.get('pid')})"
