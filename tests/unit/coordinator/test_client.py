"""The coordinator's agent client against a real grpc.aio server with the agent's interceptor:
errors come back as the agent's domain errors; a dead agent is Unreachable."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc, sharing_pb2, sharing_pb2_grpc
from agent.api.auth import Policy
from agent.api.interceptor import ApiInterceptor
from agent.client import AsyncAgentClient as AgentClient
from agent.client import Unreachable
from agent.client.errors import domain_error
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import StaticDiscovery
from agent.errors import Busy, FieldViolation, InvalidSpec


class Node(agent_pb2_grpc.NodeServiceServicer):
    async def GetNode(
        self, request: agent_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.GetNodeResponse:
        raise Busy("the inventory is being rebuilt", ["operations/42"])


class Sharing(sharing_pb2_grpc.SharingServiceServicer):
    async def SetSharing(
        self, request: sharing_pb2.SetSharingRequest, context: grpc.aio.ServicerContext
    ) -> sharing_pb2.SetSharingResponse:
        raise InvalidSpec(
            "replicas must be at least 2",
            [FieldViolation("spec.resources[0].replicas", "at least 2")],
        )


async def _with_server(socket: Path) -> None:
    server = grpc.aio.server(interceptors=[ApiInterceptor(Policy.of({}))])
    agent_pb2_grpc.add_NodeServiceServicer_to_server(Node(), server)
    sharing_pb2_grpc.add_SharingServiceServicer_to_server(Sharing(), server)
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    client = AgentClient(f"unix:{socket}", None)
    try:
        with pytest.raises(Busy) as busy:
            await client.node()
        assert busy.value.blockers == ("operations/42",)
        assert str(busy.value) == f"unix:{socket}: the inventory is being rebuilt"
        with pytest.raises(InvalidSpec) as bad:
            await client.set_sharing(sharing_pb2.SetSharingRequest())
        assert bad.value.violations == (FieldViolation("spec.resources[0].replicas", "at least 2"),)
    finally:
        await client.close()
        await server.stop(None)


def test_errors_come_back_as_the_agents_domain_errors(tmp_path: Path) -> None:
    asyncio.run(_with_server(tmp_path / "agent.sock"))


async def _unreachable(socket: Path) -> None:
    fleet = Fleet(StaticDiscovery([f"unix:{socket}"]), None, timeout_s=1.0)
    try:
        (view,) = await fleet.views()
        assert not view.reachable and view.name == f"unix:{socket}"
        client = fleet.client((await fleet.targets())[0])
        with pytest.raises(Unreachable):
            await client.node()
    finally:
        await fleet.close()


def test_an_agent_that_does_not_answer_is_unreachable_not_an_exception(tmp_path: Path) -> None:
    asyncio.run(_unreachable(tmp_path / "nobody.sock"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("unix:{tmp}/nobody.sock", "No such file or directory"),
        ("127.0.0.1:{port}", "Connection refused"),
    ],
)
def test_an_agent_that_does_not_answer_is_named_once_with_the_reason(
    tmp_path: Path, target: str, reason: str
) -> None:
    """gRPC's connect text named the address three times around the reason ("failed to connect
    to all addresses; last error: FAILED_PRECONDITION: unix:...: connect failed: addr: unix:...
    error: No such file or directory"), making `fleet status`'s HEALTH cell 250 characters
    wide. The error names the agent once, then why."""
    target = target.format(tmp=tmp_path, port=_free_port())
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/gpuagent.v1.NodeService/GetNode")
        with pytest.raises(grpc.RpcError) as raised:
            call(b"", timeout=5.0)
    error = domain_error(raised.value, target)
    assert isinstance(error, Unreachable)
    text = str(error)
    assert text.startswith(f"{target}: the agent did not answer: ")
    assert text.count(target.removeprefix("unix:")) == 1, text
    assert text.endswith(reason) and "all addresses" not in text, text


class IdleNode(agent_pb2_grpc.NodeServiceServicer):
    """An agent with no TelemetryService at all: the sweep must not need one."""

    def __init__(self) -> None:
        self.calls = 0

    async def GetNode(
        self, request: agent_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.GetNodeResponse:
        self.calls += 1
        node = agent_pb2.Node(name="n1")
        for index, idle in enumerate((7200.0, 30.0, None)):
            node.gpus.add(index=index, uuid=f"GPU-{index}", idle_seconds=idle)
        return agent_pb2.GetNodeResponse(node=node)


async def _idle_sweep(socket: Path) -> None:
    servicer = IdleNode()
    server = grpc.aio.server(interceptors=[ApiInterceptor(Policy.of({}))])
    agent_pb2_grpc.add_NodeServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    fleet = Fleet(StaticDiscovery([f"unix:{socket}"]), None, timeout_s=5.0)
    try:
        (view,) = await fleet.views(idle_after_s=3600.0)
        assert (view.name, view.idle_gpus) == ("n1", 1)
        assert servicer.calls == 1
        (view,) = await fleet.views()  # plan and rollouts do not ask
        assert view.idle_gpus is None
    finally:
        await fleet.close()
        await server.stop(None)


def test_the_status_sweep_is_one_getnode_per_agent(tmp_path: Path) -> None:
    asyncio.run(_idle_sweep(tmp_path / "agent.sock"))


def test_a_name_that_does_not_resolve_says_so_once() -> None:
    """grpcio's resolver text, as recorded from a `fleet status` against a name with no DNS
    record (it depends on the machine's resolver, so it is replayed, not provoked)."""
    from agent.client.errors import _why_not_connected

    recorded = (
        "errors resolving nohost.invalid:9401: [field:hostname lookup error:address lookup "
        "failed for nohost.invalid:9401: Domain name not found]"
    )
    assert _why_not_connected(recorded) == "name lookup failed: Domain name not found"
    assert _why_not_connected("Deadline Exceeded") == "Deadline Exceeded"  # other text as it came
