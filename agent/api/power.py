"""PowerService: show, apply and restore the node's power caps (agent.power)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

import grpc

from agent._proto.gpuagent.v1 import power_pb2, power_pb2_grpc
from agent.api.operations import OperationRunner
from agent.power import PowerResult
from agent.power.service import PowerService
from agent.wire.power import power_changes_pb, power_lost_pb, power_view_pb

__all__ = ["PowerServicer"]

_SERVICE = "/gpuagent.v1.PowerService/"
#: the feature the driver guard names per RPC (``<feature> needs the NVIDIA driver``)
_FEATURES = {"GetPower": "power show", "ApplyPower": "power apply", "RestorePower": "power restore"}
_R = TypeVar("_R", power_pb2.ApplyPowerResponse, power_pb2.RestorePowerResponse)


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
        self._guard(_FEATURES["GetPower"])
        return power_view_pb(await asyncio.to_thread(self._power.show))

    async def ApplyPower(
        self, request: power_pb2.ApplyPowerRequest, context: grpc.aio.ServicerContext
    ) -> power_pb2.ApplyPowerResponse:
        apply = functools.partial(self._power.apply, request.spec_yaml)
        return await self._change("ApplyPower", request, power_pb2.ApplyPowerResponse, apply)

    async def RestorePower(
        self, request: power_pb2.RestorePowerRequest, context: grpc.aio.ServicerContext
    ) -> power_pb2.RestorePowerResponse:
        return await self._change(
            "RestorePower", request, power_pb2.RestorePowerResponse, self._power.restore
        )

    async def _change(
        self,
        method: str,
        request: power_pb2.ApplyPowerRequest | power_pb2.RestorePowerRequest,
        response_type: type[_R],
        change: Callable[[], PowerResult],
    ) -> _R:
        """Apply or restore the caps once per request id, while the driver is attached."""
        self._guard(_FEATURES[method])

        async def call() -> _R:
            done = await asyncio.to_thread(change)
            return response_type(
                changes=power_changes_pb(done.changes),
                lost_gpus=power_lost_pb(done.lost),
                unread_gpus=power_lost_pb(done.unread),
            )

        return await self._runner.once(
            _SERVICE + method, request, request.request_id, response_type, call
        )
