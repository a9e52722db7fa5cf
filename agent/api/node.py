"""NodeService: the node inventory, served from the background-refreshed snapshot."""

from __future__ import annotations

import grpc

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc
from agent.api.auth import granted, sees_processes
from agent.api.inventory import NodeInventory

__all__ = ["NodeServicer"]


class NodeServicer(agent_pb2_grpc.NodeServiceServicer):
    def __init__(self, inventory: NodeInventory) -> None:
        self._inventory = inventory

    async def GetNode(
        self, request: agent_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.GetNodeResponse:
        return self._inventory.response(processes=sees_processes(granted()))
