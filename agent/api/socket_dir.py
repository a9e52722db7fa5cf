"""Where the Unix socket lives, and whether serving there is safe.

The socket grants the local admin everything, so whoever may write its directory could put
their own socket in its place (and receive root's calls) or squat the path before the agent
starts. The agent therefore serves only from a directory that it or root owns and that no group
or other user may write, under ancestors nobody else may rename it in (a world-writable
ancestor is fine only with the sticky bit, like /tmp). A missing directory is created 0700.
A path longer than a Unix socket address holds is refused before anything is made.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from agent.errors import Conflict, FieldViolation, InvalidSpec

__all__ = ["SOCKET_PATH_MAX", "directory_problem", "over_length", "prepare_socket"]

#: The longest path a Unix socket binds to on Linux: sun_path is 108 bytes, the last the NUL.
SOCKET_PATH_MAX = 107


def over_length(path: Path) -> int | None:
    """The path's length in bytes when a socket cannot be bound there (over SOCKET_PATH_MAX);
    None when it fits."""
    size = len(os.fsencode(path))
    return size if size > SOCKET_PATH_MAX else None


def prepare_socket(path: Path) -> None:
    """Make way for the socket: check its directory (creating it when missing), refuse when a
    live agent serves on the path, remove a stale socket. A path too long to bind is refused
    first, with nothing made."""
    size = over_length(path)
    if size is not None:
        raise InvalidSpec(
            f"socket_path {path} is {size} bytes, longer than the {SOCKET_PATH_MAX} a Unix "
            "socket path may have: set socket_path (--config or GPU_AGENT_SOCKET_PATH) to a "
            "shorter path",
            [FieldViolation("socket_path", f"at most {SOCKET_PATH_MAX} bytes, not {size}")],
        )
    directory = path.parent
    _make_directory(directory)
    _check_directory(path, directory)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise Conflict(f"{path} exists and is not a socket; remove it or set socket_path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # left by an agent that was killed
        return
    finally:
        probe.close()
    raise Conflict(f"another agent is serving on {path}; stop it first")


def _make_directory(directory: Path) -> None:
    """Create what is missing: the directory 0700, its missing ancestors 0755 (whatever the
    umask lets through, never more)."""
    missing = [d for d in (directory, *directory.parents) if not os.path.lexists(d)]
    for made in reversed(missing):
        try:
            os.mkdir(made, 0o700 if made == directory else 0o755)
        except FileExistsError:  # made meanwhile by someone else: the check below judges it
            continue
        if made == directory:
            os.chmod(made, 0o700)  # whatever the umask


def _refuse(path: Path, problem: str, fix: str) -> InvalidSpec:
    return InvalidSpec(
        f"refusing to serve the API on {path}: {problem}, so another user could replace the "
        f"socket and receive the local admin's calls; {fix} (or set socket_path to a directory "
        "only root may write)",
        [FieldViolation("socket_path", f"{problem}; {fix}")],
    )


def _check_directory(path: Path, directory: Path) -> None:
    found = directory_problem(directory)
    if found is not None:
        raise _refuse(path, *found)


def directory_problem(directory: Path) -> tuple[str, str] | None:
    """Why serving a socket in ``directory`` (which exists) is not safe, and the fix; None
    when it is. The one rule: the start refuses by it, and ``gpu-agent doctor`` reports it."""
    me = os.geteuid()
    trusted = {0, me}
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode):
        return (
            f"its directory {directory} is a symbolic link",
            f"point socket_path at the real directory ({os.path.realpath(directory)})",
        )
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory", f"remove {directory}"
    if info.st_uid not in trusted:
        return (
            f"its directory {directory} is owned by uid {info.st_uid}",
            f"chown {me} {directory} && chmod 0700 {directory}",
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"its directory {directory} is mode {stat.S_IMODE(info.st_mode):04o} "
            "(group or others may write it)",
            f"chmod 0700 {directory}",
        )
    for ancestor in Path(os.path.realpath(directory)).parents:
        info = os.stat(ancestor)
        writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if info.st_uid not in trusted or (writable and not info.st_mode & stat.S_ISVTX):
            return (
                f"its directory's ancestor {ancestor} (uid {info.st_uid}, mode "
                f"{stat.S_IMODE(info.st_mode):04o}) lets another user rename {directory}",
                f"chmod go-w {ancestor}, or chown it to root",
            )
    return None
