"""The partition lock: one reconfiguration per node at a time, across processes.

A held file lock (agent/lockfile.py) under the state dir: a killed holder releases it with its
last descriptor, and the holder's record tells a refused caller which operation is in the way.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.errors import Busy
from agent.gpu.changes import Changes
from agent.lockfile import HolderLock

LOCK_FILE = "partition.lock"


class PartitionLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE

    @contextmanager
    def hold(self, operation: str, changes: Changes | None = None) -> Iterator[None]:
        """Hold the lock while ``operation`` runs; Busy naming the holder if someone has it.
        ``changes``: the driver's, marked as reconfiguring the node meanwhile (telemetry says
        a change of this agent's once it is over, not at each of its steps)."""
        lock = HolderLock(self.path)
        if not lock.try_acquire({"operation": operation, "pid": os.getpid(), "since": time.time()}):
            holder = self.holder() or "another reconfiguration (starting)"
            raise Busy(f"another reconfiguration is running on this node: {holder}", [holder])
        try:
            if changes is None:
                yield
            else:
                with changes.reconfiguring():
                    yield
        finally:
            lock.release()

    def holder(self) -> str | None:
        """What the current holder said it is doing, e.g. ``mig apply all-balanced (pid 42)``."""
        record = HolderLock(self.path).holder()
        if record is None:
            return None
        return f"{record.get('operation')} (pid {record.get('pid')})"
