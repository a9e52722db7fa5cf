"""The config file on disk: atomic writes, the previous version for rollback, a status record.

Beside ``<path>`` (the file the device plugin reads) the store keeps ``<path>.previous`` (what
``share rollback`` restores) and ``<path>.status.json`` (what was written and how the plugin was
reloaded). Readers of ``<path>`` only ever see a whole old or a whole new file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from agent import safeyaml
from agent.durable import CHUNK_SIZE, replace_file
from agent.errors import (
    AgentError,
    Conflict,
    FieldViolation,
    InvalidSpec,
    NotFound,
    PermissionDenied,
)
from agent.sharing.schema import PluginConfig, parse

_DEFAULT_MODE = 0o644  # the plugin may run as another user; the config is not a secret


def atomic_write(
    path: Path,
    data: bytes,
    *,
    chunk_size: int = CHUNK_SIZE,
    on_chunk: Callable[[int], None] | None = None,
) -> None:
    """`agent.durable.replace_file`, a new file readable by the plugin (which may run as
    another user), with OS errors as domain errors naming ``path``."""
    with _os_errors(path):
        replace_file(path, data, new_mode=_DEFAULT_MODE, chunk_size=chunk_size, on_chunk=on_chunk)


@contextlib.contextmanager
def _os_errors(path: Path) -> Iterator[None]:
    """Translate OS errors at this edge into domain errors that name the path."""
    try:
        yield
    except PermissionError as exc:
        raise PermissionDenied(f"cannot write {path}: {exc.strerror}") from exc
    except FileNotFoundError as exc:
        raise NotFound(
            f"{path.parent} does not exist: mount the device plugin's config directory there"
        ) from exc
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise PermissionDenied(f"cannot write {path}: read-only filesystem") from exc
        raise AgentError(f"cannot write {path}: {exc.strerror or exc}") from exc


class ConfigStore:
    """The plugin's config file plus the agent's two companion files.

    Mutating methods expect the caller to hold ``lock()`` for the whole read-decide-write.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.previous_path = path.with_name(path.name + ".previous")
        self.status_path = path.with_name(path.name + ".status.json")

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialise changes across processes (the agent and a local CLI).

        flock on the directory itself, so no lock file has to live in the plugin's directory.
        """
        with _os_errors(self.path):
            fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._remove_stale_temp_files()
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _remove_stale_temp_files(self) -> None:
        # A writer killed mid-write leaves its temp file; under the lock no writer is running.
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            stale.unlink(missing_ok=True)

    def read(self) -> bytes | None:
        return _read(self.path)

    def read_previous(self) -> bytes | None:
        return _read(self.previous_path)

    def read_config(self) -> PluginConfig:
        """The config the plugin reads (its defaults when there is no file); Conflict when the
        file is not one, naming why, as every `share` command and `gpu-agent doctor` say it."""
        return parse_file(self.read(), self.path)

    def write(self, data: bytes) -> None:
        """Make ``data`` the config, keeping what was there as the previous version.

        The previous version is saved first: a crash in between leaves previous == current,
        never a config without its predecessor. A missing config is kept as an empty file, which
        the plugin reads as its defaults.
        """
        atomic_write(self.previous_path, self.read() or b"")
        atomic_write(self.path, data)

    def swap_with_previous(self, previous: bytes) -> None:
        """Restore ``previous`` (read from ``previous_path``) and keep the current config as the
        new previous version. The config is restored first, so a crash in between still leaves
        the rollback done.
        """
        current = self.read() or b""
        atomic_write(self.path, previous)
        atomic_write(self.previous_path, current)

    def mtime(self) -> float | None:
        try:
            return self.path.stat().st_mtime
        except FileNotFoundError:
            return None

    def write_status(self, record: Mapping[str, object]) -> None:
        atomic_write(self.status_path, json.dumps(record, indent=2, sort_keys=True).encode())

    def read_status(self) -> Mapping[str, object] | None:
        """The last status record, or None when absent or unreadable.

        The status is the agent's own bookkeeping: a damaged one loses only the evidence of how
        the plugin was reloaded, which ``share show`` then reports as unknown.
        """
        raw = _read(self.status_path)
        if raw is None:
            return None
        try:
            record = json.loads(raw)
        except ValueError:
            return None
        return record if isinstance(record, dict) else None


def parse_file(raw: bytes | None, path: Path) -> PluginConfig:
    """The config in ``raw``, the bytes of the file at ``path`` (None: no file, so the plugin's
    defaults); Conflict, naming the file and every problem, when the plugin cannot read it."""
    if raw is None:
        return PluginConfig()
    try:
        return parse(raw)
    except InvalidSpec as exc:
        problems = "; ".join(map(str, exc.violations))
        raise Conflict(
            f"{path} is not a valid device-plugin config ({problems}); fix or remove it"
        ) from exc


def _read(path: Path) -> bytes | None:
    """A file's bytes, None when there is none; one larger than YAML is parsed within
    (`safeyaml.DEFAULT`) is refused before it is in memory."""
    limit = safeyaml.DEFAULT.max_bytes
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise PermissionDenied(f"cannot read {path}: {exc.strerror}") from exc
    except IsADirectoryError as exc:  # a hostPath mounted where the file should be
        raise Conflict(
            f"{path} is a directory, not a device-plugin config file (a hostPath mounted at "
            "the file's path makes one when the host has no such file); remove it or fix the "
            "mount, or set sharing.config_path"
        ) from exc
    except OSError as exc:
        raise AgentError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise InvalidSpec(
            f"{path} is larger than {limit} bytes: not a device-plugin config; fix or remove it",
            [FieldViolation("sharing.config_path", f"at most {limit} bytes")],
        )
    return data
