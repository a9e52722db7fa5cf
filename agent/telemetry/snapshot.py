"""The immutable result of one collection tick, which every scrape renders.

Built by the sampler thread, published whole, never mutated: a scrape reads one consistent
snapshot without locks and without NVML. Values are in the DCGM unit of their field
(``dcgm.fields``); a field missing from ``values`` has no value this tick (unsupported or failed),
which the exporter omits rather than reporting 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.gpu.reading_calls import Reading
from agent.gpu.readings import GpuIdentity
from agent.gpu.types import GpuLayout

__all__ = [
    "ClockEventCount",
    "DraClaim",
    "Entity",
    "EntitySample",
    "FieldSupport",
    "GpuIdentity",
    "GpuStatus",
    "HealthReadings",
    "InstanceIdentity",
    "P2pLink",
    "PodRef",
    "PodUsage",
    "Snapshot",
    "SourceStatus",
    "XidCount",
]


@dataclass(frozen=True, slots=True)
class InstanceIdentity:
    """A MIG GPU instance."""

    gpu_instance_id: int
    #: profile name, e.g. ``1g.10gb``
    profile: str


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """A container of a pod; kubelet's PodResources names pods without UIDs."""

    namespace: str
    name: str
    container: str


@dataclass(frozen=True, slots=True)
class DraClaim:
    """The DRA claim a GPU or instance was allocated through: dcgm-exporter's ``dra_*`` labels,
    filled as it fills them (``mig_*`` only for a device of type ``mig``)."""

    name: str
    namespace: str
    driver: str
    pool: str
    device: str
    #: the slice's ``profile`` attribute, e.g. ``1g.10gb``
    mig_profile: str | None = None
    #: the slice's ``uuid`` attribute, or for a DynamicMIG device (none in the slice) the MIG
    #: device UUID NVML reports for the instance it resolved to
    mig_device_uuid: str | None = None


@dataclass(frozen=True, slots=True)
class Entity:
    """A GPU (``instance`` None) or one of its GPU instances."""

    gpu: GpuIdentity
    instance: InstanceIdentity | None = None


@dataclass(frozen=True, slots=True)
class EntitySample:
    entity: Entity
    #: DCGM field id -> value in the field's DCGM unit
    values: Mapping[int, float]
    #: the one container this GPU or instance is allocated to; None when free or shared
    pod: PodRef | None = None
    #: seconds since utilisation was last above the idle threshold; None when unknown
    idle_seconds: float | None = None
    #: the DRA claim ``pod`` holds it through; None for device-plugin pods
    claim: DraClaim | None = None
    #: the pod's UID (from kubelet's log links), on DRA-attributed rows; None when unknown
    pod_uid: str | None = None


@dataclass(frozen=True, slots=True)
class PodUsage:
    """One container's own use of a GPU or instance, from NVML's per-process data."""

    entity: Entity
    pod: PodRef
    memory_used_bytes: float | None
    #: summed SM utilisation of its processes (0-1); None where NVML has none (MIG)
    sm_utilization: float | None
    claim: DraClaim | None = None
    pod_uid: str | None = None


@dataclass(frozen=True, slots=True)
class XidCount:
    entity: Entity
    xid: int
    count: int
    #: when (Unix time) the first of ``count`` came; None where not kept (the window's counts)
    first_seen: float | None = None


@dataclass(frozen=True, slots=True)
class ClockEventCount:
    gpu: GpuIdentity
    #: dcgm-exporter's clock_event label, e.g. ``power_cap``
    reason: str
    #: samples within the window with the reason set
    count: int


@dataclass(frozen=True, slots=True)
class P2pLink:
    gpu: GpuIdentity
    peer: int
    #: nvmlGpuP2PStatus_t, 0 = OK
    status: int


@dataclass(frozen=True, slots=True)
class GpuStatus:
    gpu: GpuIdentity
    #: True: it answered (this tick, or its last whole tick before a failed one); False: lost;
    #: None: not read once since the agent started, so whether it works is unknown
    up: bool | None
    #: why the GPU is down (the driver's error); empty while it is up
    detail: str = ""
    #: why its layout and process list were not read this tick (the failing call); "" when
    #: they were. The snapshot's layout of it is then the last read (or none): not current
    unread: str = ""


@dataclass(frozen=True, slots=True)
class HealthReadings:
    """What the health marks judge a GPU by this tick (``HEALTH_READINGS`` in devices.py),
    read whatever the counters select; a reading NVML does not support is absent, one whose
    call failed this tick is absent and named in ``unread``."""

    gpu: GpuIdentity
    values: Mapping[Reading, float]
    #: the health calls that failed this tick and why ("" when every one answered or is not
    #: supported): nothing is known of what they read, so no mark clears meanwhile
    unread: str = ""


@dataclass(frozen=True, slots=True)
class FieldSupport:
    """Whether a selected field could be read on a GPU (its own series or its instances')."""

    field_id: int
    gpu: GpuIdentity
    supported: bool


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Whether a telemetry source (one reader) was read this tick; its series are absent, not
    0, while it is degraded."""

    source: str
    #: why it failed this tick; None when it was read
    degraded: str | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    #: wall-clock seconds when the tick started (for display: the wall clock may step)
    taken_at: float
    hostname: str
    driver_version: str
    nvml_version: str
    gpus: tuple[GpuStatus, ...]
    entities: tuple[EntitySample, ...]
    pods: tuple[PodUsage, ...] = ()
    xids: tuple[XidCount, ...] = ()
    support: tuple[FieldSupport, ...] = ()
    #: XIDs per GPU within the last window (DCGM_EXP_XID_ERRORS_COUNT), when selected
    xid_recent: tuple[XidCount, ...] = ()
    #: clock-event reasons per GPU within the last window (DCGM_EXP_CLOCK_EVENTS_COUNT)
    clock_events: tuple[ClockEventCount, ...] = ()
    #: NVLink P2P status of each GPU to each peer (DCGM_EXP_P2P_STATUS), when selected
    p2p: tuple[P2pLink, ...] = ()
    #: each GPU's MIG layout and processes (the planner's view) for the API's inventory; a GPU
    #: down this tick keeps its last known layout, one never seen up has none
    layouts: tuple[GpuLayout, ...] = ()
    #: the sampler's monotonic seconds when the tick started: what orders snapshots
    taken_mono: float = 0.0
    #: per GPU that answered: ECC, row-remap and clock-event readings for the health marks
    health: tuple[HealthReadings, ...] = ()
    #: each reader chosen for the counters, and why it failed this tick where it did
    sources: tuple[SourceStatus, ...] = ()

    def serving(self) -> int:
        """How many GPUs answered this tick."""
        return sum(1 for g in self.gpus if g.up is True)

    def gpu_idle_seconds(self) -> dict[str, float]:
        """Whole GPUs' idle seconds by UUID, where known (MIG instances are left out)."""
        return {
            s.entity.gpu.uuid: s.idle_seconds
            for s in self.entities
            if s.entity.instance is None and s.idle_seconds is not None
        }
