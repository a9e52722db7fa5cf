"""An OS file lock (``flock``) that says who holds it: the one mechanism behind the node's owner
lock (agent/ownership.py) and the MIG partition lock (agent/mig/lock.py).

The holder writes a JSON record into the file, so a refused or waiting caller can name it. A
killed holder releases the lock with its last descriptor; its stale record is overwritten by
the next holder.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any


class HolderLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self, record: dict[str, Any]) -> bool:
        """Take the lock and write ``record``; False (nothing held) when another has it."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # releases the flock
            self._fd = None

    def holder(self) -> dict[str, Any] | None:
        """The holder's record, or None when there is none (or it cannot be read)."""
        try:
            record = json.loads(self.path.read_text() or "null")
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None
