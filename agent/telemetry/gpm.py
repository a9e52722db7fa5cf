"""Two-sample GPM rates per GPU and per GPU instance (reference/telemetry.md §3.4, fact 3).

Each entity keeps two sample buffers: the baseline and a spare. A tick samples into the spare,
asks NVML for the averages between baseline and spare, then swaps them, so steady state costs one
sample and one metrics call per entity, with no allocation. The first tick of an entity only
seeds (no value: N/A, not 0); a window shorter than NVML's 100 ms refresh keeps serving the
previous value. An entity is keyed by its identity, which for a GPU instance includes its MIG
device UUIDs: a GI destroyed and re-created with the same id starts over instead of mixing the
counters of two instances. Buffers of entities that disappear, or fail, are freed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from agent.gpu.readings import GpmReadout, GpmSample, GpuInstanceInfo, MigLayout

#: NVML refreshes GPM counters every 100 ms; shorter windows are noise (DCGM #310).
MIN_WINDOW_S = 0.1


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


def instance_keys(layouts: Mapping[int, MigLayout]) -> Iterable[GpmKey]:
    """The keys of every GPU instance of ``layouts`` (GPU index -> MIG layout)."""
    for index, layout in layouts.items():
        for instance in layout.instances:
            yield GpmKey.of(index, instance)


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
