"""Per-tick NVML reads for telemetry, returned as typed records.

The telemetry sampler lives in ``agent/telemetry`` but, like every other service, reaches NVML
only through ``agent/gpu``: this module is its read side. :class:`NodeReader` caches what does not
change while the driver is loaded (handles, identities, NVLink link counts, MIG device ids and
profile names) and reads the rest on request: grouped device readings (one NVML call per group,
however many fields it feeds: ``reading_calls.py`` says which call answers each reading), MIG
layouts, processes and GPM samples. XID events have their own event set (``xid_events.py``).

Every call goes through the driver's one NVML gateway (:attr:`GpuDriver.nvml`: counted, with
version fallbacks), and errors are translated by :meth:`GpuDriver.call`.

Failures keep their meaning: a reading NVML does not support is reported as unsupported (the
caller stops asking), a lost GPU raises :class:`~agent.errors.DeviceLost` for that GPU only,
anything else is a failed reading for this tick. Nothing is turned into 0. A GPU lost before the
agent started is still listed, by its index and what of its identity NVML answered (a handle, then
its PCI bus id and UUID), the rest unknown, never guessed; it is re-tried every tick.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from agent.errors import AgentError, DeviceLost, DriverUnavailable, NotSupported
from agent.gpu.nvml import GpuDriver, translate
from agent.gpu.reading_calls import (
    FIELD_VALUES,
    GETTERS,
    INSTANCE_READINGS,
    NVLINK_TRAFFIC,
    NVLINK_TRAFFIC_READINGS,
    Getter,
    Reading,
    field_value,
)
from agent.gpu.types import GpuLayout, Process

__all__ = [
    "DeviceReadings",
    "GpmReadout",
    "GpmSample",
    "GpuIdentity",
    "GpuInstanceInfo",
    "GpuString",
    "MigDevice",
    "MigLayout",
    "NodeReader",
    "nvml_code",
]

# NVML return codes (nvml.h) the read paths tell apart.
_SUCCESS = 0
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_SUPPORTED = 3
_ERR_NOT_FOUND = 6
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_UNSUPPORTED = (_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND)

#: A full layout re-read at least this often (in reads, one per sampler tick).
FULL_LAYOUT_EVERY = 30


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What labels a physical GPU; immutable while the driver is loaded."""

    index: int
    #: "" while unknown (a GPU lost before NVML answered), as ``name`` and ``pci_bus_id``
    uuid: str
    name: str
    pci_bus_id: str
    #: /dev/nvidia<minor>; None while unknown (never assumed to be the index)
    minor: int | None
    #: static strings of the board (``GpuString`` value -> text), those NVML answered
    strings: tuple[tuple[str, str], ...] = ()

    def string(self, key: GpuString) -> str | None:
        return dict(self.strings).get(key.value)


class GpuString(Enum):
    """Static per-GPU strings, read once (dcgm-exporter's label-type fields)."""

    BRAND = "brand"
    SERIAL = "serial"
    VBIOS_VERSION = "vbios_version"
    INFOROM_OEM = "inforom_oem"
    INFOROM_ECC = "inforom_ecc"
    INFOROM_POWER = "inforom_power"
    INFOROM_IMAGE = "inforom_image"


@dataclass(frozen=True, slots=True)
class MigDevice:
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True, slots=True)
class GpuInstanceInfo:
    id: int
    #: profile name, e.g. ``1g.10gb``
    profile: str
    #: its compute instances' MIG devices, by CI id
    devices: tuple[MigDevice, ...]


@dataclass(frozen=True, slots=True)
class MigLayout:
    enabled: bool
    instances: tuple[GpuInstanceInfo, ...] = ()
    #: the requested mode (differs from ``enabled`` until a reset); None: not MIG-capable
    pending: bool | None = None


@dataclass(frozen=True, slots=True)
class DeviceReadings:
    """One read of several readings on one device handle."""

    values: dict[Reading, float] = field(default_factory=dict)
    #: NVML said NOT_SUPPORTED (or the driver lacks the function): stop asking on this device
    unsupported: dict[Reading, str] = field(default_factory=dict)
    #: any other failure, for this tick only
    failed: dict[Reading, str] = field(default_factory=dict)


class GpmSample:
    """An NVML GPM sample buffer; not thread-safe, freed with :meth:`NodeReader.gpm_free`."""

    __slots__ = ("native",)

    def __init__(self, native: Any) -> None:
        self.native = native


@dataclass(frozen=True, slots=True)
class GpmReadout:
    """GPM metric values between two samples (NVML units: %, MiB/s)."""

    values: dict[int, float]
    unsupported: frozenset[int]


#: nvmlBrandType_t -> the name DCGM gives it (DCGM_FI_DEV_BRAND; nvidia-smi's wording)
_BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NVIDIA Virtual Applications",
    8: "NVIDIA Virtual PC",
    9: "NVIDIA Virtual Compute Server",
    10: "NVIDIA RTX Virtual Workstation",
    11: "NVIDIA vGaming",
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "Titan RTX",
}


def _bus_id(pci: Any) -> str:
    return pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)


def nvml_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


class NodeReader:
    """The telemetry read side of one :class:`GpuDriver`. Call from one thread at a time
    (the sampler's), except :class:`XidEvents`, which owns its own event set."""

    def __init__(self, driver: GpuDriver) -> None:
        self._driver = driver
        self._n = driver.nvml
        #: by index; None for a GPU that has not answered yet (lost at start)
        self._handles: list[Any] = []
        self._identities: tuple[GpuIdentity, ...] = ()
        self._link_counts: dict[int, int] = {}
        self._max_mig: dict[int, int] = {}
        #: MIG device UUID -> (GI id, CI id, profile name); a re-created GI gets new UUIDs
        self._mig_ids: dict[str, tuple[int, int, str]] = {}
        self._mig_handles: dict[str, Any] = {}
        self._profile_names: dict[int, dict[int, str]] = {}
        #: gpu -> (what the full read saw, the layout, reads since the full one)
        self._layouts: dict[int, tuple[tuple[MigLayout, int], GpuLayout, int]] = {}
        #: wanted readings -> (each getter with the readings it yields, the field-value ones)
        self._plans: dict[
            frozenset[Reading], tuple[list[tuple[Getter, list[Reading]]], list[Reading]]
        ] = {}
        #: metric ids -> the request struct GPM averages are read into (sampler thread only)
        self._gpm_requests: dict[tuple[int, ...], Any] = {}

    @property
    def driver(self) -> GpuDriver:
        return self._driver

    # -- identity ---------------------------------------------------------------------------------

    def gpus(self) -> tuple[GpuIdentity, ...]:
        """Every GPU's identity by index, read once; a GPU that does not answer has only what
        NVML answered of it (often only its index) until it does (see :meth:`_handle`)."""
        if not self._handles:
            count = int(self._driver.call(self._n.nvmlDeviceGetCount))
            self._handles = [None] * count
            self._identities = tuple(GpuIdentity(i, "", "", "", None) for i in range(count))
            for i in range(count):
                try:
                    self._handle(i)
                except DriverUnavailable:
                    raise  # the driver went away: no GPU answers
                except AgentError:
                    # Lost, or a read failing (a GPU that needs a reset): it keeps what NVML
                    # answered of it, and the others are read; each tick asks it again.
                    continue
        return self._identities

    def _handle(self, gpu: int) -> Any:
        """The GPU's handle; opened (and its identity read) the first time it answers."""
        h = self._handles[gpu]
        if h is None:
            h = self._driver.call(self._n.nvmlDeviceGetHandleByIndex, gpu)
            self._set_identity(self._identity(gpu, h))
            self._handles[gpu] = h
        return h

    def _set_identity(self, identity: GpuIdentity) -> None:
        ids = list(self._identities)
        ids[identity.index] = identity
        self._identities = tuple(ids)

    def _identity(self, index: int, h: Any) -> GpuIdentity:
        n, call = self._n, self._driver.call
        bus_id, uuid = self._known_parts(index, h)
        try:
            minor: int | None = int(call(n.nvmlDeviceGetMinorNumber, h))
        except NotSupported:
            minor = index  # Windows / WSL have no /dev/nvidia<N>: NVML's index names the GPU
        return GpuIdentity(
            index, uuid, str(call(n.nvmlDeviceGetName, h)), bus_id, minor, self._strings(h)
        )

    def _known_parts(self, index: int, h: Any) -> tuple[str, str]:
        """(PCI bus id, UUID), kept in the GPU's identity as soon as read: a GPU lost before
        the rest of its identity is read is labelled by whichever of the two NVML still
        answered, not by nothing (reference/telemetry.md, fact 10)."""
        n, call = self._n, self._driver.call
        parts: list[str] = []
        lost: DeviceLost | None = None
        for read in (
            lambda: _bus_id(call(n.nvmlDeviceGetPciInfo, h)),
            lambda: str(call(n.nvmlDeviceGetUUID, h)),
        ):
            try:
                parts.append(read())
            except DeviceLost as exc:
                parts.append("")
                lost = exc
        bus_id, uuid = parts
        known = self._identities[index]
        self._set_identity(
            replace(known, pci_bus_id=bus_id or known.pci_bus_id, uuid=uuid or known.uuid)
        )
        if lost is not None:
            raise lost
        return bus_id, uuid

    def _strings(self, h: Any) -> tuple[tuple[str, str], ...]:
        """The board strings NVML answers; one it does not is left out (unknown, not "")."""
        n = self._n
        reads: dict[GpuString, Callable[[], Any]] = {
            GpuString.BRAND: lambda: _BRANDS.get(int(n.nvmlDeviceGetBrand(h)), "Unknown"),
            GpuString.SERIAL: lambda: n.nvmlDeviceGetSerial(h),
            GpuString.VBIOS_VERSION: lambda: n.nvmlDeviceGetVbiosVersion(h),
            GpuString.INFOROM_OEM: lambda: n.nvmlDeviceGetInforomVersion(h, n.NVML_INFOROM_OEM),
            GpuString.INFOROM_ECC: lambda: n.nvmlDeviceGetInforomVersion(h, n.NVML_INFOROM_ECC),
            GpuString.INFOROM_POWER: lambda: n.nvmlDeviceGetInforomVersion(h, n.NVML_INFOROM_POWER),
            GpuString.INFOROM_IMAGE: lambda: n.nvmlDeviceGetInforomImageVersion(h),
        }
        out = []
        for key, read in reads.items():
            try:
                value = read()
            except n.NVMLError as exc:
                if nvml_code(exc) == _ERR_GPU_IS_LOST:
                    raise DeviceLost(str(exc)) from exc
                continue
            text = value.decode() if isinstance(value, bytes) else str(value)
            out.append((key.value, text))
        return tuple(out)

    def versions(self) -> tuple[str, str]:
        """(driver version, NVML version)."""
        n, call = self._n, self._driver.call
        nvml = call(n.nvmlSystemGetNVMLVersion)
        return str(call(n.nvmlSystemGetDriverVersion)), nvml.decode() if isinstance(
            nvml, bytes
        ) else str(nvml)

    # -- device readings --------------------------------------------------------------------------

    def read(self, gpu: int, wanted: Iterable[Reading]) -> DeviceReadings:
        """Read ``wanted`` on a physical GPU. Raises DeviceLost when the GPU is gone."""
        return self._read(self._handle(gpu), gpu, frozenset(wanted))

    def read_instance(self, mig_uuid: str, wanted: Iterable[Reading]) -> DeviceReadings:
        """Read per-instance readings (framebuffer) through a MIG device of the instance."""
        handle = self._mig_handles[mig_uuid]
        return self._read(handle, None, frozenset(wanted) & INSTANCE_READINGS)

    def _plan(
        self, wanted: frozenset[Reading]
    ) -> tuple[list[tuple[Getter, list[Reading]]], list[Reading]]:
        """The calls that read ``wanted``, worked out once per set (a few sets per node)."""
        plan = self._plans.get(wanted)
        if plan is None:
            getters: dict[int, tuple[Getter, list[Reading]]] = {}
            for reading in wanted:
                getter = GETTERS.get(reading)
                if getter is not None:
                    getters.setdefault(id(getter), (getter, []))[1].append(reading)
            fielded = [r for r in wanted if r in FIELD_VALUES or r in NVLINK_TRAFFIC_READINGS]
            plan = self._plans[wanted] = (list(getters.values()), fielded)
        return plan

    def _read(self, h: Any, gpu: int | None, wanted: frozenset[Reading]) -> DeviceReadings:
        out = DeviceReadings()
        getters, fielded = self._plan(wanted)
        for getter, readings in getters:
            try:
                values = getter(self._n, h)
            except self._n.NVMLError as exc:
                self._classify(exc, readings, out)
                continue
            for reading in readings:
                if reading in values:
                    out.values[reading] = float(values[reading])
                else:  # this driver's version of the call has no such figure (memory v1)
                    out.unsupported[reading] = "not in this driver's answer"
        if fielded and gpu is not None:
            self._read_fields(h, gpu, fielded, out)
        return out

    def _classify(
        self, exc: BaseException, readings: Iterable[Reading], out: DeviceReadings
    ) -> None:
        code = nvml_code(exc)
        if code == _ERR_GPU_IS_LOST:
            raise DeviceLost(str(exc)) from exc
        target = out.unsupported if code in _UNSUPPORTED else out.failed
        for reading in readings:
            target[reading] = str(exc)

    def _read_fields(self, h: Any, gpu: int, readings: list[Reading], out: DeviceReadings) -> None:
        n = self._n
        ids: list[tuple[int, int]] = []
        owners: list[Reading] = []
        for reading in readings:
            if reading not in NVLINK_TRAFFIC_READINGS:
                ids.append((getattr(n, FIELD_VALUES[reading]), 0))
                owners.append(reading)
                continue
            try:
                links = self._nvlink_links(h, gpu)
            except NotSupported as exc:
                out.unsupported[reading] = str(exc)
                continue
            except DeviceLost:
                raise
            except AgentError as exc:  # this tick only: the count is asked again next tick
                out.failed[reading] = str(exc)
                continue
            for link in range(links if reading is Reading.NVLINK_TRAFFIC_KIB else 1):
                for name in NVLINK_TRAFFIC:
                    ids.append((getattr(n, name), link))
                    owners.append(reading)
        if not ids:
            return
        try:
            values = n.nvmlDeviceGetFieldValues(h, ids)
        except n.NVMLError as exc:
            self._classify(exc, set(owners), out)
            return
        sums: dict[Reading, float] = {}
        for owner, value in zip(owners, values, strict=True):
            ret = int(value.nvmlReturn)
            if ret == _ERR_GPU_IS_LOST:  # one field's answer: the GPU is gone all the same
                raise DeviceLost(f"NVML field {value.fieldId}: the GPU is lost")
            if ret != _SUCCESS:
                bucket = out.unsupported if ret in _UNSUPPORTED else out.failed
                bucket[owner] = f"NVML field {value.fieldId}: return code {ret}"
                continue
            sums[owner] = sums.get(owner, 0.0) + field_value(value)
        for owner, total in sums.items():
            if owner not in out.unsupported and owner not in out.failed:
                out.values[owner] = total

    def _nvlink_links(self, h: Any, gpu: int) -> int:
        """The GPU's NVLink link count, cached once NVML answers it (or says the GPU has none).

        Raises NotSupported for a GPU without links, DeviceLost for a lost one, and another
        AgentError for any other failure, call or field: that one is not cached (a transient
        error is not "no links") and the count is asked again next tick.
        """
        if gpu not in self._link_counts:
            n = self._n
            what = "NVLink link count"
            (value,) = self._driver.call(
                n.nvmlDeviceGetFieldValues, h, [n.NVML_FI_DEV_NVLINK_LINK_COUNT], what=what
            )
            ret = int(value.nvmlReturn)
            if ret in _UNSUPPORTED:
                self._link_counts[gpu] = 0
            elif ret == _SUCCESS:
                self._link_counts[gpu] = int(field_value(value))
            else:
                raise translate(n.NVMLError(ret), what)  # its field's own return code
        if self._link_counts[gpu] <= 0:
            raise NotSupported("the GPU has no NVLink links")
        return self._link_counts[gpu]

    # -- MIG layout -------------------------------------------------------------------------------

    def mig_layout(self, gpu: int) -> MigLayout:
        """The GPU's MIG mode and instances now. Cheap: handle and UUID per MIG device slot,
        with ids and profile names looked up only for UUIDs not seen before."""
        n, h = self._n, self._handle(gpu)
        try:
            current, pending = n.nvmlDeviceGetMigMode(h)
        except n.NVMLError as exc:
            code = nvml_code(exc)
            if code == _ERR_GPU_IS_LOST:
                raise DeviceLost(str(exc)) from exc
            if code in _UNSUPPORTED:
                return MigLayout(False)
            raise translate(exc, "nvmlDeviceGetMigMode") from exc
        if not current:
            return MigLayout(False, pending=bool(pending))
        devices: dict[int, list[MigDevice]] = {}
        profiles: dict[int, str] = {}
        for mig in self._mig_device_handles(gpu, h):
            uuid = str(self._driver.call(n.nvmlDeviceGetUUID, mig))
            self._mig_handles[uuid] = mig
            if uuid not in self._mig_ids:
                self._mig_ids[uuid] = self._mig_identity(gpu, h, mig)
            gi, ci, profile = self._mig_ids[uuid]
            devices.setdefault(gi, []).append(MigDevice(uuid, gi, ci))
            profiles[gi] = profile
        instances = tuple(
            GpuInstanceInfo(
                gi, profiles[gi], tuple(sorted(devs, key=lambda d: d.compute_instance_id))
            )
            for gi, devs in sorted(devices.items())
        )
        return MigLayout(True, instances, pending=bool(pending))

    def layout(self, gpu: int, mig: MigLayout) -> GpuLayout:
        """The planner's view of the GPU (``GpuLayout``) for the node snapshot, at the cost of
        one process-list call on most ticks.

        Profiles, instances and placements are re-read in full only when ``mig`` (this tick's
        mode and MIG devices) differs from the last full read's, when the agent changed a GPU
        since (the driver's ``generation``), or every ``FULL_LAYOUT_EVERY`` reads (a GPU
        instance without a compute instance, made outside the agent, has no MIG device to
        notice it by). Otherwise the cached shape is returned with fresh processes.
        """
        cached = self._layouts.get(gpu)
        key = (mig, self._driver.generation)
        if cached is None or cached[0] != key or cached[2] >= FULL_LAYOUT_EVERY:
            layout = self._driver.layout(self._identities[gpu].uuid)
            self._layouts[gpu] = (key, layout, 1)
            return layout
        _key, layout, reads = cached
        self._layouts[gpu] = (key, layout, reads + 1)
        return replace(layout, processes=self._driver.processes_of(self._handle(gpu)))

    def _mig_device_handles(self, gpu: int, h: Any) -> Iterable[Any]:
        n = self._n
        if gpu not in self._max_mig:
            self._max_mig[gpu] = int(self._driver.call(n.nvmlDeviceGetMaxMigDeviceCount, h))
        for i in range(self._max_mig[gpu]):
            try:
                yield n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except n.NVMLError as exc:
                if nvml_code(exc) in (_ERR_NOT_FOUND, _ERR_INVALID_ARGUMENT):
                    continue  # empty slot: MIG device handles are sparse
                raise translate(exc, "nvmlDeviceGetMigDeviceHandleByIndex") from exc

    def _mig_identity(self, gpu: int, h: Any, mig: Any) -> tuple[int, int, str]:
        n, call = self._n, self._driver.call
        gi = int(call(n.nvmlDeviceGetGpuInstanceId, mig))
        ci = int(call(n.nvmlDeviceGetComputeInstanceId, mig))
        info = call(n.nvmlGpuInstanceGetInfo, call(n.nvmlDeviceGetGpuInstanceById, h, gi))
        return gi, ci, self._profile_name(gpu, int(info.profileId))

    def _profile_name(self, gpu: int, profile_id: int) -> str:
        if gpu not in self._profile_names:
            uuid = self._identities[gpu].uuid
            self._profile_names[gpu] = {p.id: p.name for p in self._driver.gi_profiles(uuid)}
        return self._profile_names[gpu].get(profile_id, f"profile-{profile_id}")

    # -- processes --------------------------------------------------------------------------------

    def processes(self, gpu: int, mig_uuid: str | None = None) -> tuple[Process, ...]:
        """Compute processes on a GPU, or on one MIG device."""
        h = self._mig_handles[mig_uuid] if mig_uuid is not None else self._handle(gpu)
        return self._driver.processes_of(h)

    def process_utilization(self, gpu: int, since_us: int) -> tuple[dict[int, float], int]:
        """(pid -> mean SM utilisation % over NVML's samples since ``since_us``, newest sample
        timestamp). Raises NotSupported on MIG-enabled GPUs and drivers without the call."""
        n = self._n
        try:
            samples = n.nvmlDeviceGetProcessUtilization(self._handle(gpu), since_us)
        except n.NVMLError as exc:
            code = nvml_code(exc)
            if code in (_SUCCESS, _ERR_NOT_FOUND):
                return {}, since_us  # no sample since then (pynvml raises on an empty first call)
            raise translate(exc, "nvmlDeviceGetProcessUtilization") from exc
        sums: dict[int, list[float]] = {}
        newest = since_us
        for s in samples:
            sums.setdefault(int(s.pid), []).append(float(s.smUtil))
            newest = max(newest, int(s.timeStamp))
        return {pid: sum(v) / len(v) for pid, v in sums.items()}, newest

    # -- topology -------------------------------------------------------------------------------

    def p2p_status(self, gpus: Iterable[int]) -> dict[tuple[int, int], int]:
        """NVLink P2P status (nvmlGpuP2PStatus_t: 0 OK, 1-6 why not) of every ordered pair of
        ``gpus``. Raises NotSupported when the driver cannot tell (no such call)."""
        n = self._n
        gpus = list(gpus)
        out: dict[tuple[int, int], int] = {}
        for a in gpus:
            for b in gpus:
                if a == b:
                    continue
                status = self._driver.call(
                    n.nvmlDeviceGetP2PStatus,
                    self._handle(a),
                    self._handle(b),
                    n.NVML_P2P_CAPS_INDEX_NVLINK,
                )
                out[(a, b)] = int(status)
        return out

    # -- GPM --------------------------------------------------------------------------------------

    def gpm_supported(self, gpu: int) -> bool:
        """Decided by NVML per device, never by model name (telemetry.md fact 3). False only
        when NVML says so (or the driver lacks the call); any other failure raises, DeviceLost
        for a lost GPU: a transient error says nothing about the GPU having no GPM."""
        n = self._n
        try:
            return bool(n.nvmlGpmQueryDeviceSupport(self._handle(gpu)).isSupportedDevice)
        except n.NVMLError as exc:
            if nvml_code(exc) in _UNSUPPORTED:
                return False
            raise translate(exc, "nvmlGpmQueryDeviceSupport") from exc

    def gpm_sample(
        self, gpu: int, gpu_instance_id: int | None = None, into: GpmSample | None = None
    ) -> GpmSample:
        """Sample the GPU, or one of its GPU instances (parent handle + GI id, as DCGM does),
        into ``into`` or a newly allocated buffer."""
        n = self._n
        sample = into if into is not None else GpmSample(self._driver.call(n.nvmlGpmSampleAlloc))
        try:
            if gpu_instance_id is None:
                self._driver.call(n.nvmlGpmSampleGet, self._handle(gpu), sample.native)
            else:
                self._driver.call(
                    n.nvmlGpmMigSampleGet, self._handle(gpu), gpu_instance_id, sample.native
                )
        except BaseException:
            if into is None:
                self.gpm_free(sample)
            raise
        return sample

    def gpm_metrics(
        self, first: GpmSample, second: GpmSample, metric_ids: Iterable[int]
    ) -> GpmReadout:
        """Averages of ``metric_ids`` between two samples of the same entity."""
        n = self._n
        ids = tuple(metric_ids)
        request = self._gpm_requests.get(ids)
        if request is None:  # built once per metric set: ctypes fields are slow to set
            request = self._gpm_requests[ids] = n.c_nvmlGpmMetricsGet_t()
            request.version = n.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(ids)
            for i, metric in enumerate(ids):
                request.metrics[i].metricId = metric
        request.sample1 = first.native
        request.sample2 = second.native
        self._driver.call(n.nvmlGpmMetricsGet, request)
        values: dict[int, float] = {}
        unsupported: set[int] = set()
        for metric, result in zip(ids, request.metrics, strict=False):
            code = result.nvmlReturn
            if code == _SUCCESS:
                values[metric] = result.value
            elif code in _UNSUPPORTED:
                unsupported.add(metric)
        return GpmReadout(values, frozenset(unsupported))

    def gpm_free(self, sample: GpmSample) -> None:
        n = self._n
        with contextlib.suppress(n.NVMLError):  # a driver going away has nothing left to free
            n.nvmlGpmSampleFree(sample.native)
