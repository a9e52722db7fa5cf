"""The GPM reader, and its two-sample rates per GPU and per GPU instance (reference/telemetry.md
§3.4, fact 3).

Each entity keeps two sample buffers: the baseline and a spare. A tick samples into the spare,
asks NVML for the averages between baseline and spare, then swaps them, so steady state costs one
sample and one metrics call per entity, with no allocation. The first tick of an entity only
seeds (no value: N/A, not 0); a window shorter than NVML's 100 ms refresh keeps serving the
previous value. An entity is keyed by its identity, which for a GPU instance includes its MIG
device UUIDs: a GI destroyed and re-created with the same id starts over instead of mixing the
counters of two instances. Buffers of entities that disappear, or fail, are freed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.errors import AgentError, DeviceLost
from agent.gpu.readings import GpmReadout, GpmSample, GpuInstanceInfo
from agent.telemetry.reader import Frame, Part
from agent.telemetry.stats import TelemetryStats
from dcgm.fields import Field, Gpm, Level

log = logging.getLogger(__name__)

#: NVML refreshes GPM counters every 100 ms; shorter windows are noise (DCGM #310).
MIN_WINDOW_S = 0.1
#: NVML_GPM_METRIC_GRAPHICS_UTIL: idle tracking where NVML has no utilisation (MIG)
GR_ENGINE_METRIC = 1
NO_GPM = "the GPU has no GPM (Hopper or newer has)"


class GpmSource(Protocol):
    """The GPM calls of :class:`agent.gpu.readings.NodeReader`."""

    def gpm_sample(
        self, gpu: int, gpu_instance_id: int | None = None, into: GpmSample | None = None
    ) -> GpmSample: ...

    def gpm_metrics(
        self, first: GpmSample, second: GpmSample, metric_ids: Iterable[int]
    ) -> GpmReadout: ...

    def gpm_free(self, sample: GpmSample) -> None: ...


@dataclass(frozen=True, slots=True)
class GpmKey:
    """One sampled entity: a GPU (``gpu_instance_id`` None) or a GPU instance."""

    gpu: int
    gpu_instance_id: int | None
    #: what makes this the same entity across ticks: GPU UUID, or the GI's MIG device UUIDs
    identity: str

    @classmethod
    def of(cls, gpu: int, instance: GpuInstanceInfo) -> GpmKey:
        """The key of GPU instance ``instance`` on GPU ``gpu``."""
        return cls(gpu, instance.id, ",".join(sorted(d.uuid for d in instance.devices)))


class _Entity:
    __slots__ = ("baseline", "last", "spare", "taken_at")

    def __init__(self, baseline: GpmSample, taken_at: float) -> None:
        self.baseline = baseline
        self.taken_at = taken_at
        self.spare: GpmSample | None = None
        self.last: GpmReadout | None = None


class GpmTracker:
    """Owns every GPM buffer of the sampler; call from the sampler thread only."""

    def __init__(
        self,
        source: GpmSource,
        metric_ids: Iterable[int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._metric_ids = tuple(sorted(set(metric_ids)))
        self._clock = clock
        self._entities: dict[GpmKey, _Entity] = {}

    @property
    def metric_ids(self) -> tuple[int, ...]:
        return self._metric_ids

    def collect(self, key: GpmKey) -> GpmReadout | None:
        """The averages since this entity's previous tick; None on its first tick.

        Raises what the reader raises (DeviceLost, NotFound for a vanished instance); the entity's
        buffers are freed first, so the next success starts a fresh window.
        """
        entity = self._entities.get(key)
        try:
            if entity is None:
                sample = self._source.gpm_sample(key.gpu, key.gpu_instance_id)
                self._entities[key] = _Entity(sample, self._clock())
                return None
            now = self._clock()
            if now - entity.taken_at < MIN_WINDOW_S:
                return entity.last
            spare = self._source.gpm_sample(key.gpu, key.gpu_instance_id, into=entity.spare)
            entity.spare = spare
            readout = self._source.gpm_metrics(entity.baseline, spare, self._metric_ids)
        except BaseException:
            self.drop(key)
            raise
        entity.baseline, entity.spare = spare, entity.baseline
        entity.taken_at = now
        entity.last = readout
        return readout

    def retain(self, keys: Iterable[GpmKey]) -> None:
        """Free the buffers of every entity not in ``keys`` (instances destroyed, GPUs lost)."""
        keep = set(keys)
        for key in [k for k in self._entities if k not in keep]:
            self.drop(key)

    def drop(self, key: GpmKey) -> None:
        entity = self._entities.pop(key, None)
        if entity is not None:
            self._source.gpm_free(entity.baseline)
            if entity.spare is not None:
                self._source.gpm_free(entity.spare)

    def close(self) -> None:
        self.retain(())

    def __len__(self) -> int:
        return len(self._entities)


class GpmReader:
    """The GPM reader: DCP fields per GPU and per GPU instance on GPUs with GPM, and their
    GR-engine activity for idle tracking (read whatever the counters select). On a GPU without
    GPM it reads nothing; with no DCGM reader to serve it, its DCP fields are unsupported."""

    name = "gpm"
    after_attribution = False

    def __init__(
        self,
        source: GpmSource,
        fields: Sequence[Field],
        stats: TelemetryStats,
        clock: Callable[[], float] = time.monotonic,
        *,
        dcgm: bool = False,
    ) -> None:
        self._fields = [_plan(f) for f in fields if isinstance(f.source, Gpm)]
        self._instance_fields = [
            _plan(f) for f in fields if isinstance(f.source, Gpm) and f.level is not Level.GPU
        ]
        self._stats = stats
        self._dcgm = dcgm
        gpu_metrics = {metric for _, metric, _, _ in self._fields}
        gi_metrics = {metric for _, metric, _, _ in self._instance_fields}
        self._gpu = GpmTracker(source, gpu_metrics | {GR_ENGINE_METRIC}, clock)
        self._gi = GpmTracker(source, gi_metrics | {GR_ENGINE_METRIC}, clock)

    def close(self) -> None:
        self._gpu.close()
        self._gi.close()

    def read(self, frame: Frame) -> Part:
        part = Part()
        instances: dict[int, list[GpmKey]] = {}
        for index, layout in frame.layouts.items():
            gpu = frame.gpus[index]
            instances[index] = keys = [GpmKey.of(index, i) for i in layout.instances]
            if index not in frame.gpm:
                # Not known to have no GPM (the probe failed): nothing read, nothing refused.
                if not self._dcgm and index not in frame.gpm_unknown:
                    reason = NO_GPM + " and DCGM's Python bindings are absent"
                    part.unsupported.extend((index, f, reason) for f, _, _, _ in self._fields)
                continue
            try:
                self._entity(GpmKey(index, None, gpu.uuid), self._fields, part, frame.ours)
                for key in keys:
                    self._entity(key, self._instance_fields, part, frame.ours)
            except DeviceLost as exc:
                part.lost[index] = str(exc)
        kept = [i for i in frame.layouts if i not in part.lost]
        self._gpu.retain(GpmKey(i, None, frame.gpus[i].uuid) for i in kept)
        self._gi.retain(key for i in kept for key in instances[i])
        unknown = [f"GPU {i}: {why}" for i, why in sorted(frame.gpm_unknown.items())]
        if unknown:  # its profiling series are absent, and the source says why
            part.degraded = "GPM support not known (its probe failed): " + "; ".join(unknown)
        return part

    def _entity(
        self, key: GpmKey, fields: list[_FieldPlan], part: Part, ours: Callable[[int], bool]
    ) -> None:
        tracker = self._gpu if key.gpu_instance_id is None else self._gi
        try:
            readout = tracker.collect(key)
        except DeviceLost:
            raise
        except AgentError as exc:
            if not ours(key.gpu):  # a failure that met this agent's own MIG change: no fault
                self._stats.error("gpm")
            log.debug("GPM sample of %s failed: %s", key, exc)
            return
        if readout is None:
            return  # first window of this entity: nothing to report yet
        entity = (key.gpu, key.gpu_instance_id)
        out = part.values.setdefault(entity, {})
        for field_id, metric, mul, div in fields:
            value = readout.values.get(metric)
            if value is not None:
                out[field_id] = value * mul / div  # the field's Scale, without a call per value
            elif metric in readout.unsupported and key.gpu_instance_id is None:
                part.unsupported.append(
                    (key.gpu, field_id, f"GPM metric {metric} is not supported")
                )
        activity = readout.values.get(GR_ENGINE_METRIC)
        if activity is not None:
            part.activity[entity] = activity


#: (DCGM field id, GPM metric id, its Scale's mul and div) of a selected GPM field
_FieldPlan = tuple[int, int, float, float]


def _plan(f: Field) -> _FieldPlan:
    assert isinstance(f.source, Gpm)
    return f.id, f.source.metric_id, f.source.scale.mul, f.source.scale.div
