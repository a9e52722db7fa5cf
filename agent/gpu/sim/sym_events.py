"""Event sets: XID errors delivered to ``nvmlEventSetWait`` (telemetry.md §4 "XID events").

Event sets live in process memory, as in NVML; the events themselves are queued in the shared
node state with a sequence number, so an XID raised by ``gpu-agent sim`` in another process
reaches the agent's waiting thread. A set sees only events raised after its registration.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pynvml

from agent.gpu.sim.abi import (
    decode,
    fail,
    handle_slot,
    set_value,
    store_handle,
    symbol,
    target,
    to_int,
)
from agent.gpu.sim.handles import Handle, Kind, pointer
from agent.gpu.sim.memory import EventSet

if TYPE_CHECKING:
    from agent.gpu.sim.driver import SimDriver

SUPPORTED_TYPES = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeClock
)
_NOT_ATTRIBUTABLE = 0xFFFFFFFF  # event GI/CI ids when the XID concerns the whole GPU
_POLL_S = 0.005


def _event_set(drv: SimDriver, value: Any) -> EventSet:
    h = decode(value)
    found = drv.event_sets.get(h.serial) if h.kind == Kind.EVENT_SET else None
    if found is None:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return found


@symbol("nvmlEventSetCreate")
def create(drv: SimDriver, ref: Any) -> None:
    slot = handle_slot(ref)
    with drv.lock:
        set_id = drv.new_local_id()
        drv.event_sets[set_id] = EventSet()
    store_handle(slot, Handle(Kind.EVENT_SET, 0, set_id))


@symbol("nvmlEventSetFree")
def free(drv: SimDriver, value: Any) -> None:
    _event_set(drv, value)
    with drv.lock:
        drv.event_sets.pop(decode(value).serial, None)


@symbol("nvmlDeviceGetSupportedEventTypes")
def supported_types(drv: SimDriver, handle: Any, ref: Any) -> None:
    drv.physical(handle)
    set_value(ref, SUPPORTED_TYPES)


@symbol("nvmlDeviceRegisterEvents")
def register(drv: SimDriver, handle: Any, event_types: Any, value: Any) -> None:
    t = drv.physical(handle)  # MIG devices cannot register: use the parent and the event's ids
    mask = to_int(event_types)
    es = _event_set(drv, value)
    if mask & ~SUPPORTED_TYPES:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with drv.lock:
        old_mask, first = es.registered.get(t.gpu.index, (0, t.node.next_event_seq))
        es.registered[t.gpu.index] = (old_mask | mask, first)


@symbol("nvmlEventSetWait_v2")
def wait(drv: SimDriver, value: Any, data_ref: Any, timeout_ms: Any) -> None:
    es = _event_set(drv, value)
    data = target(data_ref)
    deadline = time.monotonic() + to_int(timeout_ms) / 1000
    node = drv.node()
    while True:
        for event in node.events:
            mask, first = es.registered.get(event.gpu, (0, 0))
            if event.seq <= es.delivered or event.seq < first:
                continue
            if not mask & pynvml.nvmlEventTypeXidCriticalError:
                continue
            es.delivered = event.seq
            data.device = pointer(pynvml.c_nvmlDevice_t, Handle(Kind.DEVICE, event.gpu, 0))
            data.eventType = pynvml.nvmlEventTypeXidCriticalError
            data.eventData = event.xid
            gi = event.gpu_instance
            data.gpuInstanceId = _NOT_ATTRIBUTABLE if gi is None else gi
            data.computeInstanceId = _NOT_ATTRIBUTABLE
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise fail(pynvml.NVML_ERROR_TIMEOUT)
        time.sleep(min(_POLL_S, left))
        node = drv.reread()  # a waiting call sees the events raised meanwhile
