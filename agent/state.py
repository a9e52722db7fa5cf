"""The agent's one SQLite store: operations, the MIG journal, the prewarm cache index.

One WAL-mode database under the state dir, one connection, one transaction helper. Every write
runs in a ``BEGIN IMMEDIATE`` transaction, so a killed process leaves only whole transactions
behind. Only the node's owner (agent/ownership.py) opens it.

The database and its ``-wal`` and ``-shm`` files are mode 0600 and the state dir 0700, set on
every open (files an older agent made are fixed): they hold signed URLs of prewarm requests and
the node's MIG history, for root alone (docs/security.md, "State on disk").

Durability is chosen per table (`TABLE_DURABILITY`) and set per transaction, since SQLite's
``synchronous`` applies to a commit, not a table:

- ``operations`` and ``journal``: FULL. A committed operation or MIG journal entry survives a
  power loss, not only a killed process: recovery after a reboot reads them to roll a half-done
  MIG change back or forward.
- ``prewarm_items`` and ``prewarm_image_pulls``: NORMAL (no fsync at commit). A download saves
  its progress every second while it dirties the same filesystem, and on ext4 each fsync would
  also flush that file's data (1.1 s of a 2.9 s 1 GiB fetch). A power loss may lose the last
  rows; the cache's reconcile() squares the index with what is on disk at the next start.
"""

from __future__ import annotations

import enum
import glob
import json
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from agent.errors import (
    Busy,
    Conflict,
    FieldViolation,
    InvalidSpec,
    NotFound,
    NotSupported,
    StateUnavailable,
)
from agent.statedir import Unwritable, probe

__all__ = [
    "DONE_STATES",
    "INTERRUPTED",
    "LOST_WITH_DATABASE",
    "MIGRATIONS",
    "OPERATION_STATES",
    "TABLE_DURABILITY",
    "AlreadyRunning",
    "Durability",
    "Operation",
    "StateStore",
]

OPERATION_STATES = ("pending", "running", "succeeded", "failed", "cancelled")
DONE_STATES = frozenset({"succeeded", "failed", "cancelled"})
INTERRUPTED = "Interrupted"
"""``error["type"]`` of operations the agent stopped in the middle of (see mark_interrupted)."""

_BUSY_TIMEOUT_MS = 10_000
#: How often health and the metric probe a state dir that took no write (agent/statedir.py).
_PROBE_EVERY_S = 1.0
_CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
LOST_WITH_DATABASE = (
    "the operation history, the MIG journal (a MIG change cut short is not rolled back from "
    "it; the layout is read from the GPUs), and the prewarm index (cache files are adopted "
    "back from disk; pins, sources and retries are lost)"
)
"""What a corrupt state database takes with it, as the log and the node's health say."""

log = logging.getLogger(__name__)


class _Corrupt(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code of ``exc`` (extended codes carry it in the low byte)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


class Durability(enum.IntEnum):
    """What a committed transaction survives; higher is stronger."""

    NORMAL = 1  # a killed process (WAL: no fsync at commit)
    FULL = 2  # a power loss (fsync at commit)


TABLE_DURABILITY: dict[str, Durability] = {
    "operations": Durability.FULL,
    "journal": Durability.FULL,
    "prewarm_items": Durability.NORMAL,
    "prewarm_image_pulls": Durability.NORMAL,
}
"""The rule each table's writers follow (see the module docstring for why)."""

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE operations (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            state TEXT NOT NULL CHECK (
                state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')
            ),
            request_id TEXT,
            request TEXT NOT NULL,  -- canonical JSON: equal requests have equal text
            metadata TEXT NOT NULL,
            result TEXT,
            error TEXT,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        -- A retried create with the same request id finds the first operation.
        CREATE UNIQUE INDEX operations_by_request_id ON operations (kind, request_id)
            WHERE request_id IS NOT NULL;
        CREATE INDEX operations_by_state ON operations (state);
        CREATE TABLE journal (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, so order survives clears
            scope TEXT NOT NULL,
            entry TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX journal_by_scope ON journal (scope, seq);
        """,
    ),
    (
        2,
        # The prewarm cache index (agent/prewarm/index.py): one row per item, one per pull.
        # IF NOT EXISTS: databases from before this migration may already hold the tables.
        """
        CREATE TABLE IF NOT EXISTS prewarm_items (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            name TEXT NOT NULL UNIQUE,
            source TEXT NOT NULL,
            state TEXT NOT NULL,
            pinned INTEGER NOT NULL DEFAULT 0,
            size INTEGER,
            sha256 TEXT,
            expected_sha256 TEXT,
            fetched_bytes INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL,
            last_used REAL,
            hits INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            warm_seconds REAL,
            options TEXT NOT NULL DEFAULT '{}',
            owner_pid INTEGER
        );
        CREATE INDEX IF NOT EXISTS prewarm_items_sha256 ON prewarm_items (sha256);
        CREATE TABLE IF NOT EXISTS prewarm_image_pulls (
            ref TEXT NOT NULL,
            cold INTEGER NOT NULL,
            seconds REAL NOT NULL,
            at REAL NOT NULL
        );
        """,
    ),
    (
        3,
        # Who did the work (agent/owner.py): an admin's items and operations are undone only by
        # an admin. NULL: work from before owners were recorded, anyone's of its role to undo.
        """
        ALTER TABLE prewarm_items ADD COLUMN owner TEXT;
        ALTER TABLE prewarm_items ADD COLUMN owner_role TEXT;
        ALTER TABLE operations ADD COLUMN owner TEXT;
        ALTER TABLE operations ADD COLUMN owner_role TEXT;
        """,
    ),
)
"""Schema migrations: (version, SQL), applied in order; ``PRAGMA user_version`` records the last.

Append only: a released migration never changes, since databases in the field already ran it.
"""


class AlreadyRunning(Busy):
    """An operation of a kind that runs one at a time is in the way; ``running`` is it."""

    def __init__(self, running: Operation) -> None:
        super().__init__(f"{running.kind} operation {running.id} is running")
        self.running = running


@dataclass(frozen=True, slots=True)
class Operation:
    """A long-running piece of work (google.longrunning style) as stored.

    ``error`` is ``{"type": ..., "message": ...}`` where type names an ``agent.errors`` class or
    is `INTERRUPTED`. Times are epoch seconds.
    """

    id: str
    kind: str
    state: str
    request_id: str | None
    request: dict[str, Any]
    metadata: dict[str, Any]
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    created_at: float
    updated_at: float
    cancel_requested: bool
    owner: str | None = None  # the identity that started it (agent/owner.py)
    owner_role: str | None = None  # the role it acted under

    @property
    def done(self) -> bool:
        return self.state in DONE_STATES


def _encode(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _operation(row: sqlite3.Row) -> Operation:
    return Operation(
        id=row["id"],
        kind=row["kind"],
        state=row["state"],
        request_id=row["request_id"],
        request=_decode(row["request"]),
        metadata=_decode(row["metadata"]),
        result=_decode(row["result"]),
        error=_decode(row["error"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        cancel_requested=bool(row["cancel_requested"]),
        owner=row["owner"],
        owner_role=row["owner_role"],
    )


def _retried(row: sqlite3.Row, kind: str, request_id: str, encoded: str) -> Operation:
    """The operation of a known request id; `Conflict` when it came with another request."""
    if row["request"] != encoded:
        raise Conflict(
            f"request id {request_id!r} was already used for another {kind} "
            f"request (operation {row['id']}); use a new request id"
        )
    return _operation(row)


def _statements(script: str) -> Iterator[str]:
    """Split a script into statements; `sqlite3.complete_statement` keeps ';' in strings and
    trigger bodies where they belong (``executescript`` would commit our transaction)."""
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip(" \t\r\n;"):
                yield buffer
            buffer = ""
    if buffer.strip(" \t\r\n;"):
        yield buffer  # incomplete: SQLite reports the error instead of it being dropped


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


class StateStore:
    """The agent's SQLite database. Thread-safe: one connection behind a lock."""

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
            raise StateUnavailable(
                f"the state dir {path.parent} is not writable ({exc.strerror}): the agent keeps "
                "its state there; make it writable (remount read-write, fix its owner) or pass "
                "another --state-dir"
            ) from exc

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
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
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
        if self._write_error is None:
            return True, "ok"
        found = self._probe_again()
        if found is None:
            self._write_error = None
            return True, "ok"
        return False, found.cause

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
                what = (
                    f"the state dir {where} is not writable ({exc}): make it writable "
                    "(remount read-write, fix its owner) or pass another --state-dir"
                )
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
                for statement in _statements(script):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version}")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> StateStore:
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

    # --- operations ---------------------------------------------------------------------------

    def create_operation(
        self,
        kind: str,
        *,
        request_id: str | None,
        request: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        exclusive: bool = False,
        owner: str | None = None,
        owner_role: str | None = None,
    ) -> Operation:
        """A new pending operation; a retry with a known ``request_id`` gets the first one back.
        ``owner`` and ``owner_role``: who starts it (agent/owner.py).

        Raises `Conflict` when the ``request_id`` was used for this kind with another request.
        With ``exclusive``, raises `AlreadyRunning` when an operation of this kind is not done:
        the check and the insert are one transaction, so of two callers at the same instant
        (threads or processes) exactly one gets an operation and the other gets no row at all.
        """
        encoded = _encode(request)
        with self.transaction() as conn:
            if request_id is not None:
                row = conn.execute(
                    "SELECT * FROM operations WHERE kind = ? AND request_id = ?",
                    (kind, request_id),
                ).fetchone()
                if row is not None:
                    return _retried(row, kind, request_id, encoded)
            if exclusive:
                marks = ", ".join("?" * len(DONE_STATES))
                running = conn.execute(
                    f"SELECT * FROM operations WHERE kind = ? AND state NOT IN ({marks})"
                    " ORDER BY created_at LIMIT 1",
                    (kind, *sorted(DONE_STATES)),
                ).fetchone()
                if running is not None:
                    raise AlreadyRunning(_operation(running))
            now = self._clock()
            op_id = uuid.uuid4().hex
            conn.execute(
                "INSERT INTO operations (id, kind, state, request_id, request, metadata,"
                " created_at, updated_at, owner, owner_role)"
                " VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?)",
                (
                    op_id,
                    kind,
                    request_id,
                    encoded,
                    _encode(metadata or {}),
                    now,
                    now,
                    owner,
                    owner_role,
                ),
            )
            return self.get_operation(op_id)

    def find_request(self, kind: str, request_id: str, request: dict[str, Any]) -> Operation | None:
        """The operation a ``request_id`` already started, None when it is new; `Conflict` (as
        `create_operation` raises it) when the id was used for another request."""
        with self._lock:
            row = self._conn.execute(
                "SELECT * FROM operations WHERE kind = ? AND request_id = ?", (kind, request_id)
            ).fetchone()
        return None if row is None else _retried(row, kind, request_id, _encode(request))

    def get_operation(self, op_id: str) -> Operation:
        with self._lock:
            row = self._conn.execute("SELECT * FROM operations WHERE id = ?", (op_id,)).fetchone()
        if row is None:
            raise NotFound(f"operation {op_id!r} does not exist")
        return _operation(row)

    def list_operations(
        self,
        *,
        kind: str | None = None,
        done: bool | None = None,
        limit: int = 100,
        kinds: Sequence[str] | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Operation]:
        """Operations, newest first (by creation, then id), optionally of one kind (or of
        ``kinds``) and done or not; ``after`` (created_at, id) of the last one seen resumes."""
        if limit < 1:
            raise InvalidSpec(
                f"limit must be >= 1, got {limit}", [FieldViolation("limit", "must be >= 1")]
            )
        where: list[str] = ["1"]
        params: list[object] = []
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        if kinds is not None:
            where.append(f"kind IN ({', '.join('?' * len(kinds)) or 'NULL'})")
            params.extend(kinds)
        if done is not None:
            marks = ", ".join("?" * len(DONE_STATES))
            where.append(f"state {'IN' if done else 'NOT IN'} ({marks})")
            params.extend(sorted(DONE_STATES))
        if after is not None:
            where.append("(created_at < ? OR (created_at = ? AND id < ?))")
            params.extend((after[0], after[0], after[1]))
        sql = (
            f"SELECT * FROM operations WHERE {' AND '.join(where)}"
            " ORDER BY created_at DESC, id DESC LIMIT ?"
        )
        with self._lock:
            rows = self._conn.execute(sql, (*params, limit)).fetchall()
        return [_operation(row) for row in rows]

    def prune_operations(self, *, max_age_s: float, keep_per_kind: int) -> int:
        """Delete done operations (idempotency records included) last changed more than
        ``max_age_s`` ago, and all but the newest ``keep_per_kind`` done ones of each kind.
        Operations not done are never deleted. Returns how many went."""
        done = sorted(DONE_STATES)
        marks = ", ".join("?" * len(done))
        cutoff = self._clock() - max_age_s
        with self.transaction() as conn:
            gone = conn.execute(
                f"DELETE FROM operations WHERE state IN ({marks}) AND updated_at < ?",
                (*done, cutoff),
            ).rowcount
            kinds = [row[0] for row in conn.execute("SELECT DISTINCT kind FROM operations")]
            for kind in kinds:
                gone += conn.execute(
                    "DELETE FROM operations WHERE id IN (SELECT id FROM operations"
                    f" WHERE kind = ? AND state IN ({marks})"
                    " ORDER BY updated_at DESC, id DESC LIMIT -1 OFFSET ?)",
                    (kind, *done, keep_per_kind),
                ).rowcount
        return gone

    def update_operation(
        self,
        op_id: str,
        *,
        state: str | None = None,
        metadata: dict[str, Any] | None = None,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> Operation:
        """Set the given fields (``metadata`` replaces the old one). A done operation is final:
        updating it raises `Conflict`, so a late worker cannot overwrite a cancellation."""
        if state is not None and state not in OPERATION_STATES:
            allowed = ", ".join(OPERATION_STATES)
            raise InvalidSpec(
                f"operation state {state!r} is not one of: {allowed}",
                [FieldViolation("state", f"must be one of: {allowed}")],
            )
        columns: dict[str, str] = {} if state is None else {"state": state}
        for name, value in (("metadata", metadata), ("result", result), ("error", error)):
            if value is not None:
                columns[name] = _encode(value)
        with self.transaction() as conn:
            current = self.get_operation(op_id)
            if current.done:
                raise Conflict(f"operation {op_id} is already {current.state}")
            assignments = "".join(f"{name} = ?, " for name in columns)
            conn.execute(
                f"UPDATE operations SET {assignments}updated_at = ? WHERE id = ?",
                (*columns.values(), self._clock(), op_id),
            )
            return self.get_operation(op_id)

    def request_cancel(self, op_id: str) -> Operation:
        """Flag the operation for cancellation; its worker stops at its next checkpoint and
        sets the state. A no-op on a done operation."""
        with self.transaction() as conn:
            current = self.get_operation(op_id)
            if current.done or current.cancel_requested:
                return current
            conn.execute(
                "UPDATE operations SET cancel_requested = 1, updated_at = ? WHERE id = ?",
                (self._clock(), op_id),
            )
            return self.get_operation(op_id)

    def mark_interrupted_operations(self, reason: str) -> list[Operation]:
        """On agent start: fail every operation left pending or running by a previous process.

        Services that can resume or roll back their own operations (MIG apply, from its journal)
        do so before this is called; what is left is failed with ``error.type`` `INTERRUPTED`.
        """
        error = _encode({"type": INTERRUPTED, "message": reason})
        with self.transaction() as conn:
            ids = [
                row["id"]
                for row in conn.execute(
                    "SELECT id FROM operations WHERE state IN ('pending', 'running')"
                    " ORDER BY created_at, rowid"
                )
            ]
            conn.execute(
                "UPDATE operations SET state = 'failed', error = ?, updated_at = ?"
                " WHERE state IN ('pending', 'running')",
                (error, self._clock()),
            )
            return [self.get_operation(op_id) for op_id in ids]

    # --- journal ------------------------------------------------------------------------------

    def journal_append(self, scope: str, entry: dict[str, Any]) -> int:
        """Durably record ``entry`` under ``scope`` (e.g. ``mig:<gpu uuid>``); returns its seq."""
        with self.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO journal (scope, entry, created_at) VALUES (?, ?, ?)",
                (scope, _encode(entry), self._clock()),
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def journal_entries(self, scope: str) -> list[tuple[int, dict[str, Any]]]:
        """The scope's entries as (seq, entry), oldest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, entry FROM journal WHERE scope = ? ORDER BY seq", (scope,)
            ).fetchall()
        return [(row["seq"], _decode(row["entry"])) for row in rows]

    def journal_replace(self, scope: str, entry: dict[str, Any]) -> int:
        """Make ``entry`` the scope's only entry, in one transaction; returns its seq."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM journal WHERE scope = ?", (scope,))
            cursor = conn.execute(
                "INSERT INTO journal (scope, entry, created_at) VALUES (?, ?, ?)",
                (scope, _encode(entry), self._clock()),
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def journal_clear(self, scope: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM journal WHERE scope = ?", (scope,))

    def journal_scopes(self) -> list[str]:
        """Scopes with entries left, oldest first: on start, a killed agent's unfinished work."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT scope FROM journal GROUP BY scope ORDER BY MIN(seq)"
            ).fetchall()
        return [row["scope"] for row in rows]
