"""The state database's schema: its tables, their migrations, and each table's durability.

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
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

__all__ = ["MIGRATIONS", "TABLE_DURABILITY", "Durability", "decode", "encode", "statements"]


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


def encode(value: dict[str, Any]) -> str:
    """A JSON column's text: canonical, so equal values (requests) have equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def statements(script: str) -> Iterator[str]:
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
