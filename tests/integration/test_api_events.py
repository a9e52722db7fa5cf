"""WatchEvents streams what happens on the node: MIG layout changes, XIDs and lost GPUs, as the
simulated driver reports them to a running agent; and lost GPUs show in GetNode's health."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc, events_pb2, events_pb2_grpc
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from tests.unit.api.support import AgentProcess, agent_config, unix_channel, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    with AgentProcess(tmp_path, agent_config(tmp_path)) as process:
        yield process


class Watcher:
    """Collects events from one WatchEvents stream on a thread."""

    def __init__(self, channel: grpc.Channel, types: list[int]) -> None:
        self.events: list[events_pb2.Event] = []
        self._call = events_pb2_grpc.EventsServiceStub(channel).WatchEvents(
            events_pb2.WatchEventsRequest(types=types), timeout=60
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for answer in self._call:
                self.events.append(answer.event)
        except grpc.RpcError:
            return

    def of(self, payload: str) -> list[events_pb2.Event]:
        return [e for e in self.events if e.WhichOneof("payload") == payload]

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(10)


def test_mig_layout_changes_xids_and_lost_gpus_are_streamed(agent: AgentProcess) -> None:
    control = SimControl(agent.state_dir)
    with unix_channel(agent.socket) as channel:
        watcher = Watcher(
            channel,
            [
                events_pb2.EVENT_TYPE_MIG_LAYOUT,
                events_pb2.EVENT_TYPE_XID,
                events_pb2.EVENT_TYPE_GPU_LOST,
            ],
        )
        # The agent notices driver changes on its next inventory refresh (each second), long
        # after the watch is subscribed.
        # Another NVML client changes GPU 1's MIG mode (as nvidia-smi would).
        driver = open_driver(agent.preset, agent.state_dir)
        uuid = driver.gpus()[1].uuid
        driver.set_mig_mode(uuid, True)
        driver.close()
        layout = wait_for(lambda: watcher.of("mig_layout"), "a MIG layout event", 15)[0].mig_layout
        assert (layout.gpu_index, layout.gpu_uuid, layout.mig_mode.current) == (1, uuid, True)

        control.raise_xid(0, 13)
        xid = wait_for(lambda: watcher.of("xid"), "an XID event", 15)[0].xid
        assert (xid.gpu_index, xid.xid, xid.count) == (0, 13, 1)
        assert xid.message == "Graphics Engine Exception"  # dcgm-exporter's err_msg

        control.mark_lost(3)
        lost = wait_for(lambda: watcher.of("gpu_lost"), "a GPU lost event", 15)[0].gpu_lost
        assert lost.gpu_index == 3
        watcher.close()
        assert not watcher.of("operation")  # filtered out by type

        node = agent_pb2_grpc.NodeServiceStub(channel).GetNode(
            agent_pb2.GetNodeRequest(), timeout=10
        )
    gpu3 = next(g for g in node.node.gpus if g.index == 3)
    assert gpu3.health == agent_pb2.GPU_HEALTH_LOST
    assert not node.node.health.healthy
    sequences = [e.sequence for e in watcher.events]
    assert sequences == sorted(sequences)
