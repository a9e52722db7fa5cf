"""Finding the agents: static addresses, a DNS name, and the DaemonSet's pods via Kubernetes."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from agent.coordinator.discovery import (
    AGENT_SELECTOR,
    DnsDiscovery,
    KubeDiscovery,
    StaticDiscovery,
    Target,
)
from agent.coordinator.kube import KubeLister
from agent.errors import InvalidSpec


def test_static_addresses_are_checked_and_kept_in_order() -> None:
    found = asyncio.run(StaticDiscovery(["b:9401", " [::1]:9401", "unix:/run/a.sock"]).targets())
    assert [t.address for t in found] == ["b:9401", "[::1]:9401", "unix:/run/a.sock"]
    with pytest.raises(InvalidSpec, match="not HOST:PORT"):
        StaticDiscovery(["node-1"])
    with pytest.raises(InvalidSpec, match="no agent addresses"):
        StaticDiscovery([" "])


def test_every_address_of_a_dns_name_is_an_agent() -> None:
    async def resolve(name: str, port: int) -> Sequence[str]:
        assert (name, port) == ("gpu-agent-grpc.gpu-agent.svc", 9401)
        return ["10.0.0.2", "10.0.0.1", "10.0.0.2", "fd00::5"]

    found = asyncio.run(DnsDiscovery("gpu-agent-grpc.gpu-agent.svc", resolve=resolve).targets())
    assert [t.address for t in found] == ["10.0.0.1:9401", "10.0.0.2:9401", "[fd00::5]:9401"]


def _pod(name: str, node: str, ip: str | None, ready: bool, phase: str = "Running") -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "ports": [
                        {"name": "metrics", "containerPort": 9400},
                        {"name": "grpc", "containerPort": 9411},
                    ]
                }
            ],
        },
        "status": {
            "phase": phase,
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class FakeApiServer:
    """The two list calls of the Kubernetes API, recording the queries it gets."""

    def __init__(self) -> None:
        self.queries: list[tuple[str, dict[str, list[str]]]] = []
        pods = [
            _pod("gpu-agent-b", "node-b", "10.1.0.7", True),
            _pod("gpu-agent-a", "node-a", "10.1.0.5", True),
            _pod("gpu-agent-c", "node-c", None, False, "Pending"),
        ]
        nodes = [
            {"metadata": {"name": "node-a", "labels": {"pool": "train"}}},
            {"metadata": {"name": "node-b", "labels": {"pool": "serve"}}},
        ]
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                owner.queries.append((url.path, parse_qs(url.query)))
                assert self.headers["Authorization"] == "Bearer t0ken"
                body = {
                    "/api/v1/namespaces/gpu-agent/pods": {"items": pods},
                    "/api/v1/nodes": {"items": nodes},
                }.get(url.path)
                data = json.dumps(body).encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeApiServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def test_kubernetes_discovery_lists_agent_pods_with_their_nodes_labels(
    api_server: FakeApiServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    lister = KubeLister(api_server.url, token)
    found = asyncio.run(KubeDiscovery(lister, "gpu-agent").targets())
    assert found == (
        Target("10.1.0.5:9411", "node-a", {"pool": "train"}, pod="gpu-agent-a"),
        Target("10.1.0.7:9411", "node-b", {"pool": "serve"}, pod="gpu-agent-b"),
        Target("", "node-c", {}, "agent pod gpu-agent-c is Pending with no IP", "gpu-agent-c"),
    )
    path, query = api_server.queries[0]
    assert path == "/api/v1/namespaces/gpu-agent/pods"
    assert query == {"labelSelector": [AGENT_SELECTOR]}
