"""Right-sizing from observed use: pods whose work fits a smaller MIG profile (pure).

Over a window the coordinator reads every agent's telemetry snapshot (`GetTelemetrySnapshot`)
at an interval; a MIG GPU instance allocated to one container carries that container's
``PodRef``, its framebuffer use (``DCGM_FI_DEV_FB_USED``) and, where GPM exists (Hopper), its
engine activity (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, else ``SM_ACTIVE``). Per pod the window
keeps the peaks. A smaller profile of the same GPU model fits when, with ``headroom``:

* its memory holds the peak memory used, times (1 + headroom);
* its compute slices cover the peak activity times the current slices, times (1 + headroom);
* media engines stay: a ``+me`` device is only offered ``+me`` profiles, others none.

Unknown is not 0: a pod whose activity no sample reported (no GPM) is listed with the memory
fit only, and not suggested. Time-sliced GPUs carry no per-pod attribution in the snapshot
(``PodRef`` is unset when shared), so they are counted, not sized.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from math import ceil

from agent._proto.gpuagent.v1 import telemetry_pb2
from agent.coordinator.demand import Demand, DemandEntry
from agent.gpu.types import GpuLayout

__all__ = ["Observation", "Suggestion", "Window", "rightsized_demand", "suggest"]

FB_USED, FB_TOTAL = 252, 250
ACTIVITY = (1001, 1002)  # GR_ENGINE_ACTIVE, then SM_ACTIVE


@dataclass(slots=True)
class Observation:
    """One container on one MIG GPU instance, over the window."""

    namespace: str
    pod: str
    container: str
    node: str
    gpu_uuid: str
    gpu_instance_id: int
    profile: str
    samples: int = 0
    peak_memory_mib: float | None = None
    memory_total_mib: float | None = None
    peak_activity: float | None = None


@dataclass(frozen=True, slots=True)
class Suggestion:
    observation: Observation
    model: str
    #: the smallest profile the work fits, None when it fits nothing smaller (or is unknown).
    fits: str | None
    reason: str
    #: memory slices freed per device by moving to ``fits``.
    saves_slices: int = 0


@dataclass(slots=True)
class Window:
    """Peaks per (node, GPU, instance, pod) over the snapshots folded in."""

    observations: dict[tuple[str, str, int, str, str, str], Observation] = field(
        default_factory=dict
    )
    #: time-sliced or free entities seen without a pod, per node: counted, not sized.
    unattributed: Counter[str] = field(default_factory=Counter)
    snapshots: int = 0
    #: nodes whose last sweep failed, and why.
    failed: dict[str, str] = field(default_factory=dict)

    def add(self, node: str, snapshot: telemetry_pb2.TelemetrySnapshot) -> None:
        self.snapshots += 1
        self.failed.pop(node, None)
        for sample in snapshot.entities:
            entity = sample.entity
            if not entity.HasField("gpu_instance_id"):
                continue
            values = {v.field_id: v.value for v in sample.values}
            if not sample.HasField("pod") or not sample.pod.name:
                if values.get(FB_USED, 0.0) > 0:
                    self.unattributed[node] += 1
                continue
            key = (
                node,
                entity.gpu_uuid,
                entity.gpu_instance_id,
                sample.pod.namespace,
                sample.pod.name,
                sample.pod.container,
            )
            seen = self.observations.get(key)
            if seen is None:
                seen = self.observations[key] = Observation(
                    sample.pod.namespace,
                    sample.pod.name,
                    sample.pod.container,
                    node,
                    entity.gpu_uuid,
                    entity.gpu_instance_id,
                    entity.profile,
                )
            seen.samples += 1
            seen.peak_memory_mib = _peak(seen.peak_memory_mib, values.get(FB_USED))
            seen.memory_total_mib = values.get(FB_TOTAL, seen.memory_total_mib)
            activity = next((values[f] for f in ACTIVITY if f in values), None)
            seen.peak_activity = _peak(seen.peak_activity, activity)


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
    by_name = {p.name: p for p in layout.profiles}
    current = by_name.get(obs.profile)
    if current is None:
        return Suggestion(obs, model, None, f"{obs.profile} is not a profile of {model}")
    if obs.peak_memory_mib is None:
        return Suggestion(obs, model, None, "no memory sample in the window")
    need_mib = obs.peak_memory_mib * (1 + headroom)
    media = "+me" in current.name
    smaller = sorted(
        (
            p
            for p in layout.profiles
            if ("+me" in p.name) == media
            and (p.memory_slices, p.slice_count) < (current.memory_slices, current.slice_count)
            and p.memory_mb >= need_mib
        ),
        key=lambda p: (p.memory_slices, p.slice_count, p.memory_mb),
    )
    if obs.peak_activity is None:
        what = f"memory alone fits {smaller[0].name}" if smaller else "memory needs this size"
        return Suggestion(obs, model, None, f"activity unknown (no GPM sample); {what}")
    need_slices = ceil(obs.peak_activity * current.slice_count * (1 + headroom) - 1e-9)
    fitting = [p for p in smaller if p.slice_count >= need_slices]
    if not fitting:
        return Suggestion(
            obs, model, None, f"needs {need_mib:.0f} MiB and {need_slices} compute slice(s)"
        )
    best = fitting[0]
    return Suggestion(
        obs,
        model,
        best.name,
        f"peak {obs.peak_memory_mib:.0f} MiB of {current.memory_mb} MiB, activity "
        f"{obs.peak_activity:.0%} of {current.slice_count} slice(s)",
        saves_slices=current.memory_slices - best.memory_slices,
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
        elif keep_others:
            counts[(s.observation.profile, s.model)] += 1
    return Demand(tuple(DemandEntry(p, n, model) for (p, model), n in sorted(counts.items())))
