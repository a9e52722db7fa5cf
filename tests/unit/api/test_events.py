"""The event bus: publish from any thread without blocking; a watcher that falls behind is cut
off alone."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent._proto.gpuagent.v1 import events_pb2
from agent.api.events import EventBus, Overflow


def xid(n: int) -> events_pb2.XidEvent:
    return events_pb2.XidEvent(gpu_index=0, xid=n, count=1)


def test_events_from_threads_reach_watchers_in_order_with_filters() -> None:
    async def scenario() -> None:
        bus = EventBus()
        bus.bind(asyncio.get_running_loop())
        everything = bus.subscribe()
        only_lost = bus.subscribe([events_pb2.EVENT_TYPE_GPU_LOST])
        worker = threading.Thread(
            target=lambda: (
                [bus.publish(xid=xid(i)) for i in range(1, 6)]
                + [bus.publish(gpu_lost=events_pb2.GpuLostEvent(gpu_index=3))]
            )
        )
        worker.start()
        worker.join()
        got = [await everything.get() for _ in range(6)]
        assert [e.sequence for e in got] == [1, 2, 3, 4, 5, 6]
        assert [e.xid.xid for e in got[:5]] == [1, 2, 3, 4, 5]
        lost = await only_lost.get()
        assert lost.WhichOneof("payload") == "gpu_lost" and lost.sequence == 6

    asyncio.run(scenario())


def test_a_watcher_that_falls_behind_is_dropped_and_the_others_carry_on() -> None:
    async def scenario() -> None:
        bus = EventBus(queue_limit=10)
        bus.bind(asyncio.get_running_loop())
        stuck = bus.subscribe()
        reader = bus.subscribe()
        received = []
        for i in range(25):
            bus.publish(xid=xid(i + 1))
            await asyncio.sleep(0)  # deliver
            received.append(await reader.get())
        assert len(received) == 25
        with pytest.raises(Overflow):
            await stuck.get()
        assert bus.watchers == 1

    asyncio.run(scenario())


def test_events_before_the_loop_is_bound_are_dropped() -> None:
    bus = EventBus()
    bus.publish(xid=xid(1))  # nobody can be watching yet; must not raise
    assert bus.watchers == 0
