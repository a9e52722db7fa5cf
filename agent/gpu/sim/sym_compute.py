"""MIG symbols for compute instances inside a GPU instance (mig.md §1.6, §2.2, nvml.h).

CI profile ids equal their NVML_COMPUTE_INSTANCE_PROFILE_* constants; placements count compute
slices inside the GI.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pynvml

from agent.gpu.models import CiProfileSpec, profile_name
from agent.gpu.sim import activity, layout
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
from agent.gpu.sim.state import ComputeInstance, GpuInstance
from agent.gpu.sim.sym_mig import fill_instance_info, gi_handle

if TYPE_CHECKING:
    from agent.gpu.sim.driver import SimDriver, Target


def _ci_handle(t: Target, ci: ComputeInstance) -> Handle:
    return Handle(Kind.COMPUTE_INSTANCE, t.gpu.index, ci.serial)


def _ci_spec_by_id(t: Target, gi: GpuInstance, profile_id: Any) -> CiProfileSpec:
    spec = layout.ci_spec_by_id(t.model, gi, to_int(profile_id))
    if spec is None:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return spec


def _ci_profile_info(
    drv: SimDriver, handle: Any, constant: Any, eng: Any, ref: Any, *, versioned: bool
) -> None:
    t, gi = drv.gpu_instance(handle)
    c = index_arg(constant, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
    index_arg(eng, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
    gi_spec = layout.gi_spec(t.model, gi)
    spec = next((s for s in t.model.ci_profiles(gi_spec) if s.constant == c), None)
    if spec is None:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    info = target(ref)
    if versioned and info.version != pynvml.nvmlComputeInstanceProfileInfo_v2:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    info.id = spec.id
    info.sliceCount = spec.slice_count
    info.instanceCount = spec.instance_count
    info.multiprocessorCount = spec.multiprocessor_count
    info.sharedCopyEngineCount = gi_spec.copy_engines
    info.sharedDecoderCount = gi_spec.decoders
    info.sharedEncoderCount = gi_spec.encoders
    info.sharedJpegCount = gi_spec.jpegs
    info.sharedOfaCount = gi_spec.ofas
    if versioned:
        info.name = f"MIG {profile_name(t.model, gi_spec, spec.slice_count)}".encode()


@symbol("nvmlGpuInstanceGetComputeInstanceProfileInfo")
def ci_profile_info(drv: SimDriver, handle: Any, constant: Any, eng: Any, ref: Any) -> None:
    _ci_profile_info(drv, handle, constant, eng, ref, versioned=False)


@symbol("nvmlGpuInstanceGetComputeInstanceProfileInfoV")
def ci_profile_info_v(drv: SimDriver, handle: Any, constant: Any, eng: Any, ref: Any) -> None:
    _ci_profile_info(drv, handle, constant, eng, ref, versioned=True)


@symbol("nvmlGpuInstanceGetComputeInstancePossiblePlacements")
def ci_possible_placements(
    drv: SimDriver, handle: Any, profile_id: Any, placements: Any, count_ref: Any
) -> None:
    t, gi = drv.gpu_instance(handle)
    spec = _ci_spec_by_id(t, gi, profile_id)
    write_placements(layout.ci_placements(spec), placements, count_ref)


@symbol("nvmlGpuInstanceGetComputeInstanceRemainingCapacity")
def ci_remaining_capacity(drv: SimDriver, handle: Any, profile_id: Any, ref: Any) -> None:
    t, gi = drv.gpu_instance(handle)
    set_value(ref, layout.ci_remaining_capacity(gi, _ci_spec_by_id(t, gi, profile_id)))


def _create_ci(
    drv: SimDriver, handle: Any, profile_id: Any, wanted: tuple[int, int] | None
) -> Handle:
    with drv.mutate() as node:
        t, gi = drv.gpu_instance(handle, node)
        spec = _ci_spec_by_id(t, gi, profile_id)
        start = start_for(wanted, spec.slice_count, lambda: layout.choose_ci_start(gi, spec))
        error = layout.ci_create_error(gi, spec, start)
        if error is not None:
            raise fail(error)
        ci = ComputeInstance(
            id=layout.next_ci_id(gi),
            profile_id=spec.id,
            start=start,
            size=spec.slice_count,
            serial=node.take_serial(),
            uuid=f"MIG-{uuid.uuid4()}",
        )
        gi.compute_instances.append(ci)
    return _ci_handle(t, ci)


creators(
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
    _create_ci,
)


@symbol("nvmlComputeInstanceDestroy")
def destroy_ci(drv: SimDriver, handle: Any) -> None:
    with drv.mutate() as node:
        t, gi, ci = drv.compute_instance(handle, node)
        if any(
            p.gpu == t.gpu.index and p.gpu_instance == gi.id and p.compute_instance == ci.id
            for p in node.processes
        ):
            raise fail(pynvml.NVML_ERROR_IN_USE)
        gi.compute_instances.remove(ci)
        if not gi.compute_instances and gi.workload:
            # Without a compute instance nothing can run on the GI any more.
            gi.workload.clear()
            activity.refresh(t.gpu, t.model, drv.now())


@symbol("nvmlGpuInstanceGetComputeInstances")
def compute_instances(
    drv: SimDriver, handle: Any, profile_id: Any, instances: Any, count_ref: Any
) -> None:
    t, gi = drv.gpu_instance(handle)
    spec = _ci_spec_by_id(t, gi, profile_id)
    handles = [_ci_handle(t, ci) for ci in layout.of_profile(gi.compute_instances, spec.id)]
    write_handles(handles, pynvml.c_nvmlComputeInstance_t, instances, count_ref)


@symbol("nvmlGpuInstanceGetComputeInstanceById")
def compute_instance_by_id(drv: SimDriver, handle: Any, ci_id: Any, ref: Any) -> None:
    t, gi = drv.gpu_instance(handle)
    ci = gi.compute_instance(to_int(ci_id))
    if ci is None:
        raise fail(pynvml.NVML_ERROR_NOT_FOUND)
    set_handle(ref, _ci_handle(t, ci))


@symbol("nvmlComputeInstanceGetInfo_v2")
def compute_instance_info(drv: SimDriver, handle: Any, ref: Any) -> None:
    t, gi, ci = drv.compute_instance(handle)
    info = target(ref)
    fill_instance_info(info, t, ci)
    info.gpuInstance = pointer(pynvml.c_nvmlGpuInstance_t, gi_handle(t, gi))
