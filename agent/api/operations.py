"""Operations: long work run in the background, followed through the OperationsService.

`OperationRunner` turns a piece of blocking work into a stored operation (StateStore), runs it
on a worker thread, persists its typed progress and its end, and wakes whoever waits or
watches. The same store row makes ``request_id`` retries idempotent: `start` and `once` (for
the quick mutating calls) find the first attempt instead of doing the work twice.

Stored ``metadata`` and ``result`` are the JSON form of ``OperationMetadata`` and
``OperationResponse``, so any stored operation converts back to the same message after a
restart.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from agent._proto.gpuagent.v1 import operations_pb2, operations_pb2_grpc
from agent.api.auth import OPERATION_ROLES, Role, actor_of, allows, granted, sees_processes
from agent.api.events import EventBus
from agent.errors import AgentError, Busy, FieldViolation, InvalidSpec, NotFound, PermissionDenied
from agent.loops import call_soon_from_thread
from agent.operation import Operation
from agent.owner import Actor, check_may_undo
from agent.state import StateStore
from agent.tasks import Need, Task
from agent.wire.errors import error_record
from agent.wire.operations import (
    message_dict,
    operation_id_from,
    operation_name,
    operation_pb,
    without_processes,
)

log = logging.getLogger(__name__)

__all__ = [
    "API_KINDS",
    "MIG_APPLY",
    "PREWARM",
    "Checkpointed",
    "EndedShort",
    "OperationContext",
    "OperationRunner",
    "OperationsServicer",
    "Work",
    "check_request_id",
    "page_token",
    "read_page_token",
]

MIG_APPLY = "mig.apply"
PREWARM = "prewarm"
API_KINDS = (MIG_APPLY, PREWARM)
"""Kinds the OperationsService shows; the records of idempotent quick calls stay internal."""

_CALL_KIND = "call:"
_PROGRESS_EVERY_S = 0.5  # each persisted update is an fsync'd SQLite write
_WATCH_RECHECK_S = 5.0
_REQUEST_ID_MAX = 128
_DEFAULT_PAGE = 100
_MAX_PAGE = 1000

M = TypeVar("M", bound=Message)


class Checkpointed(AgentError):
    """Work stopped for the agent's shutdown with its progress saved; its operation stays
    running in the store, to be resumed or reported interrupted on the next start."""


class OperationContext:
    """What a piece of work sees of its operation; used from the worker thread."""

    def __init__(self, runner: OperationRunner, op: Operation) -> None:
        self.op = op
        self._runner = runner
        self._cancel = threading.Event()
        self._latest: operations_pb2.OperationMetadata | None = None
        self._saved_at = 0.0

    @property
    def id(self) -> str:
        return self.op.id

    def progress(self, metadata: operations_pb2.OperationMetadata, *, force: bool = False) -> None:
        """Record progress; persisted at most every 0.5 s unless ``force`` (phase changes)."""
        self._latest = metadata
        now = time.monotonic()
        if force or now - self._saved_at >= _PROGRESS_EVERY_S:
            self._saved_at = now
            self._runner._update(self.id, metadata=message_dict(metadata))

    def latest_metadata(self) -> dict[str, Any] | None:
        return None if self._latest is None else message_dict(self._latest)

    def cancel(self) -> None:
        self._cancel.set()

    def cancelled(self) -> bool:
        """Cancellation was asked for: stop at the next checkpoint, undo what must be undone."""
        return self._cancel.is_set()

    def stopping(self) -> bool:
        """The agent is shutting down: stop soon. Raise `Checkpointed` to leave the operation
        for the next start, or end it as usual (e.g. after rolling back)."""
        return self._runner.stopping


class EndedShort(Exception):
    """Work that did part of what it was asked and must not read as done: the operation ends
    FAILED with ``error``, and keeps ``response`` (what it did) as its ``failed_response``: a
    MIG apply that left a GPU's mode pending or a GPU lost (agent/api/mig.py)."""

    def __init__(self, error: AgentError, response: operations_pb2.OperationResponse) -> None:
        super().__init__(str(error))
        self.error = error
        self.response = response


Work = Callable[[OperationContext], operations_pb2.OperationResponse]


class OperationRunner:
    def __init__(self, store: StateStore, bus: EventBus, *, workers: int = 4) -> None:
        self.store = store
        self._bus = bus
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="operation")
        self._running: dict[str, tuple[OperationContext, Future[None]]] = {}
        self._calls: set[str] = set()  # quick calls in flight, by their record's id
        self._lock = threading.Lock()
        self._changed: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False

    def prune(self, max_age_s: float, keep_per_kind: int) -> None:
        """Bound the state database: done operations and request-id records by age and count."""
        if self.store.read_only is not None:
            return
        try:
            gone = self.store.prune_operations(max_age_s=max_age_s, keep_per_kind=keep_per_kind)
        except sqlite3.Error as exc:  # e.g. the database busy past its timeout: next time
            log.warning("pruning operations failed, retrying later: %s", exc)
            return
        if gone:
            log.info("pruned %d done operation(s) and request-id record(s)", gone)

    def tasks(self, interval_s: float, max_age_s: float, keep_per_kind: int) -> list[Task]:
        """Pruning after the start's own pass."""

        def prune() -> None:
            self.prune(max_age_s, keep_per_kind)

        return [Task("prune-operations", prune, interval_s, needs=Need.WRITABLE, wait_first=True)]

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # -- starting work ----------------------------------------------------------------------------

    async def start(
        self,
        kind: str,
        request_id: str,
        request: Message,
        work: Work,
        metadata: operations_pb2.OperationMetadata | None = None,
        *,
        exclusive: bool = False,
        owner: Actor | None = None,
    ) -> Operation:
        """A new operation running ``work``, or the first one for a retried ``request_id``;
        ``owner`` started it (only an equal or higher role cancels it, agent/owner.py).

        ``exclusive``: one operation of ``kind`` at a time; `AlreadyRunning` (no row written)
        when one is not done.
        """
        check_request_id(request_id)
        await asyncio.to_thread(self.store.require_writable)  # agent/statedir.py
        op = await asyncio.to_thread(
            self.store.create_operation,
            kind,
            request_id=request_id or None,
            request=_request_dict(request),
            metadata=message_dict(metadata) if metadata is not None else None,
            exclusive=exclusive,
            owner=owner.identity if owner is not None else None,
            owner_role=owner.role if owner is not None else None,
        )
        with self._lock:
            fresh = op.state == "pending" and op.id not in self._running
            if fresh:
                if self.stopping:
                    raise AgentError("the agent is shutting down; retry on its next start")
                ctx = OperationContext(self, op)
                self._running[op.id] = (ctx, self._pool.submit(self._run, ctx, work))
        if fresh:
            log.info("operation %s (%s) started", op.id, kind)
            self._publish(op)
        return op

    async def admit(self, kind: str, request_id: str, request: Message) -> Operation | None:
        """Everything `start` could refuse, checked before the caller records anything: a bad
        request id, a reused one, the agent stopping. Returns the first operation of a retried
        ``request_id`` (answer with it and do nothing), None for a new request."""
        check_request_id(request_id)
        if self.stopping:
            raise AgentError("the agent is shutting down; retry on its next start")
        if not request_id:
            return None
        return await asyncio.to_thread(
            self.store.find_request, kind, request_id, _request_dict(request)
        )

    def _run(self, ctx: OperationContext, work: Work) -> None:
        try:
            self._update(ctx.id, state="running")
            response = work(ctx)
        except Checkpointed as exc:
            # Left running on purpose: the next start resumes it or reports it interrupted.
            log.info("operation %s checkpointed at shutdown: %s", ctx.id, exc)
            return
        except EndedShort as exc:
            result = message_dict(exc.response)
            self._finish(ctx, state="failed", error=error_record(exc.error), result=result)
        except Exception as exc:
            if not isinstance(exc, AgentError):
                log.error("bug in operation %s (%s)", ctx.id, ctx.op.kind, exc_info=exc)
            state = "cancelled" if ctx.cancelled() else "failed"
            self._finish(ctx, state=state, error=error_record(exc))
        else:
            self._finish(ctx, state="succeeded", result=message_dict(response))
        finally:
            with self._lock:
                self._running.pop(ctx.id, None)

    def _finish(self, ctx: OperationContext, **fields: Any) -> None:
        latest = ctx.latest_metadata()
        if latest is not None:
            fields["metadata"] = latest
        self._update(ctx.id, **fields)
        log.info("operation %s ended %s", ctx.id, fields["state"])

    def _update(self, op_id: str, **fields: Any) -> None:
        op = self.store.update_operation(op_id, **fields)
        self._publish(op)

    def _publish(self, op: Operation) -> None:
        self._bus.publish(operation=operation_pb(op))
        loop = self._loop
        if loop is not None:
            call_soon_from_thread(loop, self._wake, op.id)

    def _wake(self, op_id: str) -> None:
        event = self._changed.pop(op_id, None)
        if event is not None:
            event.set()

    def _change_event(self, op_id: str) -> asyncio.Event:
        return self._changed.setdefault(op_id, asyncio.Event())

    # -- quick mutating calls ---------------------------------------------------------------------

    async def once(
        self,
        method: str,
        request: Message,
        request_id: str,
        response_type: type[M],
        call: Callable[[], Awaitable[M]],
    ) -> M:
        """Run a quick mutating call once per ``request_id``: a retry gets the first answer.

        Without a request id the call just runs. A failed first attempt changed nothing, so
        its retry runs again.
        """
        # A change the state dir could not record is not made (agent/statedir.py).
        await asyncio.to_thread(self.store.require_writable)
        if not request_id:
            return await call()
        check_request_id(request_id)
        op = await asyncio.to_thread(
            self.store.create_operation,
            _CALL_KIND + method,
            request_id=request_id,
            request=_request_dict(request),
        )
        if op.state == "succeeded" and op.result is not None:
            return response_type.FromString(base64.b64decode(op.result["response"]))
        if op.state in ("pending", "running"):
            with self._lock:
                in_flight = op.id in self._calls
            if in_flight:
                raise Busy(
                    f"the request {request_id!r} is already being processed",
                    [operation_name(op.id)],
                )
        first = op.state == "pending"
        with self._lock:
            self._calls.add(op.id)
        try:
            response = await call()
        except Exception as exc:
            if first:
                await asyncio.to_thread(
                    self.store.update_operation, op.id, state="failed", error=error_record(exc)
                )
            raise
        finally:
            with self._lock:
                self._calls.discard(op.id)
        if first:
            encoded = base64.b64encode(response.SerializeToString()).decode()
            await asyncio.to_thread(
                self.store.update_operation,
                op.id,
                state="succeeded",
                result={"response": encoded, "type": response.DESCRIPTOR.full_name},
            )
        return response

    # -- reading ----------------------------------------------------------------------------------

    async def get(self, op_id: str) -> Operation:
        op = await asyncio.to_thread(self.store.get_operation, op_id)
        if op.kind.startswith(_CALL_KIND):
            raise NotFound(f"operation {op_id!r} does not exist")
        return op

    async def list(
        self, kind: str, done: bool | None, limit: int, after: tuple[float, str] | None = None
    ) -> list[Operation]:
        if kind and kind not in API_KINDS:
            raise InvalidSpec(
                f"unknown operation kind {kind!r}",
                [FieldViolation("kind", f"one of: {', '.join(API_KINDS)}; empty for all")],
            )
        kinds = (kind,) if kind else API_KINDS
        return await asyncio.to_thread(
            self.store.list_operations, kinds=kinds, done=done, limit=limit, after=after
        )

    async def wait(self, op_id: str, timeout_s: float) -> Operation:
        deadline = time.monotonic() + timeout_s
        while True:
            event = self._change_event(op_id)  # before the read, so no change is missed
            op = await self.get(op_id)
            left = deadline - time.monotonic()
            if op.done or left <= 0:
                return op
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(left, _WATCH_RECHECK_S))

    async def watch(self, op_id: str) -> AsyncIterator[Operation]:
        last: Operation | None = None
        while True:
            event = self._change_event(op_id)
            op = await self.get(op_id)
            if op != last:
                yield op
                last = op
            if op.done:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), _WATCH_RECHECK_S)

    async def cancel(self, op_id: str) -> Operation:
        await self.get(op_id)  # NotFound for internal records too
        op = await asyncio.to_thread(self.store.request_cancel, op_id)
        with self._lock:
            running = self._running.get(op_id)
        if running is not None:
            running[0].cancel()
        if not op.done:
            self._publish(op)
        return op

    # -- stopping ---------------------------------------------------------------------------------

    async def shutdown(self, grace_s: float) -> None:
        """Ask running work to checkpoint, wait up to ``grace_s``, then leave the rest: their
        rows stay running and the next start recovers them or reports them interrupted."""
        self.stopping = True
        with self._lock:
            futures = [asyncio.wrap_future(f) for _, f in self._running.values() if f.running()]
        if futures:
            log.info("waiting up to %.0fs for %d operation(s) to checkpoint", grace_s, len(futures))
            await asyncio.wait(futures, timeout=grace_s)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _request_dict(request: Message) -> dict[str, Any]:
    data = message_dict(request)
    data.pop("request_id", None)  # the key, not the request: equal requests have equal text
    return data


_TOKEN_MAX = 512


def _filter_of(kind: str, done: bool | None) -> str:
    return f"{kind}|{'' if done is None else int(done)}"


def page_token(last: Operation, kind: str, done: bool | None) -> str:
    """An opaque cursor after ``last``, bound to the call's filter (google AIP-158)."""
    data = {"t": last.created_at, "id": last.id, "f": _filter_of(kind, done)}
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


def read_page_token(token: str, kind: str, done: bool | None) -> tuple[float, str] | None:
    """The cursor of a page token; InvalidSpec naming page_token when it is not ours or was
    made for another filter."""
    if not token:
        return None
    try:
        if len(token) > _TOKEN_MAX:
            raise ValueError("too long")
        data = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
        created, op_id, where = data["t"], data["id"], data["f"]
        if not isinstance(created, float | int) or not isinstance(op_id, str) or len(op_id) > 64:
            raise ValueError("bad cursor")
        created = float(created)  # an integer of 330 digits overflows here, inside the try
        if not math.isfinite(created):
            raise ValueError("bad cursor")
    except (ValueError, TypeError, KeyError, UnicodeError, OverflowError) as exc:
        raise InvalidSpec(
            "page_token is not a token ListOperations returned",
            [FieldViolation("page_token", "a next_page_token from ListOperations, or empty")],
        ) from exc
    if where != _filter_of(kind, done):
        raise InvalidSpec(
            "page_token was returned for another kind or done filter",
            [
                FieldViolation(
                    "page_token", "use it with the kind and done of the call it came from"
                )
            ],
        )
    return created, op_id


def check_request_id(request_id: str) -> None:
    if len(request_id) > _REQUEST_ID_MAX or not request_id.isprintable():
        raise InvalidSpec(
            "request_id is too long or not printable",
            [FieldViolation("request_id", f"at most {_REQUEST_ID_MAX} printable characters")],
        )


def _timeout_s(
    request: operations_pb2.WaitOperationRequest, context: grpc.aio.ServicerContext
) -> float:
    remaining = context.time_remaining()
    # Answer a little before the caller's deadline, so it gets the operation, not an error.
    limit = float("inf") if remaining is None else max(remaining - 0.05, 0.0)
    if request.HasField("timeout"):
        asked = request.timeout.ToNanoseconds() / 1e9
        if asked < 0:
            raise InvalidSpec(
                "timeout must not be negative", [FieldViolation("timeout", "must be >= 0")]
            )
        return min(asked, limit)
    if remaining is None:
        raise InvalidSpec(
            "WaitOperation needs a timeout or a call deadline",
            [FieldViolation("timeout", "set it, or call with a deadline")],
        )
    return limit


def _shown(op: Operation) -> operations_pb2.Operation:
    """An operation as the caller of this call may see it: no process list unless its role
    sees processes."""
    message = operation_pb(op)
    return message if sees_processes(granted()) else without_processes(message)


class OperationsServicer(operations_pb2_grpc.OperationsServiceServicer):
    def __init__(self, runner: OperationRunner) -> None:
        self._runner = runner

    async def GetOperation(
        self, request: operations_pb2.GetOperationRequest, context: grpc.aio.ServicerContext
    ) -> operations_pb2.GetOperationResponse:
        op = await self._runner.get(operation_id_from(request.name))
        return operations_pb2.GetOperationResponse(operation=_shown(op))

    async def ListOperations(
        self, request: operations_pb2.ListOperationsRequest, context: grpc.aio.ServicerContext
    ) -> operations_pb2.ListOperationsResponse:
        size = request.page_size or _DEFAULT_PAGE
        if not 1 <= size <= _MAX_PAGE:
            raise InvalidSpec(
                f"page_size must be 1-{_MAX_PAGE}, got {request.page_size}",
                [FieldViolation("page_size", f"1-{_MAX_PAGE}, or 0 for {_DEFAULT_PAGE}")],
            )
        done = request.done if request.HasField("done") else None
        after = read_page_token(request.page_token, request.kind, done)
        # One more than the page: whether a next page exists without a second query.
        ops = await self._runner.list(request.kind, done, size + 1, after)
        page, more = ops[:size], len(ops) > size
        token = page_token(page[-1], request.kind, done) if more else ""
        return operations_pb2.ListOperationsResponse(
            operations=[_shown(op) for op in page], next_page_token=token
        )

    async def WaitOperation(
        self, request: operations_pb2.WaitOperationRequest, context: grpc.aio.ServicerContext
    ) -> operations_pb2.WaitOperationResponse:
        op_id = operation_id_from(request.name)
        op = await self._runner.wait(op_id, _timeout_s(request, context))
        return operations_pb2.WaitOperationResponse(operation=_shown(op))

    async def CancelOperation(
        self, request: operations_pb2.CancelOperationRequest, context: grpc.aio.ServicerContext
    ) -> operations_pb2.CancelOperationResponse:
        op_id = operation_id_from(request.name)
        current = await self._runner.get(op_id)
        needed = OPERATION_ROLES.get(current.kind, Role.ADMIN)
        if not allows(granted(), frozenset({needed})):
            raise PermissionDenied(
                f"cancelling operation {request.name!r} needs the role {needed.value} or admin"
            )
        check_may_undo(
            actor_of(context, needed), current.owner_role, f"operation {request.name}", "cancel"
        )
        op = await self._runner.cancel(op_id)
        return operations_pb2.CancelOperationResponse(operation=_shown(op))

    async def WatchOperation(
        self, request: operations_pb2.WatchOperationRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[operations_pb2.WatchOperationResponse]:
        async for op in self._runner.watch(operation_id_from(request.name)):
            yield operations_pb2.WatchOperationResponse(operation=_shown(op))
