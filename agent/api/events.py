"""The in-process event bus and the EventsService that streams it.

Services and the agent's background loops publish from any thread; `publish` never blocks and
never waits for a watcher. Each watcher has a bounded queue: one that falls behind is cut off
with RESOURCE_EXHAUSTED (it must re-read state and watch again) instead of holding memory or
slowing the agent, so a slow or stuck client cannot hurt the others.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

import grpc

from agent._proto.gpuagent.v1 import events_pb2, events_pb2_grpc
from agent.api.auth import granted, sees_processes
from agent.errors import FieldViolation, InvalidSpec
from agent.loops import call_soon_from_thread
from agent.wire.operations import without_processes

log = logging.getLogger(__name__)

__all__ = ["EventBus", "EventsServicer", "Overflow", "Subscription"]

_QUEUE_LIMIT = 1024

# Event.payload field -> EventType, for filtering.
_TYPES = {
    "operation": events_pb2.EVENT_TYPE_OPERATION,
    "mig_layout": events_pb2.EVENT_TYPE_MIG_LAYOUT,
    "xid": events_pb2.EVENT_TYPE_XID,
    "gpu_lost": events_pb2.EVENT_TYPE_GPU_LOST,
    "health": events_pb2.EVENT_TYPE_HEALTH,
}


class Overflow(Exception):
    """The watcher fell more than its queue behind and was dropped."""


class Subscription:
    """One watcher's queue. Fed on the loop thread only."""

    def __init__(self, types: Collection[int], limit: int) -> None:
        self.types = frozenset(types)
        self._limit = limit
        self._items: deque[events_pb2.Event] = deque()
        self._ready = asyncio.Event()
        self.overflowed = False

    def offer(self, event: events_pb2.Event, kind: int) -> None:
        if self.overflowed or (self.types and kind not in self.types):
            return
        if len(self._items) >= self._limit:
            self.overflowed = True
            self._items.clear()
        else:
            self._items.append(event)
        self._ready.set()

    async def get(self) -> events_pb2.Event:
        while not self._items:
            if self.overflowed:
                raise Overflow
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()


class EventBus:
    def __init__(
        self, *, clock: Callable[[], float] = time.time, queue_limit: int = _QUEUE_LIMIT
    ) -> None:
        self._clock = clock
        self._limit = queue_limit
        self._sequence = itertools.count(1)
        self._lock = threading.Lock()  # sequence order == delivery order across threads
        self._subscribers: set[Subscription] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver on ``loop``; events published before this are dropped (nobody watches)."""
        self._loop = loop

    def publish(self, **payload: Any) -> None:
        """Publish one event, e.g. ``publish(operation=op)``; safe from any thread."""
        ((field, _),) = payload.items()
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with self._lock:
            event = events_pb2.Event(sequence=next(self._sequence), **payload)
            event.time.FromNanoseconds(int(self._clock() * 1e9))
            call_soon_from_thread(loop, self._deliver, event, _TYPES[field])

    def _deliver(self, event: events_pb2.Event, kind: int) -> None:
        for sub in list(self._subscribers):
            sub.offer(event, kind)
            if sub.overflowed:
                self._subscribers.discard(sub)

    def subscribe(self, types: Collection[int] = ()) -> Subscription:
        sub = Subscription(types, self._limit)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    @property
    def watchers(self) -> int:
        return len(self._subscribers)


class EventsServicer(events_pb2_grpc.EventsServiceServicer):
    def __init__(self, bus: EventBus) -> None:
        self._bus = bus

    async def WatchEvents(
        self, request: events_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[events_pb2.WatchEventsResponse]:
        known = set(_TYPES.values())
        unknown = [t for t in request.types if t not in known]
        if unknown:
            allowed = ", ".join(events_pb2.EventType.Name(t) for t in sorted(known))
            raise InvalidSpec(
                f"unknown event types {unknown}",
                [FieldViolation("types", f"allowed: {allowed}")],
            )
        # Health marks name pods, a MIG apply's error the processes in its way: for mig and
        # admin only.
        processes = sees_processes(granted())
        sub = self._bus.subscribe(request.types)
        try:
            while True:
                try:
                    event = await sub.get()
                except Overflow:
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"this watcher fell over {_QUEUE_LIMIT} events behind and was dropped; "
                        "re-read the state and watch again",
                    )
                yield events_pb2.WatchEventsResponse(
                    event=event if processes else _without_processes(event)
                )
        finally:
            self._bus.unsubscribe(sub)


def _without_processes(event: events_pb2.Event) -> events_pb2.Event:
    """The event a caller that sees no processes gets: a health mark without its pods, an
    operation without the processes its error names (the bus's event is shared by every
    watcher, so it is copied, never changed)."""
    payload = event.WhichOneof("payload")
    if payload == "operation":
        shown = without_processes(event.operation)
        if shown is event.operation:
            return event
        copy = events_pb2.Event(sequence=event.sequence, operation=shown)
        copy.time.CopyFrom(event.time)
        return copy
    if payload != "health" or not event.health.mark.pods:
        return event
    copy = events_pb2.Event()
    copy.CopyFrom(event)
    del copy.health.mark.pods[:]
    return copy
