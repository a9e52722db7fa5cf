"""A GPU whose process list (and so its planner's layout) cannot be read: never shown as read.

The whole agent on the simulated driver, GetNode over its socket. The reviewer's repro: a
process on GPU 0, then `nvmlDeviceGetComputeRunningProcesses_v3` failing there. A running
agent kept serving the last list (frozen), and one that never read the GPU served its
placeholder: memory 0 B, PCI device id 0, no instances, no processes, nothing degraded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc
from agent.cli.status import _table, status_view
from agent.gpu.sim import SimControl, open_simulator
from agent.wire.doctor import CheckState
from agent.wire.node import node_from
from tests.unit.api.support import InProcessAgent, agent_config, unix_channel, wait_for

pytestmark = pytest.mark.integration

CALL = "nvmlDeviceGetComputeRunningProcesses"


def _node(socket: Path) -> agent_pb2.Node:
    with unix_channel(socket) as channel:
        return agent_pb2_grpc.NodeServiceStub(channel).GetNode(agent_pb2.GetNodeRequest()).node


def _component(node: agent_pb2.Node, name: str) -> agent_pb2.ComponentHealth:
    return next(c for c in node.health.components if c.name == name)


def test_a_process_list_that_fails_is_unknown_never_stale_and_degrades_naming_gpu_and_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "agent"
    config = agent_config(root, telemetry={"interval_s": 0.2})
    with InProcessAgent(root, config) as agent:
        control = SimControl(root / "state")
        control.start_process(4242, 0, used_memory_mib=2048)
        wait_for(lambda: [p.pid for p in _node(agent.socket).gpus[0].processes] == [4242], "", 10)
        memory = _node(agent.socket).gpus[0].memory_total_bytes
        control.inject_fault(f"{CALL}_v3", "Unknown", count=1_000_000, gpu=0)
        control.stop_process(4242)  # gone meanwhile: the frozen list kept it "running"
        gpu = wait_for(lambda: (g := _node(agent.socket).gpus[0]).unread and g, "GPU 0 unread", 10)
        assert CALL in gpu.unread and "Unknown" in gpu.unread
        assert list(gpu.processes) == [] and not gpu.never_read
        assert gpu.memory_total_bytes == memory  # read before: as last read
        node = _node(agent.socket)
        assert (
            f"GPU 0 not read: processes and layout: {CALL}" in _component(node, "gpu-driver").detail
        )
        telemetry = _component(node, "telemetry")
        assert not telemetry.healthy and f"processes: GPU 0: processes and layout: {CALL}" in (
            telemetry.detail
        )
        data = status_view(node_from(node))
        assert data["gpus"][0]["processes"] is None and data["gpus"][1]["processes"] == []
        assert f"GPU 0: not read (processes and layout: {CALL}" in _table(data)
        said = [r for r in caplog.records if "its processes unknown" in r.getMessage()]
        assert len(said) == 1, "said once, not every tick"
        control.clear_faults()
        wait_for(lambda: not _node(agent.socket).gpus[0].unread, "GPU 0 read again", 10)
        assert _component(_node(agent.socket), "gpu-driver").healthy


def test_a_gpu_whose_layout_was_never_read_has_unknown_memory_mig_and_instances(
    tmp_path: Path,
) -> None:
    root = tmp_path / "agent"
    config = agent_config(root, telemetry={"interval_s": 0.2})
    open_simulator(root / "state", "dgx-h100")
    control = SimControl(root / "state")
    control.start_process(4242, 0, used_memory_mib=2048)
    control.inject_fault(f"{CALL}_v3", "Unknown", count=1_000_000, gpu=0)
    with InProcessAgent(root, config) as agent:
        gpu = wait_for(lambda: (g := _node(agent.socket).gpus[0]).unread and g, "GPU 0 unread", 10)
        assert gpu.never_read and list(gpu.processes) == []
        data = status_view(node_from(_node(agent.socket)))
        view = data["gpus"][0]
        assert view["memory_total_bytes"] is None and view["pci_device_id"] is None
        assert view["instances"] is None and view["mig"] is None and view["processes"] is None
        assert view["unread"].startswith(f"processes and layout: {CALL}")
        text = _table(data)
        assert "GPU 0 was never read: its memory, MIG mode and instances are unknown" in text
        row = next(line for line in text.splitlines() if line.startswith("0 "))
        assert " 0 B " not in row and row.rstrip().endswith("?")
        assert data["gpus"][1]["memory_total_bytes"]  # the other GPU is read as usual


@pytest.mark.parametrize("call", ["nvmlDeviceGetMigMode", "nvmlDeviceGetName"])
def test_a_gpu_that_fails_a_read_at_start_is_named_and_the_others_keep_their_features(
    tmp_path: Path, call: str
) -> None:
    # The reviewer's repro: GPU 1's MIG mode read failing (UNKNOWN, as a GPU needing a reset
    # answers) from before the start made the whole node "driver not ready". Its name read
    # failing then stopped the agent's start (the sampler's first identity read).
    root = tmp_path / "agent"
    config = agent_config(root, telemetry={"interval_s": 0.2})
    open_simulator(root / "state", "dgx-h100")
    SimControl(root / "state").inject_fault(call, "Unknown", count=10**6, gpu=1)
    with InProcessAgent(root, config) as agent:
        gpu = wait_for(lambda: (g := _node(agent.socket).gpus[1]).unread and g, "GPU 1 unread", 10)
        assert f"{call}: Unknown Error" in gpu.unread
        node = _node(agent.socket)
        assert node.driver.state == agent_pb2.DRIVER_STATE_ATTACHED
        assert not node.gpus[0].unread and node.gpus[0].memory_total_bytes > 0
        assert "GPU 1 not read" in _component(node, "gpu-driver").detail
        data = status_view(node_from(node))
        assert [g["health"] for g in data["gpus"][:3]] == ["ok", "unread", "ok"]
        assert f"GPU 1 not read ({call}: Unknown Error)" in _table(data)
        assert agent.node.services.power.show().gpus[0].index == 0  # power reads the others
        doctor = agent.node.services.doctor
        assert doctor is not None
        nvml = next(c for c in doctor.run(ask_api=False).checks if c.name == "nvml")
        assert nvml.state is CheckState.DEGRADED  # never "ok" beside a GPU not read
        assert f"not read: GPU 1: {call}: Unknown Error" in nvml.evidence


def test_readyz_names_the_gpus_when_none_answers_one_lost_one_unread(tmp_path: Path) -> None:
    """GPU 0 failing its MIG mode read (waiting for a reset), GPU 1 lost: no GPU answers, and
    /readyz said a plain "ready" (it named only a node whose every GPU was lost). It stays 200
    (the agent serves) and names both, until one answers again."""
    import urllib.request

    root = tmp_path / "agent"
    config = agent_config(root, telemetry={"interval_s": 0.2})
    open_simulator(root / "state", "h100-nvl")
    control = SimControl(root / "state")
    with InProcessAgent(root, config, "h100-nvl") as agent:
        port = agent.node.metrics_port

        def readyz() -> tuple[int, str]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as r:
                return r.status, r.read().decode()

        wait_for(lambda: readyz() == (200, "ready\n"), "/readyz ready", 10)
        # While it serves (at the start the driver link waits for a GPU that answers, and
        # /readyz names them as GPU features waiting for the driver).
        control.inject_fault("nvmlDeviceGetMigMode", "Unknown", count=10**6, gpu=0)
        control.mark_lost(1)
        said = (
            "ready; no GPU answers: GPU 0 cannot be read (nvmlDeviceGetMigMode: Unknown Error), "
            "GPU 1 lost; the API, prewarm and /metrics serve\n"
        )
        wait_for(lambda: readyz() == (200, said), f"/readyz to say {said!r}", 10)
        control.clear_faults()  # GPU 0 reset: it answers, the node serves a GPU
        wait_for(lambda: readyz() == (200, "ready\n"), "/readyz ready", 10)
