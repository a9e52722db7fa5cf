"""Who owns the node's state: one process at a time, the running agent or a CLI's embedded one.

An OS file lock (``flock``) on ``<state_dir>/agent.lock``, held for the owner's whole life:
``serve`` holds it while it runs, and a CLI command with no agent running holds it while its
embedded agent does the command's work. A killed owner releases it with its last descriptor.
The holder writes who it is into the file, so a process that must wait can say for whom.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

LOCK_FILE = "agent.lock"
_POLL_S = 0.1


class NodeOwnership:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    def try_acquire(self, role: str) -> bool:
        """Take ownership if nobody has it; False (and nothing held) if someone does."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        record = {"role": role, "pid": os.getpid(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return True

    def acquire(self, role: str, waiting: Callable[[str], None]) -> None:
        """Take ownership, waiting for the holder; ``waiting(holder)`` is called once if so."""
        told = False
        while not self.try_acquire(role):
            if not told:
                waiting(self.holder() or "another gpu-agent process (starting)")
                told = True
            time.sleep(_POLL_S)

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # releases the flock
            self._fd = None

    def holder(self) -> str | None:
        """Who holds it, e.g. ``gpu-agent serve (pid 42)``; None when not known."""
        try:
            record = json.loads(self.path.read_text() or "null")
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict):
            return None
        return f"{record.get('role')} (pid {record.get('pid')})"
