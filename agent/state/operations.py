"""The operations table: long-running work (google.longrunning style) as the store keeps it.

An operation is created pending, updated by its worker and final once done; a retried create
with the same request id finds the first one. Rows are written at FULL durability
(agent/state/schema.py), so a committed operation survives a power loss.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Sequence
from typing import Any

from agent.errors import Conflict, FieldViolation, InvalidSpec, NotFound
from agent.operation import (
    DONE_STATES,
    INTERRUPTED,
    OPERATION_STATES,
    AlreadyRunning,
    Operation,
)
from agent.state.database import Database
from agent.state.schema import decode, encode

__all__ = ["Operations"]


def _operation(row: sqlite3.Row) -> Operation:
    return Operation(
        id=row["id"],
        kind=row["kind"],
        state=row["state"],
        request_id=row["request_id"],
        request=decode(row["request"]),
        metadata=decode(row["metadata"]),
        result=decode(row["result"]),
        error=decode(row["error"]),
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


class Operations(Database):
    """The operations table's reads and writes, on the store's connection."""

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
        encoded = encode(request)
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
                    encode(metadata or {}),
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
        return None if row is None else _retried(row, kind, request_id, encode(request))

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
                columns[name] = encode(value)
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

    def restate_error(self, op_id: str, error: dict[str, Any]) -> Operation:
        """What an ended operation's error says, made what is true of it now (a rollback that
        failed, finished since by recovery): ``error`` replaces it, and the error it replaces
        is kept, with when it stopped being true, at the end of the new one's ``history``. The
        one change an ended operation takes; its state stays. `Conflict` when it has no error."""
        with self.transaction() as conn:
            current = self.get_operation(op_id)
            if not current.done or current.error is None:
                raise Conflict(f"operation {op_id} has not ended with an error to restate")
            now = self._clock()
            earlier = dict(current.error)
            history = [*earlier.pop("history", ()), {**earlier, "until": now}]
            conn.execute(
                "UPDATE operations SET error = ?, updated_at = ? WHERE id = ?",
                (encode({**error, "history": history}), now, op_id),
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
        error = encode({"type": INTERRUPTED, "message": reason})
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
