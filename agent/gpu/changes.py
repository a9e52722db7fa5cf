"""Which GPUs this agent is reconfiguring now: what tells its own MIG changes from a fault.

Every mutation through :class:`~agent.gpu.nvml.GpuDriver` marks its GPU, and the MIG executor
marks a GPU for the whole of its steps (the reset between them included); the MIG service marks
the node for a whole reconfiguration (every GPU of an apply, one after the other). A reader
takes a GPU's :meth:`Changes.stamp` before reading it and asks :meth:`Changes.since` after: a
read that overlapped this agent's own change of that GPU saw instances destroyed or created
under it, so what it failed to read is no fault of the GPU, and what it read is no steady state.
A change made by anyone else (nvidia-smi, another agent) is not marked: its failures count.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Changes"]


class Changes:
    """Per GPU (by UUID), and for the whole node: thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: GPU UUID -> changes of it in progress (nested marks count each)
        self._busy: Counter[str] = Counter()
        #: GPU UUID -> bumped when a change of it starts and when it ends
        self._generation: Counter[str] = Counter()
        #: reconfigurations of the node in progress (MigService: apply, restore, reset, recover)
        self._node = 0

    @contextmanager
    def changing(self, uuid: str) -> Iterator[None]:
        """Mark GPU ``uuid`` as being changed by this agent while the block runs."""
        with self._lock:
            self._busy[uuid] += 1
            self._generation[uuid] += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy[uuid] -= 1
                self._generation[uuid] += 1

    @contextmanager
    def reconfiguring(self) -> Iterator[None]:
        """Mark the node as being reconfigured by this agent while the block runs."""
        with self._lock:
            self._node += 1
        try:
            yield
        finally:
            with self._lock:
                self._node -= 1

    def stamp(self, uuid: str) -> int:
        """GPU ``uuid``'s change count now, for :meth:`since`."""
        with self._lock:
            return self._generation[uuid]

    def since(self, uuid: str, stamp: int) -> bool:
        """Whether this agent changed GPU ``uuid`` since ``stamp`` was taken, or changes it
        now: a read between the two overlapped the agent's own change."""
        with self._lock:
            return self._busy[uuid] > 0 or self._generation[uuid] != stamp

    def quiet(self) -> bool:
        """No reconfiguration by this agent is in progress, of the node or of any GPU."""
        with self._lock:
            return self._node == 0 and not any(self._busy.values())
