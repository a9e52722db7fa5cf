"""MIG mode changes: the driver resets the GPU itself unless something holds it (ARCHITECTURE.md).

``nvmlDeviceSetMigMode`` returns the activation status; ``nvmlDeviceGetMigMode`` gives
[current, pending].
"""

from __future__ import annotations

import pynvml
import pytest

from agent.errors import Busy, DeviceLost

from .conftest import Opener, create_at, enable_mig, gpu_instances

ENABLE, DISABLE = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "a30-node"])
def test_a_free_gpu_switches_at_once(node: Opener, preset: str) -> None:
    nvml, _ = node(preset)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    assert nvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert nvml.nvmlDeviceSetMigMode(handle, DISABLE) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100"])
def test_a_holder_daemon_leaves_the_mode_pending_until_a_reset(node: Opener, preset: str) -> None:
    nvml, control = node(preset)
    control.add_holder(0, "nvidia-persistenced")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_ERROR_IN_USE
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 1]
    with pytest.raises(Busy) as busy:
        control.reset_gpu(0)
    assert busy.value.blockers == ("holder nvidia-persistenced",)
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 1]
    control.remove_holder(0, "nvidia-persistenced")
    control.reset_gpu(0)
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]


def test_a_running_process_leaves_the_mode_pending(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.start_process(1234, 1, used_memory_mib=100)
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_ERROR_IN_USE
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 1]
    with pytest.raises(Busy, match="pid 1234"):
        control.reset_gpu(1)
    control.stop_process(1234)
    assert nvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_SUCCESS  # retry once idle
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]


def test_holders_block_only_their_own_gpu(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.add_holder(0, "dcgm")
    assert nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByIndex(1), ENABLE) == 0


def test_passthrough_vm_ampere_needs_a_reboot(node: Opener) -> None:
    nvml, control = node("dgx-a100")
    control.set_passthrough_vm(True)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 1]
    control.reset_gpu(0)  # a GPU reset is not enough inside the VM
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 1]
    control.reboot()
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]


def test_passthrough_vm_hopper_switches_at_once(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.set_passthrough_vm(True)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]


def test_passthrough_vm_hopper_still_waits_for_its_holders(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.set_passthrough_vm(True)
    control.add_holder(0, "dcgm")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_ERROR_IN_USE


def test_disabling_with_gpu_instances_is_in_use(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    gi = create_at(nvml, handle, 0, 0, 8)
    assert nvml.nvmlDeviceSetMigMode(handle, DISABLE) == pynvml.NVML_ERROR_IN_USE
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 0]
    nvml.nvmlGpuInstanceDestroy(gi)
    assert nvml.nvmlDeviceSetMigMode(handle, DISABLE) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]


def test_setting_the_current_mode_clears_a_pending_change(node: Opener) -> None:
    nvml, control = node("dgx-a100")
    control.add_holder(0, "dcgm")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(handle, ENABLE)
    assert nvml.nvmlDeviceSetMigMode(handle, DISABLE) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]


def test_bad_mode_is_invalid_argument(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByIndex(0), 2)


def test_reboot_loses_instances_and_processes_but_keeps_the_mode(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    gi = create_at(nvml, handle, 9, 0, 4)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, 2)
    control.start_process(99, 0, gpu_instance=nvml.nvmlGpuInstanceGetInfo(gi).id, used_memory_mib=1)
    control.add_holder(0, "dcgm")
    control.reboot()
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert gpu_instances(nvml, handle) == []
    assert nvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    assert control.describe()["gpus"][0]["holders"] == []


def test_reset_destroys_instances_but_keeps_the_mode(node: Opener) -> None:
    nvml, control = node("dgx-a100")
    handle = enable_mig(nvml, 3)
    create_at(nvml, handle, 19, 0, 1)
    control.reset_gpu(3)
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert gpu_instances(nvml, handle) == []


def test_a_lost_gpu_cannot_be_reset(node: Opener) -> None:
    _, control = node("dgx-h100")
    control.mark_lost(2)
    with pytest.raises(DeviceLost):
        control.reset_gpu(2)
