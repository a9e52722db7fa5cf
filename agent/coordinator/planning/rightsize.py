"""Right-sizing from observed use: pods whose work fits a smaller MIG profile (pure).

Over a window the coordinator reads every agent's telemetry snapshot (`GetTelemetrySnapshot`)
at an interval; a MIG GPU instance allocated to one container carries that container's
``PodRef``, its framebuffer use (``DCGM_FI_DEV_FB_USED``) and, where GPM exists (Hopper), its
engine activity (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, else ``SM_ACTIVE``). Per pod the window
keeps the peaks. A smaller profile of the same GPU model fits when, with ``headroom``:

* its memory holds the peak memory used, times (1 + headroom);
* its compute slices cover the peak activity times the current slices, times (1 + headroom);
* media engines stay: a ``+me`` device is only offered ``+me`` profiles, others none.

A shared (time-sliced) device has no single ``PodRef``; the snapshot's per-container use
(``pods``: memory and SM utilisation from NVML's per-process data) tells its containers apart.
A container on a shared whole GPU is sized against MIG profiles of that GPU's model: the
smallest one holding its peak memory, with compute slices for its peak SM utilisation of the
whole GPU, with headroom, is where its work would fit on its own.

Unknown is not 0: a pod whose activity no sample reported (no GPM; NVML has no per-process
utilisation under MIG) is listed with the memory fit only, and not suggested.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from math import ceil

from agent.coordinator.planning.demand import Demand, DemandEntry
from agent.gpu.types import GpuLayout
from agent.telemetry.snapshot import PodRef
from agent.wire.telemetry import SampledEntity, TelemetryView

__all__ = ["Observation", "Suggestion", "Window", "rightsized_demand", "suggest"]

FB_USED, FB_TOTAL = 252, 250
ACTIVITY = (1001, 1002)  # GR_ENGINE_ACTIVE, then SM_ACTIVE


@dataclass(slots=True)
class Observation:
    """One container on one MIG GPU instance, or on a shared whole GPU, over the window."""

    namespace: str
    pod: str
    container: str
    node: str
    gpu_uuid: str
    #: None for a whole GPU (shared).
    gpu_instance_id: int | None
    #: the instance's profile; "" for a whole GPU.
    profile: str
    #: whether other containers share the device (time-slicing).
    shared: bool = False
    samples: int = 0
    peak_memory_mib: float | None = None
    memory_total_mib: float | None = None
    peak_activity: float | None = None

    @property
    def device(self) -> str:
        return self.profile or "whole GPU"


@dataclass(frozen=True, slots=True)
class Suggestion:
    observation: Observation
    model: str
    #: the smallest profile the work fits, None when it fits nothing smaller (or is unknown).
    fits: str | None
    reason: str
    #: memory slices freed per device by moving to ``fits`` (0 from a shared GPU).
    saves_slices: int = 0


_Key = tuple[str, str, int | None, str, str, str]


@dataclass(slots=True)
class Window:
    """Peaks per (node, GPU, instance, pod) over the snapshots folded in."""

    observations: dict[_Key, Observation] = field(default_factory=dict)
    #: busy shared devices seen with no per-container use, per node: counted, not sized.
    unattributed: Counter[str] = field(default_factory=Counter)
    snapshots: int = 0
    #: nodes whose last sweep failed, and why.
    failed: dict[str, str] = field(default_factory=dict)

    def add(self, node: str, snapshot: TelemetryView) -> None:
        self.snapshots += 1
        self.failed.pop(node, None)
        per_container = {(u.entity.gpu_uuid, _gi(u.entity)) for u in snapshot.pods if u.pod.name}
        for sample in snapshot.samples:
            entity = sample.entity
            if entity.gpu_instance_id is None:
                continue
            values = sample.values
            if sample.pod is None or not sample.pod.name:
                busy = values.get(FB_USED, 0.0) > 0
                if busy and (entity.gpu_uuid, _gi(entity)) not in per_container:
                    self.unattributed[node] += 1
                continue
            seen = self._seen(node, entity, sample.pod, shared=False)
            seen.memory_total_mib = values.get(FB_TOTAL, seen.memory_total_mib)
            activity = next((values[f] for f in ACTIVITY if f in values), None)
            seen.peak_memory_mib = _peak(seen.peak_memory_mib, values.get(FB_USED))
            seen.peak_activity = _peak(seen.peak_activity, activity)
        exclusive = {
            (s.entity.gpu_uuid, _gi(s.entity))
            for s in snapshot.samples
            if s.pod is not None and s.pod.name
        }
        for usage in snapshot.pods:
            where = (usage.entity.gpu_uuid, _gi(usage.entity))
            if not usage.pod.name or where in exclusive:
                continue  # an exclusive device is sized from its own sample
            seen = self._seen(node, usage.entity, usage.pod, shared=True)
            if usage.memory_used_bytes is not None:
                memory = usage.memory_used_bytes / (1 << 20)
                seen.peak_memory_mib = _peak(seen.peak_memory_mib, memory)
            if usage.sm_utilization is not None:
                seen.peak_activity = _peak(seen.peak_activity, usage.sm_utilization)

    def _seen(
        self,
        node: str,
        entity: SampledEntity,
        pod: PodRef,
        *,
        shared: bool,
    ) -> Observation:
        key = (node, entity.gpu_uuid, _gi(entity), pod.namespace, pod.name, pod.container)
        seen = self.observations.get(key)
        if seen is None:
            seen = self.observations[key] = Observation(
                pod.namespace,
                pod.name,
                pod.container,
                node,
                entity.gpu_uuid,
                _gi(entity),
                entity.profile,
                shared,
            )
        seen.samples += 1
        return seen


def _gi(entity: SampledEntity) -> int | None:
    return entity.gpu_instance_id


def _peak(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    return new if old is None else max(old, new)


def suggest(
    window: Window, layouts: Mapping[str, GpuLayout], headroom: float = 0.2
) -> list[Suggestion]:
    """Per observed pod: the smallest profile of its GPU's model its peaks fit (see the doc)."""
    out = []
    for obs in sorted(window.observations.values(), key=lambda o: (o.namespace, o.pod, o.node)):
        layout = layouts.get(obs.gpu_uuid)
        if layout is None:
            out.append(Suggestion(obs, "", None, "the GPU is not in the inventory"))
            continue
        out.append(_suggest(obs, layout, headroom))
    return out


def _suggest(obs: Observation, layout: GpuLayout, headroom: float) -> Suggestion:
    model = layout.gpu.name
    if not layout.profiles:
        return Suggestion(obs, model, None, f"{model} has no MIG profiles")
    whole = max(layout.profiles, key=lambda p: (p.memory_slices, p.slice_count))
    by_name = {p.name: p for p in layout.profiles}
    current = by_name.get(obs.profile) if obs.profile else whole
    if current is None:
        return Suggestion(obs, model, None, f"{obs.profile} is not a profile of {model}")
    if obs.peak_memory_mib is None:
        return Suggestion(obs, model, None, "no memory sample in the window")
    need_mib = obs.peak_memory_mib * (1 + headroom)
    media = "+me" in current.name
    size = (current.memory_slices, current.slice_count)
    # A MIG device is offered smaller profiles; a shared whole GPU any, the full one included
    # (then it is told its work needs the whole GPU).
    smaller = sorted(
        (
            p
            for p in layout.profiles
            if ("+me" in p.name) == media
            and ((p.memory_slices, p.slice_count) < size or not obs.profile)
            and p.memory_mb >= need_mib
        ),
        key=lambda p: (p.memory_slices, p.slice_count, p.memory_mb),
    )
    if obs.peak_activity is None:
        what = f"memory alone fits {smaller[0].name}" if smaller else "memory needs this size"
        return Suggestion(
            obs, model, None, f"activity unknown (no GPM or per-process sample); {what}"
        )
    need_slices = ceil(obs.peak_activity * current.slice_count * (1 + headroom) - 1e-9)
    fitting = [p for p in smaller if p.slice_count >= need_slices]
    if not fitting:
        return Suggestion(
            obs, model, None, f"needs {need_mib:.0f} MiB and {need_slices} compute slice(s)"
        )
    best = fitting[0]
    if not obs.profile and best is whole:
        return Suggestion(obs, model, None, "its work needs the whole GPU")
    return Suggestion(
        obs,
        model,
        best.name,
        f"peak {obs.peak_memory_mib:.0f} MiB of {current.memory_mb} MiB, activity "
        f"{obs.peak_activity:.0%} of {current.slice_count} slice(s)"
        + (" (shared)" if obs.shared else ""),
        saves_slices=0 if not obs.profile else current.memory_slices - best.memory_slices,
    )


def rightsized_demand(suggestions: Iterable[Suggestion], keep_others: bool = True) -> Demand:
    """The devices the observed pods need: the smaller profile where one fits, per model.

    ``keep_others``: pods with no smaller fit keep asking for their current profile.
    """
    counts: Counter[tuple[str, str]] = Counter()
    for s in suggestions:
        if not s.model:
            continue
        if s.fits is not None:
            counts[(s.fits, s.model)] += 1
        elif keep_others and s.observation.profile:
            counts[(s.observation.profile, s.model)] += 1
    return Demand(tuple(DemandEntry(p, n, model) for (p, model), n in sorted(counts.items())))
