"""The DCGM reader: DCP fields for GPUs without GPM (Ampere and older), from NVIDIA DCGM when it
is installed.

Before Hopper the profiling counters are only reachable through DCGM's profiling module
(reference §2). DCGM's Python bindings are not on PyPI; they ship with the DCGM package in
``/usr/share/datacenter-gpu-manager-4/bindings/python3``, which must be on ``PYTHONPATH``. When
they are not importable, or nv-hostengine cannot be reached, the agent runs without this backend
and reports those fields unsupported. DCGM watches the fields on its own cadence (the agent's
interval); the reader takes its latest values, keyed by GPU UUID and NVML GPU-instance id.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from agent.telemetry.gpm import NO_GPM
from agent.telemetry.reader import Degraded, Frame, Part, Reader
from dcgm.fields import Field, Gpm, Level

log = logging.getLogger(__name__)

__all__ = [
    "DcgmProfiling",
    "DcgmReader",
    "ProfilingBackend",
    "entity_values",
    "load_dcgm_backend",
]

_GR_ENGINE_FIELD = 1001  # DCGM_FI_PROF_GR_ENGINE_ACTIVE: idle tracking
_FE_GPU = 1  # DCGM_FE_GPU
_FE_GPU_I = 4  # DCGM_FE_GPU_I
#: how often DCGM is asked again for a GPU instance it does not list yet
_REWATCH_S = 30.0
EntityKey = tuple[str, int | None]


def entity_values(
    latest: Mapping[int, Mapping[int, Mapping[int, float]]],
    gpu_uuids: Mapping[int, str],
    instances: Mapping[int, EntityKey],
) -> dict[EntityKey, dict[int, float]]:
    """Re-key DCGM's ``{entity group: {entity id: {field id: value}}}`` by (GPU UUID, GI id).

    ``gpu_uuids`` maps DCGM GPU ids to UUIDs; ``instances`` maps DCGM GPU-instance entity ids to
    (parent UUID, NVML GI id) from DCGM's MIG hierarchy. Entities of neither kind are dropped.
    """
    out: dict[EntityKey, dict[int, float]] = {}
    for group, keys in (
        (_FE_GPU, {i: (u, None) for i, u in gpu_uuids.items()}),
        (_FE_GPU_I, instances),
    ):
        for entity_id, values in latest.get(group, {}).items():
            key = keys.get(entity_id)
            if key is not None:
                out[key] = {int(f): float(v) for f, v in values.items()}
    return out


class DcgmProfiling:
    """The reader's ProfilingBackend over DCGM's ``DcgmReader`` and agent API."""

    def __init__(
        self, modules: Mapping[str, Any], field_ids: Iterable[int], interval_s: float
    ) -> None:
        self._m = modules
        self._field_ids = sorted(set(field_ids))
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._reader: Any = None
        self._gpu_uuids: dict[int, str] = {}
        self._instances: dict[int, EntityKey] = {}
        self._supported: dict[str, frozenset[int]] = {}
        self._values: dict[EntityKey, dict[int, float]] = {}
        self._read_at = 0.0
        self._connect()

    def _connect(self) -> None:
        """Read DCGM's GPUs and MIG hierarchy and watch them all; on failure (DCGM's error
        classes) what was watched before stays as it was."""
        reader_cls = self._m["DcgmReader"].DcgmReader
        structs, fields = self._m["dcgm_structs"], self._m["dcgm_fields"]
        probe = reader_cls(fieldIds=self._field_ids, updateFrequency=int(self._interval_s * 1e6))
        _init(probe)
        try:  # the probe is let go however the reads end
            handle = probe.m_dcgmHandle.handle
            hierarchy = self._m["dcgm_agent"].dcgmGetGpuInstanceHierarchy(handle)
            instances: dict[int, EntityKey] = {}
            entities = []
            for gpu_id in probe.m_dcgmGroup.GetGpuIds():
                entities.append(structs.c_dcgmGroupEntityPair_t(fields.DCGM_FE_GPU, gpu_id))
            for i in range(hierarchy.count):
                item = hierarchy.entityList[i]
                if item.entity.entityGroupId == _FE_GPU_I:
                    uuid = (
                        item.info.gpuUuid.decode()
                        if isinstance(item.info.gpuUuid, bytes)
                        else str(item.info.gpuUuid)
                    )
                    instances[item.entity.entityId] = (uuid, int(item.info.nvmlInstanceId))
                    entities.append(item.entity)
            gpu_uuids = {gpu_id: str(uuid) for gpu_id, uuid in probe.m_gpuIdToUUId.items()}
            supported = {uuid: self._groups(handle, gpu_id) for gpu_id, uuid in gpu_uuids.items()}
        finally:
            probe.Shutdown()
        reader = reader_cls(
            fieldIds=self._field_ids, updateFrequency=int(self._interval_s * 1e6), entities=entities
        )
        _init(reader)
        old, self._reader = self._reader, reader
        self._instances, self._gpu_uuids, self._supported = instances, gpu_uuids, supported
        self._read_at = 0.0  # the next read asks the new reader
        if old is not None:
            old.Shutdown()

    def instances(self) -> frozenset[EntityKey]:
        return frozenset(self._instances.values())

    def rewatch(self) -> None:
        with self._lock:
            self._connect()

    def _groups(self, handle: Any, gpu_id: int) -> frozenset[int]:
        """Field ids DCGM can profile on this GPU (its metric groups)."""
        try:
            groups = self._m["dcgm_agent"].dcgmProfGetSupportedMetricGroups(handle, gpu_id)
        except Exception as exc:  # DCGM raises its own error classes, one per status
            log.warning("DCGM cannot profile GPU %d: %s", gpu_id, exc)
            return frozenset()
        ids: set[int] = set()
        for i in range(groups.numMetricGroups):
            group = groups.metricGroups[i]
            ids.update(group.fieldIds[j] for j in range(group.numFieldIds))
        return frozenset(ids) & frozenset(self._field_ids)

    def supports(self, gpu_uuid: str) -> frozenset[int]:
        return self._supported.get(gpu_uuid, frozenset())

    def read(self, gpu_uuid: str, gpu_instance_id: int | None) -> Mapping[int, float]:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self._interval_s / 2:  # once per tick for all entities
                latest = self._reader.GetLatestEntityValuesAsFieldIdDict()
                answered = latest.get(_FE_GPU, {})
                if self._gpu_uuids and not any(g in answered for g in self._gpu_uuids):
                    # DcgmReader catches a lost connection, disconnects and answers {} (it
                    # reconnects on the next call): nothing for every watched GPU is a
                    # failure, not a tick of no values. Asked again on the next read.
                    self._values = {}
                    raise Degraded(
                        "DCGM answered no value for any of its GPUs "
                        "(DcgmReader drops a lost nv-hostengine connection)"
                    )
                self._values = entity_values(latest, self._gpu_uuids, self._instances)
                self._read_at = now
            return self._values.get((gpu_uuid, gpu_instance_id), {})


def _init(reader: Any) -> None:
    """Connect a DcgmReader. Its Init catches a refused connection (logs it and keeps no
    handle) instead of raising: that is raised here, so no reader without one is used."""
    reader.Init()
    if reader.m_dcgmHandle is None:
        raise ConnectionError("nv-hostengine cannot be reached (DcgmReader has no connection)")


def load_dcgm_backend(
    field_ids: Iterable[int],
    interval_s: float,
    importer: Callable[[str], Any] = importlib.import_module,
) -> DcgmProfiling | None:
    """The DCGM backend, or None (with one log line) when DCGM is not usable here."""
    names = ("DcgmReader", "dcgm_agent", "dcgm_fields", "dcgm_structs")
    try:
        modules = {name: importer(name) for name in names}
    except ImportError:
        log.info(
            "DCGM Python bindings not importable: profiling fields are unsupported on GPUs without "
            "GPM (add /usr/share/datacenter-gpu-manager-4/bindings/python3 to PYTHONPATH)"
        )
        return None
    try:
        return DcgmProfiling(modules, field_ids, interval_s)
    except Exception as exc:  # connection and init failures surface as DCGM's own error classes
        log.warning("DCGM is installed but unusable (%s): profiling fields unsupported", exc)
        return None


class ProfilingBackend(Protocol):
    """DCP values for GPUs without GPM (DCGM's profiling module on Ampere and older)."""

    def supports(self, gpu_uuid: str) -> frozenset[int]:
        """DCGM field ids this backend serves for the GPU (and its instances)."""
        ...

    def read(self, gpu_uuid: str, gpu_instance_id: int | None) -> Mapping[int, float]:
        """Latest values (DCGM units) of one GPU or GPU instance; raises (Degraded, with why)
        when DCGM did not answer, never an empty answer for a failure."""
        ...

    def instances(self) -> frozenset[EntityKey]:
        """The GPU instances it watches: (parent GPU UUID, NVML GI id)."""
        ...

    def rewatch(self) -> None:
        """Read DCGM's MIG hierarchy again and watch the GPU instances it lists now."""
        ...


class DcgmReader(Reader):
    """The DCGM reader: DCP fields, and GR-engine activity for idle tracking, of the GPUs and
    GPU instances on GPUs without GPM. A failing hostengine fails the reader (its fields have
    no value this tick), never the GPM or NVML readers."""

    name = "dcgm"
    after_attribution = False

    def __init__(self, backend: ProfilingBackend, fields: Sequence[Field]) -> None:
        self._backend = backend
        self._fields = [f for f in fields if isinstance(f.source, Gpm)]
        self._instance_fields = [f for f in self._fields if f.level is not Level.GPU]
        self._rewatched_at = float("-inf")

    def read(self, frame: Frame) -> Part:
        self._follow_layouts(frame)
        part = Part()
        for index, layout in frame.layouts.items():
            if index in frame.gpm or index in frame.gpm_unknown:
                continue  # GPM serves it, or may: DCGM must not call it a GPU without GPM
            uuid = frame.gpus[index].uuid
            served = self._backend.supports(uuid)
            self._entity(uuid, (index, None), self._fields, served, part)
            for instance in layout.instances:
                self._entity(uuid, (index, instance.id), self._instance_fields, served, part)
        return part

    def _follow_layouts(self, frame: Frame) -> None:
        """DCGM watches the GPU instances it listed when the agent connected. After a layout
        change of a GPU it profiles (an instance made, or made again under the same GI id as
        another DCGM entity) it is asked again at once, then every ``_REWATCH_S`` while an
        instance is still missing from its list."""
        # Only GPUs DCGM profiles: another's instances never appear in its list.
        profiled = [
            i
            for i in frame.layouts
            if i not in frame.gpm and self._backend.supports(frame.gpus[i].uuid)
        ]
        wanted = {
            (frame.gpus[i].uuid, gi.id) for i in profiled for gi in frame.layouts[i].instances
        }
        changed = any(i in frame.changed for i in profiled)
        missing = not wanted <= self._backend.instances()
        if changed or (missing and frame.now - self._rewatched_at >= _REWATCH_S):
            self._rewatched_at = frame.now
            try:
                self._backend.rewatch()
            except Exception as exc:  # DCGM's own error classes: the old watch stays
                log.warning("DCGM could not watch the new MIG layout (kept the old one): %s", exc)

    def _entity(
        self,
        uuid: str,
        key: tuple[int, int | None],
        fields: list[Field],
        served: frozenset[int],
        part: Part,
    ) -> None:
        values = self._backend.read(uuid, key[1])
        for f in fields:
            if f.id not in served:
                reason = NO_GPM + " and DCGM does not profile it"
                part.unsupported.append((key[0], f.id, reason))
            elif f.id in values:
                part.value(key, f.id, values[f.id])
        gr_engine = values.get(_GR_ENGINE_FIELD)
        if gr_engine is not None:
            part.activity[key] = gr_engine * 100
