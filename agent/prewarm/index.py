"""The cache inventory: one row per item, one per image pull, in the agent's one store.

The tables are migration 2 of agent/state/schema.py and follow its NORMAL durability rule
(progress is saved every second during a download; see agent/state/schema.py). Decisions
that read then write (claiming an item, admitting bytes) happen inside one IMMEDIATE
transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from agent.errors import Conflict, NotFound
from agent.prewarm.model import CacheItem, ImagePull, ItemKind, ItemState, item_kind
from agent.state import TABLE_DURABILITY, StateStore

_DURABILITY = TABLE_DURABILITY["prewarm_items"]
#: pulls of one image kept, cold and warm each (the metric shows the latest of each)
PULLS_KEPT = 8

_COLUMNS = tuple(f.name for f in fields(CacheItem))


def _to_row(item: CacheItem) -> dict[str, Any]:
    row = {name: getattr(item, name) for name in _COLUMNS}
    row["kind"] = str(item.kind)
    row["state"] = item.state.value
    row["pinned"] = int(item.pinned)
    row["options"] = json.dumps(dict(item.options), sort_keys=True)
    return row


def _from_row(row: sqlite3.Row) -> CacheItem:
    data = {name: row[name] for name in _COLUMNS}
    data["kind"] = item_kind(data["kind"])
    data["state"] = ItemState(data["state"])
    data["pinned"] = bool(data["pinned"])
    data["options"] = json.loads(data["options"])
    return CacheItem(**data)


class PrewarmIndex:
    """Typed operations on the prewarm tables of a `StateStore`; safe to share between threads."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    @classmethod
    def open(cls, path: Path) -> PrewarmIndex:
        """On a store of its own (tools and tests that hold no other); `close` closes it."""
        return cls(StateStore(path))

    def close(self) -> None:
        self.store.close()

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """An IMMEDIATE transaction at the prewarm tables' durability (check-then-write)."""
        return self.store.transaction(_DURABILITY)

    def insert(self, item: CacheItem) -> CacheItem:
        row = _to_row(item)
        cols = ", ".join(row)
        marks = ", ".join(f":{c}" for c in row)
        try:
            with self.transaction() as conn:
                conn.execute(f"INSERT INTO prewarm_items ({cols}) VALUES ({marks})", row)
        except sqlite3.IntegrityError:
            raise Conflict(f"a cache item named {item.name!r} already exists") from None
        return item

    def update(self, item_id: str, **changes: Any) -> CacheItem:
        """Set columns of one item and return the new row."""
        current = self.get(item_id)
        row = _to_row(replace(current, **changes))
        sets = ", ".join(f"{c} = :{c}" for c in changes)
        with self.transaction() as conn:
            conn.execute(f"UPDATE prewarm_items SET {sets} WHERE id = :id", row)
        return self.get(item_id)

    def delete(self, item_id: str) -> None:
        """Delete the item, and the pull history of an image no item names any more."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM prewarm_items WHERE id = ?", (item_id,))
            conn.execute(
                "DELETE FROM prewarm_image_pulls WHERE ref NOT IN "
                "(SELECT source FROM prewarm_items WHERE kind = ?)",
                (ItemKind.IMAGE.value,),
            )

    def set_owner(self, item_id: str, pid: int | None) -> None:
        with self.transaction() as conn:
            conn.execute("UPDATE prewarm_items SET owner_pid = ? WHERE id = ?", (pid, item_id))

    def owner(self, item_id: str) -> int | None:
        with self.store.reading() as conn:
            row = conn.execute(
                "SELECT owner_pid FROM prewarm_items WHERE id = ?", (item_id,)
            ).fetchone()
        return None if row is None else row[0]

    def get(self, item_id: str) -> CacheItem:
        with self.store.reading() as conn:
            row = conn.execute("SELECT * FROM prewarm_items WHERE id = ?", (item_id,)).fetchone()
        if row is None:
            raise NotFound(f"no cache item with id {item_id!r}")
        return _from_row(row)

    def find(self, id_or_name: str) -> CacheItem:
        with self.store.reading() as conn:
            row = conn.execute(
                "SELECT * FROM prewarm_items WHERE id = ? OR name = ?", (id_or_name, id_or_name)
            ).fetchone()
        if row is None:
            raise NotFound(f"no cache item with id or name {id_or_name!r}")
        return _from_row(row)

    def find_by_name(self, name: str) -> CacheItem | None:
        with self.store.reading() as conn:
            row = conn.execute("SELECT * FROM prewarm_items WHERE name = ?", (name,)).fetchone()
        return None if row is None else _from_row(row)

    def items(self, states: Sequence[ItemState] = ()) -> list[CacheItem]:
        query = "SELECT * FROM prewarm_items"
        args: list[str] = []
        if states:
            query += f" WHERE state IN ({', '.join('?' for _ in states)})"
            args = [s.value for s in states]
        with self.store.reading() as conn:
            rows = conn.execute(query + " ORDER BY created_at, id", args).fetchall()
        return [_from_row(r) for r in rows]

    def ready_with_sha256(self, sha256: str) -> list[CacheItem]:
        """The ready items that record ``sha256``, of any kind (`CacheStore.on_blob` keeps
        those that are that one blob)."""
        with self.store.reading() as conn:
            rows = conn.execute(
                "SELECT * FROM prewarm_items WHERE sha256 = ? AND state = ?",
                (sha256, ItemState.READY.value),
            ).fetchall()
        return [_from_row(r) for r in rows]

    def record_pull(self, pull: ImagePull) -> None:
        """Keep ``pull`` and the last `PULLS_KEPT` cold and warm pulls of its image (`delete`
        drops an image's with its last item): the history stays bounded however long the
        agent runs, and the metric keeps an image's latest cold pull among many warm ones."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO prewarm_image_pulls (ref, cold, seconds, at) VALUES (?, ?, ?, ?)",
                (pull.ref, int(pull.cold), pull.seconds, pull.at),
            )
            same = (pull.ref, int(pull.cold))
            conn.execute(
                "DELETE FROM prewarm_image_pulls WHERE ref = ? AND cold = ? AND rowid NOT IN "
                "(SELECT rowid FROM prewarm_image_pulls WHERE ref = ? AND cold = ? "
                "ORDER BY at DESC, rowid DESC LIMIT ?)",
                (*same, *same, PULLS_KEPT),
            )

    def pulls(self, ref: str | None = None) -> list[ImagePull]:
        query = "SELECT ref, cold, seconds, at FROM prewarm_image_pulls"
        args: tuple[str, ...] = ()
        if ref is not None:
            query, args = query + " WHERE ref = ?", (ref,)
        with self.store.reading() as conn:
            rows = conn.execute(query + " ORDER BY at", args).fetchall()
        return [ImagePull(r[0], bool(r[1]), r[2], r[3]) for r in rows]
