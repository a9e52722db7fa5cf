"""MIG symbols: the mode and GPU instances (reference/mig.md §2.2, nvml.h).

Return codes follow the nvml.h doc comments: profile constants past the enumeration end are
INVALID_ARGUMENT and constants the board lacks NOT_SUPPORTED; the versioned profile queries
(``...InfoV``, ``...ByIdV``), capacity, listing and creation need MIG mode enabled
(NOT_SUPPORTED otherwise) while ``nvmlDeviceGetGpuInstanceProfileInfo`` (v1) and the placement
query answer whatever the mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pynvml

from agent.gpu.models import GiProfileSpec, profile_name
from agent.gpu.sim import activity, layout, lifecycle
from agent.gpu.sim.abi import (
    creators,
    fail,
    index_arg,
    set_handle,
    set_value,
    start_for,
    symbol,
    target,
    to_int,
    write_handles,
    write_placements,
)
from agent.gpu.sim.handles import Handle, Kind, pointer
from agent.gpu.sim.state import Activity, ComputeInstance, GpuInstance

if TYPE_CHECKING:
    from agent.gpu.sim.driver import SimDriver, Target


def _mig_capable(t: Target) -> None:
    if not t.model.gi_profiles:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)


def _mig_enabled(t: Target) -> None:
    _mig_capable(t)
    if not t.gpu.mig_current:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)


def gi_handle(t: Target, gi: GpuInstance) -> Handle:
    return Handle(Kind.GPU_INSTANCE, t.gpu.index, gi.serial)


# --- MIG mode ---------------------------------------------------------------------------------


@symbol("nvmlDeviceGetMigMode")
def get_mig_mode(drv: SimDriver, handle: Any, current: Any, pending: Any) -> None:
    t = drv.physical(handle)
    _mig_capable(t)
    set_value(current, int(t.gpu.mig_current))
    set_value(pending, int(t.gpu.mig_pending))


@symbol("nvmlDeviceSetMigMode")
def set_mig_mode(drv: SimDriver, handle: Any, mode: Any, status_ref: Any) -> None:
    status = target(status_ref)
    m = to_int(mode)
    with drv.mutate() as node:
        t = drv.physical(handle, node)
        _mig_capable(t)
        if m not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        code = lifecycle.set_mig_mode(node, t.gpu, m == pynvml.NVML_DEVICE_MIG_ENABLE, drv.now())
    status.value = code


# --- GPU instance profiles --------------------------------------------------------------------


def _gi_spec_by_constant(t: Target, constant: Any) -> GiProfileSpec:
    c = index_arg(constant, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
    spec = t.model.gi_profile_by_constant(c)
    if spec is None:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return spec


def _gi_spec_by_id(t: Target, profile_id: Any, missing: int) -> GiProfileSpec:
    spec = t.model.gi_profile_by_id(to_int(profile_id))
    if spec is None:
        raise fail(missing)
    return spec


def _fill_gi_profile(t: Target, info: Any, spec: GiProfileSpec, *, versioned: bool) -> None:
    if versioned and info.version != pynvml.nvmlGpuInstanceProfileInfo_v2:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    info.id = spec.id
    info.isP2pSupported = 0  # "P2P No" in every -lgip listing of the reference
    info.sliceCount = spec.slice_count
    info.instanceCount = spec.instance_count
    info.multiprocessorCount = spec.multiprocessor_count
    info.copyEngineCount = spec.copy_engines
    info.decoderCount = spec.decoders
    info.encoderCount = spec.encoders
    info.jpegCount = spec.jpegs
    info.ofaCount = spec.ofas
    info.memorySizeMB = spec.memory_mb
    if versioned:
        info.name = f"MIG {profile_name(t.model, spec)}".encode()


@symbol("nvmlDeviceGetGpuInstanceProfileInfo")
def gi_profile_info(drv: SimDriver, handle: Any, constant: Any, ref: Any) -> None:
    t = drv.physical(handle)
    _mig_capable(t)
    _fill_gi_profile(t, target(ref), _gi_spec_by_constant(t, constant), versioned=False)


@symbol("nvmlDeviceGetGpuInstanceProfileInfoV")
def gi_profile_info_v(drv: SimDriver, handle: Any, constant: Any, ref: Any) -> None:
    t = drv.physical(handle)
    _mig_capable(t)
    spec = _gi_spec_by_constant(t, constant)
    _mig_enabled(t)
    _fill_gi_profile(t, target(ref), spec, versioned=True)


@symbol("nvmlDeviceGetGpuInstanceProfileInfoByIdV")
def gi_profile_info_by_id(drv: SimDriver, handle: Any, profile_id: Any, ref: Any) -> None:
    t = drv.physical(handle)
    _mig_enabled(t)
    spec = _gi_spec_by_id(t, profile_id, pynvml.NVML_ERROR_NOT_SUPPORTED)
    _fill_gi_profile(t, target(ref), spec, versioned=True)


@symbol("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
def gi_possible_placements(
    drv: SimDriver, handle: Any, profile_id: Any, placements: Any, count_ref: Any
) -> None:
    t = drv.physical(handle)
    _mig_capable(t)
    spec = _gi_spec_by_id(t, profile_id, pynvml.NVML_ERROR_NOT_SUPPORTED)
    write_placements(layout.gi_placements(spec), placements, count_ref)


@symbol("nvmlDeviceGetGpuInstanceRemainingCapacity")
def gi_remaining_capacity(drv: SimDriver, handle: Any, profile_id: Any, ref: Any) -> None:
    t = drv.physical(handle)
    _mig_enabled(t)
    spec = _gi_spec_by_id(t, profile_id, pynvml.NVML_ERROR_NOT_SUPPORTED)
    set_value(ref, layout.gi_remaining_capacity(t.gpu, t.model, spec))


# --- GPU instances ----------------------------------------------------------------------------


def _create_gi(
    drv: SimDriver, handle: Any, profile_id: Any, wanted: tuple[int, int] | None
) -> Handle:
    with drv.mutate() as node:
        t = drv.physical(handle, node)
        _mig_enabled(t)
        spec = _gi_spec_by_id(t, profile_id, pynvml.NVML_ERROR_INVALID_ARGUMENT)
        start = start_for(
            wanted, spec.memory_slices, lambda: layout.choose_gi_start(t.gpu, t.model, spec)
        )
        error = layout.gi_create_error(t.gpu, t.model, spec, start)
        if error is not None:
            raise fail(error)
        now = drv.now()
        gi = GpuInstance(
            id=layout.gi_id(t.model, start, spec.memory_slices),
            profile_id=spec.id,
            start=start,
            size=spec.memory_slices,
            serial=node.take_serial(),
            activity=Activity(since=now),
        )
        t.gpu.gpu_instances.append(gi)
        activity.refresh(t.gpu, t.model, now)
    return gi_handle(t, gi)


creators("nvmlDeviceCreateGpuInstance", "nvmlDeviceCreateGpuInstanceWithPlacement", _create_gi)


@symbol("nvmlGpuInstanceDestroy")
def destroy_gi(drv: SimDriver, handle: Any) -> None:
    with drv.mutate() as node:
        t, gi = drv.gpu_instance(handle, node)
        busy = any(p.gpu == t.gpu.index and p.gpu_instance == gi.id for p in node.processes)
        if gi.compute_instances or busy:
            raise fail(pynvml.NVML_ERROR_IN_USE)
        now = drv.now()
        activity.refresh(t.gpu, t.model, now)
        t.gpu.gpu_instances.remove(gi)
        activity.refresh(t.gpu, t.model, now)


@symbol("nvmlDeviceGetGpuInstances")
def gpu_instances(
    drv: SimDriver, handle: Any, profile_id: Any, instances: Any, count_ref: Any
) -> None:
    t = drv.physical(handle)
    _mig_enabled(t)
    spec = _gi_spec_by_id(t, profile_id, pynvml.NVML_ERROR_INVALID_ARGUMENT)
    handles = [gi_handle(t, gi) for gi in layout.of_profile(t.gpu.gpu_instances, spec.id)]
    write_handles(handles, pynvml.c_nvmlGpuInstance_t, instances, count_ref)


@symbol("nvmlDeviceGetGpuInstanceById")
def gpu_instance_by_id(drv: SimDriver, handle: Any, gi_id: Any, ref: Any) -> None:
    t = drv.physical(handle)
    _mig_enabled(t)
    gi = t.gpu.gpu_instance(to_int(gi_id))
    if gi is None:
        raise fail(pynvml.NVML_ERROR_NOT_FOUND)
    set_handle(ref, gi_handle(t, gi))


@symbol("nvmlGpuInstanceGetInfo")
def gpu_instance_info(drv: SimDriver, handle: Any, ref: Any) -> None:
    t, gi = drv.gpu_instance(handle)
    fill_instance_info(target(ref), t, gi)


def fill_instance_info(info: Any, t: Target, instance: GpuInstance | ComputeInstance) -> None:
    """What a GI's and a CI's info structs share: their GPU, id, profile and placement."""
    info.device = pointer(pynvml.c_nvmlDevice_t, Handle(Kind.DEVICE, t.gpu.index, 0))
    info.id = instance.id
    info.profileId = instance.profile_id
    info.placement.start, info.placement.size = instance.start, instance.size
