"""Injected faults, lost GPUs and XID events."""

from __future__ import annotations

import threading
import time
from typing import Any

import pynvml
import pytest

from agent.errors import InvalidSpec, NotFound
from agent.gpu.sim import SimNvml

from .conftest import Opener, create_at, enable_mig


def test_the_nth_call_fails_with_the_injected_error(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    control.inject_fault("nvmlDeviceGetMemoryInfo", "InUse", nth=2)
    nvml.nvmlDeviceGetMemoryInfo(handle)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlDeviceGetMemoryInfo(handle)
    nvml.nvmlDeviceGetMemoryInfo(handle)  # one failure, then the fault is spent
    assert control.describe()["faults"] == []


def test_an_nvml_error_reads_the_drivers_text(node: Opener) -> None:
    """As str() of pynvml's error reads nvmlErrorString on a GPU: "In use by another client"
    and "Insufficient Resources", never "NVML Error with code 19"."""
    nvml, control = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    control.inject_fault("nvmlDeviceGetMemoryInfo", "InUse")
    with pytest.raises(pynvml.NVMLError_InUse) as info:
        nvml.nvmlDeviceGetMemoryInfo(handle)
    assert str(info.value) == "In use by another client"
    assert nvml.nvmlErrorString(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES) == (
        "Insufficient Resources"
    )
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)) == (
        "Insufficient Resources"
    )


def test_count_fails_consecutive_calls(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.inject_fault("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN, count=2)
    for _ in range(2):
        with pytest.raises(pynvml.NVMLError_Unknown):
            nvml.nvmlDeviceGetCount()
    assert nvml.nvmlDeviceGetCount() == 8


def test_a_fault_can_target_one_gpu(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.inject_fault("nvmlDeviceGetPowerUsage", "NVML_ERROR_GPU_IS_LOST", gpu=3)
    nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(3))


def test_a_failed_mutation_changes_nothing(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    control.inject_fault("nvmlDeviceCreateGpuInstanceWithPlacement", "InsufficientResources")
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create_at(nvml, handle, 0, 0, 8)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 0) == 1


@pytest.mark.parametrize(
    ("function", "error", "field"),
    [
        ("nvmlDeviceGetNothing", "InUse", "function"),
        ("NVMLError", "InUse", "function"),
        ("nvmlDeviceGetCount", "Sleepy", "error"),
        ("nvmlDeviceGetCount", 12345, "error"),
    ],
)
def test_fault_names_are_validated(
    node: Opener, function: str, error: str | int, field: str
) -> None:
    _, control = node("dgx-h100")
    with pytest.raises(InvalidSpec) as raised:
        control.inject_fault(function, error)
    assert [v.field for v in raised.value.violations] == [field]


@pytest.mark.parametrize(
    ("function", "error", "meant"),
    [
        (
            "nvmlDeviceCreateGpuInstanceWithPlacment",
            "InUse",
            "nvmlDeviceCreateGpuInstanceWithPlacement",
        ),
        ("nvmldevicegetcount", "InUse", "nvmlDeviceGetCount"),
        ("CreateGpuInstanceWithPlacement", "InUse", "nvmlDeviceCreateGpuInstanceWithPlacement"),
        ("nvmlDeviceGetCount", "InsufficentResources", "INSUFFICIENT_RESOURCES"),
        ("nvmlDeviceGetCount", "NVML_ERROR_IN_USED", "IN_USE"),
    ],
)
def test_a_misspelt_name_is_refused_with_the_names_it_is_close_to(
    node: Opener, function: str, error: str, meant: str
) -> None:
    """`sim fault` with a typo in NVML's C name (or the error's) said only "expected e.g.
    'nvmlGpuInstanceDestroy'", a fixed example, so the user had to search pynvml for the
    spelling; the refusal now lists the close matches, and arms nothing."""
    _, control = node("dgx-h100")
    with pytest.raises(InvalidSpec) as raised:
        control.inject_fault(function, error)
    assert "did you mean" in str(raised.value)
    assert meant in str(raised.value).split("did you mean", 1)[1]
    assert control.describe()["faults"] == []


def test_a_lost_gpu_fails_every_call_on_it_and_its_mig_devices(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = enable_mig(nvml, 1)
    nvml.nvmlGpuInstanceCreateComputeInstance(create_at(nvml, handle, 0, 0, 8), 4)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    control.mark_lost(1)
    for call in (
        lambda: nvml.nvmlDeviceGetHandleByIndex(1),
        lambda: nvml.nvmlDeviceGetMemoryInfo(handle),
        lambda: nvml.nvmlDeviceGetUUID(mig),
        lambda: nvml.nvmlDeviceSetMigMode(handle, 0),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert nvml.nvmlDeviceGetCount() == 8
    nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0))
    control.reboot()
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByIndex(1)) == 1


def _xid_set(nvml: SimNvml, gpu: int) -> Any:
    event_set = nvml.nvmlEventSetCreate()
    handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
    nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    return event_set


def test_xid_events_reach_a_waiting_set(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.raise_xid(2, 48)  # before registration: never seen
    event_set = _xid_set(nvml, 2)
    control.raise_xid(2, 79)
    control.raise_xid(5, 13)  # another GPU, not registered
    event = nvml.nvmlEventSetWait(event_set, 1000)
    assert isinstance(event, pynvml.c_nvmlEventData_t)
    assert (event.eventType, event.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert nvml.nvmlDeviceGetIndex(event.device) == 2
    assert (event.gpuInstanceId, event.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(event_set, 20)
    nvml.nvmlEventSetFree(event_set)


def test_wait_blocks_until_an_xid_arrives(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    event_set = _xid_set(nvml, 0)
    timer = threading.Timer(0.05, control.raise_xid, args=(0, 31))
    started = time.monotonic()
    timer.start()
    event = nvml.nvmlEventSetWait_v2(event_set, 2000)
    assert event.eventData == 31
    assert 0.03 < time.monotonic() - started < 1.0
    timer.join()


def test_losing_a_gpu_raises_xid_79(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    event_set = _xid_set(nvml, 4)
    control.mark_lost(4)
    assert nvml.nvmlEventSetWait(event_set, 1000).eventData == 79


def test_a_fault_on_a_gpu_the_node_lacks_is_not_found_as_in_every_sim_command(
    node: Opener,
) -> None:
    """`sim fault F E --gpu 9` on an 8-GPU node exited 2 (a bad field) where `sim lost 9`,
    `sim xid 9 79`, `sim reset 9` and the rest exit 3 (NotFound) with "GPU 9 does not
    exist": one GPU the node lacks, one exit code. Nothing is armed."""
    _, control = node("dgx-h100")
    with pytest.raises(NotFound, match=r"GPU 9 does not exist; the node has GPUs 0\.\.7"):
        control.inject_fault("nvmlDeviceGetCount", "InUse", gpu=9)
    with pytest.raises(NotFound):
        control.mark_lost(9)
    assert control.describe()["faults"] == []
