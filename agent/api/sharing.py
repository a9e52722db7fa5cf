"""SharingService: show and change the device plugin's sharing config (agent.sharing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from agent._proto.gpuagent.v1 import sharing_pb2, sharing_pb2_grpc
from agent.api.operations import OperationRunner
from agent.sharing import ApplyResult, SharingService
from agent.wire.sharing import requested_config, sharing_change_pb, sharing_view_pb

__all__ = ["SharingServicer"]

_SERVICE = "/gpuagent.v1.SharingService/"


class SharingServicer(sharing_pb2_grpc.SharingServiceServicer):
    def __init__(
        self, sharing: SharingService, runner: OperationRunner, changed: Callable[[], None]
    ) -> None:
        self._sharing = sharing
        self._runner = runner
        self._changed = changed  # refreshes the inventory after a write

    async def GetSharing(
        self, request: sharing_pb2.GetSharingRequest, context: grpc.aio.ServicerContext
    ) -> sharing_pb2.GetSharingResponse:
        return sharing_view_pb(await asyncio.to_thread(self._sharing.show))

    async def SetSharing(
        self, request: sharing_pb2.SetSharingRequest, context: grpc.aio.ServicerContext
    ) -> sharing_pb2.SetSharingResponse:
        requested = requested_config(request)

        async def call() -> sharing_pb2.SetSharingResponse:
            result = await self._apply(lambda: self._sharing.set(requested))
            return sharing_pb2.SetSharingResponse(change=result)

        return await self._runner.once(
            _SERVICE + "SetSharing",
            request,
            request.request_id,
            sharing_pb2.SetSharingResponse,
            call,
        )

    async def ClearSharing(
        self, request: sharing_pb2.ClearSharingRequest, context: grpc.aio.ServicerContext
    ) -> sharing_pb2.ClearSharingResponse:
        async def call() -> sharing_pb2.ClearSharingResponse:
            return sharing_pb2.ClearSharingResponse(change=await self._apply(self._sharing.clear))

        return await self._runner.once(
            _SERVICE + "ClearSharing",
            request,
            request.request_id,
            sharing_pb2.ClearSharingResponse,
            call,
        )

    async def RollbackSharing(
        self, request: sharing_pb2.RollbackSharingRequest, context: grpc.aio.ServicerContext
    ) -> sharing_pb2.RollbackSharingResponse:
        async def call() -> sharing_pb2.RollbackSharingResponse:
            change = await self._apply(self._sharing.rollback)
            return sharing_pb2.RollbackSharingResponse(change=change)

        return await self._runner.once(
            _SERVICE + "RollbackSharing",
            request,
            request.request_id,
            sharing_pb2.RollbackSharingResponse,
            call,
        )

    async def _apply(self, change: Callable[[], ApplyResult]) -> sharing_pb2.SharingChange:
        result = await asyncio.to_thread(change)
        if result.changed:
            self._changed()
        return sharing_change_pb(result)
