"""The one interface every telemetry source is read through, and how their parts merge.

A reader serves one source (NVML device readings, GPM, DCGM, XID events, processes, kubelet's
PodResources, DRA claims). Each tick the sampler hands every chosen reader the same
:class:`Frame` (the GPUs that answered and their MIG layouts) and takes back a :class:`Part`;
``merge`` unions the parts into the tick's readings. A reader that raises contributes nothing
that tick: its series are absent (never 0) and the sampler names it, with the reason, as
degraded, while the other readers' parts are published as usual. Readers that need to know who
holds what (processes) run after the attribution stage and find it in ``Frame.attribution``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agent.gpu.reading_calls import Reading
from agent.gpu.readings import GpuIdentity, MigLayout
from agent.gpu.types import GpuLayout, Process
from agent.telemetry.allocation import Allocation
from agent.telemetry.attribution import Attribution
from agent.telemetry.snapshot import ClockEventCount, P2pLink, PodUsage, XidCount

__all__ = ["Degraded", "EntityKey", "Frame", "Part", "Reader", "merge"]

#: (GPU index, GPU instance id or None for the whole GPU)
EntityKey = tuple[int, int | None]


class Degraded(Exception):
    """A source that cannot be read this tick; the message says why."""


@dataclass(frozen=True, slots=True)
class Frame:
    """What every reader reads against in one tick."""

    #: the sampler's monotonic seconds at the start of the tick
    now: float
    gpus: tuple[GpuIdentity, ...]
    #: GPU index -> MIG layout, of the GPUs that answered this tick
    layouts: Mapping[int, MigLayout]
    #: GPUs whose layout changed since the previous tick: what they refused may work now
    changed: frozenset[int] = frozenset()
    #: GPUs that have GPM (decided by NVML per device)
    gpm: frozenset[int] = frozenset()
    #: the planner's layouts of the GPUs that answered (DynamicMIG placements)
    placed: tuple[GpuLayout, ...] = ()
    #: who holds which GPU or instance; set for the readers that run after attribution
    attribution: Attribution | None = None
    #: GPU index -> its compute processes (with their GPU instance), as the planner's layout
    #: read them this tick; a GPU whose read failed is absent
    processes: Mapping[int, tuple[Process, ...]] = field(default_factory=dict)
    #: GPU index -> why its planner's layout (with the process list) was not read this tick
    unread: Mapping[int, str] = field(default_factory=dict)
    #: GPU index -> why it is not known whether it has GPM (NVML's probe failed this tick):
    #: neither GPM nor DCGM reads it, and neither says it has no GPM
    gpm_unknown: Mapping[int, str] = field(default_factory=dict)
    #: whether this agent changed the GPU (a MIG apply) since the tick began, or changes it
    #: now: a read of it that failed met the agent's own change, no fault (not counted)
    ours: Callable[[int], bool] = field(default=lambda _gpu: False)


@dataclass
class Part:
    """One reader's share of a tick's readings; each reader fills what its source provides."""

    #: entity -> DCGM field id -> value in the field's DCGM unit
    values: dict[EntityKey, dict[int, float]] = field(default_factory=dict)
    #: entity -> utilisation in %, for idle tracking (the first reader to give one wins)
    activity: dict[EntityKey, float] = field(default_factory=dict)
    #: (GPU index, DCGM field id, why it cannot be read there)
    unsupported: list[tuple[int, int, str]] = field(default_factory=list)
    #: GPU index -> why it is lost (marked down)
    lost: dict[int, str] = field(default_factory=dict)
    #: GPUs whose reads failed this tick: no series from them, their up state unchanged
    failed: set[int] = field(default_factory=set)
    #: GPU index -> the readings the health marks judge it by
    health: dict[int, Mapping[Reading, float]] = field(default_factory=dict)
    #: GPU index -> which of those readings failed this tick and why (the marks hold meanwhile)
    health_unread: dict[int, str] = field(default_factory=dict)
    clock_events: tuple[ClockEventCount, ...] = ()
    p2p: tuple[P2pLink, ...] = ()
    xids: tuple[XidCount, ...] = ()
    xid_recent: tuple[XidCount, ...] = ()
    #: which containers hold which devices (kubelet, DRA claims)
    allocations: tuple[Allocation, ...] = ()
    #: per-container usage of held entities
    usage: tuple[PodUsage, ...] = ()
    #: set by a reader whose source failed but which serves its last good answer (kubelet's
    #: pod allocations, DRA's slices): the part is published and the source is reported
    #: degraded, saying why
    degraded: str | None = None

    def value(self, key: EntityKey, field_id: int, value: float) -> None:
        self.values.setdefault(key, {})[field_id] = value


class Reader(Protocol):
    """One source of telemetry."""

    #: the source's name in status, logs and ``gpu_agent_collection_source_*{source}``
    name: str
    #: True for a reader that needs ``Frame.attribution``
    after_attribution: bool

    def read(self, frame: Frame) -> Part:
        """This tick's part; raises (Degraded or anything else) when the source fails."""
        ...

    def close(self) -> None:
        """Free what the reader holds (NVML buffers); the collection is stopping. Most readers
        hold nothing: they subclass this protocol and keep this empty default."""
        return None


def merge(parts: Iterable[Part]) -> Part:
    """The union of ``parts``, in reader order: values per entity, the first activity of an
    entity, every note, GPU lost or failed, and each kind of row."""
    out = Part()
    for part in parts:
        for key, values in part.values.items():
            out.values.setdefault(key, {}).update(values)
        for key, activity in part.activity.items():
            out.activity.setdefault(key, activity)
        out.unsupported.extend(part.unsupported)
        out.lost.update(part.lost)
        out.failed |= part.failed
        out.health.update(part.health)
        out.health_unread.update(part.health_unread)
        out.clock_events += part.clock_events
        out.p2p += part.p2p
        out.xids += part.xids
        out.xid_recent += part.xid_recent
        out.allocations += part.allocations
        out.usage += part.usage
    return out
