"""Compute instances inside a GI and the MIG devices they form (mig.md §1.6, §2.2)."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from .conftest import Opener, create_at, enable_mig

P1G, P3G, P7G = 19, 9, 0
C1, C2, C3, C4, C7 = 0, 1, 2, 3, 4  # NVML_COMPUTE_INSTANCE_PROFILE_* (= CI profile ids)
ENG = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED


def test_ci_profiles_offered_inside_a_3g(node: Opener) -> None:
    nvml, _ = node("dgx-a100")
    gi = create_at(nvml, enable_mig(nvml, 0), P3G, 0, 4)
    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, C1, ENG)
    assert isinstance(info, pynvml.c_nvmlComputeInstanceProfileInfo_v2_t)
    assert (info.id, info.sliceCount, info.instanceCount, info.name) == (0, 1, 3, "MIG 1c.3g.20gb")
    full = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, C3, ENG)
    assert (full.id, full.instanceCount, full.multiprocessorCount, full.name) == (
        2,
        1,
        42,
        "MIG 3g.20gb",
    )
    with pytest.raises(pynvml.NVMLError_NotSupported):  # 4c does not fit a 3g
        nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, C4, ENG)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT, ENG
        )


def test_ci_placements_and_capacity(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    gi = create_at(nvml, enable_mig(nvml, 0), P7G, 0, 8)
    placements = (pynvml.c_nvmlComputeInstancePlacement_t * 8)()
    count = ctypes.c_uint(8)
    nvml.nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        gi, C2, placements, ctypes.byref(count)
    )
    assert [(p.start, p.size) for p in placements[: count.value]] == [(0, 2), (2, 2), (4, 2)]
    assert nvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, C1) == 7
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, C4)
    assert nvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, C1) == 3
    assert nvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, C4) == 0


def test_ci_overlap_and_bad_placement(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    gi = create_at(nvml, enable_mig(nvml, 0), P7G, 0, 8)
    at = pynvml.c_nvmlComputeInstancePlacement_t(start=0, size=4)
    nvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, C4, ctypes.byref(at))
    overlap = pynvml.c_nvmlComputeInstancePlacement_t(start=2, size=2)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, C2, ctypes.byref(overlap))
    odd = pynvml.c_nvmlComputeInstancePlacement_t(start=5, size=2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, C2, ctypes.byref(odd))


def test_ci_info_ids_and_listing(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    gi = create_at(nvml, enable_mig(nvml, 0), P3G, 4, 4)
    cis = [nvml.nvmlGpuInstanceCreateComputeInstance(gi, C1) for _ in range(3)]
    infos = [nvml.nvmlComputeInstanceGetInfo(ci) for ci in cis]
    assert [(i.id, i.profileId, i.placement.start, i.placement.size) for i in infos] == [
        (0, C1, 0, 1),
        (1, C1, 1, 1),
        (2, C1, 2, 1),
    ]
    parent = ctypes.cast(infos[0].gpuInstance, ctypes.c_void_p).value
    assert parent == ctypes.cast(gi, ctypes.c_void_p).value
    array = (pynvml.c_nvmlComputeInstance_t * 3)()
    count = ctypes.c_uint()
    nvml.nvmlGpuInstanceGetComputeInstances(gi, C1, array, ctypes.byref(count))
    assert count.value == 3
    nvml.nvmlComputeInstanceDestroy(cis[1])
    again = nvml.nvmlGpuInstanceCreateComputeInstance(gi, C1)
    assert nvml.nvmlComputeInstanceGetInfo(again).id == 1  # CI ids are reused too
    by_id = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 2)
    assert nvml.nvmlComputeInstanceGetInfo(by_id).placement.start == 2
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 5)


def test_destroying_a_ci_with_a_running_process_is_in_use(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    gi = create_at(nvml, enable_mig(nvml, 2), P3G, 0, 4)
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, C3)
    gi_id = nvml.nvmlGpuInstanceGetInfo(gi).id
    control.start_process(777, 2, gpu_instance=gi_id, used_memory_mib=1024)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(ci)
    control.stop_process(777)
    nvml.nvmlComputeInstanceDestroy(ci)


def test_destroying_a_gi_with_a_running_process_is_in_use(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    gi = create_at(nvml, enable_mig(nvml, 0), P1G, 3, 1)
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, C1)
    control.start_process(5, 0, gpu_instance=nvml.nvmlGpuInstanceGetInfo(gi).id, used_memory_mib=8)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(ci)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(gi)


def test_mig_device_slots(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    plain = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(plain) == 0
    handle = enable_mig(nvml, 0)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
    create_at(nvml, handle, P3G, 4, 4)  # a GI without a CI is no MIG device
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)


def test_mig_device_handle_identity(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    gi = create_at(nvml, handle, P3G, 4, 4)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, C3)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert isinstance(mig, pynvml.c_nvmlDevice_t)
    assert nvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert nvml.nvmlDeviceGetGpuInstanceId(mig) == nvml.nvmlGpuInstanceGetInfo(gi).id
    assert nvml.nvmlDeviceGetComputeInstanceId(mig) == 0
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert nvml.nvmlDeviceGetIndex(parent) == 0
    uuid = nvml.nvmlDeviceGetUUID(mig)
    assert uuid.startswith("MIG-") and not uuid.startswith("MIG-GPU-")
    by_uuid = nvml.nvmlDeviceGetHandleByUUID(uuid)
    assert nvml.nvmlDeviceGetComputeInstanceId(by_uuid) == 0
    assert nvml.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 1)


def test_mig_devices_are_indexed_by_gi_then_ci_id(node: Opener) -> None:
    nvml, _ = node("dgx-a100")
    handle = enable_mig(nvml, 0)
    for start in (6, 0):
        gi = create_at(nvml, handle, P1G, start, 1)
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, C1)
    ids = [
        nvml.nvmlDeviceGetGpuInstanceId(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
        for i in range(2)
    ]
    assert ids == sorted(ids)


def test_mig_device_attributes(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    gi = create_at(nvml, enable_mig(nvml, 0), P3G, 0, 4)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, C1)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(0), 0)
    attrs = nvml.nvmlDeviceGetAttributes(mig)
    assert isinstance(attrs, pynvml.c_nvmlDeviceAttributes)
    assert (attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount) == (3, 1)
    assert (attrs.multiprocessorCount, attrs.sharedCopyEngineCount) == (20, 3)
    assert attrs.memorySizeMB == 40448
    assert nvml.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb"


def test_memory_and_processes_through_a_mig_device(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    small = create_at(nvml, handle, P1G, 0, 1)
    big = create_at(nvml, handle, P3G, 4, 4)
    for gi in (small, big):
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, C1)
    big_id = nvml.nvmlGpuInstanceGetInfo(big).id
    control.start_process(11, 0, gpu_instance=big_id, used_memory_mib=3000)
    mig_big = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)  # GI 2 sorts before GI 7
    assert nvml.nvmlDeviceGetGpuInstanceId(mig_big) == big_id
    memory = nvml.nvmlDeviceGetMemoryInfo(mig_big)
    assert (memory.total, memory.used) == (40448 << 20, 3000 << 20)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(mig_big)
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [(11, big_id, 0)]
    mig_small = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 1)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(mig_small) == []
    assert nvml.nvmlDeviceGetMemoryInfo(mig_small).used == 0
    everything = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [p.usedGpuMemory for p in everything] == [3000 << 20]
