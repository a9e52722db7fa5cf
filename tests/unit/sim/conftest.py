"""Fixtures for the simulated driver: a node per test, opened the way the agent opens it."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.gpu.sim import SimControl, SimNvml, open_simulator

Opener = Callable[[str], tuple[SimNvml, SimControl]]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Opener]:
    """``node(preset)`` -> (initialised pynvml-like module, control) on a fresh state dir."""
    opened: list[SimNvml] = []

    def open_node(preset: str) -> tuple[SimNvml, SimControl]:
        nvml = open_simulator(tmp_path, preset)
        nvml.nvmlInit()
        opened.append(nvml)
        return nvml, SimControl(tmp_path)

    yield open_node
    for nvml in opened:
        nvml.nvmlShutdown()


def gpu_instances(nvml: SimNvml, handle: Any) -> list[Any]:
    """Every GI on a GPU, the way mig-parted lists them: per profile id, caller-sized arrays."""
    found = []
    for constant in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
        except nvml.NVMLError_NotSupported:
            continue
        array = (nvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint()
        nvml.nvmlDeviceGetGpuInstances(handle, info.id, array, ctypes.byref(count))
        found.extend(array[i] for i in range(count.value))
    return found


def placements_of(nvml: SimNvml, handle: Any) -> list[tuple[int, int, int, int]]:
    """(GI id, profile id, start, size) of every GI, sorted by start."""
    infos = [nvml.nvmlGpuInstanceGetInfo(gi) for gi in gpu_instances(nvml, handle)]
    rows = [(i.id, i.profileId, i.placement.start, i.placement.size) for i in infos]
    return sorted(rows, key=lambda r: r[2])


def enable_mig(nvml: SimNvml, index: int) -> Any:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    assert nvml.nvmlDeviceSetMigMode(handle, nvml.NVML_DEVICE_MIG_ENABLE) == nvml.NVML_SUCCESS
    return handle


def create_at(nvml: SimNvml, handle: Any, profile_id: int, start: int, size: int) -> Any:
    """Create a GI with an explicit placement, passed by reference as pynvml requires."""
    placement = nvml.c_nvmlGpuInstancePlacement_t(start=start, size=size)
    return nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        handle, profile_id, ctypes.byref(placement)
    )
