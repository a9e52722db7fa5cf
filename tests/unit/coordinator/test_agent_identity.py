"""The coordinator checks that the agent it dials is the one Kubernetes runs on that node: each
agent's serving certificate names its own pod, and a certificate naming another pod is refused
by the TLS handshake (real gRPC over TCP with mTLS, certificates made with openssl)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc
from agent.api.auth import Policy, Role
from agent.api.interceptor import ApiInterceptor
from agent.client import ClientTls
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import KubeDiscovery, Target
from agent.coordinator.kube import AgentPod
from agent.errors import InvalidSpec
from agent.wire.node import node_from
from tests.unit.api.support import COORDINATOR, Identity, Pki

SERVER_NAME = "{pod}.gpu-agent-grpc.gpu-agent.svc"  # the coordinator's default with --kubernetes


def pod_identity(pki: Pki, pod: str) -> Identity:
    """What cert-manager's CSI driver issues to an agent pod (agent-daemonset.yaml)."""
    return pki.issue(
        pod,
        f"DNS:{pod}.gpu-agent-grpc.gpu-agent.svc,URI:spiffe://cluster.local/ns/gpu-agent/pod/{pod}",
    )


class Node(agent_pb2_grpc.NodeServiceServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    async def GetNode(
        self, request: agent_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.GetNodeResponse:
        return agent_pb2.GetNodeResponse(node=agent_pb2.Node(name=self.name))


async def serve(pki: Pki, node: str, identity: Identity) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=[ApiInterceptor(Policy.of({Role.ADMIN: [COORDINATOR]}))])
    agent_pb2_grpc.add_NodeServiceServicer_to_server(Node(node), server)
    credentials = grpc.ssl_server_credentials(
        [(identity.key.read_bytes(), identity.cert.read_bytes())],
        root_certificates=pki.ca.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)  # grpc binds and reports it
    await server.start()
    return server, port


class Lister:
    """The two reads KubeDiscovery makes of the Kubernetes API."""

    def __init__(self, pods: tuple[AgentPod, ...]) -> None:
        self.pods = pods

    def agent_pods(self, namespace: str, label_selector: str) -> tuple[AgentPod, ...]:
        return self.pods

    def node_labels_all(self) -> Mapping[str, Mapping[str, str]]:
        return {}


async def _fleet(pki: Pki) -> None:
    # node-b's agent presents node-a's certificate and key (one node's stolen key).
    stolen = pod_identity(pki, "gpu-agent-aaaaa")
    a, port_a = await serve(pki, "node-a", stolen)
    b, port_b = await serve(pki, "node-b", stolen)
    pods = (
        AgentPod("gpu-agent-aaaaa", "node-a", "127.0.0.1", "Running", True, port_a),
        AgentPod("gpu-agent-bbbbb", "node-b", "127.0.0.1", "Running", True, port_b),
    )
    discovery = KubeDiscovery(Lister(pods), "gpu-agent")  # type: ignore[arg-type]
    tls = ClientTls(pki.coordinator.cert, pki.coordinator.key, pki.ca, SERVER_NAME)
    fleet = Fleet(discovery, tls, timeout_s=5.0)
    try:
        views = {v.name: v for v in await fleet.views()}
        assert views["node-a"].reachable, views["node-a"].error
        assert not views["node-b"].reachable
        assert views["node-b"].address == f"127.0.0.1:{port_b}"
        assert "Hostname Verification Check failed" in (views["node-b"].error or "")
    finally:
        await fleet.close()
        await a.stop(None)
        await b.stop(None)


def test_an_agent_whose_certificate_names_another_node_is_refused(tmp_path: Path) -> None:
    asyncio.run(_fleet(Pki(tmp_path)))


def test_a_per_agent_name_needs_the_pod_it_names() -> None:
    tls = ClientTls(Path("c"), Path("k"), Path("ca"), SERVER_NAME)
    target = Target("10.0.0.7:9401", "node-a", pod="gpu-agent-x1")
    assert tls.name_for(target) == "gpu-agent-x1.gpu-agent-grpc.gpu-agent.svc"
    with pytest.raises(InvalidSpec) as caught:
        tls.name_for(Target("10.0.0.7:9401", "node-a"))  # DNS or static discovery: no pod
    assert [v.field for v in caught.value.violations] == ["server_name"]
    assert ClientTls(Path("c"), Path("k"), Path("ca"), "agents.example").name_for(target) == (
        "agents.example"
    )
    by_node = ClientTls(Path("c"), Path("k"), Path("ca"), "{node}.agents.example")
    assert by_node.name_for(target) == "node-a.agents.example"
    with pytest.raises(InvalidSpec):
        by_node.name_for(Target("10.0.0.7:9401"))


def test_an_agent_that_hides_processes_is_not_planned_on() -> None:
    """A coordinator holding only read sees no processes; it must not take GPUs for idle."""
    from agent.coordinator.fleet.inventory import node_view

    hidden = agent_pb2.Node(name="node-a", processes_hidden=True, gpus=[agent_pb2.Gpu(index=0)])
    view = node_view(Target("10.0.0.7:9401", "node-a", pod="gpu-agent-x1"), node_from(hidden))
    assert view.reachable and not view.plannable
    assert "mig or admin role" in view.why_not_plannable
    shown = node_view(Target("10.0.0.7:9401", "node-a"), node_from(agent_pb2.Node(name="node-a")))
    assert shown.reachable
