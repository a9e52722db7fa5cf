"""GPU instances: profiles, placements, capacity, creation and destruction (mig.md §1-2)."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

from agent.gpu.sim import SimNvml

from .conftest import Opener, create_at, enable_mig, gpu_instances, placements_of

P1G, P1G_ME, P1G_2M, P2G, P3G, P4G, P7G = 19, 20, 15, 14, 9, 5, 0  # A100 / Hopper profile ids


def test_profile_info_by_constant_gives_the_profile_id(node: Opener) -> None:
    nvml, _ = node("dgx-a100")
    handle = enable_mig(nvml, 0)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, nvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert info.version == pynvml.nvmlGpuInstanceProfileInfo_v2
    assert (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB) == (9, 3, 2, 19968)
    assert info.name == "MIG 3g.20gb"


def test_profile_enumeration_stops_with_invalid_argument(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # a constant the board lacks
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, nvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)


def test_a30_profile_ids_differ_from_a100(node: Opener) -> None:
    nvml, _ = node("a30-node")
    handle = enable_mig(nvml, 0)
    ids = [
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, c).id
        for c in (nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, nvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE)
    ]
    assert ids == [14, 0]


def test_versioned_profile_queries_need_mig_mode_but_v1_does_not(node: Opener) -> None:
    nvml, _ = node("dgx-a100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    constant = nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)  # version=2 by default
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfoById(handle, P1G)
    v1 = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant, version=1)
    assert isinstance(v1, pynvml.c_nvmlGpuInstanceProfileInfo_t)
    assert v1.id == P1G


def test_profile_info_by_id(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfoById(handle, P1G_2M)
    assert (info.id, info.sliceCount, info.multiprocessorCount, info.name) == (
        15,
        1,
        26,
        "MIG 1g.20gb",
    )


def test_possible_placements_fill_a_caller_array_whatever_the_mode(node: Opener) -> None:
    nvml, _ = node("dgx-a100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)  # MIG still disabled
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
    count = ctypes.c_uint(8)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, P3G, placements, ctypes.byref(count))
    assert [(p.start, p.size) for p in placements[: count.value]] == [(0, 4), (4, 4)]


def test_possible_placements_ignore_occupancy(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    create_at(nvml, handle, P1G, 0, 1)
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
    count = ctypes.c_uint(8)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, P1G, placements, ctypes.byref(count))
    assert [p.start for p in placements[: count.value]] == [0, 1, 2, 3, 4, 5, 6]


def test_possible_placements_into_too_small_an_array(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * 4)()
    count = ctypes.c_uint(4)
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            handle, P1G, placements, ctypes.byref(count)
        )


def test_create_needs_mig_mode(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceCreateGpuInstance(handle, P7G)


def test_create_with_placement_reports_it_back(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    gi = create_at(nvml, handle, P3G, 4, 4)
    assert isinstance(gi, pynvml.c_nvmlGpuInstance_t)
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.profileId, info.placement.start, info.placement.size) == (P3G, 4, 4)
    parent = ctypes.cast(info.device, ctypes.c_void_p).value
    assert parent == ctypes.cast(handle, ctypes.c_void_p).value


def test_overlapping_placement_is_insufficient_resources(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    create_at(nvml, handle, P3G, 0, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create_at(nvml, handle, P2G, 2, 2)


@pytest.mark.parametrize(("profile_id", "start", "size"), [(P2G, 6, 2), (P3G, 2, 4), (P3G, 0, 3)])
def test_placement_outside_the_valid_list_is_invalid_argument(
    node: Opener, profile_id: int, start: int, size: int
) -> None:
    nvml, _ = node("dgx-a100")
    handle = enable_mig(nvml, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        create_at(nvml, handle, profile_id, start, size)


def test_placement_passed_by_value_is_rejected(node: Opener) -> None:
    """Without argtypes a bare Structure reaches C by value: the driver sees garbage."""
    nvml, _ = node("dgx-a100")
    handle = enable_mig(nvml, 0)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start=0, size=8)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, P7G, placement)


def test_more_than_the_max_count_is_insufficient_resources(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    for start in (0, 2, 4):
        create_at(nvml, handle, P2G, start, 2)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstance(handle, P2G)


def test_only_one_media_extension_instance_per_gpu(node: Opener) -> None:
    nvml, _ = node("a30-node")
    handle = enable_mig(nvml, 0)
    nvml.nvmlDeviceCreateGpuInstance(handle, 21)  # 1g.6gb+me
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 6) == 0  # 2g.12gb+me
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstance(handle, 6)


def test_all_media_instance_coexists_only_with_no_media_instances(node: Opener) -> None:
    """nvml.h _ALL_ME: a +me.all GI takes every media engine; only -me GIs fit beside it."""
    nvml, _ = node("rtx-pro-6000")
    handle = enable_mig(nvml, 0)
    create_at(nvml, handle, 65, 0, 1)  # 1g.24gb+me.all
    for profile_id in (14, 21, 47):  # 1g.24gb, 1g.24gb+me, 1g.24gb+gfx
        assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, profile_id) == 0
        with pytest.raises(nvml.NVMLError_InsufficientResources):
            create_at(nvml, handle, profile_id, 1, 1)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 67) == 3  # 1g.24gb-me
    create_at(nvml, handle, 67, 1, 1)
    create_at(nvml, handle, 66, 2, 2)  # 2g.48gb-me
    assert [row[1] for row in placements_of(nvml, handle)] == [65, 67, 66]


def test_all_media_instance_needs_a_gpu_without_media_users(node: Opener) -> None:
    nvml, _ = node("rtx-pro-6000")
    handle = enable_mig(nvml, 0)
    create_at(nvml, handle, 67, 0, 1)  # 1g.24gb-me: no media engines, no conflict
    create_at(nvml, handle, 47, 1, 1)  # 1g.24gb+gfx holds its share of the engines
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 64) == 0  # 2g.48gb+me.all
    with pytest.raises(nvml.NVMLError_InsufficientResources):
        create_at(nvml, handle, 64, 2, 2)


def test_remaining_capacity_counts_free_placements_and_max_counts(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    capacity = nvml.nvmlDeviceGetGpuInstanceRemainingCapacity
    assert [capacity(handle, p) for p in (P1G, P2G, P3G, P7G)] == [7, 3, 2, 1]
    create_at(nvml, handle, P3G, 4, 4)
    assert [capacity(handle, p) for p in (P1G, P2G, P3G, P4G, P7G)] == [4, 2, 1, 1, 0]
    create_at(nvml, handle, P1G, 0, 1)
    assert [capacity(handle, p) for p in (P1G, P2G, P3G, P4G, P1G_ME)] == [3, 1, 0, 0, 1]


def test_remaining_capacity_needs_mig_mode(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(nvml.nvmlDeviceGetHandleByIndex(0), P1G)


def _create_in_order(nvml: SimNvml, handle: Any, order: list[int]) -> list[tuple[int, int]]:
    """``nvidia-smi mig -cgi <order>``: (GI id, start) of each instance created."""
    created = []
    for profile_id in order:
        info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceCreateGpuInstance(handle, profile_id))
        created.append((info.id, info.placement.start))
    return created


def test_create_without_placement_fragments_like_the_known_issue(node: Opener) -> None:
    """MIG guide known issue (mig.md §1.1): on A100 ``-cgi 19,19,14,9`` fails.

    The guide prints GI ids 13, 11 and 3 for the three that succeed.
    """
    nvml, _ = node("dgx-a100")
    handle = enable_mig(nvml, 0)
    assert _create_in_order(nvml, handle, [P1G, P1G, P2G]) == [(13, 6), (11, 4), (3, 0)]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstance(handle, P3G)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, P3G) == 0


def test_creating_the_3g_first_avoids_the_known_issue(node: Opener) -> None:
    """The guide's working order ``-cgi 9,19,14,19``: GIs 2, 7, 4, 8 at 4:4, 0:1, 2:2, 1:1."""
    nvml, _ = node("dgx-a100")
    handle = enable_mig(nvml, 0)
    assert _create_in_order(nvml, handle, [P3G, P1G, P2G, P1G]) == [(2, 4), (7, 0), (4, 2), (8, 1)]


def test_the_guides_2_1_1_1_1_1_geometry(node: Opener) -> None:
    """The guide's ``-cgi 14,19,19,19,19,19``: GIs 5, 13, 7, 8, 9, 10."""
    nvml, _ = node("dgx-a100")
    handle = enable_mig(nvml, 0)
    created = _create_in_order(nvml, handle, [P2G, P1G, P1G, P1G, P1G, P1G])
    assert created == [(5, 4), (13, 6), (7, 0), (8, 1), (9, 2), (10, 3)]


def test_seven_1g_without_placement_fill_slot_6_first(node: Opener) -> None:
    nvml, _ = node("dgx-a100")
    handle = enable_mig(nvml, 0)
    # GI ids as nvidia-smi printed them for `-cgi 19` x7 on an A100: 13, 11, 12, 7, 8, 9, 10.
    created = _create_in_order(nvml, handle, [P1G] * 7)
    assert created == [(13, 6), (11, 4), (12, 5), (7, 0), (8, 1), (9, 2), (10, 3)]


def test_gpu_instance_ids_are_reused_after_destroy(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    gi = create_at(nvml, handle, P3G, 0, 4)
    first = nvml.nvmlGpuInstanceGetInfo(gi).id
    nvml.nvmlGpuInstanceDestroy(gi)
    again = create_at(nvml, handle, P3G, 0, 4)
    assert nvml.nvmlGpuInstanceGetInfo(again).id == first


def test_a_destroyed_instance_handle_stays_invalid(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    gi = create_at(nvml, handle, P3G, 0, 4)
    nvml.nvmlGpuInstanceDestroy(gi)
    create_at(nvml, handle, P3G, 0, 4)  # same id, new instance
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpuInstanceGetInfo(gi)


def test_destroying_a_gi_with_a_compute_instance_is_in_use(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    gi = create_at(nvml, handle, P3G, 0, 4)
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, nvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(gi)
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    assert gpu_instances(nvml, handle) == []


def test_destroying_one_gi_leaves_the_others(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    keep = create_at(nvml, handle, P3G, 4, 4)
    nvml.nvmlGpuInstanceDestroy(create_at(nvml, handle, P3G, 0, 4))
    assert [r[2] for r in placements_of(nvml, handle)] == [4]
    assert nvml.nvmlGpuInstanceGetInfo(keep).placement.start == 4


def test_gpu_instance_by_id(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    gi_id = nvml.nvmlGpuInstanceGetInfo(create_at(nvml, handle, P7G, 0, 8)).id
    assert gi_id == 0
    found = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    assert nvml.nvmlGpuInstanceGetInfo(found).profileId == P7G
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetGpuInstanceById(handle, 5)


def test_listing_into_too_small_an_array_is_insufficient_size(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    create_at(nvml, handle, P1G, 0, 1)
    create_at(nvml, handle, P1G, 1, 1)
    array = (pynvml.c_nvmlGpuInstance_t * 1)()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        nvml.nvmlDeviceGetGpuInstances(handle, P1G, array, ctypes.byref(ctypes.c_uint()))
