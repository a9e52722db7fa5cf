"""PrewarmService: warm files and images (agent.prewarm) as an operation; list and evict."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import TypeVar

import grpc

from agent._proto.gpuagent.v1 import operations_pb2, prewarm_pb2, prewarm_pb2_grpc
from agent.api.auth import Role, actor_of
from agent.api.operations import PREWARM, Checkpointed, OperationContext, OperationRunner
from agent.errors import Conflict, FieldViolation, InvalidSpec, PermissionDenied
from agent.owner import Actor
from agent.prewarm.errors import Cancelled, FetchFailed
from agent.prewarm.model import CacheItem, ItemState, Progress
from agent.prewarm.service import PrewarmService
from agent.wire.operations import operation_pb
from agent.wire.prewarm import (
    cache_inventory_pb,
    cache_item_pb,
    item_state_pb,
    prewarm_requests_from,
)

__all__ = ["PrewarmServicer"]

_SERVICE = "/gpuagent.v1.PrewarmService/"
_DONE = (ItemState.READY, ItemState.FAILED, ItemState.EVICTED)
_POLL_S = 0.5
_MAX_ITEM = 256

_ItemRequest = (
    prewarm_pb2.CancelPrewarmItemRequest
    | prewarm_pb2.EvictCacheItemRequest
    | prewarm_pb2.DeletePrewarmItemRequest
    | prewarm_pb2.PinCacheItemRequest
)
_R = TypeVar(
    "_R",
    prewarm_pb2.CancelPrewarmItemResponse,
    prewarm_pb2.EvictCacheItemResponse,
    prewarm_pb2.DeletePrewarmItemResponse,
    prewarm_pb2.PinCacheItemResponse,
)


def _progress(
    items: Sequence[CacheItem], live: dict[str, Progress]
) -> operations_pb2.OperationMetadata:
    entries = []
    for item in items:
        p = live.get(item.id)
        entry = operations_pb2.PrewarmItemProgress(
            item_id=item.id,
            name=item.name,
            state=item_state_pb(item.state),
            done_bytes=p.done_bytes
            if p
            else (item.size or 0 if item.state is ItemState.READY else item.fetched_bytes),
            total_bytes=p.total_bytes if p else item.size,
            rate_bytes_per_second=p.rate_bps if p else 0.0,
            eta_seconds=p.eta_s if p else None,
            retrying=p.retrying if p else "",
        )
        entries.append(entry)
    return operations_pb2.OperationMetadata(
        prewarm=operations_pb2.PrewarmProgress(
            items=entries,
            items_total=len(items),
            items_done=sum(1 for i in items if i.state in _DONE),
        )
    )


class _PrewarmWork:
    """Runs on an operation worker: enqueue the items, follow them, report how they ended."""

    def __init__(self, service: PrewarmService, item_ids: Sequence[str], by: Actor) -> None:
        self._service = service
        self._ids = list(item_ids)
        self._by = by  # who submitted: cancelling the operation cancels only what it may
        self._live: dict[str, Progress] = {}
        self._lock = threading.Lock()

    def _on_progress(self, progress: Progress) -> None:
        if progress.item_id in self._ids:
            with self._lock:
                self._live[progress.item_id] = progress

    def _items(self) -> list[CacheItem]:
        return [self._service.get(i) for i in self._ids]

    def __call__(self, ctx: OperationContext) -> operations_pb2.OperationResponse:
        unsubscribe = self._service.subscribe(self._on_progress)
        try:
            futures: list[Future[CacheItem]] = [self._service.enqueue(i) for i in self._ids]
            while True:
                items = self._items()
                with self._lock:
                    ctx.progress(_progress(items, dict(self._live)))
                if all(i.state in _DONE for i in items):
                    break
                if ctx.cancelled():
                    self._cancel(items)
                    raise Cancelled("prewarm cancelled; partial files were deleted")
                if ctx.stopping():
                    raise Checkpointed("the agent stopped; its items resume on its next start")
                wait_futures(futures, timeout=_POLL_S)
        finally:
            unsubscribe()
        ctx.progress(_progress(items, {}), force=True)
        failed = [i for i in items if i.state is not ItemState.READY]
        if failed:
            raise FetchFailed("; ".join(f"{i.name}: {i.error or i.state.value}" for i in failed))
        return operations_pb2.OperationResponse(
            prewarm=operations_pb2.PrewarmResult(items=[cache_item_pb(i) for i in items])
        )

    def _cancel(self, items: Sequence[CacheItem]) -> None:
        for item in items:
            if item.state not in _DONE:
                # Conflict: it ended meanwhile; PermissionDenied: a higher role's item that this
                # request only joined goes on.
                with contextlib.suppress(Conflict, PermissionDenied):
                    self._service.cancel(item.id, self._by)


def _item_name(value: str) -> str:
    if not value or len(value) > _MAX_ITEM or not value.isprintable():
        raise InvalidSpec(
            "item must name a cache item",
            [FieldViolation("item", f"an item id or name, 1-{_MAX_ITEM} printable characters")],
        )
    return value


class PrewarmServicer(prewarm_pb2_grpc.PrewarmServiceServicer):
    def __init__(
        self, service: PrewarmService, runner: OperationRunner, changed: Callable[[], None]
    ) -> None:
        self._service = service
        self._runner = runner
        self._changed = changed  # refreshes the inventory after a change

    async def SubmitPrewarm(
        self, request: prewarm_pb2.SubmitPrewarmRequest, context: grpc.aio.ServicerContext
    ) -> prewarm_pb2.SubmitPrewarmResponse:
        requests = prewarm_requests_from(request.targets)
        # What could refuse the operation is checked before any item is recorded, so a refused
        # request leaves no queued item behind; a retry gets its first operation, submits nothing.
        first = await self._runner.admit(PREWARM, request.request_id, request)
        if first is not None:
            return prewarm_pb2.SubmitPrewarmResponse(operation=operation_pb(first))
        by = actor_of(context, Role.PREWARM)
        # Validates every target before recording any: a bad one refuses the whole request.
        items = await asyncio.to_thread(self._service.submit_all, requests, by)
        op = await self._runner.start(
            PREWARM,
            request.request_id,
            request,
            _PrewarmWork(self._service, [i.id for i in items], by),
            metadata=_progress(items, {}),
            owner=by,
        )
        self._changed()
        return prewarm_pb2.SubmitPrewarmResponse(operation=operation_pb(op))

    async def ListPrewarmItems(
        self, request: prewarm_pb2.ListPrewarmItemsRequest, context: grpc.aio.ServicerContext
    ) -> prewarm_pb2.ListPrewarmItemsResponse:
        items = await asyncio.to_thread(self._service.items)
        return prewarm_pb2.ListPrewarmItemsResponse(items=[cache_item_pb(i) for i in items])

    async def CancelPrewarmItem(
        self, request: prewarm_pb2.CancelPrewarmItemRequest, context: grpc.aio.ServicerContext
    ) -> prewarm_pb2.CancelPrewarmItemResponse:
        return await self._change_item(
            "CancelPrewarmItem",
            request,
            context,
            prewarm_pb2.CancelPrewarmItemResponse,
            self._service.cancel,
        )

    async def ListCache(
        self, request: prewarm_pb2.ListCacheRequest, context: grpc.aio.ServicerContext
    ) -> prewarm_pb2.ListCacheResponse:
        inv = await asyncio.to_thread(self._service.inventory)
        ready = [i for i in inv.items if i.state is ItemState.READY]
        return prewarm_pb2.ListCacheResponse(cache=cache_inventory_pb(inv.usage, ready))

    async def EvictCacheItem(
        self, request: prewarm_pb2.EvictCacheItemRequest, context: grpc.aio.ServicerContext
    ) -> prewarm_pb2.EvictCacheItemResponse:
        return await self._change_item(
            "EvictCacheItem",
            request,
            context,
            prewarm_pb2.EvictCacheItemResponse,
            self._service.evict,
        )

    async def DeletePrewarmItem(
        self, request: prewarm_pb2.DeletePrewarmItemRequest, context: grpc.aio.ServicerContext
    ) -> prewarm_pb2.DeletePrewarmItemResponse:
        return await self._change_item(
            "DeletePrewarmItem",
            request,
            context,
            prewarm_pb2.DeletePrewarmItemResponse,
            self._service.delete,
        )

    async def PinCacheItem(
        self, request: prewarm_pb2.PinCacheItemRequest, context: grpc.aio.ServicerContext
    ) -> prewarm_pb2.PinCacheItemResponse:
        def pin(item: str, by: Actor) -> CacheItem:
            return self._service.pin(item, request.pinned, by)

        return await self._change_item(
            "PinCacheItem", request, context, prewarm_pb2.PinCacheItemResponse, pin
        )

    async def _change_item(
        self,
        method: str,
        request: _ItemRequest,
        context: grpc.aio.ServicerContext,
        response_type: type[_R],
        change: Callable[[str, Actor], CacheItem],
    ) -> _R:
        """Cancel, evict, delete or pin one item, once per request id; the inventory follows."""
        item = _item_name(request.item)
        by = actor_of(context, Role.PREWARM)

        async def call() -> _R:
            changed = await asyncio.to_thread(change, item, by)
            self._changed()
            return response_type(item=cache_item_pb(changed))

        return await self._runner.once(
            _SERVICE + method, request, request.request_id, response_type, call
        )
