"""Which cache blobs a process on the node holds: open file descriptors and mappings, from /proc.

A pod's processes read a model through its by-name link or a hostPath mount; either way the open
file is the blob's inode. safetensors are mmapped and the descriptor may be closed after the
mmap, so /proc/<pid>/maps is read as well as /proc/<pid>/fd. Files are matched by (device,
inode), not by path: a path in /proc is the one the reading process's mount namespace shows, which
inside a pod is rarely the cache path. The agent needs the host's PID namespace (hostPID) to see
the node's processes; a process it cannot read (gone, or not permitted) is skipped, so the scan
reports what it could see.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

FileId = tuple[int, int]  # (st_dev, st_ino)


def file_id(path: Path) -> FileId | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


class ProcScanner:
    """``holders(files)``: the pids holding each of ``files`` open or mapped."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc

    def holders(self, files: Iterable[FileId]) -> dict[FileId, set[int]]:
        wanted = set(files)
        found: dict[FileId, set[int]] = {}
        if not wanted:
            return found
        for entry in self._pids():
            pid = int(entry.name)
            for fid in self._held(entry, wanted):
                found.setdefault(fid, set()).add(pid)
        return found

    def _pids(self) -> list[Path]:
        try:
            return [p for p in self._proc.iterdir() if p.name.isdigit()]
        except OSError:
            return []

    def _held(self, proc: Path, wanted: set[FileId]) -> set[FileId]:
        held: set[FileId] = set()
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            fds = []
        for fd in fds:
            try:
                st = os.stat(fd)  # follows the magic link to the open file, any namespace
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in wanted:
                held.add((st.st_dev, st.st_ino))
        try:
            maps = (proc / "maps").read_text()
        except OSError:
            return held
        for line in maps.splitlines():
            # address perms offset dev(major:minor, hex) inode path
            fields = line.split(None, 5)
            if len(fields) < 5 or fields[4] == "0":
                continue
            major, _, minor = fields[3].partition(":")
            try:
                fid = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
            except ValueError:
                continue
            if fid in wanted:
                held.add(fid)
        return held
