"""Typed facade over pynvml: the only code in the agent that calls NVML.

The module it drives is either the real ``pynvml`` or the simulator (``agent.gpu.sim``), which
exposes the same functions, structs and exceptions; this file cannot tell them apart.

Every NVML function is reached through one :class:`~agent.gpu.nvml_gateway.Gateway`
(``GpuDriver.nvml``: calls counted, versioned symbols resolved to the newest the driver has),
and :meth:`GpuDriver.call` translates ``NVMLError`` into the agent's domain errors (keeping the
NVML error as ``__cause__``). The telemetry read side (``agent.gpu.readings``) goes through the
same gateway. One lost GPU never hides the others: :meth:`GpuDriver.scan` reports it beside
the GPUs that answer.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from agent.errors import (
    AgentError,
    Busy,
    Conflict,
    DeviceLost,
    DriverUnavailable,
    InvalidSpec,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from agent.gpu.changes import Changes
from agent.gpu.nvml_gateway import Gateway
from agent.gpu.profiles import profile_name
from agent.gpu.types import (
    ActivationStatus,
    CiProfile,
    ComputeInstance,
    GiProfile,
    GpuInfo,
    GpuInstance,
    GpuLayout,
    LostGpu,
    MigMode,
    Placement,
    PowerLimits,
    Process,
    UnreadGpu,
)

T = TypeVar("T")

# NVML return codes (nvml.h); pynvml exposes the same names. Kept here so the table below reads as
# data and does not depend on which module is loaded.
_SUCCESS = 0
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_RESET_REQUIRED = 16
_ERR_IN_USE = 19
_ERR_INSUFFICIENT_RESOURCES = 23
_ERR_INVALID_STATE = 29

# NVML error code -> domain error class. Mutations raise these; reads may degrade to None.
_ERROR_MAP: dict[int, type[AgentError]] = {
    _ERR_INVALID_ARGUMENT: InvalidSpec,
    _ERR_NOT_SUPPORTED: NotSupported,
    _ERR_FUNCTION_NOT_FOUND: NotSupported,
    _ERR_NO_PERMISSION: PermissionDenied,
    _ERR_NOT_FOUND: NotFound,
    _ERR_DRIVER_NOT_LOADED: DriverUnavailable,
    _ERR_LIBRARY_NOT_FOUND: DriverUnavailable,
    _ERR_GPU_IS_LOST: DeviceLost,
    _ERR_IN_USE: Busy,
    _ERR_INSUFFICIENT_RESOURCES: Conflict,
    _ERR_INVALID_STATE: Conflict,
}

_ACTIVATION = {
    _SUCCESS: ActivationStatus.APPLIED,
    _ERR_IN_USE: ActivationStatus.IN_USE,
    _ERR_RESET_REQUIRED: ActivationStatus.RESET_REQUIRED,
    _ERR_NOT_SUPPORTED: ActivationStatus.NOT_SUPPORTED,
}

_NO_ID = 0xFFFFFFFF  # NVML's "not in a MIG instance" GI/CI id in process records
_MAX_PLACEMENTS = 16  # >= any instanceCount; NVML fills at most this many


class NvmlError(AgentError):
    """An NVML failure with no better domain meaning; ``code`` is the NVML return code."""


def translate(exc: Exception, what: str) -> AgentError:
    """The domain error for an ``NVMLError`` (its code kept as ``nvml_code``)."""
    code = getattr(exc, "value", None)
    cls = _ERROR_MAP.get(code, NvmlError) if isinstance(code, int) else NvmlError
    err = cls(f"{what}: {exc}")
    err.nvml_code = code  # type: ignore[attr-defined]  # lets callers tell IN_USE from other Busy
    return err


@dataclass(frozen=True, slots=True)
class GpuScan:
    """Every GPU the driver counts: the ones that answer, and the lost and unread ones beside
    them."""

    gpus: tuple[GpuInfo, ...]
    lost: tuple[LostGpu, ...] = ()
    #: not lost, but a read of its identity failed (the failing call and its error)
    unread: tuple[UnreadGpu, ...] = ()


def _mutation(method: Callable[..., T]) -> Callable[..., T]:
    """Bump ``generation`` before and after a change, so a layout read while it ran is re-read,
    and mark its GPU (the first argument, a UUID) as changed by this agent (``changes``)."""

    @functools.wraps(method)
    def mutate(self: GpuDriver, uuid: str, *args: Any, **kwargs: Any) -> T:
        self.generation += 1
        try:
            with self.changes.changing(uuid):
                return method(self, uuid, *args, **kwargs)
        finally:
            self.generation += 1

    return mutate


class GpuDriver:
    """Typed access to the GPUs of this node through a pynvml-compatible module.

    Use :func:`agent.gpu.open_driver` to build one. Methods take a GPU by UUID (stable across
    reboots, unlike the index) and return records from :mod:`agent.gpu.types`.
    """

    def __init__(self, nvml: Any) -> None:
        self._nvml = Gateway(nvml)
        self._lock = threading.Lock()
        self._initialised = False
        #: last identity each index answered with, to name a GPU after it is lost
        self._known: dict[int, GpuInfo] = {}
        #: bumped before and after every mutation, so cached layouts are re-read after the agent's
        #: own changes (also when a read raced one)
        self.generation = 0
        #: which GPUs this agent is changing now (telemetry does not count their reads' failures)
        self.changes = Changes()

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self) -> GpuDriver:
        with self._lock:
            if not self._initialised:
                self.call(self._nvml.nvmlInit, what="nvmlInit")
                self._initialised = True
        return self

    def close(self) -> None:
        with self._lock:
            if self._initialised:
                self._initialised = False
                self.call(self._nvml.nvmlShutdown, what="nvmlShutdown")

    @property
    def nvml(self) -> Gateway:
        """The one NVML gateway (for the telemetry read paths in ``agent.gpu.readings``)."""
        return self._nvml

    @property
    def calls(self) -> Counter[str]:
        """NVML calls made so far, by function (versioned tries counted each)."""
        return self._nvml.calls

    def call(self, fn: Callable[..., T], *args: Any, what: str | None = None) -> T:
        """Call a gateway function; an ``NVMLError`` becomes the matching domain error."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise translate(exc, what or fn.__name__) from exc

    def _handle(self, uuid: str) -> Any:
        return self.call(self._nvml.nvmlDeviceGetHandleByUUID, uuid, what=f"GPU {uuid}")

    # -- inventory -------------------------------------------------------------------------------

    def driver_version(self) -> str:
        return str(self.call(self._nvml.nvmlSystemGetDriverVersion))

    def scan(self) -> GpuScan:
        """Every GPU by index; one that is lost (at start or since) or fails a read (a GPU that
        needs a reset) is reported, not raised: one GPU must not take the others' features."""
        count = self.call(self._nvml.nvmlDeviceGetCount)
        gpus: list[GpuInfo] = []
        lost: list[LostGpu] = []
        unread: list[UnreadGpu] = []
        for i in range(count):
            try:
                info = self._info(i, self.call(self._nvml.nvmlDeviceGetHandleByIndex, i))
            except DeviceLost as exc:
                lost.append(LostGpu(i, self._known.get(i), str(exc)))
                continue
            except DriverUnavailable:
                raise  # the driver went away: no GPU answers, the node detaches
            except AgentError as exc:
                unread.append(UnreadGpu(i, self._known.get(i), str(exc)))
                continue
            self._known[i] = info
            gpus.append(info)
        return GpuScan(tuple(gpus), tuple(lost), tuple(unread))

    def gpus(self) -> tuple[GpuInfo, ...]:
        """The GPUs that answer (see :meth:`scan` for the lost ones)."""
        return self.scan().gpus

    def gpu(self, selector: str | int) -> GpuInfo:
        """A GPU by index, UUID (``GPU-…``) or PCI bus id; NotFound naming what exists,
        DeviceLost when it is a lost GPU, NvmlError naming the failing call for an unread one."""
        scan = self.scan()
        for info in scan.gpus:
            if _selects(str(selector), info):
                return info
        for gone in scan.lost:
            if str(selector) == str(gone.index) or (
                gone.last_known is not None and _selects(str(selector), gone.last_known)
            ):
                raise DeviceLost(f"GPU {gone.index} is lost: {gone.detail}")
        for bad in scan.unread:
            if str(selector) == str(bad.index) or (
                bad.last_known is not None and _selects(str(selector), bad.last_known)
            ):
                raise NvmlError(f"GPU {bad.index} cannot be read: {bad.detail}")
        known = ", ".join(f"{g.index}={g.uuid}" for g in scan.gpus)
        raise NotFound(f"no GPU {selector!r} on this node (GPUs: {known})")

    def _info(self, index: int, h: Any) -> GpuInfo:
        n = self._nvml
        pci = self.call(n.nvmlDeviceGetPciInfo, h)
        mem = self.call(n.nvmlDeviceGetMemoryInfo, h)
        return GpuInfo(
            index=index,
            uuid=str(self.call(n.nvmlDeviceGetUUID, h)),
            name=str(self.call(n.nvmlDeviceGetName, h)),
            pci_bus_id=_text(pci.busId),
            pci_device_id=int(pci.pciDeviceId),
            pci_subsystem_id=int(pci.pciSubSystemId),
            memory_total_bytes=int(mem.total),
            mig_mode=self._mig_mode(h),
            compute_capability=self._compute_capability(h),
        )

    def _compute_capability(self, h: Any) -> tuple[int, int] | None:
        # A read that may degrade: unknown, not a guess (the MPS client limit depends on it).
        try:
            major, minor = self._nvml.nvmlDeviceGetCudaComputeCapability(h)
        except self._nvml.NVMLError:
            return None
        return int(major), int(minor)

    def _mig_mode(self, h: Any) -> MigMode | None:
        try:
            current, pending = self._nvml.nvmlDeviceGetMigMode(h)
        except self._nvml.NVMLError as exc:
            if getattr(exc, "value", None) in (_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND):
                return None  # not MIG-capable
            raise translate(exc, "nvmlDeviceGetMigMode") from exc
        return MigMode(current=bool(current), pending=bool(pending))

    def layout(self, uuid: str) -> GpuLayout:
        """Everything the MIG planner needs about one GPU, read in one go."""
        h = self._handle(uuid)
        info = self._info(self.call(self._nvml.nvmlDeviceGetIndex, h), h)
        profiles = self._gi_profiles(h, info.memory_total_bytes)
        enabled = info.mig_mode is not None and info.mig_mode.current
        instances = self._gpu_instances(h, profiles) if enabled else ()
        return GpuLayout(info, profiles, instances, self._processes(h))

    # -- profiles --------------------------------------------------------------------------------

    def gi_profiles(self, uuid: str) -> tuple[GiProfile, ...]:
        h = self._handle(uuid)
        total = int(self.call(self._nvml.nvmlDeviceGetMemoryInfo, h).total)
        return self._gi_profiles(h, total)

    def _gi_profiles(self, h: Any, total_bytes: int) -> tuple[GiProfile, ...]:
        n = self._nvml
        out: list[GiProfile] = []
        # Loop the constants, never hard-coded ids: ids differ per architecture (mig.md §1.2).
        for constant in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                # v1 answers whatever the MIG mode; the versioned query needs MIG enabled, and a
                # dry run must see a disabled GPU's profiles too. The v2 extras (a driver name) we
                # compute ourselves (mig.md §1.7).
                info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, constant, 1)
            except n.NVMLError as exc:
                if getattr(exc, "value", None) in (_ERR_NOT_SUPPORTED, _ERR_INVALID_ARGUMENT):
                    continue
                raise translate(exc, "nvmlDeviceGetGpuInstanceProfileInfo") from exc
            placements = self._gi_placements(h, info.id)
            out.append(
                GiProfile(
                    constant=constant,
                    id=int(info.id),
                    name=profile_name(
                        int(info.sliceCount),
                        int(info.memorySizeMB),
                        total_bytes,
                        _attrs(constant, n),
                    ),
                    slice_count=int(info.sliceCount),
                    memory_slices=placements[0].size if placements else int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    memory_mb=int(info.memorySizeMB),
                    multiprocessor_count=int(info.multiprocessorCount),
                    copy_engines=int(info.copyEngineCount),
                    decoders=int(info.decoderCount),
                    encoders=int(info.encoderCount),
                    jpegs=int(info.jpegCount),
                    ofas=int(info.ofaCount),
                    placements=placements,
                )
            )
        return tuple(out)

    def _gi_placements(self, h: Any, profile_id: int) -> tuple[Placement, ...]:
        n = self._nvml
        array = (n.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
        count = ctypes.c_uint(_MAX_PLACEMENTS)
        self.call(
            n.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, array, ctypes.byref(count)
        )
        return tuple(Placement(int(array[i].start), int(array[i].size)) for i in range(count.value))

    def ci_profiles(self, uuid: str, gi_id: int) -> tuple[CiProfile, ...]:
        """CI profiles available inside one existing GI (reference/mig.md §1.6)."""
        n = self._nvml
        h = self._handle(uuid)
        gi = self.call(n.nvmlDeviceGetGpuInstanceById, h, gi_id, what=f"GPU instance {gi_id}")
        gi_info = self.call(n.nvmlGpuInstanceGetInfo, gi)
        gi_profile = next(p for p in self.gi_profiles(uuid) if p.id == gi_info.profileId)
        total = int(self.call(n.nvmlDeviceGetMemoryInfo, h).total)
        out: list[CiProfile] = []
        for constant, info in self._ci_profile_infos(gi):
            out.append(
                CiProfile(
                    constant=constant,
                    id=int(info.id),
                    name=profile_name(
                        gi_profile.slice_count,
                        gi_profile.memory_mb,
                        total,
                        _attrs(gi_profile.constant, n),
                        ci_slices=int(info.sliceCount),
                    ),
                    slice_count=int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    multiprocessor_count=int(info.multiprocessorCount),
                )
            )
        return tuple(out)

    # -- instances -------------------------------------------------------------------------------

    def gpu_instances(self, uuid: str) -> tuple[GpuInstance, ...]:
        h = self._handle(uuid)
        total = int(self.call(self._nvml.nvmlDeviceGetMemoryInfo, h).total)
        return self._gpu_instances(h, self._gi_profiles(h, total))

    def _gpu_instances(self, h: Any, profiles: tuple[GiProfile, ...]) -> tuple[GpuInstance, ...]:
        n = self._nvml
        uuids = self._mig_uuids(h)  # once per GPU: listing MIG devices per GI is quadratic
        out: list[GpuInstance] = []
        for profile in profiles:
            listed = self._instances(
                n.nvmlDeviceGetGpuInstances,
                n.c_nvmlGpuInstance_t,
                h,
                profile.id,
                profile.instance_count,
            )
            for gi in listed:
                info = self.call(n.nvmlGpuInstanceGetInfo, gi)
                out.append(
                    GpuInstance(
                        id=int(info.id),
                        profile_id=profile.id,
                        profile_name=profile.name,
                        placement=Placement(int(info.placement.start), int(info.placement.size)),
                        compute_instances=self._compute_instances(gi, uuids),
                    )
                )
        return tuple(sorted(out, key=lambda gi: gi.placement))

    def _instances(
        self, fn: Callable[..., Any], handle_type: Any, parent: Any, profile_id: int, most: int
    ) -> list[Any]:
        """The handles of one profile's instances that a listing call (``fn``) writes into an
        array of ``handle_type`` the caller allocates for the profile's ``most`` instances."""
        array = (handle_type * max(most, 1))()
        count = ctypes.c_uint(0)
        self.call(fn, parent, profile_id, array, ctypes.byref(count))
        return [array[i] for i in range(count.value)]

    def _ci_profile_infos(self, gi: Any) -> Iterator[tuple[int, Any]]:
        """(constant, profile info) of each compute instance profile the GPU instance offers."""
        n = self._nvml
        for constant in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, constant, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except n.NVMLError as exc:
                if getattr(exc, "value", None) in (_ERR_NOT_SUPPORTED, _ERR_INVALID_ARGUMENT):
                    continue
                raise translate(exc, "nvmlGpuInstanceGetComputeInstanceProfileInfo") from exc
            yield constant, info

    def _compute_instances(
        self, gi: Any, uuids: dict[tuple[int, int], str]
    ) -> tuple[ComputeInstance, ...]:
        n = self._nvml
        out: list[ComputeInstance] = []
        gi_id = int(self.call(n.nvmlGpuInstanceGetInfo, gi).id)
        for _, info in self._ci_profile_infos(gi):
            listed = self._instances(
                n.nvmlGpuInstanceGetComputeInstances,
                n.c_nvmlComputeInstance_t,
                gi,
                info.id,
                int(info.instanceCount),
            )
            for handle in listed:
                ci = self.call(n.nvmlComputeInstanceGetInfo, handle)
                out.append(
                    ComputeInstance(
                        id=int(ci.id),
                        profile_id=int(ci.profileId),
                        placement=Placement(int(ci.placement.start), int(ci.placement.size)),
                        uuid=uuids.get((gi_id, int(ci.id))),
                    )
                )
        return tuple(sorted(out, key=lambda c: c.placement))

    def _mig_uuids(self, h: Any) -> dict[tuple[int, int], str]:
        """(GI id, CI id) -> MIG device UUID, skipping empty slots (reference/mig.md §2.2)."""
        n = self._nvml
        out: dict[tuple[int, int], str] = {}
        for mig in self._mig_handles(h):
            gi_id = int(self.call(n.nvmlDeviceGetGpuInstanceId, mig))
            ci_id = int(self.call(n.nvmlDeviceGetComputeInstanceId, mig))
            out[(gi_id, ci_id)] = str(self.call(n.nvmlDeviceGetUUID, mig))
        return out

    def _mig_handles(self, h: Any) -> Iterator[Any]:
        n = self._nvml
        for i in range(int(self.call(n.nvmlDeviceGetMaxMigDeviceCount, h))):
            try:
                yield n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except n.NVMLError as exc:
                if getattr(exc, "value", None) in (_ERR_NOT_FOUND, _ERR_INVALID_ARGUMENT):
                    continue  # empty slot: handles are sparse
                raise translate(exc, "nvmlDeviceGetMigDeviceHandleByIndex") from exc

    def processes(self, uuid: str) -> tuple[Process, ...]:
        return self._processes(self._handle(uuid))

    def processes_of(self, handle: Any) -> tuple[Process, ...]:
        """Compute processes on a device or MIG device handle (the telemetry read side's)."""
        return self._processes(handle)

    def _processes(self, h: Any) -> tuple[Process, ...]:
        procs = self.call(self._nvml.nvmlDeviceGetComputeRunningProcesses, h)
        return tuple(
            Process(
                pid=int(p.pid),
                used_memory_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                gpu_instance_id=_opt_id(getattr(p, "gpuInstanceId", _NO_ID)),
                compute_instance_id=_opt_id(getattr(p, "computeInstanceId", _NO_ID)),
            )
            for p in procs
        )

    def power_limits(self, uuid: str) -> PowerLimits:
        """The GPU's power management range, default, set and enforced limits (mW)."""
        n = self._nvml
        h = self._handle(uuid)
        low, high = self.call(
            n.nvmlDeviceGetPowerManagementLimitConstraints, h, what=f"power limit range of {uuid}"
        )
        return PowerLimits(
            min_mw=int(low),
            max_mw=int(high),
            default_mw=int(
                self.call(
                    n.nvmlDeviceGetPowerManagementDefaultLimit, h, what=f"default power of {uuid}"
                )
            ),
            current_mw=int(
                self.call(n.nvmlDeviceGetPowerManagementLimit, h, what=f"power limit of {uuid}")
            ),
            enforced_mw=int(
                self.call(n.nvmlDeviceGetEnforcedPowerLimit, h, what=f"enforced power of {uuid}")
            ),
        )

    # -- mutations -------------------------------------------------------------------------------

    def set_power_limit(self, uuid: str, milliwatts: int) -> None:
        """Set the power management limit; the driver forgets it on reboot and reload."""
        n = self._nvml
        self.call(
            n.nvmlDeviceSetPowerManagementLimit,
            self._handle(uuid),
            milliwatts,
            what=f"set power limit {milliwatts / 1000:g} W on {uuid}",
        )

    @_mutation
    def set_mig_mode(self, uuid: str, enabled: bool) -> ActivationStatus:
        """Request a MIG mode; the activation status says whether it took effect (mig.md §7.7)."""
        n = self._nvml
        mode = n.NVML_DEVICE_MIG_ENABLE if enabled else n.NVML_DEVICE_MIG_DISABLE
        status = self.call(
            n.nvmlDeviceSetMigMode, self._handle(uuid), mode, what=f"set MIG mode on {uuid}"
        )
        return _ACTIVATION.get(int(status), ActivationStatus.NOT_SUPPORTED)

    @_mutation
    def create_gpu_instance(self, uuid: str, profile_id: int, placement: Placement) -> GpuInstance:
        n = self._nvml
        h = self._handle(uuid)
        ref = ctypes.byref(n.c_nvmlGpuInstancePlacement_t(placement.start, placement.size))
        what = f"create GPU instance profile {profile_id} at {placement} on {uuid}"
        gi = self.call(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, profile_id, ref, what=what)
        info = self.call(n.nvmlGpuInstanceGetInfo, gi)
        name = next((p.name for p in self.gi_profiles(uuid) if p.id == profile_id), str(profile_id))
        return GpuInstance(int(info.id), profile_id, name, placement, ())

    @_mutation
    def destroy_gpu_instance(self, uuid: str, gi_id: int) -> None:
        n = self._nvml
        gi = self.call(
            n.nvmlDeviceGetGpuInstanceById, self._handle(uuid), gi_id, what=f"GPU instance {gi_id}"
        )
        self.call(n.nvmlGpuInstanceDestroy, gi, what=f"destroy GPU instance {gi_id} on {uuid}")

    @_mutation
    def create_compute_instance(
        self, uuid: str, gi_id: int, ci_profile_id: int, placement: Placement | None = None
    ) -> ComputeInstance:
        n = self._nvml
        gi = self.call(
            n.nvmlDeviceGetGpuInstanceById, self._handle(uuid), gi_id, what=f"GPU instance {gi_id}"
        )
        what = f"create compute instance profile {ci_profile_id} in GPU instance {gi_id} on {uuid}"
        if placement is None:
            ci = self.call(n.nvmlGpuInstanceCreateComputeInstance, gi, ci_profile_id, what=what)
        else:
            ref = ctypes.byref(n.c_nvmlComputeInstancePlacement_t(placement.start, placement.size))
            ci = self.call(
                n.nvmlGpuInstanceCreateComputeInstanceWithPlacement,
                gi,
                ci_profile_id,
                ref,
                what=what,
            )
        info = self.call(n.nvmlComputeInstanceGetInfo, ci)
        uuid_of = self._mig_uuids(self._handle(uuid)).get((gi_id, int(info.id)))
        return ComputeInstance(
            int(info.id),
            int(info.profileId),
            Placement(int(info.placement.start), int(info.placement.size)),
            uuid_of,
        )

    @_mutation
    def destroy_compute_instance(self, uuid: str, gi_id: int, ci_id: int) -> None:
        n = self._nvml
        gi = self.call(
            n.nvmlDeviceGetGpuInstanceById, self._handle(uuid), gi_id, what=f"GPU instance {gi_id}"
        )
        ci = self.call(
            n.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id, what=f"compute instance {ci_id}"
        )
        self.call(
            n.nvmlComputeInstanceDestroy,
            ci,
            what=f"destroy compute instance {gi_id}/{ci_id} on {uuid}",
        )

    @contextmanager
    def session(self) -> Iterator[GpuDriver]:
        self.open()
        try:
            yield self
        finally:
            self.close()


def _attrs(constant: int, n: Any) -> str:
    """Name suffix for a GI profile constant (go-nvlib's mapping, reference/mig.md §1.2)."""
    if constant in (
        n.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
        getattr(n, "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1", -1),
    ):
        return "+me"
    suffixes = {
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME": "+me.all",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME": "+me.all",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME": "-me",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME": "-me",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX": "+gfx",
    }
    for name, suffix in suffixes.items():
        if getattr(n, name, None) == constant:
            return suffix
    return ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt_id(value: Any) -> int | None:
    v = int(value) if value is not None else _NO_ID
    return None if v == _NO_ID else v


def _selects(selector: str, info: GpuInfo) -> bool:
    return selector in (str(info.index), info.uuid) or _same_bus_id(selector, info.pci_bus_id)


def _same_bus_id(a: str, b: str) -> bool:
    """Bus ids match case-insensitively, with NVML's 8-digit domain or a short one."""
    return ":" in a and _norm_bus_id(a) == _norm_bus_id(b)


def _norm_bus_id(bus_id: str) -> str:
    s = bus_id.lower()
    domain, rest = s.split(":", 1) if s.count(":") == 2 else ("0", s)
    return f"{int(domain, 16):08x}:{rest}"
