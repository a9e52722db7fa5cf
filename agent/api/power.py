"""PowerService: show, apply and restore the node's power caps (agent.power)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from agent._proto.gpuagent.v1 import power_pb2, power_pb2_grpc
from agent.api.operations import OperationRunner
from agent.power import PowerService
from agent.wire.power import power_changes_pb, power_view_pb

__all__ = ["PowerServicer"]

_SERVICE = "/gpuagent.v1.PowerService/"
_FEATURE = "power caps"


class PowerServicer(power_pb2_grpc.PowerServiceServicer):
    def __init__(
        self, power: PowerService, runner: OperationRunner, gpu_guard: Callable[[str], None]
    ) -> None:
        self._power = power
        self._runner = runner
        self._guard = gpu_guard  # DriverNotReady while the driver is not attached

    async def GetPower(
        self, request: power_pb2.GetPowerRequest, context: grpc.aio.ServicerContext
    ) -> power_pb2.GetPowerResponse:
        self._guard(_FEATURE)
        return power_view_pb(await asyncio.to_thread(self._power.show))

    async def ApplyPower(
        self, request: power_pb2.ApplyPowerRequest, context: grpc.aio.ServicerContext
    ) -> power_pb2.ApplyPowerResponse:
        self._guard(_FEATURE)

        async def call() -> power_pb2.ApplyPowerResponse:
            changes = await asyncio.to_thread(self._power.apply, request.spec_yaml)
            return power_pb2.ApplyPowerResponse(changes=power_changes_pb(changes))

        return await self._runner.once(
            _SERVICE + "ApplyPower",
            request,
            request.request_id,
            power_pb2.ApplyPowerResponse,
            call,
        )

    async def RestorePower(
        self, request: power_pb2.RestorePowerRequest, context: grpc.aio.ServicerContext
    ) -> power_pb2.RestorePowerResponse:
        self._guard(_FEATURE)

        async def call() -> power_pb2.RestorePowerResponse:
            changes = await asyncio.to_thread(self._power.restore)
            return power_pb2.RestorePowerResponse(changes=power_changes_pb(changes))

        return await self._runner.once(
            _SERVICE + "RestorePower",
            request,
            request.request_id,
            power_pb2.RestorePowerResponse,
            call,
        )
