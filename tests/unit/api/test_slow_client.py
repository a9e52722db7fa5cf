"""A client that stops reading its event stream does not slow anyone else: the agent drops it
from the bus once its queue is full, and it learns so (RESOURCE_EXHAUSTED) when it reads again."""

from __future__ import annotations

import tempfile
from pathlib import Path

import grpc

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc, events_pb2, events_pb2_grpc
from tests.unit.api.support import InProcessAgent, agent_config, unix_channel, wait_for

EVENTS = 20_000  # several MiB: more than HTTP/2 flow control lets through to a stuck reader


def test_a_stuck_watcher_is_dropped_and_others_are_served() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with InProcessAgent(root, agent_config(root)) as agent:
            bus = agent.node.services.bus
            with unix_channel(agent.socket) as stuck_channel, unix_channel(agent.socket) as channel:
                stuck = events_pb2_grpc.EventsServiceStub(stuck_channel).WatchEvents(
                    events_pb2.WatchEventsRequest(), timeout=120
                )
                wait_for(lambda: bus.watchers == 1, "the watch to subscribe")
                layout = events_pb2.MigLayoutEvent(gpu_uuid="GPU-" + "f" * 36, gpu_index=1)
                layout.instances.add(id=1, profile_name="1g.10gb")
                for _ in range(EVENTS):
                    bus.publish(mig_layout=layout)
                wait_for(lambda: bus.watchers == 0, "the stuck watcher to be dropped")
                node = agent_pb2_grpc.NodeServiceStub(channel)
                for _ in range(50):  # served, each within its deadline, while one watch is stuck
                    node.GetNode(agent_pb2.GetNodeRequest(), timeout=5)
                received = 0
                try:
                    for _ in stuck:
                        received += 1
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                else:
                    raise AssertionError("the stuck watcher's stream should have been ended")
                # What was already on its way before the drop (possibly nothing: the drop can
                # come before the first send), never the whole backlog.
                assert received < EVENTS
