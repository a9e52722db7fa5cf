"""``gpu-agent share`` on a DRA node, as a user runs it: the CLI over the agent's real gRPC
sharing API (Unix socket), the SharingService behind it writing DeviceClasses to the
Kubernetes API stand-in over HTTPS. The stand-in validates like the API server."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from click.testing import CliRunner, Result

from agent._proto.gpuagent.v1 import sharing_pb2_grpc
from agent.api.auth import Policy
from agent.api.events import EventBus
from agent.api.interceptor import ApiInterceptor
from agent.api.operations import OperationRunner
from agent.api.sharing import SharingServicer
from agent.cli.share import RemoteSharing, share
from agent.client.sync import AgentClient
from agent.config import SharingSettings
from agent.dra.mode import Allocation, AllocationMode
from agent.kube import InClusterKubeClient
from agent.sharing.service import SharingService
from agent.state import StateStore
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.sharing.layouts import node

DRA = Allocation(AllocationMode.DRA, "ResourceSlices of gpu.nvidia.com", "gpu.nvidia.com")


@dataclass
class Obj:
    remote: RemoteSharing

    def sharing_service(self) -> RemoteSharing:
        return self.remote


@pytest.fixture
def agent_socket(tmp_path: Path, kube: InClusterKubeClient) -> Iterator[Path]:
    """The sharing API of an agent on a DRA node, served on a Unix socket from a thread."""
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    service = SharingService(
        SharingSettings(config_path=plugin_dir / "config.yaml", reload="none"),
        lambda: node(8),
        kube,
        node_name=NODE,
        allocation=lambda: DRA,
    )
    sock = tmp_path / "agent.sock"
    loop = asyncio.new_event_loop()
    ready, stop = threading.Event(), asyncio.Event()

    async def serve() -> None:
        runner = OperationRunner(StateStore(tmp_path / "agent.db"), EventBus())
        runner.bind(asyncio.get_running_loop())
        server = grpc.aio.server(interceptors=[ApiInterceptor(Policy.of({}))])
        sharing_pb2_grpc.add_SharingServiceServicer_to_server(
            SharingServicer(service, runner, lambda: None), server
        )
        server.add_insecure_port(f"unix:{sock}")
        await server.start()
        ready.set()
        await stop.wait()
        await server.stop(None)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield sock
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def cli(sock: Path, *args: str) -> Result:
    client = AgentClient(sock)
    try:
        return CliRunner().invoke(share, list(args), obj=Obj(RemoteSharing(client)))
    finally:
        client.close()


def classes(api: FakeKubeApi) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in api.dra("deviceclasses")}


def test_share_on_a_dra_node_creates_device_classes_and_clear_leaves_them(
    agent_socket: Path, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    first = cli(agent_socket, "set", "--time-slicing", "nvidia.com/gpu=4")
    assert first.exit_code == 0, first.output
    assert "gpu-agent-time-slicing-gpu  created" in first.stdout
    assert "4 is not enforced" in first.stdout
    assert list(classes(api)) == ["gpu-agent-time-slicing-gpu"]

    second = cli(agent_socket, "set", "--mps", "nvidia.com/gpu=4", "-o", "json")
    assert second.exit_code == 0, second.output
    data = json.loads(second.stdout)
    assert data["dra"]["mode"] == "dra"
    assert [(o["name"], o["state"]) for o in data["dra"]["objects"]] == [
        ("gpu-agent-mps-gpu-25pct", "created")
    ]
    stored = classes(api)["gpu-agent-mps-gpu-25pct"]
    assert stored["spec"]["config"][0]["opaque"]["parameters"]["sharing"] == {
        "strategy": "MPS",
        "mpsConfig": {"defaultActiveThreadPercentage": 25},
    }

    shown = cli(agent_socket, "show", "-o", "yaml")
    assert shown.exit_code == 0, shown.output
    view = yaml.safe_load(shown.stdout)
    assert [(o["name"], o["state"]) for o in view["dra"]["objects"]] == [
        ("gpu-agent-mps-gpu-25pct", "present")
    ]
    assert view["strategy"] == "mps" and view["advertised"] == []

    cleared = cli(agent_socket, "clear")
    assert cleared.exit_code == 0, cleared.output
    # other nodes may use them: no node deletes a class (docs/dra.md, "Several nodes, one class")
    assert sorted(classes(api)) == ["gpu-agent-mps-gpu-25pct", "gpu-agent-time-slicing-gpu"]
    back = cli(agent_socket, "rollback")
    assert back.exit_code == 0, back.output
    assert "gpu-agent-mps-gpu-25pct  unchanged" in back.stdout


def test_a_spec_the_driver_cannot_take_is_refused_by_field_over_the_api(
    agent_socket: Path, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    result = cli(agent_socket, "set", "--time-slicing", "gpu=4", "--rename-by-default")
    assert result.exit_code == 2, result.output
    assert "sharing.timeSlicing.renameByDefault" in result.output
    assert classes(api) == {}
