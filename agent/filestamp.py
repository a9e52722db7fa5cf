"""What tells that a set of files changed, without reading them: the one test behind every TLS
reload (the gRPC listener, the metrics listener, the coordinator's client certificate)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Stamp", "stamp_files"]

Stamp = tuple[tuple[int, int, int], ...]


def stamp_files(paths: Sequence[Path]) -> Stamp:
    """Each file's inode, mtime (ns) and size. ``os.stat`` follows links, so the files a
    Kubernetes Secret or cert-manager CSI volume swaps in (a ``..data`` symlink renamed to a new
    directory) count as changed. Raises OSError when a file is missing."""
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(stamps)
