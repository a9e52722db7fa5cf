"""SharingService: show and change the device plugin's sharing config (agent.sharing)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

import grpc

from agent._proto.gpuagent.v1 import sharing_pb2, sharing_pb2_grpc
from agent.api.auth import Role, granted, sees_processes
from agent.api.operations import OperationRunner
from agent.sharing import ApplyResult
from agent.sharing.service import SharingService
from agent.wire.sharing import (
    change_without_pids,
    keeps_sharing,
    requested_config,
    sharing_change_pb,
    sharing_view_pb,
    without_pids,
)

__all__ = ["SharingServicer"]

_SERVICE = "/gpuagent.v1.SharingService/"
_ChangeRequest = (
    sharing_pb2.SetSharingRequest
    | sharing_pb2.ClearSharingRequest
    | sharing_pb2.RollbackSharingRequest
)
_R = TypeVar(
    "_R",
    sharing_pb2.SetSharingResponse,
    sharing_pb2.ClearSharingResponse,
    sharing_pb2.RollbackSharingResponse,
)


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
        view = sharing_view_pb(await asyncio.to_thread(self._sharing.show))
        return view if sees_processes(granted()) else without_pids(view)

    async def SetSharing(
        self, request: sharing_pb2.SetSharingRequest, context: grpc.aio.ServicerContext
    ) -> sharing_pb2.SetSharingResponse:
        requested = requested_config(request)
        keep = keeps_sharing(request)
        # Sharing is the sharing role's; the plugin's other settings are an admin's.
        admin = Role.ADMIN in granted()
        set_it = functools.partial(
            self._sharing.set, requested, keep_sharing=keep, plugin_settings=admin
        )
        return await self._change("SetSharing", request, sharing_pb2.SetSharingResponse, set_it)

    async def ClearSharing(
        self, request: sharing_pb2.ClearSharingRequest, context: grpc.aio.ServicerContext
    ) -> sharing_pb2.ClearSharingResponse:
        return await self._change(
            "ClearSharing", request, sharing_pb2.ClearSharingResponse, self._sharing.clear
        )

    async def RollbackSharing(
        self, request: sharing_pb2.RollbackSharingRequest, context: grpc.aio.ServicerContext
    ) -> sharing_pb2.RollbackSharingResponse:
        admin = Role.ADMIN in granted()  # a rollback restores the plugin's settings too
        rollback = functools.partial(self._sharing.rollback, plugin_settings=admin)
        return await self._change(
            "RollbackSharing", request, sharing_pb2.RollbackSharingResponse, rollback
        )

    async def _change(
        self,
        method: str,
        request: _ChangeRequest,
        response_type: type[_R],
        change: Callable[[], ApplyResult],
    ) -> _R:
        """Set, clear or roll back the sharing once per request id; the inventory follows a
        change."""

        async def call() -> _R:
            result = await asyncio.to_thread(change)
            if result.changed:
                self._changed()
            return response_type(change=sharing_change_pb(result))

        answer = await self._runner.once(
            _SERVICE + method, request, request.request_id, response_type, call
        )
        if sees_processes(granted()):
            return answer
        # The sharing role acts on the plugin without seeing processes: not its pids either.
        return response_type(change=change_without_pids(answer.change))
