"""The cache directory on disk: its layout, and only files the agent made in it.

Layout under the cache directory::

    blobs/sha256/<hex>      verified content, read-only; the only files pods should read
    by-name/<name>          symlink to a blob (a file) or to trees/<id> (a group), the stable
                            path a pod mounts
    trees/<id>/<path>       a group's model directory: relative symlinks to its blobs
    partial/<id>.part       bytes of a running fetch, with <id>.json (resume validators);
                            <id>.dfpart: dfdaemon's task file hard-linked in (dragonfly_output)
    quarantine/             whatever the agent found in its place and did not make (below)

Anything that can write the cache's host path is not trusted, so the cache never follows a link
it did not make: files are opened with O_NOFOLLOW relative to a directory opened with
O_NOFOLLOW, a blob or partial must be a regular file (a partial also singly linked, as a hard
link to a file outside would be truncated with it), and a subdirectory must be a directory.
Anything else found in their place is moved into quarantine/ (renamed, never followed or
deleted) and logged; the item is then fetched again. Cleanup deletes only inside these
directories, opened the same way.

This module knows files and names, not items: what an item stands on is agent/prewarm/cache.py's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from agent.errors import FieldViolation, InvalidSpec
from agent.prewarm.errors import FetchFailed

__all__ = ["CHUNK", "CacheDir"]

CHUNK = 4 * 1024 * 1024  # a read of a partial or blob being hashed

# The cache's one logger name, as before its modules were split: operators' filters keep it.
log = logging.getLogger("agent.prewarm.store")

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class CacheDir:
    """The cache directory's subdirectories, and the only ways the agent touches files in them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blob_dir = root / "blobs" / "sha256"
        self.partial_dir = root / "partial"
        self.name_dir = root / "by-name"
        self.tree_dir = root / "trees"
        self.quarantine_dir = root / "quarantine"
        self.make_layout()

    def make_layout(self) -> None:
        """Make the cache's directories: at start, and again when a wiped host path took them
        (cheap when all are there); a link or file in a subdirectory's place is quarantined."""
        root = self.root
        try:
            root.mkdir(parents=True, exist_ok=True)  # may be a link: the operator's choice
            _real_dir(self.quarantine_dir, None)
            for d in (
                root / "blobs",
                self.blob_dir,
                self.partial_dir,
                self.name_dir,
                self.tree_dir,
            ):
                _real_dir(d, self.quarantine_dir)
        except OSError as exc:  # one line naming the setting, not a traceback
            why = "not a directory" if isinstance(exc, FileExistsError) else exc.strerror
            where = "" if exc.filename in (None, str(root)) else f" ({exc.filename})"
            raise InvalidSpec(
                f"prewarm.cache_dir {root} cannot be used as the cache: {why}{where}",
                [FieldViolation("prewarm.cache_dir", "a directory the agent can make")],
            ) from None

    @contextlib.contextmanager
    def open_dir(self, path: Path, *, remake: bool = False) -> Iterator[int]:
        """A cache subdirectory's fd, never followed: opening fails (ELOOP, ENOTDIR, ENOENT)
        if it is not a directory, unless ``remake``, for a directory the agent names files
        in: then what was put in its place is quarantined and the directory made again."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
        except OSError as exc:
            if not remake or exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                raise
            self.make_layout()
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
        try:
            yield fd
        finally:
            os.close(fd)

    def quarantine(self, dir_fd: int, name: str, where: Path, why: str) -> None:
        """Move ``where/name`` (whatever it is) into quarantine/ without following it; logged."""
        moved = f"{where.name}-{name}-{time.time_ns()}"
        with self.open_dir(self.quarantine_dir) as qfd:
            os.rename(name, moved, src_dir_fd=dir_fd, dst_dir_fd=qfd)
        log.warning(
            "cache: %s is %s, not a file the agent made; moved to %s unread",
            where / name,
            why,
            self.quarantine_dir / moved,
        )

    def foreign(self, dir_fd: int, name: str, single: bool) -> str | None:
        """Why ``name`` in the directory is not a file the agent made (None: it is, or is
        absent): not a regular file, or (``single``) a hard link to a file elsewhere too."""
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return _not_ours(info, single)

    def _checked(self, dir_fd: int, name: str, where: Path, single: bool) -> None:
        why = self.foreign(dir_fd, name, single)
        if why is not None:
            self.quarantine(dir_fd, name, where, why)

    def open_partial(self, name: str) -> int:
        """partial/<name> opened read-write (made 0600 if absent); anything not the agent's
        there goes to quarantine first."""
        with self.open_dir(self.partial_dir) as dfd:
            self._checked(dfd, name, self.partial_dir, single=True)
            fd = os.open(name, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600, dir_fd=dfd)
            why = _not_ours(os.fstat(fd), single=True)  # swapped in since the check
            if why is not None:
                os.close(fd)
                raise FetchFailed(f"cache: {self.partial_dir / name} is {why}; not written")
            return fd

    def read_partial(self, name: str) -> bytes:
        with self.open_dir(self.partial_dir) as dfd:
            self._checked(dfd, name, self.partial_dir, single=True)
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dfd)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def write_partial(self, name: str, data: bytes) -> None:
        """partial/<name> replaced atomically by ``data`` (through a fresh <name>.tmp)."""
        tmp = name + ".tmp"
        with self.open_dir(self.partial_dir) as dfd:
            self._checked(dfd, tmp, self.partial_dir, single=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dfd)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)

    def check_link(self, link: str) -> None:
        """That dfdaemon left a regular file at partial/<link> (FileNotFoundError: nothing)."""
        with self.open_dir(self.partial_dir) as dfd:
            info = os.stat(link, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            raise FetchFailed(
                f"dfdaemon left something other than a file at {self.partial_dir / link}"
            )

    def adopt_partial(self, link: str, name: str) -> int:
        """dfdaemon's hard link partial/<link> renamed to partial/<name>, opened read-only."""
        with self.open_dir(self.partial_dir) as dfd:
            self.check_link(link)  # still: the rename below must not take a link in
            os.replace(link, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dfd)

    def blob_size(self, sha256: str) -> int | None:
        """The size of the blob on disk; None when absent or not a file the agent made (then
        it is quarantined, and the item is not served from it)."""
        with self.open_dir(self.blob_dir) as dfd:
            try:
                info = os.stat(sha256, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            why = _not_ours(info, single=False)
            if why is not None:
                self.quarantine(dfd, sha256, self.blob_dir, why)
                return None
            return info.st_size

    def hash_blob(self, sha256: str) -> str:
        with self.open_dir(self.blob_dir) as dfd:
            fd = os.open(sha256, os.O_RDONLY | _NOFOLLOW, dir_fd=dfd)
        digest = hashlib.sha256()
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def sweep(self, path: Path, keep: set[str], kind: int) -> None:
        """Delete the entries of a cache subdirectory not in ``keep``; an entry that is not of
        ``kind`` (S_IFREG, S_IFLNK, S_IFDIR: what the agent makes there) is quarantined."""
        with self.open_dir(path) as dfd:
            for entry in list(os.scandir(dfd)):
                info = entry.stat(follow_symlinks=False)
                if stat.S_IFMT(info.st_mode) != kind:
                    self.quarantine(dfd, entry.name, path, _kind_name(info.st_mode))
                elif entry.name in keep:
                    continue
                elif kind == stat.S_IFDIR:
                    shutil.rmtree(entry.name, dir_fd=dfd)  # fd-based: follows no link inside
                else:
                    os.unlink(entry.name, dir_fd=dfd)

    def blob_path(self, sha256: str) -> Path:
        return self.blob_dir / sha256

    def name_path(self, name: str) -> Path:
        return self.name_dir / name

    def tree_path(self, item_id: str) -> Path:
        return self.tree_dir / item_id

    def remove_link(self, name: str) -> None:
        with (
            self.open_dir(self.name_dir, remake=True) as dfd,
            contextlib.suppress(FileNotFoundError),
        ):
            os.unlink(name, dir_fd=dfd)

    def remove_blob(self, sha256: str) -> None:
        """Delete a blob, through the blob directory's fd."""
        with (
            self.open_dir(self.blob_dir, remake=True) as dfd,
            contextlib.suppress(FileNotFoundError),
        ):
            os.unlink(sha256, dir_fd=dfd)

    def remove_tree(self, item_id: str) -> None:
        """Delete a group's model directory trees/<id>, through the directory's fd."""
        with self.open_dir(self.tree_dir, remake=True) as dfd:
            self._remove_entry(dfd, item_id)

    def _remove_entry(self, dir_fd: int, name: str) -> None:
        """Delete a directory the agent made in ``dir_fd`` (following no link inside); anything
        else in its place goes to quarantine."""
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            self.quarantine(dir_fd, name, self.tree_dir, _kind_name(info.st_mode))

    def partial_size(self, item_id: str) -> int:
        """Bytes on disk in an item's partial(s) (a group's: all its files')."""
        total = 0
        with self.open_dir(self.partial_dir) as dfd:
            for entry in os.scandir(dfd):
                if entry.name.startswith(f"{item_id}.") and entry.name.endswith("part"):
                    with contextlib.suppress(FileNotFoundError):
                        info = entry.stat(follow_symlinks=False)
                        total += info.st_size if stat.S_ISREG(info.st_mode) else 0
        return total

    def discard_partial(self, item_id: str) -> None:
        """Delete an item's partial and validators (a group's: every member's); what is not a
        file the agent made goes to quarantine instead."""
        with self.open_dir(self.partial_dir) as dfd:
            for entry in list(os.scandir(dfd)):
                if not entry.name.startswith(f"{item_id}."):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    why = _not_ours(entry.stat(follow_symlinks=False), single=False)
                    if why is not None:
                        self.quarantine(dfd, entry.name, self.partial_dir, why)
                    else:
                        os.unlink(entry.name, dir_fd=dfd)

    def link_name(self, name: str, sha256: str) -> None:
        """Point by-name/<name> at the blob, replacing any old link atomically."""
        self._relink(name, Path("..", "blobs", "sha256", sha256))

    def link_tree(self, name: str, item_id: str, files: Iterable[tuple[str, str]]) -> None:
        """Lay a group out as a model directory, trees/<id>/<path> -> its blob (relative links,
        so the cache can be mounted anywhere), then point by-name/<name> at it atomically. All
        of it through directory fds opened without following links."""
        tmp = f".{item_id}.tmp"
        with self.open_dir(self.tree_dir, remake=True) as tfd:
            self._remove_entry(tfd, tmp)
            os.mkdir(tmp, 0o755, dir_fd=tfd)
            for path, sha in files:
                *dirs, leaf = path.split("/")
                parent = self.tree_dir.joinpath(tmp, *dirs)
                target = os.path.relpath(self.blob_path(sha), parent)
                fd = _make_dirs(tfd, [tmp, *dirs])
                try:
                    os.symlink(target, leaf, dir_fd=fd)
                finally:
                    os.close(fd)
            self._remove_entry(tfd, item_id)
            os.replace(tmp, item_id, src_dir_fd=tfd, dst_dir_fd=tfd)
            os.fsync(tfd)
        self._relink(name, Path("..", "trees", item_id))

    def _relink(self, name: str, target: Path) -> None:
        tmp = f".{name}.tmp"
        with self.open_dir(self.name_dir, remake=True) as dfd:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            os.symlink(target, tmp, dir_fd=dfd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            os.fsync(dfd)


def _make_dirs(dir_fd: int, parts: list[str]) -> int:
    """The fd of ``dir_fd``/``parts...``, each made when missing and opened without following a
    link (ELOOP, ENOTDIR otherwise). The caller closes it."""
    fd = os.dup(dir_fd)
    for part in parts:
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o755, dir_fd=fd)
        try:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = inner
    return fd


def _not_ours(info: os.stat_result, single: bool) -> str | None:
    """Why a file is not one the agent made (None: it may be): a link or anything but a regular
    file, or (``single``) a file with another name elsewhere."""
    if not stat.S_ISREG(info.st_mode):
        return _kind_name(info.st_mode)
    if single and info.st_nlink > 1:
        return f"a file with {info.st_nlink} hard links"
    return None


def _kind_name(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def _real_dir(path: Path, quarantine: Path | None) -> None:
    """``path`` as a directory of its own: a link or file in its place is moved into
    ``quarantine`` (None: it is the quarantine, and the link is removed) unfollowed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        path.mkdir(mode=0o755)
        return
    if stat.S_ISDIR(info.st_mode):
        return
    if quarantine is None:
        os.unlink(path)  # removes the link itself
        log.warning("cache: %s was %s; removed, unread", path, _kind_name(info.st_mode))
    else:
        moved = quarantine / f"{path.name}-{time.time_ns()}"
        os.rename(path, moved)
        log.warning(
            "cache: %s is %s, not a directory the agent made; moved to %s unread",
            path,
            _kind_name(info.st_mode),
            moved,
        )
    path.mkdir(mode=0o755)
