"""The simulated node's state as plain data: what the kernel driver would hold for the node.

One ``NodeState`` is serialised to one JSON file (see ``store.py``). Nothing here has behaviour
beyond lookups; the driver rules live in ``layout.py``, ``lifecycle.py`` and ``activity.py``.
"""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from agent.errors import Conflict
from agent.gpu.sim.presets import Preset

FORMAT = 1

# PCI buses of the GPUs on a DGX H100 board, reused for every preset (first N).
_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass
class Activity:
    """Counters integrated over time: ``totals`` hold each rate's integral up to ``since``.

    ``since`` is a ``time.monotonic()`` reading; CLOCK_MONOTONIC is shared by every process on
    the host, so the agent and the CLI integrate on one clock.
    """

    rates: dict[str, float] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)
    since: float = 0.0


@dataclass
class ComputeInstance:
    id: int
    profile_id: int
    start: int  # compute slices inside the GI
    size: int
    serial: int  # node-unique, never reused: makes stale handles detectable
    uuid: str  # "MIG-<uuid>" of the MIG device this CI forms with its GI


@dataclass
class GpuInstance:
    id: int
    profile_id: int
    start: int  # memory slices
    size: int
    serial: int
    compute_instances: list[ComputeInstance] = field(default_factory=list)
    workload: dict[str, float] = field(default_factory=dict)
    activity: Activity = field(default_factory=Activity)

    def compute_instance(self, ci_id: int) -> ComputeInstance | None:
        return next((c for c in self.compute_instances if c.id == ci_id), None)


@dataclass
class Gpu:
    index: int
    model: str  # key into models.MODELS
    uuid: str
    serial: str
    bus: int
    mig_current: bool = False
    mig_pending: bool = False
    lost: bool = False
    holders: list[str] = field(default_factory=list)
    gpu_instances: list[GpuInstance] = field(default_factory=list)
    workload: dict[str, float] = field(default_factory=dict)
    #: The GPU's effective activity (with MIG on: the aggregate of its GIs); also carries power.
    activity: Activity = field(default_factory=Activity)
    #: Power management limit set through nvmlDeviceSetPowerManagementLimit (mW); None: the
    #: model's default. The driver forgets it on reboot and driver reload.
    power_limit_mw: int | None = None
    #: Another writer of the limit on the host (a site power manager, a loop of `nvidia-smi
    #: -pl`) that sets this value (mW) again right after every set: the set succeeds and the
    #: driver then holds this. None: no such writer. Ends with the boot, as a process does.
    power_limit_writer_mw: int | None = None
    #: ECC error counts (nvmlDeviceGetTotalEccErrors): "sbe_volatile", "dbe_volatile",
    #: "sbe_aggregate", "dbe_aggregate"; volatile ones restart at zero on a reset or reboot
    ecc: dict[str, int] = field(default_factory=dict)
    #: row remapping (nvmlDeviceGetRemappedRows, Ampere and later): "correctable" and
    #: "uncorrectable" rows remapped, "pending" rows waiting for the next reset, "failure" 1
    #: once a remapping failed (no spare row left); the aggregate ones survive resets
    remap: dict[str, int] = field(default_factory=dict)
    #: injected nvmlClocksEventReason* bits (heat, power brake...); idle is computed
    clock_event_reasons: int = 0

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{self.bus:02X}:00.0"

    def gpu_instance(self, gi_id: int) -> GpuInstance | None:
        return next((g for g in self.gpu_instances if g.id == gi_id), None)


@dataclass
class Process:
    pid: int
    gpu: int
    gpu_instance: int | None
    compute_instance: int | None
    used_memory_mib: int
    name: str
    cgroup: str | None


@dataclass
class Fault:
    """Fail calls of pynvml function ``function``: let ``skip`` matching calls pass, then fail
    ``remaining`` calls with NVML return code ``code``."""

    function: str
    code: int
    skip: int
    remaining: int
    gpu: int | None


@dataclass
class XidEvent:
    seq: int
    gpu: int
    xid: int
    #: the GPU instance the driver attributes it to (None: the whole GPU)
    gpu_instance: int | None = None


@dataclass
class NodeState:
    preset: str
    driver_version: str
    cuda_driver_version: int
    passthrough_vm: bool = False
    boot_id: int = 0
    next_serial: int = 1
    next_event_seq: int = 1
    gpus: list[Gpu] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    events: list[XidEvent] = field(default_factory=list)
    #: No driver loaded (a GPU Operator node before its driver container, or during an
    #: upgrade): until ``driver_absent_until`` (Unix time), or until cleared when that is None.
    driver_absent: bool = False
    driver_absent_until: float | None = None
    #: pynvml functions whose calls block until released (``SimControl.hold``): a test watches
    #: the agent while such a call is in progress.
    held: list[str] = field(default_factory=list)

    def driver_missing(self, now: float) -> bool:
        """Whether the "kernel module" is unloaded at Unix time ``now``."""
        return self.driver_absent and (
            self.driver_absent_until is None or now < self.driver_absent_until
        )

    def take_serial(self) -> int:
        serial = self.next_serial
        self.next_serial += 1
        return serial


def new_node(preset: Preset) -> NodeState:
    """A freshly installed node: MIG disabled everywhere, nothing running."""
    gpus = [
        Gpu(
            index=i,
            model=key,
            uuid=f"GPU-{uuid.uuid4()}",
            serial=str(1650000000000 + secrets.randbelow(10**10)),
            bus=_BUSES[i] if i < len(_BUSES) else 0xE0 + i,
        )
        for i, key in enumerate(preset.gpus)
    ]
    return NodeState(
        preset=preset.name,
        driver_version=preset.driver_version,
        cuda_driver_version=preset.cuda_driver_version,
        gpus=gpus,
    )


def dumps(node: NodeState) -> str:
    # The JSON of ``{"format": FORMAT, **dataclasses.asdict(node)}``, without asdict's deep
    # copy: the encoder asks ``_fields`` for each dataclass it meets and encodes the rest itself.
    return json.dumps({"format": FORMAT, **_fields(node)}, sort_keys=True, default=_fields)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass instance's fields by name, as ``asdict`` has them (one level deep)."""
    cls = type(obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if not is_dataclass(obj) or isinstance(obj, type):
            raise TypeError(f"Object of type {cls.__name__} is not JSON serializable")
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(obj))
    return {name: getattr(obj, name) for name in names}


def loads(text: str) -> NodeState:
    raw = json.loads(text)
    if raw.get("format") != FORMAT:
        raise Conflict(f"simulator state has format {raw.get('format')!r}, expected {FORMAT}")
    return NodeState(
        preset=raw["preset"],
        driver_version=raw["driver_version"],
        cuda_driver_version=raw["cuda_driver_version"],
        passthrough_vm=raw["passthrough_vm"],
        boot_id=raw["boot_id"],
        next_serial=raw["next_serial"],
        next_event_seq=raw["next_event_seq"],
        gpus=[_gpu(g) for g in raw["gpus"]],
        processes=[Process(**p) for p in raw["processes"]],
        faults=[Fault(**f) for f in raw["faults"]],
        events=[XidEvent(**e) for e in raw["events"]],
        driver_absent=raw.get("driver_absent", False),
        driver_absent_until=raw.get("driver_absent_until"),
        held=raw.get("held", []),
    )


def _gpu(raw: dict[str, Any]) -> Gpu:
    return Gpu(
        **{k: v for k, v in raw.items() if k not in ("gpu_instances", "activity")},
        gpu_instances=[_gpu_instance(g) for g in raw["gpu_instances"]],
        activity=Activity(**raw["activity"]),
    )


def _gpu_instance(raw: dict[str, Any]) -> GpuInstance:
    return GpuInstance(
        **{k: v for k, v in raw.items() if k not in ("compute_instances", "activity")},
        compute_instances=[ComputeInstance(**c) for c in raw["compute_instances"]],
        activity=Activity(**raw["activity"]),
    )
