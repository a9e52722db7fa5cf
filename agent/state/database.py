"""The state database's connection: opening it, its transactions, and what the disk allows.

One WAL-mode database under the state dir, one connection, one transaction helper. Every write
runs in a ``BEGIN IMMEDIATE`` transaction, so a killed process leaves only whole transactions
behind. Only the node's owner (agent/ownership.py) opens it.

The database and its ``-wal`` and ``-shm`` files are mode 0600 and the state dir 0700, set on
every open (files an older agent made are fixed): they hold signed URLs of prewarm requests and
the node's MIG history, for root alone (docs/security.md, "State on disk").

A damaged database is kept aside and a new one started (`Database._quarantine`); a state dir
that takes no write at start gives a read-only store (`Database._open_read_only`); a write the
disk refuses later is a `StateUnavailable` that the node's health reports until the dir takes
writes again. The tables themselves are agent/state/schema.py's; their rows are read and
written by the table modules beside this one.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import ClassVar, Self
from urllib.parse import quote

from agent.durable import fsync_dir
from agent.errors import Conflict, NotSupported, StateUnavailable
from agent.state.schema import MIGRATIONS, Durability, statements
from agent.statedir import FIX, Unwritable, probe

__all__ = ["LOST_WITH_DATABASE", "Database"]

_BUSY_TIMEOUT_MS = 10_000
#: What the WAL is cut back to once checkpointed: SQLite leaves it at its high-water mark.
_WAL_LIMIT_BYTES = 1024 * 1024
#: How often health and the metric probe a state dir that took no write (agent/statedir.py).
_PROBE_EVERY_S = 1.0
_CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
LOST_WITH_DATABASE = (
    "the operation history, the MIG journal (a MIG change cut short is not rolled back from "
    "it; the layout is read from the GPUs), and the prewarm index (cache files are adopted "
    "back from disk; pins, sources and retries are lost)"
)
"""What a corrupt state database takes with it, as the log and the node's health say."""


# The name the store logged under before it was a package: operators' filters and alerts keep it.
log = logging.getLogger("agent.state")


class _Corrupt(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code of ``exc`` (extended codes carry it in the low byte)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


_DB_SIDE_FILES = ("-wal", "-shm", "-journal")


def _make_private(path: Path) -> None:
    """The state dir 0700 and the database files 0600, also those an older agent left 0644.

    The database file is made before SQLite opens it: SQLite gives its -wal and -shm the
    database's mode, whatever the umask."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    _chmod_file(path, os.O_CREAT)
    for suffix in _DB_SIDE_FILES:
        with suppress(FileNotFoundError):
            _chmod_file(path.with_name(path.name + suffix))


def _chmod_file(path: Path, flags: int = 0) -> None:
    """0600 on the file itself: O_NOFOLLOW, so a link planted in its place is refused (ELOOP)."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class Database:
    """The agent's SQLite database and its one connection. Thread-safe: the connection is
    behind a lock. The tables' methods are added by `agent.state.store.StateStore`."""

    MIGRATIONS: ClassVar[Sequence[tuple[int, str]]] = MIGRATIONS

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
        read_only: Unwritable | None = None,
    ) -> None:
        """``read_only``: the state dir took no write at start (`agent.statedir.probe`): the
        store serves reads from a copy in memory (`_open_read_only`) and refuses every write."""
        versions = [version for version, _ in self.MIGRATIONS]
        if versions != list(range(1, len(versions) + 1)):
            raise ValueError(f"migration versions must be 1, 2, 3, ... in order; got {versions}")
        self.path = path
        self._clock = clock
        self._lock = threading.RLock()
        self._write_error: StateUnavailable | None = None
        self._synchronous = Durability.FULL
        self._durability: Durability | None = None  # of the transaction in progress
        #: Why the store is read-only (set once it is open), and whether the dir takes writes
        #: again (`_probe_again`); what the read-only store left undone (`note`).
        self.read_only: Unwritable | None = None
        self._writable_again = False
        self._probed_at = -_PROBE_EVERY_S
        self._last_probe: Unwritable | None = None
        self._notes: list[str] = []
        #: files the agent keeps beside the database (the health marks) whose last write
        #: failed: path -> (the detail, why); see `file_written`. Replaced, never changed in
        #: place, so health reads it without the lock a long write holds.
        self._files: dict[Path, tuple[str, Unwritable]] = {}
        if read_only is not None:
            self._kept = []
            try:
                self._conn = self._open_read_only()
            except (sqlite3.Error, OSError) as exc:
                raise StateUnavailable(
                    f"{read_only}; and its database {path} cannot be read ({exc})"
                ) from exc
            self.read_only = read_only
            log.warning(  # a state, like a late driver: an embedded agent's command is quiet
                "%s. The agent serves reads and refuses every change until it is restarted "
                "with a writable state dir",
                read_only,
            )
            return
        try:
            _make_private(path)
            try:
                self._conn = self._open()
            except _Corrupt as exc:
                self._quarantine(exc.reason)
                _make_private(path)  # the fresh database, as private as the one kept aside
                self._conn = self._open()
            self._kept = self.quarantined()  # listed once: health() only stats them
        except sqlite3.Error as exc:
            refusal = self._refusal(exc)
            if refusal is None:
                raise
            raise refusal from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP and exc.filename and os.path.islink(exc.filename):
                # O_NOFOLLOW met a link in the file's place: not a mount to fix
                raise StateUnavailable(
                    f"{exc.filename} is a symbolic link, not the agent's file: the agent opens "
                    "its state files only where it made them; remove the link (and find who "
                    "planted it)"
                ) from exc
            if exc.errno == errno.ELOOP:  # links in the state dir's path that loop
                raise StateUnavailable(
                    f"the state dir {path.parent} cannot be reached ({exc.strerror}): a "
                    "symbolic link on its path loops; fix the link or pass another --state-dir"
                ) from exc
            raise StateUnavailable(str(Unwritable.of(path.parent, exc))) from exc

    def _open_read_only(self) -> sqlite3.Connection:
        """A private copy in memory of the database in a state dir that takes no writes.

        SQLite opens a WAL database in a directory it cannot write only when the -wal and -shm
        files both exist (it maps the -shm read-only) or when the URI says ``immutable=1``,
        which ignores the -wal (sqlite.org/wal.html, "Read-Only Databases"). So: with both,
        ``mode=ro`` (the WAL's committed transactions are read too); with no -wal (a clean
        stop), the database file is all there is and ``immutable=1`` reads it whole; with a
        -wal but no -shm, the two are copied to a private temporary dir and read there.

        ``immutable=1`` also skips SQLite's locks and change checks, which is safe here: every
        writer of this database (a serving agent, a CLI's embedded one) holds the node's owner
        lock first (agent/ownership.py), and this agent holds it, so nothing changes the file
        while it is read. The copy is then backed up into memory and migrated there: no file
        stays open, reads see the schema this agent knows, and the copy stays true while the
        agent owns the node. No database at all (a node never written) reads as an empty one.
        """
        memory = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        if self.path.exists():
            wal = self.path.with_name(self.path.name + "-wal")
            shm = self.path.with_name(self.path.name + "-shm")
            with ExitStack() as scratch:
                source, query = self.path, "mode=ro" if wal.exists() else "immutable=1"
                if wal.exists() and not shm.exists():
                    temporary = tempfile.TemporaryDirectory(prefix="gpu-agent-state-")  # 0700
                    source = Path(scratch.enter_context(temporary)) / self.path.name
                    shutil.copyfile(self.path, source)
                    shutil.copyfile(wal, source.with_name(source.name + "-wal"))
                disk = sqlite3.connect(f"file:{quote(str(source))}?{query}", uri=True)
                try:
                    disk.backup(memory)
                finally:
                    disk.close()
        self._conn = memory
        memory.row_factory = sqlite3.Row
        try:
            self._check()
            self._migrate()
        except BaseException:
            memory.close()
            raise
        return memory

    def _open(self) -> sqlite3.Connection:
        """Connect, configure, check the file's integrity and migrate; `_Corrupt` when the file
        is damaged (then nothing is left open)."""
        # Autocommit mode: transactions are ours, explicit, and never opened behind our back.
        self._conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=_BUSY_TIMEOUT_MS / 1000,
        )
        try:
            self._configure()
            self._check()
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            if _code(exc) in _CORRUPT_CODES:
                raise _Corrupt(str(exc)) from exc
            raise
        except BaseException:
            self._conn.close()
            raise
        return self._conn

    def _check(self) -> None:
        """``PRAGMA quick_check``: every page and record well formed (not the index contents,
        which ``integrity_check`` also compares; see docs/operations.md for the cost of each)."""
        rows = [row[0] for row in self._conn.execute("PRAGMA quick_check(5)")]
        if rows != ["ok"]:
            raise _Corrupt("; ".join(rows))

    def _quarantine(self, reason: str) -> None:
        """Move the damaged database (and its WAL) aside under a timestamped name, kept for a
        person to look at; the store then starts a new one."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        kept = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = self.path.with_name(self.path.name + suffix)
            if source.exists():
                source.rename(kept.with_name(kept.name + suffix))
        fsync_dir(self.path.parent)
        log.error(
            "state database %s is corrupt (%s): kept as %s, starting a new one. Lost: %s",
            self.path,
            reason,
            kept,
            LOST_WITH_DATABASE,
        )

    def quarantined(self) -> list[Path]:
        """Damaged databases kept beside this one (`_quarantine`), until a person removes them."""
        return sorted(self.path.parent.glob(f"{glob.escape(self.path.name)}.corrupt-*[0-9TZ]"))

    def health(self) -> tuple[bool, str]:
        """(healthy, detail) of the store, for the node's health: the last write refused, or a
        damaged database kept beside it; healthy otherwise."""
        if self.read_only is not None:
            return False, self._read_only_detail()
        if self._write_error is not None and self._probe_again() is None:
            self._write_error = None  # space was freed, or the dir remounted read-write
        if self._write_error is not None:
            return False, str(self._write_error)
        for detail, _ in self._files.values():
            return False, detail
        kept = [path for path in self._kept if path.exists()]
        if kept:
            return False, (
                f"the state database was corrupt and was started anew; the damaged one is kept "
                f"as {kept[-1]} (remove it once looked at). Lost: {LOST_WITH_DATABASE}"
            )
        return True, f"{self.path}: ok"

    def _read_only_detail(self) -> str:
        assert self.read_only is not None
        detail = f"read-only since the agent started: {self.read_only}"
        if self._probe_again() is None:
            detail = (
                f"read-only since the agent started ({self.read_only.strerror}), and the state "
                f"dir {self.path.parent} takes writes again: restart the agent to leave "
                "read-only mode"
            )
        else:
            detail += ", then restart the agent"
        return "; ".join([detail, "reads are served, every change is refused", *self._notes])

    def _probe_again(self) -> Unwritable | None:
        """`probe` the state dir again, at most every _PROBE_EVERY_S (health is read often);
        the last answer in between. A read-only store logs once that the dir is back."""
        now = time.monotonic()
        if now - self._probed_at >= _PROBE_EVERY_S:
            self._probed_at = now
            self._last_probe = probe(self.path.parent)
            if self.read_only is not None and self._last_probe is None and not self._writable_again:
                log.warning(
                    "the state dir %s takes writes again: restart the agent to leave read-only "
                    "mode (it does not reopen its state while it runs)",
                    self.path.parent,
                )
            self._writable_again = self._last_probe is None
        return self._last_probe

    def note(self, left_undone: str) -> None:
        """Add what a read-only store kept the agent from doing (e.g. a MIG recovery) to its
        health."""
        self._notes.append(left_undone)

    def writable(self) -> tuple[bool, str]:
        """(takes writes, cause) for the metric: the cause is an errno name (EROFS, ENOSPC,
        ...) when not, ``restart_needed`` for a read-only store whose dir is back, or "ok"."""
        if self.read_only is not None:
            return False, "restart_needed" if self._probe_again() is None else self.read_only.cause
        if self._write_error is not None:
            found = self._probe_again()
            if found is not None:
                return False, found.cause
            self._write_error = None
        for _, why in self._files.values():
            return False, why.cause
        return True, "ok"

    def file_written(self, path: Path, error: OSError | None, *, what: str, lost: str) -> None:
        """The write of a file the agent keeps in the state dir beside the database (``what``,
        e.g. the health marks) succeeded (``error`` None) or failed: a failure is the store's
        health (naming the file, the cause and what a restart would lose) and the metric's
        cause until that file is written again. A probe that passes does not clear it: only
        the file's own next write says it is kept again."""
        files = dict(self._files)
        if error is None:
            files.pop(path, None)
        else:
            why = Unwritable.of(self.path.parent, error)
            files[path] = (f"{what} could not be written to {path}: {why}; {lost}", why)
        self._files = files

    def require_writable(self) -> None:
        """Refuse a change before it starts (`StateUnavailable` naming the dir and the fix)
        when the store is read-only or the state dir takes no write now (full, remounted
        read-only): a change the agent could not record is not made."""
        if self.read_only is not None:
            raise StateUnavailable(self._read_only_refusal())
        found = probe(self.path.parent)
        self._last_probe, self._probed_at = found, time.monotonic()  # health sees it at once
        if found is None:
            self._write_error = None
            return
        self._write_error = StateUnavailable(f"{found}; nothing was changed")
        raise self._write_error

    def _read_only_refusal(self) -> str:
        assert self.read_only is not None
        return (
            f"{self.read_only}, then restart the agent (it started read-only and serves reads "
            "only); nothing was changed"
        )

    def _refusal(self, exc: sqlite3.Error) -> StateUnavailable | None:
        """The domain error for a write the disk refused (read-only, full, failing, damaged);
        None for other errors (bugs, constraint violations), which stay what they are."""
        where = self.path.parent
        match _code(exc):
            case sqlite3.SQLITE_READONLY | sqlite3.SQLITE_CANTOPEN | sqlite3.SQLITE_PERM:
                what = f"the state dir {where} takes no writes ({exc}): {FIX}"
            case sqlite3.SQLITE_FULL:
                what = f"the state dir {where} is full ({exc}): free space on its filesystem"
            case sqlite3.SQLITE_IOERR:
                what = f"the state database {self.path} failed a write ({exc}): check the disk"
            case sqlite3.SQLITE_CORRUPT | sqlite3.SQLITE_NOTADB:
                what = (
                    f"the state database {self.path} is corrupt ({exc}): restart the agent, "
                    "which keeps it aside and starts a new one"
                )
            case _:
                return None
        return StateUnavailable(f"{what}; nothing was changed")

    def _configure(self) -> None:
        conn = self._conn
        conn.row_factory = sqlite3.Row
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":  # e.g. a network filesystem; readers would then block the writer
            raise NotSupported(
                f"state database {self.path}: SQLite refused WAL mode (got {mode}); "
                "put the state dir on a local filesystem"
            )
        # The WAL shrinks back after a burst (a churn cycle left 4 MB beside an 86 KB database).
        conn.execute(f"PRAGMA journal_size_limit = {_WAL_LIMIT_BYTES}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous = FULL")
        self._synchronous = Durability.FULL
        self._durability = None

    def _migrate(self) -> None:
        latest = len(self.MIGRATIONS)
        with self.transaction() as conn:  # re-read inside: another process may have migrated
            current = conn.execute("PRAGMA user_version").fetchone()[0]
            if current > latest:
                raise Conflict(
                    f"state database {self.path} has schema version {current}, newer than this "
                    f"agent's {latest}; run the newer agent or move the database away"
                )
            for version, script in self.MIGRATIONS[current:]:
                for statement in statements(script):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version}")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def transaction(self, durability: Durability = Durability.FULL) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` when the block raises; the
        commit is as durable as ``durability`` (the rule of the tables it writes).

        Nested use joins the outer transaction, so store methods compose into one atomic change;
        a nested block may not ask for more durability than the outer one promised (SQLite
        cannot change it inside a transaction).
        """
        if self.read_only is not None:
            raise StateUnavailable(self._read_only_refusal())
        with self._lock:
            if self._conn.in_transaction:
                if self._durability is not None and durability > self._durability:
                    raise RuntimeError(
                        f"a {durability.name} write inside a {self._durability.name} transaction"
                    )
                yield self._conn
                return
            if durability is not self._synchronous:
                self._conn.execute(f"PRAGMA synchronous = {durability.name}")
                self._synchronous = durability
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._refused(exc) from exc
            self._durability = durability
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException as exc:
                if self._conn.in_transaction:  # also when COMMIT itself failed (disk full)
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._refused(exc) from exc
                raise
            else:
                self._write_error = None
            finally:
                self._durability = None

    def _refused(self, exc: sqlite3.Error) -> Exception:
        """What a failed write raises: `StateUnavailable` (remembered for `health`) when the
        disk refused it, else the error itself."""
        refusal = self._refusal(exc)
        if refusal is None:
            return exc
        self._write_error = refusal
        log.error("%s", refusal)
        return refusal

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection for reads (WAL: they never wait for a writer in another process)."""
        with self._lock:
            yield self._conn
