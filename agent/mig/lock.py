"""The partition lock: one reconfiguration per node at a time, across processes.

An OS file lock (``flock``) under the state dir, so the agent and a CLI run on the same node
exclude each other, and a killed holder releases it with its last descriptor. The holder writes
what it is doing into the file, so a refused caller learns which operation is in the way.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.errors import Busy

LOCK_FILE = "partition.lock"


class PartitionLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE

    @contextmanager
    def hold(self, operation: str) -> Iterator[None]:
        """Hold the lock while ``operation`` runs; Busy naming the holder if someone has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self.holder() or "another reconfiguration (starting)"
                raise Busy(
                    f"another reconfiguration is running on this node: {holder}", [holder]
                ) from None
            record = {"operation": operation, "pid": os.getpid(), "since": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # releases the flock

    def holder(self) -> str | None:
        """What the current holder said it is doing, e.g. ``mig apply all-balanced (pid 42)``."""
        try:
            record = json.loads(self.path.read_text() or "null")
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict):
            return None
        return f"{record.get('operation')} (pid {record.get('pid')})"
