"""The journal table: entries a service records durably before a change, under a scope.

The MIG apply journals a GPU's layout before changing it (agent/mig/journal.py), so a killed
agent rolls the change back or forward from it at the next start. Rows are written at FULL
durability (agent/state/schema.py); ``seq`` is never reused, so order survives clears.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.state.database import Database
from agent.state.schema import decode, encode

__all__ = ["Journal"]


class Journal(Database):
    """The journal table's reads and writes, on the store's connection."""

    def journal_append(self, scope: str, entry: dict[str, Any]) -> int:
        """Durably record ``entry`` under ``scope`` (e.g. ``mig:<gpu uuid>``); returns its seq."""
        with self.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO journal (scope, entry, created_at) VALUES (?, ?, ?)",
                (scope, encode(entry), self._clock()),
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def journal_entries(self, scope: str) -> list[tuple[int, dict[str, Any]]]:
        """The scope's entries as (seq, entry), oldest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, entry FROM journal WHERE scope = ? ORDER BY seq", (scope,)
            ).fetchall()
        return [(row["seq"], decode(row["entry"])) for row in rows]

    def journal_replace(self, scope: str, entry: dict[str, Any]) -> int:
        """Make ``entry`` the scope's only entry, in one transaction; returns its seq."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM journal WHERE scope = ?", (scope,))
            cursor = conn.execute(
                "INSERT INTO journal (scope, entry, created_at) VALUES (?, ?, ?)",
                (scope, encode(entry), self._clock()),
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def journal_keep(self, scope: str, entries: Sequence[dict[str, Any]]) -> None:
        """Make ``entries`` the scope's entries, in one transaction (none: the scope is empty):
        what is left of a scope's work after part of it is done."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM journal WHERE scope = ?", (scope,))
            conn.executemany(
                "INSERT INTO journal (scope, entry, created_at) VALUES (?, ?, ?)",
                [(scope, encode(entry), self._clock()) for entry in entries],
            )

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
