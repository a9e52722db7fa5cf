"""Library, system and device-identity symbols, including MIG device handles."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pynvml

from agent.gpu.models import profile_name
from agent.gpu.sim import layout
from agent.gpu.sim.abi import (
    fail,
    set_handle,
    set_value,
    symbol,
    target,
    to_bytes,
    to_int,
    write_string,
)
from agent.gpu.sim.handles import Handle, Kind
from agent.gpu.sim.state import Gpu

if TYPE_CHECKING:
    from agent.gpu.sim.driver import SimDriver, Target

# nvmlErrorString's texts, as the driver's library returns them (NVIDIA's table in DCGM's
# sdk/nvidia/nvml/nvml_error_strings.h); other codes read "Unknown Error".
ERROR_TEXT = {
    pynvml.NVML_SUCCESS: "Success",
    pynvml.NVML_ERROR_UNINITIALIZED: "Uninitialized",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    pynvml.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    pynvml.NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    pynvml.NVML_ERROR_NOT_FOUND: "Not Found",
    pynvml.NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    pynvml.NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    pynvml.NVML_ERROR_TIMEOUT: "Timeout",
    pynvml.NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    pynvml.NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    pynvml.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    pynvml.NVML_ERROR_RESET_REQUIRED: "GPU requires reset",
    pynvml.NVML_ERROR_OPERATING_SYSTEM: "GPU access blocked by the operating system",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "Driver/library version mismatch",
    pynvml.NVML_ERROR_IN_USE: "In use by another client",
    pynvml.NVML_ERROR_MEMORY: "Insufficient Memory",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
    pynvml.NVML_ERROR_UNKNOWN: "Unknown Error",
}


def device_handle(gpu: Gpu) -> Handle:
    return Handle(Kind.DEVICE, gpu.index, 0)


def device_handle_where(drv: SimDriver, matches: Callable[[Gpu], bool]) -> Handle:
    """The handle of the GPU a lookup by identity (UUID, PCI bus id, serial) names: NOT_FOUND
    when no GPU has it, GPU_IS_LOST when that GPU is lost."""
    gpu = next((g for g in drv.node().gpus if matches(g)), None)
    if gpu is None:
        raise fail(pynvml.NVML_ERROR_NOT_FOUND)
    if gpu.lost:
        raise fail(pynvml.NVML_ERROR_GPU_IS_LOST)
    return device_handle(gpu)


def device_name(t: Target) -> str:
    """``nvmlDeviceGetName``: the board name, or for a MIG device e.g. "... MIG 1g.10gb"."""
    if t.gi is None or t.ci is None:
        return t.model.name
    spec = layout.gi_spec(t.model, t.gi)
    return f"{t.model.name} MIG {profile_name(t.model, spec, t.ci.size)}"


@symbol("nvmlInitWithFlags", needs_init=False)
def init_with_flags(drv: SimDriver, flags: Any) -> None:
    to_int(flags)
    drv.node()  # no state: the "kernel module" is not loaded
    with drv.lock:
        drv.refcount += 1


@symbol("nvmlInit_v2", needs_init=False)
def init(drv: SimDriver) -> None:
    init_with_flags(drv, 0)


@symbol("nvmlShutdown", needs_init=False)
def shutdown(drv: SimDriver) -> None:
    with drv.lock:
        if drv.refcount == 0:
            raise fail(pynvml.NVML_ERROR_UNINITIALIZED)
        drv.refcount -= 1


@symbol("nvmlErrorString", needs_init=False, returns_value=True)
def error_string(drv: SimDriver, code: Any) -> bytes:
    value = to_int(code)
    return ERROR_TEXT.get(value, "Unknown Error").encode()


@symbol("nvmlSystemGetDriverVersion")
def driver_version(drv: SimDriver, buffer: Any, length: Any) -> None:
    write_string(buffer, length, drv.node().driver_version)


@symbol("nvmlSystemGetNVMLVersion")
def nvml_version(drv: SimDriver, buffer: Any, length: Any) -> None:
    # NVML reports "<CUDA major>.<driver version>", e.g. "12.550.90.07".
    node = drv.node()
    write_string(buffer, length, f"{node.cuda_driver_version // 1000}.{node.driver_version}")


@symbol("nvmlSystemGetCudaDriverVersion")
def cuda_driver_version(drv: SimDriver, ref: Any) -> None:
    set_value(ref, drv.node().cuda_driver_version)


@symbol("nvmlSystemGetCudaDriverVersion_v2")
def cuda_driver_version_v2(drv: SimDriver, ref: Any) -> None:
    set_value(ref, drv.node().cuda_driver_version)


@symbol("nvmlDeviceGetCount_v2")
def device_count(drv: SimDriver, ref: Any) -> None:
    set_value(ref, len(drv.node().gpus))


@symbol("nvmlDeviceGetHandleByIndex_v2")
def handle_by_index(drv: SimDriver, index: Any, ref: Any) -> None:
    i = to_int(index)
    gpus = drv.node().gpus
    if not 0 <= i < len(gpus):
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if gpus[i].lost:
        raise fail(pynvml.NVML_ERROR_GPU_IS_LOST)
    set_handle(ref, device_handle(gpus[i]))


@symbol("nvmlDeviceGetHandleByUUID")
def handle_by_uuid(drv: SimDriver, uuid: Any, ref: Any) -> None:
    wanted = to_bytes(uuid).decode()
    # A MIG device's UUID, else a GPU's (the two never share one).
    for gpu in drv.node().gpus:
        for _gi, ci in layout.mig_devices(gpu):
            if ci.uuid == wanted:
                if gpu.lost:
                    raise fail(pynvml.NVML_ERROR_GPU_IS_LOST)
                set_handle(ref, Handle(Kind.MIG_DEVICE, gpu.index, ci.serial))
                return
    set_handle(ref, device_handle_where(drv, lambda gpu: gpu.uuid == wanted))


@symbol("nvmlDeviceGetHandleByPciBusId_v2")
def handle_by_pci_bus_id(drv: SimDriver, bus_id: Any, ref: Any) -> None:
    wanted = _normalise_bus_id(to_bytes(bus_id).decode())
    set_handle(ref, device_handle_where(drv, lambda gpu: gpu.pci_bus_id == wanted))


def _normalise_bus_id(text: str) -> str:
    """Accept ``domain:bus:device.function`` with a 4- or 8-digit domain, any case."""
    try:
        domain, bus, rest = text.strip().split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{int(function)}"
    except ValueError:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None


@symbol("nvmlDeviceGetName")
def name(drv: SimDriver, handle: Any, buffer: Any, length: Any) -> None:
    write_string(buffer, length, device_name(drv.device(handle)))


@symbol("nvmlDeviceGetUUID")
def uuid(drv: SimDriver, handle: Any, buffer: Any, length: Any) -> None:
    t = drv.device(handle)
    write_string(buffer, length, t.ci.uuid if t.ci is not None else t.gpu.uuid)


@symbol("nvmlDeviceGetIndex")
def index(drv: SimDriver, handle: Any, ref: Any) -> None:
    set_value(ref, drv.physical(handle).gpu.index)


@symbol("nvmlDeviceGetMinorNumber")
def minor_number(drv: SimDriver, handle: Any, ref: Any) -> None:
    set_value(ref, drv.physical(handle).gpu.index)  # /dev/nvidia<N>


@symbol("nvmlDeviceGetSerial")
def serial(drv: SimDriver, handle: Any, buffer: Any, length: Any) -> None:
    write_string(buffer, length, drv.physical(handle).gpu.serial)


@symbol("nvmlDeviceGetBrand")
def brand(drv: SimDriver, handle: Any, ref: Any) -> None:
    drv.physical(handle)
    set_value(ref, pynvml.NVML_BRAND_NVIDIA)


@symbol("nvmlDeviceGetPciInfo_v3")
def pci_info(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.physical(handle)
    info = target(ref)
    info.busIdLegacy = f"0000:{t.gpu.bus:02X}:00.0".encode()
    info.domain = 0
    info.bus = t.gpu.bus
    info.device = 0
    info.pciDeviceId = t.model.pci_device_id
    info.pciSubSystemId = t.model.pci_subsystem_id
    info.busId = t.gpu.pci_bus_id.encode()


@symbol("nvmlDeviceGetArchitecture")
def architecture(drv: SimDriver, handle: Any, ref: Any) -> None:
    set_value(ref, drv.device(handle).model.arch_code)


@symbol("nvmlDeviceGetCudaComputeCapability")
def cuda_compute_capability(drv: SimDriver, handle: Any, major: Any, minor: Any) -> None:
    model = drv.device(handle).model
    set_value(major, model.cuda_capability[0])
    set_value(minor, model.cuda_capability[1])


@symbol("nvmlDeviceGetAttributes_v2")
def attributes(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.device(handle)
    attrs = target(ref)
    if t.gi is not None and t.ci is not None:
        gi = layout.gi_spec(t.model, t.gi)
        ci = layout.ci_spec_by_id(t.model, t.gi, t.ci.profile_id)
        attrs.multiprocessorCount = ci.multiprocessor_count if ci else gi.multiprocessor_count
        attrs.gpuInstanceSliceCount = gi.slice_count
        attrs.computeInstanceSliceCount = t.ci.size
    else:
        gi = layout.whole_gpu_profile(t.model)  # with every SM of the board
        attrs.multiprocessorCount = t.model.multiprocessor_count
        attrs.gpuInstanceSliceCount = t.model.compute_slices
        attrs.computeInstanceSliceCount = t.model.compute_slices
    attrs.sharedCopyEngineCount = gi.copy_engines
    attrs.sharedDecoderCount = gi.decoders
    attrs.sharedEncoderCount = gi.encoders
    attrs.sharedJpegCount = gi.jpegs
    attrs.sharedOfaCount = gi.ofas
    attrs.memorySizeMB = gi.memory_mb if t.is_mig_device else t.model.memory_total_bytes >> 20


@symbol("nvmlDeviceIsMigDeviceHandle")
def is_mig_device_handle(drv: SimDriver, handle: Any, ref: Any) -> None:
    set_value(ref, int(drv.device(handle).is_mig_device))


@symbol("nvmlDeviceGetGpuInstanceId")
def gpu_instance_id(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.device(handle)
    if t.gi is None:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    set_value(ref, t.gi.id)


@symbol("nvmlDeviceGetComputeInstanceId")
def compute_instance_id(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.device(handle)
    if t.ci is None:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    set_value(ref, t.ci.id)


@symbol("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
def parent_handle(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.device(handle)
    if not t.is_mig_device:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    set_handle(ref, device_handle(t.gpu))


@symbol("nvmlDeviceGetMaxMigDeviceCount")
def max_mig_device_count(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.physical(handle)
    set_value(ref, t.model.compute_slices if t.gpu.mig_current else 0)


@symbol("nvmlDeviceGetMigDeviceHandleByIndex")
def mig_device_handle_by_index(drv: SimDriver, handle: Any, index: Any, ref: Any) -> None:
    t = drv.physical(handle)
    i = to_int(index)
    if not t.gpu.mig_current:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= i < t.model.compute_slices:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    devices = layout.mig_devices(t.gpu)
    if i >= len(devices):
        raise fail(pynvml.NVML_ERROR_NOT_FOUND)
    set_handle(ref, Handle(Kind.MIG_DEVICE, t.gpu.index, devices[i][1].serial))
