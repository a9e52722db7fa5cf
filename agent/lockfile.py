"""An OS file lock (``flock``) that says who holds it: the one mechanism behind the node's owner
lock (agent/ownership.py) and the MIG partition lock (agent/mig/lock.py).

The holder writes a JSON record into the file, so a refused or waiting caller can name it. A
killed holder releases the lock with its last descriptor; its stale record is overwritten by
the next holder.

A state dir that takes no writes (read-only, full, not the agent's) still locks: the file (or,
when it was never made, the directory itself) is opened read-only, and ``flock`` needs no write
access; only the record is missing, so a refused caller cannot name the holder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from contextlib import suppress
from pathlib import Path
from typing import Any

_UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


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
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        with suppress(OSError):  # read-only or full: the lock holds without its record
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return True

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            if exc.errno not in _UNWRITABLE:
                raise
            try:
                return os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)

    def note(self, **fields: Any) -> None:
        """Add ``fields`` to the record this holder wrote (none where it could not write)."""
        if self._fd is None:
            return
        record = {**(self.holder() or {}), **fields}
        with suppress(OSError):
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, json.dumps(record).encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            with suppress(OSError):  # opened read-only: there is no record to clear
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
