"""A node's allocation mode as an agent reports it (GetNode ``Node.allocation``)."""

from __future__ import annotations

from agent._proto.gpuagent.v1 import agent_pb2
from agent.dra.mode import Allocation, AllocationMode

__all__ = ["allocation_of"]

_MODES = {
    agent_pb2.ALLOCATION_MODE_UNSPECIFIED: AllocationMode.UNKNOWN,
    agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN: AllocationMode.DEVICE_PLUGIN,
    agent_pb2.ALLOCATION_MODE_DRA: AllocationMode.DRA,
    agent_pb2.ALLOCATION_MODE_DRA_DYNAMIC_MIG: AllocationMode.DRA_DYNAMIC_MIG,
    agent_pb2.ALLOCATION_MODE_NONE: AllocationMode.NONE,
}


def allocation_of(node: agent_pb2.Node) -> Allocation:
    """An agent from before the field sends none: unknown, and said why."""
    if not node.HasField("allocation"):
        return Allocation(AllocationMode.UNKNOWN, "not reported by this agent (an older version)")
    found = node.allocation
    mode = _MODES.get(found.mode, AllocationMode.UNKNOWN)
    return Allocation(mode, found.evidence, found.dra_driver)
