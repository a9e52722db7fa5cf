"""NodeService: the node inventory, served from the background-refreshed snapshot, and the
doctor's checks (run by agent/doctor, handed in by the composition root)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc
from agent.api.auth import granted, sees_processes
from agent.api.inventory import NodeInventory
from agent.wire.doctor import DoctorReport, doctor_pb

__all__ = ["NodeServicer"]


class NodeServicer(agent_pb2_grpc.NodeServiceServicer):
    def __init__(
        self, inventory: NodeInventory, doctor: Callable[[], DoctorReport] | None = None
    ) -> None:
        self._inventory = inventory
        self._doctor = doctor

    async def GetNode(
        self, request: agent_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.GetNodeResponse:
        return self._inventory.response(processes=sees_processes(granted()))

    async def Doctor(
        self, request: agent_pb2.DoctorRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.DoctorResponse:
        """Blocking reads (NVML, the API server, files) on a thread, bounded by the runner."""
        if self._doctor is None:
            return agent_pb2.DoctorResponse()
        return doctor_pb(await asyncio.to_thread(self._doctor))
