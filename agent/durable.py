"""Durable file changes: a rename, link or new file survives a crash only once its directory
is fsync'd, which POSIX leaves to the caller; a file replaced in place is never seen half
written. One way to do each, for every file the agent keeps (the state store, sharing, the
cache, health marks, rollout records, the CLI's output files)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["fsync_dir", "replace_file"]

CHUNK_SIZE = 1 << 20


def fsync_dir(path: Path) -> None:
    """Flush the entries of the directory ``path`` to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(
    path: Path,
    data: bytes,
    *,
    new_mode: int = 0o600,
    chunk_size: int = CHUNK_SIZE,
    on_chunk: Callable[[int], None] | None = None,
) -> None:
    """Replace ``path`` with ``data`` so that no reader or crash ever sees a partial file.

    A temp file in the same directory (same filesystem: the rename is atomic) is written,
    given the mode ``path`` has (``new_mode`` when it does not exist yet), fsync'd and renamed
    over ``path``; then the directory is fsync'd so the rename survives a power loss. OSError
    propagates, the temp file removed. ``on_chunk(bytes_written)`` runs after each chunk
    (tests stop a write halfway there).
    """
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = new_mode
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            for start in range(0, len(data), chunk_size):
                f.write(data[start : start + chunk_size])
                if on_chunk is not None:
                    f.flush()
                    on_chunk(min(start + chunk_size, len(data)))
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
