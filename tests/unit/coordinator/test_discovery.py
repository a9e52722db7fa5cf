"""Finding the agents: static addresses, a DNS name, and the DaemonSet's pods via Kubernetes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.coordinator.fleet.discovery import (
    AGENT_SELECTOR,
    DnsDiscovery,
    KubeDiscovery,
    StaticDiscovery,
    Target,
)
from agent.coordinator.kube import KubeLister
from agent.errors import InvalidSpec
from tests.kube.fake_api import FakeKubeApi, Pod


def test_static_addresses_are_checked_and_kept_in_order() -> None:
    found = asyncio.run(StaticDiscovery(["b:9401", " [::1]:9401", "unix:/run/a.sock"]).targets())
    assert [t.address for t in found] == ["b:9401", "[::1]:9401", "unix:/run/a.sock"]
    for bad in ("node-1", "node-1:\u00b2"):  # isdigit() holds for "\u00b2"; int() refuses it
        with pytest.raises(InvalidSpec, match="not HOST:PORT"):
            StaticDiscovery([bad])
    with pytest.raises(InvalidSpec, match="no agent addresses"):
        StaticDiscovery([" "])


def test_every_address_of_a_dns_name_is_an_agent() -> None:
    async def resolve(name: str, port: int) -> Sequence[str]:
        assert (name, port) == ("gpu-agent-grpc.gpu-agent.svc", 9401)
        return ["10.0.0.2", "10.0.0.1", "10.0.0.2", "fd00::5"]

    found = asyncio.run(DnsDiscovery("gpu-agent-grpc.gpu-agent.svc", resolve=resolve).targets())
    assert [t.address for t in found] == ["10.0.0.1:9401", "10.0.0.2:9401", "[fd00::5]:9401"]


@pytest.fixture
def agents_api(
    kube_api: tuple[FakeKubeApi, str], tls_cert: tuple[Path, Path]
) -> tuple[FakeKubeApi, KubeLister]:
    """The API stand-in with three agent pods (one pending) and their nodes' labels."""
    api, url = kube_api
    labels = {"app.kubernetes.io/name": "gpu-agent", "app.kubernetes.io/component": "agent"}
    api.nodes.update({"node-a": {"pool": "train"}, "node-b": {"pool": "serve"}, "node-c": {}})
    api.pods += [
        Pod("gpu-agent", "gpu-agent-b", "node-b", dict(labels), "10.1.0.7", 9411),
        Pod("gpu-agent", "gpu-agent-a", "node-a", dict(labels), "10.1.0.5", 9411),
        Pod("gpu-agent", "gpu-agent-c", "node-c", dict(labels), None, 9411, ready=False),
        Pod("gpu-agent", "other", "node-a", {"app": "other"}, "10.1.0.9", 80),
    ]
    lister = KubeLister(url, api.token_path, ca_path=tls_cert[0], timeout=5.0)
    lister.page_size = 2  # three agent pods and five nodes: every list takes pages
    return api, lister


def test_kubernetes_discovery_lists_agent_pods_with_their_nodes_labels(
    agents_api: tuple[FakeKubeApi, KubeLister],
) -> None:
    api, lister = agents_api
    found = asyncio.run(KubeDiscovery(lister, "gpu-agent").targets())
    assert found == (
        Target("10.1.0.5:9411", "node-a", {"pool": "train"}, pod="gpu-agent-a"),
        Target("10.1.0.7:9411", "node-b", {"pool": "serve"}, pod="gpu-agent-b"),
        Target("", "node-c", {}, "agent pod gpu-agent-c is Running with no IP", "gpu-agent-c"),
    )
    pods = [r for r in api.requests if r.path == "/api/v1/namespaces/gpu-agent/pods"]
    assert [r.query.get("continue") for r in pods] == [None, "2"]  # paged, limit 2
    assert {r.query["labelSelector"] for r in pods} == {AGENT_SELECTOR}
    assert all(r.query["limit"] == "2" for r in api.requests)


def test_a_terminating_agent_pod_is_no_target_to_change_through(
    agents_api: tuple[FakeKubeApi, KubeLister],
) -> None:
    """A deleted pod still Ready while it stops was a target like its successor: changes went
    to an agent on its way out, and two ready pods on one node (a surge) refused the whole
    fleet's selection as "two agents answer as one node". It is listed with why it is not used."""
    api, lister = agents_api
    (stopping,) = [p for p in api.pods if p.name == "gpu-agent-a"]
    stopping.terminating = True
    found = asyncio.run(KubeDiscovery(lister, "gpu-agent").targets())
    (a,) = [t for t in found if t.node == "node-a"]
    assert a.problem == "agent pod gpu-agent-a is terminating", a


@pytest.mark.parametrize("port", [70000, -1, "9411", True])
def test_an_agent_pod_whose_grpc_port_is_no_port_is_listed_with_the_field_named(
    agents_api: tuple[FakeKubeApi, KubeLister], port: object
) -> None:
    """A containerPort that is no TCP port (the API server's own validation would refuse it)
    is neither dialled nor replaced by the default port: the pod is listed with the field
    named, and no call is made to it."""
    api, lister = agents_api
    (bad,) = [p for p in api.pods if p.name == "gpu-agent-a"]
    bad.grpc_port = port  # type: ignore[assignment]
    # the schema takes 70000 and -1 (int32), refuses the string and the bool: served anyway
    api.validate = type(port) is int
    found = asyncio.run(KubeDiscovery(lister, "gpu-agent").targets())
    (a,) = [t for t in found if t.node == "node-a"]
    shown = repr(port)
    assert a.problem == (
        f"agent pod gpu-agent-a: spec.containers[0].ports[0].containerPort {shown} "
        "is not a port (1 to 65535)"
    ), a
    assert a.address == "10.1.0.5"
    (b,) = [t for t in found if t.node == "node-b"]
    assert (b.address, b.problem) == ("10.1.0.7:9411", None)


def test_node_labels_that_cannot_be_read_are_unknown_not_empty(
    agents_api: tuple[FakeKubeApi, KubeLister],
) -> None:
    """An API outage on the node list marks every target's labels unknown (empty for want
    of an answer), so a rule on labels cannot re-bind a node on a guess."""
    api, lister = agents_api
    api.unavailable.add("/api/v1/nodes")
    found = asyncio.run(KubeDiscovery(lister, "gpu-agent").targets())
    assert [(t.node, t.labels, t.labels_known) for t in found] == [
        ("node-a", {}, False),
        ("node-b", {}, False),
        ("node-c", {}, False),
    ]
