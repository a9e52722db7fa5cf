"""Typed records the GPU facade returns. Immutable; they never call NVML.

Every service above ``gpu/`` (MIG planner, sharing, telemetry, API) speaks these types, not pynvml.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, slots=True, order=True)
class Placement:
    """A GPU-instance placement in memory slices (or a CI placement in compute slices)."""

    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True, slots=True)
class GiProfile:
    """A GPU-instance profile as NVML reports it for one device (reference/mig.md §1.2-1.3).

    ``constant`` is the NVML_GPU_INSTANCE_PROFILE_* value used to query; ``id`` is what create,
    placement and listing calls take. ``name`` is computed per device (§1.7), e.g. ``1g.10gb+me``.
    ``memory_slices`` is the placement size, which is not ``slice_count`` (3g has size 4).
    """

    constant: int
    id: int
    name: str
    slice_count: int
    memory_slices: int
    instance_count: int
    memory_mb: int
    multiprocessor_count: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class CiProfile:
    """A compute-instance profile inside a GI of a given GI profile (reference/mig.md §1.6)."""

    constant: int
    id: int
    name: str
    slice_count: int
    instance_count: int
    multiprocessor_count: int


@dataclass(frozen=True, slots=True)
class ComputeInstance:
    id: int
    profile_id: int
    placement: Placement
    #: ``MIG-…`` UUID of the MIG device this CI forms with its GI; None if not visible yet.
    uuid: str | None


@dataclass(frozen=True, slots=True)
class GpuInstance:
    id: int
    profile_id: int
    profile_name: str
    placement: Placement
    compute_instances: tuple[ComputeInstance, ...]


@dataclass(frozen=True, slots=True)
class MigMode:
    current: bool
    pending: bool

    @property
    def is_pending(self) -> bool:
        """A mode change was requested and needs a GPU reset (or reboot) to take effect."""
        return self.current != self.pending


class ActivationStatus(Enum):
    """What ``nvmlDeviceSetMigMode`` returned as its activation status (reference/mig.md §2.2)."""

    APPLIED = "applied"
    IN_USE = "in-use"  # clients hold the GPU; the mode stays pending until a reset succeeds
    RESET_REQUIRED = "reset-required"  # passthrough VM: pending until reboot
    NOT_SUPPORTED = "not-supported"


@dataclass(frozen=True, slots=True)
class Process:
    pid: int
    used_memory_bytes: int | None
    #: GI / CI the process runs on when the GPU is in MIG mode, else None.
    gpu_instance_id: int | None
    compute_instance_id: int | None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static identity of one physical GPU."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    #: packed ``device << 16 | vendor`` as mig-parted's device-filter matches it, e.g. 0x233010DE.
    pci_device_id: int
    pci_subsystem_id: int
    memory_total_bytes: int
    #: None when the GPU is not MIG-capable.
    mig_mode: MigMode | None
    #: CUDA compute capability (major, minor); None when the driver did not say.
    compute_capability: tuple[int, int] | None = None

    @property
    def mig_capable(self) -> bool:
        return self.mig_mode is not None


@dataclass(frozen=True, slots=True)
class GpuLayout:
    """One GPU's MIG state at a moment: identity, profiles, instances and processes."""

    gpu: GpuInfo
    profiles: tuple[GiProfile, ...]
    instances: tuple[GpuInstance, ...]
    processes: tuple[Process, ...]

    @property
    def total_memory_slices(self) -> int:
        """8 on A100/H100/H200, 4 on A30: the size of the full-GPU profile's placement."""
        return max((p.memory_slices for p in self.profiles), default=0)


@dataclass(frozen=True, slots=True)
class _Unanswered:
    """A GPU the driver counts whose identity was not read now; ``detail`` says why.

    ``last_known`` is its identity when this process saw it answer before; None when it did
    not (NVML then may give no UUID, name or bus id for it).
    """

    index: int
    last_known: GpuInfo | None
    detail: str

    @property
    def uuid(self) -> str:
        return self.last_known.uuid if self.last_known is not None else ""

    @property
    def info(self) -> GpuInfo:
        """What is known of it: its last identity, or only its index (no UUID, no model)."""
        if self.last_known is not None:
            return self.last_known
        return GpuInfo(self.index, "", "", "", 0, 0, 0, None)


@dataclass(frozen=True, slots=True)
class LostGpu(_Unanswered):
    """A GPU the driver still counts but that no longer answers (fallen off the bus, XID 79)."""


@dataclass(frozen=True, slots=True)
class UnreadGpu(_Unanswered):
    """A GPU the driver counts, not lost, that fails a read of its identity (RESET_REQUIRED,
    UNKNOWN, TIMEOUT: often one that needs a reset). The others go on without it; what targets
    it is refused naming it and ``detail``, the failing call and its error."""


@dataclass(frozen=True, slots=True)
class PowerLimits:
    """A GPU's power management limits as NVML reports them, in milliwatts."""

    #: the range nvmlDeviceSetPowerManagementLimit accepts
    min_mw: int
    max_mw: int
    #: the limit after a reboot or driver reload
    default_mw: int
    #: the limit set (by the agent, nvidia-smi -pl, or the default)
    current_mw: int
    #: the limit the board enforces: the lowest of every limit in force (e.g. an in-band one)
    enforced_mw: int
