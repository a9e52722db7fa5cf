"""Whether the state dir takes writes: the one probe behind the agent's read-only mode.

The agent keeps everything it must not forget under the state dir (the SQLite store, the owner
and partition locks, the simulated node). A directory that is read-only (a mount, a policy),
full, or not the agent's to write is found by `probe` before anything else opens it: the agent
then starts read-only (agent/state/database.py) instead of exiting, serves every read, and
refuses every change naming the directory and the fix. The same probe tells a running agent
when the directory takes writes again.

A probe makes a small file, reserves a block for it and removes it: ``posix_fallocate`` asks
the filesystem for the space at once (ext4 and xfs otherwise allocate a plain write's blocks
only at writeback, so a full disk would pass), with no fsync: 0.16-0.4 ms a probe on ext4
(1,000 probes on a loaded 2-core VM).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["FIX", "PROBE_PREFIX", "StateCollector", "Unwritable", "probe"]

FIX = "remount it read-write, free space on its filesystem, or fix its owner"
"""What an admin does about a state dir that takes no writes, as every refusal says."""
PROBE_PREFIX = ".write-probe"
_PROBE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Unwritable:
    """Why the state dir takes no writes: the errno of the probe's failed step."""

    state_dir: Path
    errno: int
    strerror: str

    @classmethod
    def of(cls, state_dir: Path, exc: OSError) -> Unwritable:
        """Why from a failed write's error (EIO where it carries no errno)."""
        code = exc.errno if exc.errno is not None else errno.EIO
        if code == errno.EEXIST and not state_dir.is_dir():  # mkdir met a file in its place
            code = errno.ENOTDIR
            return cls(state_dir, code, os.strerror(code))
        return cls(state_dir, code, exc.strerror or os.strerror(code))

    @property
    def cause(self) -> str:
        """The errno's name (``EROFS``, ``ENOSPC``, ``EACCES``): a metric label's value."""
        return errno.errorcode.get(self.errno, "unknown")

    def __str__(self) -> str:
        if self.errno == errno.ENOTDIR:  # no remount helps: a file stands where a dir must
            return (
                f"the state dir {self.state_dir} is not a directory (or a file stands on its "
                "path): remove what is there or pass another --state-dir"
            )
        return f"the state dir {self.state_dir} takes no writes ({self.strerror}): {FIX}"


def probe(state_dir: Path) -> Unwritable | None:
    """None when ``state_dir`` (made if missing, 0700) takes a new file and its first block;
    else why not."""
    name = state_dir / f"{PROBE_PREFIX}.{os.getpid()}.{threading.get_ident()}"
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600)
    except OSError as exc:
        return Unwritable.of(state_dir, exc)
    try:
        try:
            os.posix_fallocate(fd, 0, _PROBE_BYTES)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.write(fd, bytes(_PROBE_BYTES))  # a filesystem without fallocate (e.g. some FUSE)
    except OSError as exc:
        return Unwritable.of(state_dir, exc)
    finally:
        os.close(fd)
        with suppress(OSError):
            name.unlink()
    return None


class StateCollector(Collector):
    """``gpu_agent_state_writable``: 1 while the state dir takes writes; 0 with the cause."""

    def __init__(self, writable: Callable[[], tuple[bool, str]]) -> None:
        self._writable = writable

    def collect(self) -> Iterator[Metric]:
        ok, cause = self._writable()
        family = GaugeMetricFamily(
            "gpu_agent_state_writable",
            "1 while the agent's state dir takes writes; 0 while every change is refused, with "
            "the cause (the errno name, e.g. EROFS or ENOSPC, or restart_needed: the dir takes "
            "writes again but the agent started read-only).",
            labels=["reason"],
        )
        family.add_metric([cause], 1.0 if ok else 0.0)
        yield family
