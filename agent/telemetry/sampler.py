"""The collection loop: one thread reads every selected field once per interval into a Snapshot.

Per tick and per GPU: the MIG layout (cheap; instance changes are noticed at once) and the
planner's layout with processes (``NodeReader.layout``: the API's inventory reads it from the
snapshot instead of calling NVML again), the NVML
readings of the selected fields (physical ones on the GPU only, framebuffer per instance too),
GPM averages per GPU and per GPU instance (or the DCGM backend's values where the GPU has no GPM),
the XID state, and per-pod process usage. Pod allocations come from the pod watcher's latest List.
The result is published as one immutable :class:`Snapshot`; scrapes only ever read that.

A field NVML or GPM cannot provide on a GPU is logged once and exported as
``gpu_agent_field_supported 0`` (never as 0); NVML is not asked again until the GPU's MIG layout
changes. A lost GPU is marked down and the others keep reporting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from agent.errors import AgentError, DeviceLost, NotSupported
from agent.gpu.readings import GpuIdentity, MigLayout, NodeReader, Reading
from agent.gpu.types import GpuLayout
from agent.telemetry.attribution import attribute_samples
from agent.telemetry.gpm import GpmKey, GpmTracker, instance_keys
from agent.telemetry.idle import IdleStore, IdleTracker
from agent.telemetry.pods import Allocation, UnresolvedClaims
from agent.telemetry.processes import ProcessReader
from agent.telemetry.procs import ContainerDirectory
from agent.telemetry.snapshot import (
    ClockEventCount,
    Entity,
    EntitySample,
    FieldSupport,
    GpuStatus,
    HealthReadings,
    InstanceIdentity,
    P2pLink,
    PodUsage,
    Snapshot,
)
from agent.telemetry.stats import TelemetryStats
from agent.telemetry.xid import XidState, xid_counts, xid_recent
from dcgm.counters import CounterSet
from dcgm.fields import (
    CLOCK_EVENT_NAMES,
    CLOCK_EVENT_WINDOW_S,
    ClockEventWindow,
    Field,
    Gpm,
    Level,
    Nvml,
    NvmlRate,
    P2pStatus,
    Unavailable,
    XidEvents,
    XidWindow,
)

log = logging.getLogger(__name__)

__all__ = ["ProfilingBackend", "Sampler", "SamplerOptions"]

_GR_ENGINE_METRIC = 1  # NVML_GPM_METRIC_GRAPHICS_UTIL: idle tracking where NVML has no util
_XID_FIELD = 230
_GR_ENGINE_FIELD = 1001
_NO_GPM = "the GPU has no GPM (Hopper or newer has)"
_CLOCK_EVENT_SAMPLES = 3000  # 300 s at the fastest interval (0.1 s)
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


class ProfilingBackend(Protocol):
    """DCP values for GPUs without GPM (DCGM's profiling module on Ampere and older)."""

    def supports(self, gpu_uuid: str) -> frozenset[int]:
        """DCGM field ids this backend serves for the GPU (and its instances)."""
        ...

    def read(self, gpu_uuid: str, gpu_instance_id: int | None) -> Mapping[int, float]:
        """Latest values (DCGM units) of one GPU or GPU instance."""
        ...


@dataclass(frozen=True)
class SamplerOptions:
    interval_s: float = 1.0
    idle_threshold_percent: float = 5.0
    hostname: str = ""
    #: root of /proc for the processes' cgroups (the simulator keeps its own)
    proc_root: Path = Path("/proc")
    #: where idle times survive agent restarts (the state dir's telemetry-idle.json); None: not
    idle_file: Path | None = None
    #: how often they are saved (and at stop)
    idle_save_every_s: float = 30.0


class _Pods(Protocol):
    def current(self) -> tuple[Allocation, ...]: ...


class _Xids(Protocol):
    def state(self) -> XidState: ...


@dataclass
class _GpuState:
    """What the sampler remembers about one GPU between ticks."""

    layout: MigLayout | None = None
    #: the planner's view, last read (kept while the GPU is down)
    node_layout: GpuLayout | None = None
    up: bool = True
    gpm: bool | None = None
    #: readings NVML refused on this GPU since its layout last changed
    unsupported: set[Reading] = field(default_factory=set)
    #: field id -> why the field cannot be read on this GPU
    field_unsupported: dict[int, str] = field(default_factory=dict)
    #: (reading) -> (monotonic time, cumulative value) for counter rates
    counters: dict[Reading, tuple[float, float]] = field(default_factory=dict)
    #: (monotonic time, clock-event bitmask) of the ticks within the clock-event window
    clock_events: deque[tuple[float, int]] = field(
        default_factory=lambda: deque(maxlen=_CLOCK_EVENT_SAMPLES)
    )
    #: this tick's HEALTH_READINGS
    health: Mapping[Reading, float] = field(default_factory=dict)


class Sampler:
    """Collects on its own thread; :meth:`latest` is what scrapes render."""

    def __init__(
        self,
        reader: NodeReader,
        counters: CounterSet,
        stats: TelemetryStats,
        options: SamplerOptions,
        *,
        pods: _Pods | None = None,
        containers: ContainerDirectory | None = None,
        xids: _Xids | None = None,
        profiling: ProfilingBackend | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._reader = reader
        self._stats = stats
        self._options = options
        self._pods = pods
        self._containers = containers
        self._unresolved = UnresolvedClaims(stats)
        self._xids = xids
        self._profiling = profiling
        self._clock = clock
        self._wall = wall_clock
        #: the wall clock as of now, read once: idle times are saved as ``wall0 + (mono - mono0)``
        #: so a clock step while the agent runs neither adds nor removes idle seconds, in this
        #: run or in the file the next one reads
        self._wall0, self._mono0 = wall_clock(), clock()
        self._processes = ProcessReader(
            reader, stats, options.proc_root, containers, options.interval_s, wall_clock
        )
        fields = [c.field for c in counters.values]
        self._nvml = [f for f in fields if isinstance(f.source, Nvml | NvmlRate)]
        self._prof = [f for f in fields if isinstance(f.source, Gpm)]
        self._unavailable = [f for f in fields if isinstance(f.source, Unavailable)]
        self._xid_selected = any(isinstance(f.source, XidEvents) for f in fields)
        self._xid_window = any(isinstance(f.source, XidWindow) for f in fields)
        self._clock_events = [f for f in fields if isinstance(f.source, ClockEventWindow)]
        self._p2p_fields = [f for f in fields if isinstance(f.source, P2pStatus)]
        #: read once (topology); None until read, or when the driver cannot tell
        self._p2p: dict[tuple[int, int], int] | None = None
        self._selected = fields
        gpu_metrics = {f.source.metric_id for f in self._prof if isinstance(f.source, Gpm)}
        gi_metrics = {
            f.source.metric_id
            for f in self._prof
            if isinstance(f.source, Gpm) and f.level is not Level.GPU
        }
        self._gpm_gpu = GpmTracker(reader, gpu_metrics | {_GR_ENGINE_METRIC}, clock)
        self._gpm_gi = GpmTracker(reader, gi_metrics | {_GR_ENGINE_METRIC}, clock)
        self._idle = IdleTracker(options.idle_threshold_percent)
        self._idle_store = IdleStore(options.idle_file) if options.idle_file else None
        #: saved last-busy times not yet matched to an entity seen this run
        self._idle_saved = self._idle_store.load() if self._idle_store else {}
        self._idle_saved_at: float | None = None
        self._idle_names: dict[Entity, str] = {}
        self._gpus: dict[int, _GpuState] = {}
        self._newly_unsupported: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
        #: (field, reason, GPU) already logged: a layout change re-probes support, but the same
        #: condition is not logged again.
        self._logged_unsupported: set[tuple[str, str, int]] = set()
        self._latest: Snapshot | None = None
        self._versions: tuple[str, str] | None = None
        self._subscribers: list[Callable[[Snapshot], None]] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: ticks started / the latest tick finished, for :meth:`fresh`
        self._ticks = threading.Condition()
        self._started_seq = 0
        self._done_seq = 0

    # -- lifecycle --------------------------------------------------------------------------------

    def latest(self) -> Snapshot | None:
        return self._latest

    def subscribe(self, callback: Callable[[Snapshot], None]) -> None:
        """Call ``callback`` on the sampler thread with every snapshot, just before publishing."""
        self._subscribers.append(callback)

    def start(self) -> None:
        self.tick()
        self._thread = threading.Thread(target=self._run, name="gpu-agent-sampler", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Collect now rather than at the next interval (after the agent changed a GPU)."""
        self._wake.set()

    def fresh(self, timeout_s: float = 5.0) -> bool:
        """Block until a snapshot collected after this call is published (waking the sampler),
        so what the agent just changed is in it. False on timeout, or with no sampler thread."""
        if self._thread is None or not self._thread.is_alive():
            return False
        with self._ticks:
            target = self._started_seq + 1
        self.wake()
        with self._ticks:
            return self._ticks.wait_for(lambda: self._done_seq >= target, timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self._gpm_gpu.close()
        self._gpm_gi.close()
        self._save_idle(self._clock(), force=True)

    def _run(self) -> None:
        interval = self._options.interval_s
        deadline = self._clock() + interval
        while True:
            self._wake.wait(max(0.0, deadline - self._clock()))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:
                self._stats.error("sampler")
                log.exception("telemetry collection failed; serving the previous snapshot")
            # Fixed rate; after an overrun, skip the missed ticks rather than bursting. A tick
            # woken early (``wake``) that ended before the deadline leaves it where it is: moving
            # it on per woken tick put a burst of N wake-ups N intervals ahead (after a run of
            # API changes, no snapshot for as many seconds).
            now = self._clock()
            if now >= deadline:
                deadline = max(deadline + interval, now)

    # -- one tick ---------------------------------------------------------------------------------

    def tick(self) -> Snapshot:
        """Collect once and publish the snapshot."""
        with self._ticks:
            self._started_seq += 1
            seq = self._started_seq
        try:
            return self._tick()
        finally:
            with self._ticks:
                self._done_seq = max(self._done_seq, seq)
                self._ticks.notify_all()

    def _tick(self) -> Snapshot:
        started = self._clock()
        taken_at = self._wall()
        if self._containers is not None:
            self._containers.begin()
        if self._versions is None:
            self._versions = self._reader.versions()
        gpus = self._reader.gpus()
        xid = self._xids.state() if self._xids is not None else None
        statuses: list[GpuStatus] = []
        samples: list[EntitySample] = []
        layouts: dict[int, MigLayout] = {}
        node_layouts: list[GpuLayout] = []
        for gpu in gpus:
            state = self._gpus.setdefault(gpu.index, _GpuState())
            try:
                gpu_samples = self._collect_gpu(gpu, state, xid, started)
            except DeviceLost as exc:
                self._lost(gpu, state, exc)
                statuses.append(GpuStatus(gpu, up=False, detail=str(exc)))
                node_layouts.extend([state.node_layout] if state.node_layout else [])
                continue
            except AgentError as exc:
                # One GPU's NVML failure must not silence the others; it has no series this tick.
                self._stats.error("nvml")
                log.warning("GPU %d: collection failed this tick: %s", gpu.index, exc)
                statuses.append(GpuStatus(gpu, up=state.up))
                node_layouts.extend([state.node_layout] if state.node_layout else [])
                continue
            if not state.up:
                log.warning("GPU %d (%s) answers NVML again", gpu.index, gpu.uuid)
            state.up = True
            statuses.append(GpuStatus(gpu, up=True))
            layouts[gpu.index] = state.layout or MigLayout(False)
            node_layouts.extend([state.node_layout] if state.node_layout else [])
            samples.extend(gpu_samples)
        self._gpm_gpu.retain(GpmKey(g, None, gpus[g].uuid) for g in layouts)
        self._gpm_gi.retain(instance_keys(layouts))
        read = self._clock()
        self._stats.observe_source("devices", read - started)
        samples, pods = self._attribute(gpus, layouts, samples)
        self._stats.observe_source("attribution", self._clock() - read)
        self._idle.retain(s.entity for s in samples)
        self._idle_names = {s.entity: _idle_name(s.entity) for s in samples}
        self._save_idle(started)
        snapshot = Snapshot(
            taken_at=taken_at,
            taken_mono=started,
            hostname=self._options.hostname,
            driver_version=self._versions[0],
            nvml_version=self._versions[1],
            gpus=tuple(statuses),
            entities=tuple(samples),
            pods=tuple(pods),
            xids=xid_counts(gpus, layouts, xid) if xid and self._xid_selected else (),
            xid_recent=xid_recent(gpus, xid) if xid and self._xid_window else (),
            clock_events=self._clock_event_counts(gpus),
            p2p=self._p2p_links(gpus, statuses),
            support=self._support(gpus),
            layouts=tuple(node_layouts),
            health=tuple(
                HealthReadings(s.gpu, self._gpus[s.gpu.index].health) for s in statuses if s.up
            ),
        )
        self._report_unsupported()
        self._stats.observe_collection(self._clock() - started)
        # Subscribers (the exporter's pre-encoding) see it first, so no scrape finds a snapshot
        # that is published but not encoded yet.
        for callback in self._subscribers:
            callback(snapshot)
        self._latest = snapshot
        return snapshot

    def _lost(self, gpu: GpuIdentity, state: _GpuState, exc: DeviceLost) -> None:
        if state.up:
            self._stats.error("gpu_lost")
            log.error("GPU %d (%s) is lost, marking it down: %s", gpu.index, gpu.uuid, exc)
        state.up = False

    def _collect_gpu(
        self, gpu: GpuIdentity, state: _GpuState, xid: XidState | None, now: float
    ) -> list[EntitySample]:
        layout = self._reader.mig_layout(gpu.index)
        if layout != state.layout:
            if state.layout is not None:
                log.info("GPU %d MIG layout changed: re-probing field support", gpu.index)
            state.layout = layout
            state.unsupported.clear()
            state.field_unsupported.clear()
        try:
            state.node_layout = self._reader.layout(gpu.index, layout)
        except DeviceLost:
            raise
        except AgentError as exc:  # the inventory keeps the last layout; telemetry goes on
            self._stats.error("nvml")
            log.warning("GPU %d: MIG layout read failed this tick: %s", gpu.index, exc)
        if state.gpm is None:
            state.gpm = self._reader.gpm_supported(gpu.index)
        gpu_values, gpu_util = self._gpu_values(gpu, state, now)
        if self._xid_selected:
            self._xid_value(gpu, state, xid, gpu_values)
        for f in self._unavailable:
            assert isinstance(f.source, Unavailable)
            self._unsupported(gpu, state, f, f.source.reason)
        gpu_entity = Entity(gpu)
        gpm_util = self._profile(gpu, state, GpmKey(gpu.index, None, gpu.uuid), gpu_values)
        out = [
            EntitySample(
                gpu_entity,
                MappingProxyType(gpu_values),
                idle_seconds=self._idle_seconds(gpu_entity, _first(gpu_util, gpm_util), now),
            )
        ]
        for instance in layout.instances:
            entity = Entity(gpu, InstanceIdentity(instance.id, instance.profile))
            values = self._instance_values(gpu, state, instance.devices[0].uuid)
            key = GpmKey.of(gpu.index, instance)
            util = self._profile(gpu, state, key, values)
            out.append(
                EntitySample(
                    entity,
                    MappingProxyType(values),
                    idle_seconds=self._idle_seconds(entity, util, now),
                )
            )
        return out

    def _idle_seconds(self, entity: Entity, util: float | None, now: float) -> float | None:
        name = _idle_name(entity)
        saved = self._idle_saved.pop(name, None)
        if saved is not None:  # first sight this run: carry on from the last run's figure
            self._idle.restore({name: saved}, {entity: name}, now, self._wall_at(now))
        return self._idle.update(entity, util, now)

    def _wall_at(self, now: float) -> float:
        """The wall-clock time of monotonic ``now``, blind to steps since the sampler began."""
        return self._wall0 + (now - self._mono0)

    def _save_idle(self, now: float, *, force: bool = False) -> None:
        if self._idle_store is None:
            return
        due = self._idle_saved_at is None or now - self._idle_saved_at >= (
            self._options.idle_save_every_s
        )
        if force or due:
            times = self._idle.export(self._idle_names, now, self._wall_at(now))
            self._idle_store.save({**self._idle_saved, **times})  # keep GPUs not seen this run
            self._idle_saved_at = now

    def _gpu_values(
        self, gpu: GpuIdentity, state: _GpuState, now: float
    ) -> tuple[dict[int, float], float | None]:
        wanted = {_reading(f) for f in self._nvml} | {Reading.GPU_UTIL_PERCENT} | HEALTH_READINGS
        readings = self._reader.read(gpu.index, wanted - state.unsupported)
        self._note_readings(gpu, state, readings.unsupported, readings.failed)
        state.health = MappingProxyType(
            {r: v for r, v in readings.values.items() if r in HEALTH_READINGS}
        )
        if self._clock_events:
            self._clock_event_sample(gpu, state, readings.values, readings.unsupported, now)
        values: dict[int, float] = {}
        for f in self._nvml:
            raw = readings.values.get(_reading(f))
            if raw is None:
                continue
            if isinstance(f.source, NvmlRate):
                rate = _rate(state.counters, f.source.reading, now, raw)
                if rate is not None:
                    values[f.id] = f.source.scale(rate)
            elif isinstance(f.source, Nvml):
                values[f.id] = f.source.scale(raw)
        return values, readings.values.get(Reading.GPU_UTIL_PERCENT)

    def _clock_event_sample(
        self,
        gpu: GpuIdentity,
        state: _GpuState,
        values: Mapping[Reading, float],
        unsupported: Mapping[Reading, str],
        now: float,
    ) -> None:
        mask = values.get(Reading.CLOCK_EVENT_REASONS)
        if mask is not None:
            state.clock_events.append((now, int(mask)))
        elif Reading.CLOCK_EVENT_REASONS in unsupported:
            for f in self._clock_events:
                self._unsupported(gpu, state, f, unsupported[Reading.CLOCK_EVENT_REASONS])
        while state.clock_events and state.clock_events[0][0] < now - CLOCK_EVENT_WINDOW_S:
            state.clock_events.popleft()

    def _clock_event_counts(self, gpus: tuple[GpuIdentity, ...]) -> tuple[ClockEventCount, ...]:
        out = []
        for gpu in gpus:
            state = self._gpus.get(gpu.index)
            if not self._clock_events or state is None or not state.up:
                continue
            for bit, reason in CLOCK_EVENT_NAMES.items():
                count = sum(1 for _, mask in state.clock_events if mask & bit)
                if count:
                    out.append(ClockEventCount(gpu, reason, count))
        return tuple(out)

    def _p2p_links(
        self, gpus: tuple[GpuIdentity, ...], statuses: list[GpuStatus]
    ) -> tuple[P2pLink, ...]:
        if not self._p2p_fields:
            return ()
        if self._p2p is None:
            try:
                self._p2p = self._reader.p2p_status()
            except NotSupported as exc:
                self._p2p = {}
                for gpu in gpus:
                    state = self._gpus.get(gpu.index)
                    if state is not None:
                        for f in self._p2p_fields:
                            self._unsupported(gpu, state, f, str(exc))
            except AgentError as exc:  # a GPU lost meanwhile: try again next tick
                log.debug("P2P status: %s", exc)
                return ()
        up = {s.gpu.index for s in statuses if s.up}
        return tuple(
            P2pLink(gpus[a], b, status)
            for (a, b), status in sorted(self._p2p.items())
            if a in up and a < len(gpus)
        )

    def _instance_values(
        self, gpu: GpuIdentity, state: _GpuState, mig_uuid: str
    ) -> dict[int, float]:
        instance_fields = [
            f for f in self._nvml if f.level is not Level.GPU and isinstance(f.source, Nvml)
        ]
        if not instance_fields:
            return {}
        readings = self._reader.read_instance(mig_uuid, {_reading(f) for f in instance_fields})
        self._note_readings(gpu, state, {}, readings.failed)
        return {
            f.id: f.source.scale(readings.values[_reading(f)])
            for f in instance_fields
            if isinstance(f.source, Nvml) and _reading(f) in readings.values
        }

    def _note_readings(
        self,
        gpu: GpuIdentity,
        state: _GpuState,
        unsupported: Mapping[Reading, str],
        failed: Mapping[Reading, str],
    ) -> None:
        for reading, reason in unsupported.items():
            state.unsupported.add(reading)
            for f in self._nvml:
                if _reading(f) is reading:
                    self._unsupported(gpu, state, f, reason)
        if failed:
            self._stats.error("nvml", len(failed))
            log.debug("GPU %d: reads failed this tick: %s", gpu.index, failed)

    def _profile(
        self, gpu: GpuIdentity, state: _GpuState, key: GpmKey, values: dict[int, float]
    ) -> float | None:
        """Add the DCP fields of one entity to ``values``; returns its GR-engine activity in %."""
        fields = (
            self._prof
            if key.gpu_instance_id is None
            else [f for f in self._prof if f.level is not Level.GPU]
        )
        if state.gpm:
            tracker = self._gpm_gpu if key.gpu_instance_id is None else self._gpm_gi
            try:
                readout = tracker.collect(key)
            except DeviceLost:
                raise
            except AgentError as exc:
                self._stats.error("gpm")
                log.debug("GPM sample of %s failed: %s", key, exc)
                return None
            if readout is None:
                return None  # first window of this entity: nothing to report yet
            for f in fields:
                assert isinstance(f.source, Gpm)
                metric = f.source.metric_id
                if metric in readout.values:
                    values[f.id] = f.source.scale(readout.values[metric])
                elif metric in readout.unsupported and key.gpu_instance_id is None:
                    self._unsupported(gpu, state, f, f"GPM metric {metric} is not supported")
            return readout.values.get(_GR_ENGINE_METRIC)
        return self._dcgm_values(gpu, state, key, fields, values)

    def _dcgm_values(
        self,
        gpu: GpuIdentity,
        state: _GpuState,
        key: GpmKey,
        fields: list[Field],
        values: dict[int, float],
    ) -> float | None:
        """DCP fields of a GPU without GPM, from DCGM's profiling module when it is there."""
        if self._profiling is None:
            for f in fields:
                self._unsupported(gpu, state, f, _NO_GPM + " and DCGM's Python bindings are absent")
            return None
        served = self._profiling.supports(gpu.uuid)
        try:
            dcgm = self._profiling.read(gpu.uuid, key.gpu_instance_id)
        except Exception as exc:  # DCGM raises its own error classes (hostengine gone, ...)
            self._stats.error("dcgm")
            log.debug("DCGM read of %s failed: %s", key, exc)
            return None
        for f in fields:
            if f.id not in served:
                self._unsupported(gpu, state, f, _NO_GPM + " and DCGM does not profile it")
            elif f.id in dcgm:
                values[f.id] = dcgm[f.id]
        gr_engine = dcgm.get(_GR_ENGINE_FIELD)
        return None if gr_engine is None else gr_engine * 100

    def _xid_value(
        self, gpu: GpuIdentity, state: _GpuState, xid: XidState | None, values: dict[int, float]
    ) -> None:
        xid_field = next(f for f in self._selected if f.id == _XID_FIELD)
        if xid is None:
            self._unsupported(gpu, state, xid_field, "XID events are not watched")
        elif gpu.index in xid.unsupported:
            self._unsupported(gpu, state, xid_field, xid.unsupported[gpu.index])
        else:
            values[_XID_FIELD] = float(xid.last.get(gpu.index, 0))

    def _unsupported(self, gpu: GpuIdentity, state: _GpuState, f: Field, reason: str) -> None:
        if f.id not in state.field_unsupported:
            state.field_unsupported[f.id] = reason
            if (f.name, reason, gpu.index) not in self._logged_unsupported:
                self._logged_unsupported.add((f.name, reason, gpu.index))
                self._newly_unsupported[(f.name, reason)].append(gpu.index)

    def _report_unsupported(self) -> None:
        """One log line per field and reason, naming every GPU it was found on this tick."""
        for (name, reason), gpus in sorted(self._newly_unsupported.items()):
            plural = "s" if len(gpus) > 1 else ""
            which = ", ".join(map(str, gpus))
            log.warning("%s is not supported on GPU%s %s: %s", name, plural, which, reason)
        self._newly_unsupported.clear()

    # -- pods -------------------------------------------------------------------------------------

    def _attribute(
        self,
        gpus: tuple[GpuIdentity, ...],
        layouts: Mapping[int, MigLayout],
        samples: list[EntitySample],
    ) -> tuple[list[EntitySample], list[PodUsage]]:
        """The attribution stage (agent/telemetry/attribution.py), then each held entity's
        per-process usage rows."""
        if self._pods is None:
            return samples, []
        placed = [n for i in layouts if (n := self._gpus[i].node_layout) is not None]
        uids = self._containers.pod_uid if self._containers is not None else (lambda _: None)
        result = attribute_samples(samples, gpus, layouts, placed, self._pods.current(), uids)
        self._unresolved.report(result.unresolved)
        return list(result.samples), self._processes.rows(result, layouts)

    # -- results ----------------------------------------------------------------------------------

    def _support(self, gpus: tuple[GpuIdentity, ...]) -> tuple[FieldSupport, ...]:
        out = []
        for gpu in gpus:
            state = self._gpus.get(gpu.index)
            if state is None:
                continue
            for f in self._selected:
                out.append(FieldSupport(f.id, gpu, f.id not in state.field_unsupported))
        return tuple(out)


def _idle_name(entity: Entity) -> str:
    """The idle file's key: the GPU UUID, and the GPU instance (id and profile) on it."""
    if entity.instance is None:
        return entity.gpu.uuid
    return f"{entity.gpu.uuid}/{entity.instance.gpu_instance_id}/{entity.instance.profile}"


def _reading(f: Field) -> Reading:
    assert isinstance(f.source, Nvml | NvmlRate)
    return f.source.reading


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


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)
