"""Health marks end to end (docs/health.md): the whole agent on the simulated driver, its
GetNode and WatchEvents over real gRPC on its Unix socket, its /metrics over HTTP, the API
stand-in for the Node, a fake kubelet PodResources server for the pods.

A fatal XID fails its GPU everywhere (GetNode, metric, labels, condition, taint, DRA device
taint, Event naming the pod) and clears after the configured hold-down; a lost GPU stays failed
while it is lost; a driver reload and an agent restart do not clear a failed mark before its
hold-down, an agent started after a reboot clears those a reboot remedies; an XID inside a
MIG instance marks that instance, a GPU-wide one every instance.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc, events_pb2
from agent.gpu.sim import SimControl, open_simulator
from agent.health.publish import LABEL, PUBLISH_S
from tests.integration.test_api_events import Watcher
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.api.support import InProcessAgent, agent_config, unix_channel, wait_for
from tests.unit.telemetry.kubelet import FakeKubelet, serve
from tests.unit.telemetry.simnode import sim_node

pytestmark = pytest.mark.integration

HOLD_DOWN_S = 1.5
FAILED, HEALTHY = agent_pb2.HEALTH_STATE_FAILED, agent_pb2.HEALTH_STATE_HEALTHY
OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _config(root: Path, hold_down_s: float = HOLD_DOWN_S, **health: Any) -> Path:
    return agent_config(
        root,
        node_name=NODE,
        telemetry={"kubelet_socket": str(root / "kubelet.sock"), "interval_s": 0.2},
        health={"hold_down_s": hold_down_s, **health},
        driver={"retry_max_s": 0.2, "check_s": 0.2},
    )


def _gpu(socket: Path, index: int) -> agent_pb2.Gpu:
    with unix_channel(socket) as channel:
        node = agent_pb2_grpc.NodeServiceStub(channel).GetNode(agent_pb2.GetNodeRequest()).node
    return next(g for g in node.gpus if g.index == index)


def _state(socket: Path, index: int) -> int:
    return _gpu(socket, index).condition.state


def _health_series(port: int) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {}
    for m in re.finditer(r"^gpu_agent_health_state\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        found[(labels["gpu"], labels["gpu_instance"], labels["state"])] = float(m.group(2))
    return found


def _events(api: FakeKubeApi, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.events if e["reason"] == reason]


def _slice(uuid: str) -> dict[str, Any]:
    device = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}}
    return {
        "metadata": {"name": f"{NODE}-gpu"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [device],
        },
    }


@pytest.fixture
def pod_on_gpu0(tmp_path: Path) -> Iterator[str]:
    """The simulated node, with pod ml/train-0 allocated GPU 0 (kubelet's PodResources)."""
    root = tmp_path / "agent"
    open_simulator(root / "state", "dgx-h100")
    uuid = SimControl(root / "state").describe()["gpus"][0]["uuid"]
    root.mkdir(exist_ok=True)
    rows = [("ml", "train-0", "main", "nvidia.com/gpu", [uuid])]
    with serve(root / "kubelet.sock", FakeKubelet(rows)):
        yield uuid


def test_a_fatal_xid_fails_the_gpu_everywhere_naming_the_pod_then_clears_after_the_hold_down(
    tmp_path: Path, in_cluster: FakeKubeApi, pod_on_gpu0: str
) -> None:
    api = in_cluster
    api.node_taints[NODE] = [dict(OTHER_TAINT)]
    api.put_dra("resourceslices", _slice(pod_on_gpu0))  # NVIDIA's DRA driver on the node
    root = tmp_path / "agent"
    control = SimControl(root / "state")
    with (
        InProcessAgent(root, _config(root, taint=True)) as agent,
        unix_channel(agent.socket) as channel,
    ):
        watcher = Watcher(channel, [events_pb2.EVENT_TYPE_HEALTH])
        telemetry = agent.node.services.telemetry
        wait_for(lambda: any(e.pod for e in telemetry.latest().entities), "the pod on GPU 0", 10)
        assert _state(agent.socket, 0) == HEALTHY
        control.raise_xid(0, 79)
        raised = time.time()

        gpu = wait_for(lambda: _state(agent.socket, 0) == FAILED and _gpu(agent.socket, 0), "", 5)
        mark = gpu.condition
        assert mark.reason == "XID 79 (GPU has fallen off the bus): needs reboot-node"
        assert mark.action == "reboot-node" and list(mark.pods) == ["ml/train-0"]
        assert _state(agent.socket, 1) == HEALTHY
        series = _health_series(agent.node.metrics_port)
        assert series[("0", "", "failed")] == 1.0 and series[("0", "", "healthy")] == 0.0
        assert series[("1", "", "healthy")] == 1.0
        rule = f"gpu-agent.{NODE}.{NODE}.gpu-0"
        ours = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}
        # A pass writes labels, condition and taint from the marks it read at its start, then
        # the DRA device taints from the marks as they are then: a pass that began just before
        # the XID writes the DRA taint first, and the next pass (woken by the change) the
        # rest. So wait for both the Node's taint and the DRA device taint.
        wait_for(
            lambda: rule in api.taint_rules and ours in api.node_taints[NODE],
            "the Node taint and the DRA device taint",
            5,
        )
        assert api.nodes[NODE]["gpu-agent.io/health"] == "failed"
        assert api.nodes[NODE]["gpu-agent.io/health.failed-gpus"] == "1"
        assert api.nodes[NODE]["gpu-agent.io/health.healthy-gpus"] == "7"
        (condition,) = [c for c in api.node_conditions[NODE] if c["type"] == "GPUHealthy"]
        assert condition["status"] == "False" and "GPU 0 failed: XID 79" in condition["message"]
        assert api.node_taints[NODE] == [OTHER_TAINT, ours]
        assert list(api.taint_rules) == [rule]
        assert api.taint_rules[rule]["spec"]["deviceSelector"]["device"] == "gpu-0"
        (event,) = wait_for(lambda: _events(api, "GpuFailed"), "the Event", 5)
        assert event["type"] == "Warning"
        assert "GPU 0 (" + pod_on_gpu0 + ") healthy -> failed: XID 79" in event["message"]
        assert event["message"].endswith("pods: ml/train-0")
        # The first: on a loaded machine the hold-down may end (a second event) by now.
        streamed = wait_for(lambda: watcher.of("health"), "the health event", 5)[0]
        assert streamed.health.gpu_index == 0 and streamed.health.gpu_uuid == pod_on_gpu0
        assert streamed.health.previous == HEALTHY and streamed.health.mark.state == FAILED
        assert list(streamed.health.mark.pods) == ["ml/train-0"]

        wait_for(lambda: _state(agent.socket, 0) == HEALTHY, "the mark cleared", 10)
        assert time.time() - raised >= HOLD_DOWN_S
        reason = _gpu(agent.socket, 0).condition.reason
        assert re.fullmatch(r"no new error for \d+ s since XID 79 .*", reason), reason
        wait_for(  # both, as above: one pass may remove the DRA taint before the Node's
            lambda: not api.taint_rules and ours not in api.node_taints[NODE],
            "the Node taint and the DRA device taint removed",
            5,
        )
        assert api.nodes[NODE]["gpu-agent.io/health"] == "healthy"
        assert api.node_taints[NODE] == [OTHER_TAINT]
        (condition,) = [c for c in api.node_conditions[NODE] if c["type"] == "GPUHealthy"]
        assert condition["status"] == "True"
        (cleared,) = wait_for(lambda: _events(api, "GpuHealthy"), "the clearing Event", 5)
        assert "failed -> healthy: no new error" in cleared["message"]
        watcher.close()


def test_a_reader_sees_the_failed_gpu_but_not_the_pods_on_it(
    tmp_path: Path, pod_on_gpu0: str
) -> None:
    """docs/security.md: a read identity is never shown who runs where. A failed GPU's mark
    names the pods on it; GetNode and WatchEvents give a reader the mark without them, and the
    node's admin (the Unix socket) the whole mark."""
    root = tmp_path / "agent"
    config = agent_config(
        root,
        node_name=NODE,
        telemetry={"kubelet_socket": str(root / "kubelet.sock"), "interval_s": 0.2},
        health={"hold_down_s": 60.0},
        grpc_insecure_listen="127.0.0.1:0",  # the loopback door: the read role
    )
    with (
        InProcessAgent(root, config) as agent,
        unix_channel(agent.socket) as admin,
        grpc.insecure_channel(f"127.0.0.1:{agent.node.ports.insecure}") as reader,
    ):
        theirs = Watcher(reader, [events_pb2.EVENT_TYPE_HEALTH])
        ours = Watcher(admin, [events_pb2.EVENT_TYPE_HEALTH])
        telemetry = agent.node.services.telemetry
        wait_for(lambda: any(e.pod for e in telemetry.latest().entities), "the pod on GPU 0", 10)
        SimControl(root / "state").raise_xid(0, 79)
        gpu = wait_for(lambda: _state(agent.socket, 0) == FAILED and _gpu(agent.socket, 0), "", 5)
        assert list(gpu.condition.pods) == ["ml/train-0"]

        node = agent_pb2_grpc.NodeServiceStub(reader).GetNode(agent_pb2.GetNodeRequest()).node
        seen = next(g for g in node.gpus if g.index == 0)
        assert seen.condition.state == FAILED and seen.condition.action == "reboot-node"
        assert list(seen.condition.pods) == [] and node.processes_hidden
        (mine,) = wait_for(lambda: ours.of("health"), "the admin's health event", 5)
        assert list(mine.health.mark.pods) == ["ml/train-0"]
        (event,) = wait_for(lambda: theirs.of("health"), "the reader's health event", 5)
        assert event.health.mark.state == FAILED and event.health.gpu_uuid == pod_on_gpu0
        assert list(event.health.mark.pods) == []
        theirs.close()
        ours.close()


def test_a_lost_gpu_stays_failed_while_it_is_lost(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    with InProcessAgent(root, _config(root, hold_down_s=0.5)) as agent:
        SimControl(root / "state").mark_lost(3)
        wait_for(lambda: _state(agent.socket, 3) == FAILED, "GPU 3 failed", 5)
        time.sleep(1.5)  # three hold-downs: the ongoing loss keeps it failed
        gpu = _gpu(agent.socket, 3)
        assert gpu.health == agent_pb2.GPU_HEALTH_LOST
        assert gpu.condition.state == FAILED and gpu.condition.action == "reboot-node"
        assert _state(agent.socket, 2) == HEALTHY


def test_a_driver_reload_does_not_clear_a_failed_mark_before_its_hold_down(
    tmp_path: Path,
) -> None:
    root = tmp_path / "agent"
    hold_down = 4.0
    with InProcessAgent(root, _config(root, hold_down_s=hold_down)) as agent:
        control = SimControl(root / "state")
        control.raise_xid(1, 48)
        raised = time.time()
        wait_for(lambda: _state(agent.socket, 1) == FAILED, "GPU 1 failed", 5)
        since = _gpu(agent.socket, 1).condition.since
        control.driver_absent()
        driver = agent.node.services.driver
        wait_for(lambda: not driver.is_attached, "the agent detached", 5)
        control.driver_present()
        wait_for(lambda: driver.is_attached, "the agent attached again", 5)
        wait_for(lambda: len(agent.node.services.inventory.layouts()) == 8, "GPUs again", 5)
        assert time.time() - raised < hold_down, "the reload took longer than the hold-down"
        gpu = _gpu(agent.socket, 1)
        assert gpu.condition.state == FAILED and gpu.condition.since == since
        wait_for(lambda: _state(agent.socket, 1) == HEALTHY, "the mark cleared", 10)
        assert time.time() - raised >= hold_down


def test_a_restart_keeps_a_failed_mark_until_its_hold_down(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    hold_down = 6.0  # longer than a stop and a start on a loaded 2-core machine
    config = _config(root, hold_down_s=hold_down)
    with InProcessAgent(root, config) as agent:
        SimControl(root / "state").raise_xid(2, 95)
        raised = time.time()
        wait_for(lambda: _state(agent.socket, 2) == FAILED, "GPU 2 failed", 5)
        since = _gpu(agent.socket, 2).condition.since
    with InProcessAgent(root, config) as agent:
        gpu = _gpu(agent.socket, 2)  # the first snapshot, before any hold-down passed
        assert time.time() - raised < hold_down
        assert gpu.condition.state == FAILED and gpu.condition.since == since
        assert gpu.condition.reason == "XID 95 (Uncontained ECC error): needs reset-gpu"
        wait_for(lambda: _state(agent.socket, 2) == HEALTHY, "the mark cleared", 10)
        assert time.time() - raised >= hold_down


def test_an_agent_started_after_a_reboot_ends_the_marks_a_reboot_remedies(tmp_path: Path) -> None:
    """GPU 1 failed for XID 79 (reboot-node), GPU 2 for XID 48 (reset-gpu), GPU 3 for XID 79.
    The node reboots while its agent is down (a new boot id); GPU 3 falls off the bus again.
    The agent that starts clears GPU 1's and GPU 2's marks at once, saying why (the hold-down
    is 10 minutes), and keeps GPU 3's: it is lost."""
    root = tmp_path / "agent"
    config = _config(root, hold_down_s=600.0)
    with InProcessAgent(root, config) as agent:
        control = SimControl(root / "state")
        for gpu, xid in ((1, 79), (2, 48), (3, 79)):
            control.raise_xid(gpu, xid)
        for gpu in (1, 2, 3):
            wait_for(lambda gpu=gpu: _state(agent.socket, gpu) == FAILED, f"GPU {gpu} failed", 5)
    control.reboot()
    control.mark_lost(3)
    with InProcessAgent(root, config) as agent:
        for gpu in (1, 2):
            wait_for(lambda gpu=gpu: _state(agent.socket, gpu) == HEALTHY, f"GPU {gpu} ok", 10)
        reason = _gpu(agent.socket, 1).condition.reason
        assert reason == (
            "the node was rebooted since XID 79 (GPU has fallen off the bus): needs reboot-node"
        )
        gpu3 = _gpu(agent.socket, 3).condition
        assert gpu3.state == FAILED and gpu3.action == "reboot-node"


def test_an_xid_in_a_mig_instance_marks_it_and_a_gpu_wide_one_every_instance(
    tmp_path: Path,
) -> None:
    root = tmp_path / "agent"
    node = sim_node(root / "state")
    first = node.create_instance(1, "1g.10gb", slot=0).id
    second = node.create_instance(1, "1g.10gb", slot=1).id

    def instances(socket: Path) -> dict[int, int]:
        return {gi.id: gi.condition.state for gi in _gpu(socket, 1).instances}

    with InProcessAgent(root, _config(root, hold_down_s=60)) as agent:
        control = SimControl(root / "state")
        wait_for(lambda: instances(agent.socket) == {first: HEALTHY, second: HEALTHY}, "", 5)
        control.raise_xid(1, 13, gpu_instance=first)
        time.sleep(0.5)  # one application XID: nothing
        assert instances(agent.socket) == {first: HEALTHY, second: HEALTHY}
        for _ in range(2):
            control.raise_xid(1, 13, gpu_instance=first)
        degraded = agent_pb2.HEALTH_STATE_DEGRADED
        wait_for(lambda: instances(agent.socket)[first] == degraded, "instance degraded", 5)
        assert instances(agent.socket)[second] == HEALTHY
        assert _state(agent.socket, 1) == HEALTHY
        control.raise_xid(1, 95)
        wait_for(lambda: _state(agent.socket, 1) == FAILED, "GPU 1 failed", 5)
        assert instances(agent.socket) == {first: FAILED, second: FAILED}


def test_a_reset_the_agent_makes_clears_a_reset_gpu_mark_and_no_other(tmp_path: Path) -> None:
    """GPU 1 failed for XID 48 (action reset-gpu), GPU 2 for XID 79 (reboot-node). With a
    10-minute hold-down, the agent's own reset of GPU 1 (ResetGpu: `fleet remediate`'s) left
    it failed for those 10 minutes after the action was done, so remediate always timed out and
    left the node cordoned. The reset is the action: GPU 1 clears at the next snapshot, saying
    so; GPU 2's reboot-node mark is no business of a reset and stays."""
    from agent.client import AgentClient

    root = tmp_path / "agent"
    with InProcessAgent(root, _config(root, hold_down_s=600)) as agent:
        control = SimControl(root / "state")
        control.raise_xid(1, 48)
        control.raise_xid(2, 79)
        wait_for(lambda: _state(agent.socket, 1) == FAILED, "GPU 1 failed", 5)
        wait_for(lambda: _state(agent.socket, 2) == FAILED, "GPU 2 failed", 5)
        client = AgentClient.connect(agent.socket)
        assert client is not None
        try:
            client.reset_gpu(1)
            client.reset_gpu(2)
        finally:
            client.close()
        wait_for(lambda: _state(agent.socket, 1) == HEALTHY, "GPU 1 healthy after its reset", 5)
        reason = _gpu(agent.socket, 1).condition.reason
        assert reason.startswith("the GPU was reset since XID 48"), reason
        time.sleep(1.0)  # several snapshots: the reboot-node mark stays
        gpu = _gpu(agent.socket, 2)
        assert gpu.condition.state == FAILED and gpu.condition.action == "reboot-node"


def test_a_mark_holds_while_the_health_readings_fail_and_says_so(tmp_path: Path) -> None:
    """GPU 0 failed for a double-bit ECC error (reset-gpu). Then the ECC and row-remap calls
    fail on it, tick after tick: nothing is known of what the mark was set by, so "no new
    error for N s" is no evidence and the mark holds past its hold-down, saying why; GetNode,
    the metric and doctor say so. Once the calls answer again, the count (not reset) fails it
    as before."""
    root = tmp_path / "agent"
    hold_down = 1.0
    with InProcessAgent(root, _config(root, hold_down_s=hold_down)) as agent:
        control = SimControl(root / "state")
        control.memory_errors(0, dbe=1)
        wait_for(lambda: _state(agent.socket, 0) == FAILED, "GPU 0 failed", 5)
        for call in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"):
            control.inject_fault(call, "Unknown", count=1_000_000, gpu=0)
        time.sleep(3 * hold_down + 1)  # hold-downs of ticks whose readings all failed
        condition = _gpu(agent.socket, 0).condition
        assert condition.state == FAILED, condition.reason
        assert "health readings fail (nvmlDeviceGetRemappedRows: " in condition.reason
        assert "nvmlDeviceGetTotalEccErrors: " in condition.reason
        series = _health_series(agent.node.metrics_port)
        assert series[("0", "", "failed")] == 1 and series[("0", "", "healthy")] == 0
        assert agent.node.services.doctor is not None
        report = agent.node.services.doctor.run(ask_api=False)
        check = next(c for c in report.checks if (c.duty, c.name) == ("health", "xid"))
        assert check.state.name == "FAILED"
        assert "health readings failing on GPU 0: nvmlDeviceGetRemappedRows" in check.evidence
        assert _state(agent.socket, 1) == HEALTHY
        control.clear_faults()
        time.sleep(3 * hold_down)  # read again: the count was never reset, the mark stays
        condition = _gpu(agent.socket, 0).condition
        assert condition.state == FAILED and "health readings fail" not in condition.reason


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def test_while_the_driver_is_away_health_is_unknown_on_metrics_and_the_node_and_comes_back(
    tmp_path: Path, in_cluster: FakeKubeApi
) -> None:
    """With the driver gone, /metrics kept `gpu_agent_health_state{state="healthy"} 1` beside
    `gpu_agent_driver_ready 0`, and the Node kept `gpu-agent.io/health=healthy` with
    GPUHealthy=True: GPUs nobody could read, said healthy. Meanwhile they are unchecked: no
    series, the label unknown, the condition Unknown with the driver's reason; the failed
    taint stays, and the marks come back with the driver."""
    api = in_cluster
    root = tmp_path / "agent"
    ours = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}
    with InProcessAgent(root, _config(root, hold_down_s=600, taint=True)) as agent:
        control = SimControl(root / "state")
        port = agent.node.metrics_port
        control.raise_xid(1, 48)
        wait_for(lambda: _state(agent.socket, 1) == FAILED, "GPU 1 failed", 5)
        wait_for(lambda: ours in api.node_taints.get(NODE, []), "the failed taint", 5)
        assert _health_series(port)[("0", "", "healthy")] == 1.0
        control.driver_absent()
        driver = agent.node.services.driver
        wait_for(lambda: not driver.is_attached, "the agent detached", 5)
        wait_for(lambda: not _health_series(port), "no health series", 5)
        assert re.search(r"^gpu_agent_driver_ready\{[^}]*\} 0", _metrics(port), re.M)
        wait_for(lambda: api.nodes[NODE]["gpu-agent.io/health"] == "unknown", "unknown", 5)
        (condition,) = [c for c in api.node_conditions[NODE] if c["type"] == "GPUHealthy"]
        assert condition["status"] == "Unknown" and condition["reason"] == "DriverNotReady"
        assert "not checked while the NVIDIA driver is not ready" in condition["message"]
        assert "kept for its return: GPU 1 failed" in condition["message"]
        assert ours in api.node_taints[NODE]  # not lifted on no evidence
        control.driver_present()
        wait_for(lambda: driver.is_attached, "the agent attached again", 5)
        wait_for(lambda: api.nodes[NODE]["gpu-agent.io/health"] == "failed", "failed again", 5)
        series = wait_for(lambda: _health_series(port), "the health series back", 5)
        assert series[("1", "", "failed")] == 1.0 and series[("0", "", "healthy")] == 1.0


def test_a_gpu_first_seen_while_its_readings_fail_is_not_judged_healthy(
    tmp_path: Path, in_cluster: FakeKubeApi
) -> None:
    """GPU 1's ECC and row-remap calls fail from the agent's start: it used to get a healthy
    mark at first sight, so the Node said GPUHealthy=True and /metrics healthy 1 for a GPU
    never checked. It has no verdict until the readings answer: no condition in GetNode, no
    series, the label unknown and the condition Unknown naming it; then it is judged."""
    api = in_cluster
    root = tmp_path / "agent"
    open_simulator(root / "state", "dgx-h100")
    control = SimControl(root / "state")
    for call in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"):
        control.inject_fault(call, "Unknown", count=1_000_000, gpu=1)
    with InProcessAgent(root, _config(root)) as agent:
        port = agent.node.metrics_port
        wait_for(lambda: ("0", "", "healthy") in _health_series(port), "GPU 0 judged", 5)
        wait_for(lambda: NODE in api.nodes and LABEL in api.nodes[NODE], "the label", 5)
        assert not any(gpu == "1" for gpu, _, _ in _health_series(port))
        assert not _gpu(agent.socket, 1).HasField("condition")
        assert _gpu(agent.socket, 0).condition.state == HEALTHY
        assert api.nodes[NODE][LABEL] == "unknown"
        (condition,) = [c for c in api.node_conditions[NODE] if c["type"] == "GPUHealthy"]
        assert condition["status"] == "Unknown", condition
        assert "GPU 1 not judged yet: health readings fail (nvmlDeviceGet" in condition["message"]
        control.clear_faults()
        wait_for(lambda: _state(agent.socket, 1) == HEALTHY, "GPU 1 judged", 5)
        # No change to announce (no Event): the next publish pass states it.
        wait_for(lambda: api.nodes[NODE][LABEL] == "healthy", "the node healthy", PUBLISH_S + 5)
        (condition,) = [c for c in api.node_conditions[NODE] if c["type"] == "GPUHealthy"]
        assert condition["status"] == "True"


def _state_component(socket: Path) -> agent_pb2.ComponentHealth:
    with unix_channel(socket) as channel:
        node = agent_pb2_grpc.NodeServiceStub(channel).GetNode(agent_pb2.GetNodeRequest()).node
    return next(c for c in node.health.components if c.name == "state")


def _writable(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return re.findall(r"^gpu_agent_state_writable\{.*$", text, re.M)[0]


def test_health_marks_the_full_state_dir_cannot_keep_are_said_by_the_state_component(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Real: the state dir is a small tmpfs filled while GPU 3 is lost (its mark is saved again
    every SAVE_EVERY_S). GetNode's state component and gpu_agent_state_writable said ok while
    the marks went unsaved (a restart would forget them) and ERROR was logged every tick; now
    they name the marks file and ENOSPC, the save is tried again only every SAVE_EVERY_S, and
    once space is freed the marks are saved and the state is ok again."""
    from tests.unit.test_state_disk import _tmpfs

    root = tmp_path / "agent"
    root.mkdir()
    marks = root / "state" / "health-marks.json"
    with _tmpfs(root / "state", "8m") as state, InProcessAgent(root, _config(root, 600)) as agent:
        port = agent.node.metrics_port
        SimControl(state).mark_lost(3)
        wait_for(lambda: _state(agent.socket, 3) == FAILED, "GPU 3 failed", 5)
        filler = state / "filler"
        with caplog.at_level(logging.ERROR, "agent.health"):
            with filler.open("wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(bytes(1 << 16))
            wait_for(lambda: not _state_component(agent.socket).healthy, "state unhealthy", 10)
            detail = _state_component(agent.socket).detail
            assert f"the health marks could not be written to {marks}" in detail, detail
            assert "No space left on device" in detail and "a restart forgets" in detail
            enospc = 'gpu_agent_state_writable{reason="ENOSPC"} 0.0'
            wait_for(lambda: _writable(port) == enospc, "the metric says ENOSPC", 5)
            time.sleep(2.0)  # ten ticks of the lost GPU's refreshed mark
        failed = [r for r in caplog.records if "saving health marks" in r.getMessage()]
        assert len(failed) == 1, [r.getMessage() for r in failed]
        filler.unlink()
        wait_for(lambda: _state_component(agent.socket).healthy, "state ok again", 10)
        ok = 'gpu_agent_state_writable{reason="ok"} 1.0'
        wait_for(lambda: _writable(port) == ok, "the metric says ok", 5)
        assert '"failed"' in marks.read_text()
