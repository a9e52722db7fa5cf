"""Which cache blobs a process on the node holds: open file descriptors and mappings, from /proc.

A pod's processes read a model through its by-name link or a hostPath mount; either way the open
file is the blob's inode. safetensors are mmapped and the descriptor may be closed after the
mmap, so /proc/<pid>/maps is read as well as /proc/<pid>/fd. Files are matched by (device,
inode), not by path: a path in /proc is the one the reading process's mount namespace shows, which
inside a pod is rarely the cache path. The agent needs the host's PID namespace (hostPID) to see
the node's processes; a process it cannot read (gone, or not permitted) is skipped, so the scan
reports what it could see. Where /proc is not known to be the node's namespace's (no hostPID,
or a namespace /proc does not name) the scan may see its pod's processes alone: it rules out no
one (`pidns.sees_node`).

A process's files are the tenant's to shape: a maps file can be made hundreds of megabytes. It
is read a line at a time (a line's first `MAX_LINE_BYTES`, which hold the device and inode),
stopping once every wanted file is found, and for at most `MAX_MAPS_LINES` lines and
`MAX_MAPS_BYTES` bytes. A process whose map is longer is not known not to hold a file: it is
counted as holding every wanted file it was not seen holding, and named in `Holders.unsure`.

A node's processes are the tenants' to multiply too (each with up to a million descriptors), so
a scan as a whole is bounded as well (`LIMITS`: processes, descriptors, seconds). A scan cut by
a bound has not ruled out the processes it did not read: every wanted file it did not see held
is counted as held, and `Holders.cut` says why (unknown is not "not in use").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from agent import pidns

log = logging.getLogger(__name__)

FileId = tuple[int, int]  # (st_dev, st_ino)

#: Lines of one process's maps read at most: a line per mapping, and the kernel's default
#: vm.max_map_count is 65530 mappings
MAX_MAPS_LINES = 131_072
#: Bytes of one process's maps read at most (its lines are about 100 bytes; a path, longer)
MAX_MAPS_BYTES = 32 * 1024 * 1024
#: Bytes of a maps line read: the address, perms, offset, device and inode come first; a
#: longer line's rest (a path, which can pass PATH_MAX) is skipped
MAX_LINE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class ScanLimits:
    """What one scan of the node's processes reads at most, all processes together."""

    #: processes (a node runs thousands; the kernel's pid_max allows millions)
    pids: int = 131_072
    #: open descriptors looked at (a process may hold a million)
    fds: int = 2_000_000
    #: seconds (an eviction, or a fetch making room, waits on it)
    seconds: float = 30.0


#: The bounds of a scan (read at each scan, so a test can lower them).
LIMITS = ScanLimits()
#: How long past its deadline a scan's thread is waited for before the scan is taken as cut.
_GRACE_S = 1.0


def _cut(wanted: set[FileId], why: str) -> Holders:
    """A scan that rules out no one: every wanted file held, by pids it cannot name."""
    log.warning("the scan of the node's processes for cache files in use stopped (%s)", why)
    return Holders({fid: set() for fid in wanted}, frozenset(), why)


def unseen_node(proc: Path) -> str:
    """Why a scan of ``proc`` may not see the node's processes."""
    if pidns.hides(proc):
        return f"the agent has no hostPID: the node's processes are not in {proc}"
    return (
        f"the agent's PID namespace could not be read from {proc}/self/ns/pid: the node's "
        f"processes may not be in {proc}"
    )


def file_id(path: Path) -> FileId | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


@dataclass(frozen=True, slots=True)
class Holders:
    """The pids holding each wanted file (files nobody holds are absent). A pid in ``unsure``
    has a memory map longer than `MAX_MAPS_LINES` or `MAX_MAPS_BYTES`: not read to its end, it
    is in ``held`` for every wanted file it was not seen holding (unknown is not "not in
    use")."""

    held: dict[FileId, set[int]] = field(default_factory=dict)
    unsure: frozenset[int] = frozenset()
    #: why the scan stopped before it read every process ("" when it read them all): then
    #: every wanted file is in ``held``, with the pids seen holding it (perhaps none)
    cut: str = ""


class _Budget:
    """What is left of a scan's `ScanLimits`; ``cut`` says which ran out."""

    def __init__(self, limits: ScanLimits, clock: Callable[[], float]) -> None:
        self._pids, self._fds = limits.pids, limits.fds
        self._limits = limits
        self._clock = clock
        self._deadline = clock() + limits.seconds
        self.cut = ""

    def pid(self) -> bool:
        """Whether one more process may be read."""
        self._pids -= 1
        if self._pids < 0:
            self.cut = f"more than {self._limits.pids} processes"
        return self._left()

    def fd(self) -> bool:
        """Whether one more descriptor may be looked at."""
        self._fds -= 1
        if self._fds < 0:
            self.cut = f"more than {self._limits.fds} open descriptors"
        return self._left()

    def _left(self) -> bool:
        if not self.cut and self._clock() > self._deadline:
            self.cut = f"longer than {self._limits.seconds:g} s"
        return not self.cut


class ProcScanner:
    """``holders(files)``: the pids holding each of ``files`` open or mapped.

    ``limits``: the scan's bounds (default `LIMITS`); ``clock``: monotonic seconds."""

    def __init__(
        self,
        proc: Path = Path("/proc"),
        limits: ScanLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._proc = proc
        self._limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        #: a scan that outlived its time, still blocked (a stat on a stalled mount)
        self._stuck: threading.Thread | None = None

    def holders(self, files: Iterable[FileId]) -> Holders:
        """The scan, on a thread of its own: the budget is checked between reads, but one
        read (a stat of a tenant's file on a dead NFS server, a stalled FUSE daemon) can block
        for ever. Past its time the answer is a cut scan, and while that thread stays blocked
        no other scan starts: each is cut at once."""
        wanted = set(files)
        if not wanted:
            return Holders()
        limits = self._limits or LIMITS
        with self._lock:  # only to read and set ``_stuck``: scans run side by side
            if self._stuck is not None and self._stuck.is_alive():
                return _cut(wanted, "an earlier scan is still blocked reading a process's file")
        answer: list[Holders | BaseException] = []

        def scan() -> None:
            try:
                answer.append(self._scan(wanted, limits))
            except BaseException as exc:  # the caller's to raise, as before the thread
                answer.append(exc)

        worker = threading.Thread(target=scan, name="in-use scan", daemon=True)
        worker.start()
        worker.join(limits.seconds + _GRACE_S)
        if worker.is_alive():
            with self._lock:
                self._stuck = worker
            stalled = "a process's file on a stalled mount?"
            return _cut(wanted, f"it did not end in {limits.seconds:g} s ({stalled})")
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return answer[0]

    def _scan(self, wanted: set[FileId], limits: ScanLimits) -> Holders:
        found: dict[FileId, set[int]] = {}
        unsure: set[int] = set()
        budget = _Budget(limits, self._clock)
        if not pidns.sees_node(self._proc):  # perhaps its own pod's processes alone
            budget.cut = unseen_node(self._proc)
        for entry in () if budget.cut else self._pids(budget):
            if not budget.pid():
                break
            pid = int(entry.name)
            held, whole = self._held(Path(entry.path), wanted, budget)
            for fid in held:
                found.setdefault(fid, set()).add(pid)
            if budget.cut:
                break  # this process was not read to its end either
            if not whole:
                unsure.add(pid)
        if unsure:
            log.warning(
                "the memory maps of process(es) %s are longer than is read (%d lines, %d "
                "bytes): counted as holding every cache file not found in what was read",
                ", ".join(str(p) for p in sorted(unsure)),
                MAX_MAPS_LINES,
                MAX_MAPS_BYTES,
            )
        if budget.cut:
            log.warning(
                "the scan of the node's processes for cache files in use stopped (%s): every "
                "cache file not found held in what was read is counted as held",
                budget.cut,
            )
            for fid in wanted:
                found.setdefault(fid, set())
        return Holders(found, frozenset(unsure), budget.cut)

    def _pids(self, budget: _Budget) -> Iterable[os.DirEntry[str]]:
        """The processes, listed one at a time (a list of them all is the node's to grow). A
        listing that fails, at once or part way, cuts the scan: the processes it did not list
        are not ruled out."""
        try:
            with os.scandir(self._proc) as entries:
                yield from (e for e in entries if e.name.isdigit())
        except OSError as exc:
            budget.cut = f"{self._proc} could not be listed: {exc.strerror or exc}"

    def _held(self, proc: Path, wanted: set[FileId], budget: _Budget) -> tuple[set[FileId], bool]:
        """The wanted files ``proc`` holds, and whether that is known: False when its maps
        were cut, and then every wanted file it was not seen holding is in the set."""
        held = _open(proc / "fd", wanted, budget)
        if held == wanted or budget.cut:
            return held, True
        try:
            with (proc / "maps").open("rb") as maps:
                whole = _mapped(maps, wanted, held)
        except OSError:
            return held, True  # gone, or not permitted: what could be seen
        return (held, True) if whole else (set(wanted), False)


def _open(fd_dir: Path, wanted: set[FileId], budget: _Budget) -> set[FileId]:
    """The wanted files among a process's open descriptors, listed one at a time, while the
    scan's budget lasts."""
    held: set[FileId] = set()
    try:
        fds = os.scandir(fd_dir)
    except OSError:
        return held
    with fds:
        for fd in fds:
            if not budget.fd():
                break
            try:
                st = os.stat(fd.path)  # follows the magic link to the open file, any namespace
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in wanted:
                held.add((st.st_dev, st.st_ino))
                if held == wanted:
                    break
    return held


def _mapped(maps: BinaryIO, wanted: set[FileId], held: set[FileId]) -> bool:
    """Add the wanted files the map names to ``held``, a line at a time; False when the map
    is longer than `MAX_MAPS_LINES` or `MAX_MAPS_BYTES` and not every wanted file was found
    in what was read."""
    lines = read = 0
    rest = False  # the next read continues a line longer than MAX_LINE_BYTES
    while True:
        chunk = maps.readline(MAX_LINE_BYTES)
        if not chunk:
            return True
        read += len(chunk)
        first, rest = not rest, not chunk.endswith(b"\n")
        lines += first
        if lines > MAX_MAPS_LINES or read > MAX_MAPS_BYTES:
            return False
        if not first:
            continue
        fid = _map_id(chunk)
        if fid in wanted:
            held.add(fid)
            if held == wanted:
                return True


def _map_id(line: bytes) -> FileId | None:
    """``address perms offset dev(major:minor, hex) inode path``: the mapped file, or None."""
    fields = line.split(None, 5)
    if len(fields) < 5 or fields[4] == b"0":
        return None
    major, _, minor = fields[3].partition(b":")
    try:
        return os.makedev(int(major, 16), int(minor, 16)), int(fields[4])
    except (ValueError, OverflowError):
        return None
