"""The NVML device readings reader: the selected fields NVML answers per GPU (physical ones on the
GPU only, framebuffer per MIG instance too), counter rates between ticks, the health marks'
readings, clock-event reasons over dcgm-exporter's window, and the NVLink P2P status.

A reading NVML refuses on a GPU is reported unsupported (logged once, exported as
``gpu_agent_field_supported 0``, never as 0) and not asked again until the GPU's MIG layout
changes; a lost GPU is reported lost for the sampler to mark down, and the others keep reporting.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from agent.errors import AgentError, DeviceLost, NotSupported
from agent.gpu.reading_calls import Reading
from agent.gpu.readings import GpuIdentity, MigLayout, NodeReader
from agent.telemetry.failing import FailingGpus
from agent.telemetry.reader import Frame, Part, Reader
from agent.telemetry.snapshot import ClockEventCount, P2pLink
from agent.telemetry.stats import TelemetryStats
from dcgm.fields import (
    CLOCK_EVENT_NAMES,
    CLOCK_EVENT_WINDOW_S,
    ClockEventWindow,
    Field,
    Level,
    Nvml,
    NvmlRate,
    P2pStatus,
    Unavailable,
)

log = logging.getLogger(__name__)

__all__ = ["HEALTH_CALLS", "HEALTH_READINGS", "DeviceReader"]

_CLOCK_EVENT_SAMPLES = 3000  # 300 s at the fastest interval (0.1 s)
#: How old the NVLink P2P status may get: it changes at runtime (links that fail or retrain
#: after a GPU reset), and dcgm-exporter reads it each collection (30 s by default).
P2P_REREAD_S = 30.0
#: Read every tick for the health marks (agent/health), whatever the counters CSV selects:
#: one ECC call, the row-remap call (already made for the default CSV) and the clock reasons.
HEALTH_READINGS = frozenset(
    {
        Reading.ECC_DBE_VOLATILE,
        Reading.ROW_REMAP_PENDING,
        Reading.ROW_REMAP_FAILURE,
        Reading.CLOCK_EVENT_REASONS,
    }
)
#: The NVML call behind each health reading, to say which one failed.
HEALTH_CALLS = {
    Reading.ECC_DBE_VOLATILE: "nvmlDeviceGetTotalEccErrors",
    Reading.ROW_REMAP_PENDING: "nvmlDeviceGetRemappedRows",
    Reading.ROW_REMAP_FAILURE: "nvmlDeviceGetRemappedRows",
    Reading.CLOCK_EVENT_REASONS: "nvmlDeviceGetCurrentClocksEventReasons",
}


@dataclass
class _Gpu:
    """What the reader remembers about one GPU between ticks."""

    #: readings NVML refused on this GPU since its layout last changed
    unsupported: set[Reading] = field(default_factory=set)
    #: reading -> (monotonic time, cumulative value) for counter rates
    counters: dict[Reading, tuple[float, float]] = field(default_factory=dict)
    #: (monotonic time, clock-event bitmask) of the ticks within the clock-event window
    clock_events: deque[tuple[float, int]] = field(
        default_factory=lambda: deque(maxlen=_CLOCK_EVENT_SAMPLES)
    )


class DeviceReader(Reader):
    name = "devices"
    after_attribution = False

    def __init__(self, reader: NodeReader, fields: Sequence[Field], stats: TelemetryStats) -> None:
        self._reader = reader
        self._stats = stats
        self._nvml = [f for f in fields if isinstance(f.source, Nvml | NvmlRate)]
        self._instance = [
            f for f in self._nvml if f.level is not Level.GPU and isinstance(f.source, Nvml)
        ]
        self._unavailable = [f for f in fields if isinstance(f.source, Unavailable)]
        self._clock_fields = [f for f in fields if isinstance(f.source, ClockEventWindow)]
        self._p2p_fields = [f for f in fields if isinstance(f.source, P2pStatus)]
        self._wanted = {_reading(f) for f in self._nvml} | {Reading.GPU_UTIL_PERCENT}
        self._wanted |= HEALTH_READINGS
        #: (field id, reading, unit conversion, a rate?) per selected NVML field, worked out once
        self._plan = [
            (f.id, _reading(f), *_scale(f), isinstance(f.source, NvmlRate)) for f in self._nvml
        ]
        self._instance_plan = [(f.id, _reading(f), *_scale(f)) for f in self._instance]
        self._instance_wanted = frozenset(r for _, r, _, _ in self._instance_plan)
        #: reading -> the selected fields it gives
        self._fields_of: dict[Reading, list[int]] = {}
        for f in self._nvml:
            self._fields_of.setdefault(_reading(f), []).append(f.id)
        self._gpus: dict[int, _Gpu] = {}
        self._failing = FailingGpus(log, "the readings")
        #: the last NVLink P2P status read, of the GPUs in ``_p2p_of``, at ``_p2p_at``; None
        #: until read, after a failed read, or while the driver cannot tell
        self._p2p: dict[tuple[int, int], int] | None = None
        self._p2p_of: frozenset[int] = frozenset()
        self._p2p_at = 0.0
        #: why the driver cannot tell the P2P status ("" while it can), until a layout change
        self._p2p_refused = ""
        #: this tick's ``Frame.ours``
        self._ours: Callable[[int], bool] = lambda _gpu: False

    def read(self, frame: Frame) -> Part:
        part = Part()
        self._ours = frame.ours
        for index, layout in frame.layouts.items():
            state = self._gpus.setdefault(index, _Gpu())
            if index in frame.changed:
                state.unsupported.clear()
            try:
                self._read_gpu(frame.gpus[index], layout, state, frame.now, part)
            except DeviceLost as exc:
                part.lost[index] = str(exc)
                self._failing.lost(index)
            except AgentError as exc:
                part.failed.add(index)
                if frame.ours(index):  # met this agent's own MIG change: not read, no fault
                    log.debug("GPU %d: not read while this agent changes it: %s", index, exc)
                    continue
                self._stats.error("nvml")
                self._failing.failed(index, str(exc))
                part.health_unread[index] = f"the GPU's readings: {exc}"
            else:
                self._failing.read(index)
        up = [i for i in frame.layouts if i not in part.lost and i not in part.failed]
        part.clock_events = self._clock_event_counts(frame.gpus, up)
        part.p2p = self._p2p_links(frame, up, part)
        return part

    def _read_gpu(
        self, gpu: GpuIdentity, layout: MigLayout, state: _Gpu, now: float, part: Part
    ) -> None:
        index = gpu.index
        readings = self._reader.read(index, self._wanted - state.unsupported)
        self._note(index, state, readings.unsupported, readings.failed, part)
        values = readings.values
        part.health[index] = MappingProxyType(
            {r: v for r, v in values.items() if r in HEALTH_READINGS}
        )
        unread = {HEALTH_CALLS[r]: why for r, why in readings.failed.items() if r in HEALTH_CALLS}
        if unread:
            part.health_unread[index] = "; ".join(f"{c}: {w}" for c, w in sorted(unread.items()))
        if self._clock_fields:
            self._clock_event_sample(index, state, values, readings.unsupported, now, part)
        key = (index, None)
        out = part.values.setdefault(key, {})
        for field_id, reading, mul, div, is_rate in self._plan:
            raw = values.get(reading)
            if raw is None:
                continue
            if is_rate:
                rate = _rate(state.counters, reading, now, raw)
                if rate is not None:
                    out[field_id] = rate * mul / div
            else:
                out[field_id] = raw * mul / div
        util = values.get(Reading.GPU_UTIL_PERCENT)
        if util is not None:
            part.activity[key] = util
        for f in self._unavailable:
            assert isinstance(f.source, Unavailable)
            part.unsupported.append((index, f.id, f.source.reason))
        if self._instance:
            for instance in layout.instances:
                self._read_instance(index, instance.id, instance.devices[0].uuid, state, part)

    def _read_instance(self, gpu: int, gi: int, mig_uuid: str, state: _Gpu, part: Part) -> None:
        readings = self._reader.read_instance(mig_uuid, self._instance_wanted)
        self._note(gpu, state, {}, readings.failed, part)
        for field_id, reading, mul, div in self._instance_plan:
            raw = readings.values.get(reading)
            if raw is not None:
                part.value((gpu, gi), field_id, raw * mul / div)

    def _note(
        self,
        gpu: int,
        state: _Gpu,
        unsupported: Mapping[Reading, str],
        failed: Mapping[Reading, str],
        part: Part,
    ) -> None:
        for reading, reason in unsupported.items():
            state.unsupported.add(reading)
            part.unsupported.extend((gpu, f, reason) for f in self._fields_of.get(reading, ()))
        if failed and self._ours(gpu):  # met this agent's own MIG change: half read, no fault
            part.failed.add(gpu)
            log.debug("GPU %d: reads failed while this agent changes it: %s", gpu, failed)
        elif failed:
            self._stats.error("nvml", len(failed))
            log.debug("GPU %d: reads failed this tick: %s", gpu, failed)

    def _clock_event_sample(
        self,
        gpu: int,
        state: _Gpu,
        values: Mapping[Reading, float],
        unsupported: Mapping[Reading, str],
        now: float,
        part: Part,
    ) -> None:
        mask = values.get(Reading.CLOCK_EVENT_REASONS)
        if mask is not None:
            state.clock_events.append((now, int(mask)))
        elif Reading.CLOCK_EVENT_REASONS in unsupported:
            reason = unsupported[Reading.CLOCK_EVENT_REASONS]
            part.unsupported.extend((gpu, f.id, reason) for f in self._clock_fields)
        while state.clock_events and state.clock_events[0][0] < now - CLOCK_EVENT_WINDOW_S:
            state.clock_events.popleft()

    def _clock_event_counts(
        self, gpus: tuple[GpuIdentity, ...], up: list[int]
    ) -> tuple[ClockEventCount, ...]:
        if not self._clock_fields:
            return ()
        out = []
        for index in sorted(up):
            events = self._gpus[index].clock_events
            for bit, reason in CLOCK_EVENT_NAMES.items():
                count = sum(1 for _, mask in events if mask & bit)
                if count:
                    out.append(ClockEventCount(gpus[index], reason, count))
        return tuple(out)

    def _p2p_links(self, frame: Frame, up: list[int], part: Part) -> tuple[P2pLink, ...]:
        """The NVLink P2P status between the GPUs that answer: read again every
        ``P2P_REREAD_S``, at once after a MIG layout change or when a GPU that did not answer
        since the last read does (back from a failure or reset). A read that fails leaves no
        row, never the last one's."""
        if not self._p2p_fields:
            return ()
        gpus, answered = frame.gpus, frozenset(up)
        if frame.changed:
            self._p2p, self._p2p_refused = None, ""
        if not self._p2p_refused and (
            self._p2p is None
            or not answered <= self._p2p_of
            or frame.now - self._p2p_at >= P2P_REREAD_S
        ):
            try:
                self._p2p = self._reader.p2p_status(sorted(answered))
                self._p2p_of, self._p2p_at = answered, frame.now
            except NotSupported as exc:
                self._p2p, self._p2p_refused = None, str(exc)
            except AgentError as exc:  # a GPU lost meanwhile: try again next tick
                log.debug("P2P status: %s", exc)
                self._p2p = None
        if self._p2p_refused:
            for gpu in gpus:
                part.unsupported.extend(
                    (gpu.index, f.id, self._p2p_refused) for f in self._p2p_fields
                )
        if self._p2p is None:
            return ()
        # Both ends answered every tick since the read: what it says of a link to a peer
        # that went away since is not known, even once the peer is back (read again then).
        self._p2p_of &= answered
        return tuple(
            P2pLink(gpus[a], b, status)
            for (a, b), status in sorted(self._p2p.items())
            if a in self._p2p_of and b in self._p2p_of and a < len(gpus)
        )


def _reading(f: Field) -> Reading:
    assert isinstance(f.source, Nvml | NvmlRate)
    return f.source.reading


def _scale(f: Field) -> tuple[float, float]:
    """The field's Scale as (mul, div): applied inline, ``value * mul / div``, as Scale does."""
    assert isinstance(f.source, Nvml | NvmlRate)
    return f.source.scale.mul, f.source.scale.div


def _rate(
    counters: dict[Reading, tuple[float, float]], reading: Reading, now: float, value: float
) -> float | None:
    """Per-second rate of a cumulative counter since the previous tick; None on the first tick
    or when the counter went backwards (driver reload)."""
    previous = counters.get(reading)
    counters[reading] = (now, value)
    if previous is None or now <= previous[0] or value < previous[1]:
        return None
    return (value - previous[1]) / (now - previous[0])
