"""Persistence of the simulated node: one JSON file, shared by every process that opens it.

Like a kernel driver's state, it outlives the processes using it. Writers serialise on an
``flock`` of a separate lock file and replace the state file atomically (temp file, then
``os.replace``), so a reader never sees a half-written file and a writer killed with SIGKILL
leaves the previous state intact. No fsync: what a killed process wrote is in the page cache
anyway; only a host crash could lose it, and that takes the simulated node down with it.

Readers take no lock: they re-parse only when the file's identity (inode, mtime, size) changed,
which keeps the hot telemetry path to one ``stat``.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.gpu.sim import state
from agent.gpu.sim.state import NodeState

_FileKey = tuple[int, int, int]


class StateMissing(Exception):
    """The state directory holds no simulated node."""


class StateStore:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "sim"
        self.path = self.root / "state.json"
        self._path = os.fspath(self.path)  # stat()ed on every read: spare Path.__fspath__
        self._lock_path = self.root / "state.lock"
        self._cache: tuple[_FileKey, NodeState] | None = None
        self._cache_lock = threading.Lock()

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> NodeState:
        """The current state. Shared with other readers: treat it as read-only."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            raise StateMissing(str(self.path)) from None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._cache
        if cached is not None and cached[0] == key:
            return cached[1]
        key, node = self._load()
        with self._cache_lock:
            self._cache = (key, node)
        return node

    @contextmanager
    def transaction(self) -> Iterator[NodeState]:
        """Yield a private copy of the state; write it back if the block completes."""
        with self._locked():
            _, node = self._load()
            yield node
            self._write(node)

    def create(self, node: NodeState) -> NodeState:
        """Write ``node`` unless another process created a node first; return the stored one."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked():
            if self.path.exists():
                return self._load()[1]
            self._write(node)
            return node

    def _load(self) -> tuple[_FileKey, NodeState]:
        try:
            with open(self.path, encoding="utf-8") as f:
                st = os.fstat(f.fileno())
                text = f.read()
        except FileNotFoundError:
            raise StateMissing(str(self.path)) from None
        return (st.st_ino, st.st_mtime_ns, st.st_size), state.loads(text)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Only lock holders write temp files, so any left now belong to a killed writer.
            for stale in self.root.glob(".state.*.tmp"):
                stale.unlink(missing_ok=True)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _write(self, node: NodeState) -> None:
        tmp = self.root / f".state.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(state.dumps(node))
        os.replace(tmp, self.path)
        st = os.stat(self.path)
        with self._cache_lock:
            self._cache = ((st.st_ino, st.st_mtime_ns, st.st_size), node)
