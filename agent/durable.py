"""Durable directory changes: a rename, link or new file survives a crash only once its
directory is fsync'd, which POSIX leaves to the caller (the state store, sharing, the cache)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir"]


def fsync_dir(path: Path) -> None:
    """Flush the entries of the directory ``path`` to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
