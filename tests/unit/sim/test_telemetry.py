"""Telemetry getters follow the injected workload, in NVML's units (telemetry.md §4)."""

from __future__ import annotations

import ctypes
import time

import pynvml
import pytest

from agent.errors import InvalidSpec, NotFound

from .conftest import Opener, create_at, enable_mig

MIB = 1 << 20


def test_idle_gpu(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    util = nvml.nvmlDeviceGetUtilizationRates(handle)
    assert isinstance(util, pynvml.c_nvmlUtilization_t)
    assert (util.gpu, util.memory) == (0, 0)
    assert nvml.nvmlDeviceGetPowerUsage(handle) == 70_000  # idle power, mW
    assert nvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert (memory.total, memory.used, memory.free) == (81559 * MIB, 0, 81559 * MIB)


def test_workload_shows_in_utilisation_power_and_pcie(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.set_workload(0, sm_active=0.75, dram_active=0.4, pcie_tx_bytes_per_s=2_048_000)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    util = nvml.nvmlDeviceGetUtilizationRates(handle)
    assert (util.gpu, util.memory) == (75, 40)
    assert nvml.nvmlDeviceGetPowerUsage(handle) > 70_000
    assert nvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 2000
    assert nvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES) == 0
    assert nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1980
    assert nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) > 32
    control.clear_workload(0)
    assert nvml.nvmlDeviceGetUtilizationRates(handle).gpu == 0


def test_energy_integrates_power_over_elapsed_time(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.set_workload(0, sm_active=1.0, tensor_active=1.0, dram_active=1.0)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    watts = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
    assert watts == 700.0
    start, t0 = nvml.nvmlDeviceGetTotalEnergyConsumption(handle), time.monotonic()
    time.sleep(0.05)
    end, t1 = nvml.nvmlDeviceGetTotalEnergyConsumption(handle), time.monotonic()
    assert end - start == pytest.approx(watts * (t1 - t0) * 1000, rel=0.1)  # mJ


def test_processes_report_bytes_and_no_instance_ids_without_mig(node: Opener) -> None:
    nvml, control = node("dgx-a100")
    control.start_process(4242, 1, used_memory_mib=2048)
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (proc.pid, proc.usedGpuMemory) == (4242, 2048 * MIB)
    assert (proc.gpuInstanceId, proc.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)[0].pid == 4242
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(handle) == []
    assert nvml.nvmlDeviceGetMemoryInfo(handle).used == 2048 * MIB
    assert nvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used == 2048 * MIB


def test_process_cgroup_is_written_under_the_state_dir(node: Opener) -> None:
    _, control = node("dgx-h100")
    cgroup = "0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope"
    control.start_process(31337, 0, used_memory_mib=1, cgroup=cgroup, name="trainer")
    assert (control.proc_root / "31337" / "cgroup").read_text() == cgroup + "\n"
    assert (control.proc_root / "31337" / "comm").read_text() == "trainer\n"
    control.stop_process(31337)
    assert not (control.proc_root / "31337").exists()


def test_process_memory_must_fit(node: Opener) -> None:
    _, control = node("dgx-a100")
    with pytest.raises(InvalidSpec, match="used_memory_mib"):
        control.start_process(1, 0, used_memory_mib=50_000)


def test_processes_on_a_mig_gpu_need_an_instance(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    enable_mig(nvml, 0)
    with pytest.raises(InvalidSpec, match="gpu_instance"):
        control.start_process(1, 0, used_memory_mib=1)
    with pytest.raises(NotFound):
        control.start_process(1, 0, gpu_instance=3, used_memory_mib=1)


def test_mig_gpu_has_no_utilisation_and_aggregates_instances(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    gi = create_at(nvml, handle, 9, 4, 4)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, 2)
    control.set_workload(0, gpu_instance=nvml.nvmlGpuInstanceGetInfo(gi).id, sm_active=0.7)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(handle)
    assert nvml.nvmlDeviceGetPowerUsage(handle) > 70_000  # the GI's work heats the board


def test_ratios_on_a_mig_gpu_must_be_set_per_instance(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    enable_mig(nvml, 0)
    with pytest.raises(InvalidSpec, match="per gpu_instance"):
        control.set_workload(0, sm_active=0.5)
    control.set_workload(0, pcie_rx_bytes_per_s=1e9)  # traffic stays a GPU-level property


@pytest.mark.parametrize(("field", "value"), [("sm_active", 1.5), ("dram_active", -0.1)])
def test_workload_ratios_are_validated(node: Opener, field: str, value: float) -> None:
    _, control = node("dgx-h100")
    with pytest.raises(InvalidSpec) as error:
        control.set_workload(0, **{field: value})
    assert [v.field for v in error.value.violations] == [field]


def test_gpu_wide_getters_are_not_supported_on_a_mig_device(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    nvml.nvmlGpuInstanceCreateComputeInstance(create_at(nvml, handle, 0, 0, 8), 4)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(mig)
    assert nvml.nvmlDeviceGetBAR1MemoryInfo(mig).bar1Total == (128 << 30) - MIB


def test_static_device_facts(node: Opener) -> None:
    nvml, _ = node("dgx-a100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetArchitecture(handle) == pynvml.NVML_DEVICE_ARCH_AMPERE
    assert nvml.nvmlDeviceGetCudaComputeCapability(handle) == (8, 0)
    assert nvml.nvmlDeviceGetPowerManagementLimit(handle) == 400_000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 400_000
    assert nvml.nvmlDeviceGetPersistenceMode(handle) == pynvml.NVML_FEATURE_ENABLED
    assert nvml.nvmlDeviceGetPerformanceState(handle) == 0
    assert nvml.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert nvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1410
    assert (
        nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
        nvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
    ) == (4, 16)
    assert nvml.nvmlDeviceGetBAR1MemoryInfo(handle).bar1Total == 64 << 30
    assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
    assert nvml.nvmlDeviceGetPcieReplayCounter(handle) == 0
    assert nvml.nvmlDeviceGetEncoderUtilization(handle)[0] == 0
    assert nvml.nvmlDeviceGetNvLinkState(handle, 11) == pynvml.NVML_FEATURE_ENABLED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(handle, 12)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetFanSpeed(handle)
    assert nvml.nvmlDeviceGetSerial(handle).isdigit()


def test_direct_symbol_calls_like_nvitop_makes(node: Opener) -> None:
    """nvitop calls C symbols through pynvml._nvmlGetFunctionPointer with its own structs."""
    nvml, control = node("dgx-h100")
    control.start_process(7, 0, used_memory_mib=64)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(0)
    assert fn(handle, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 1
    infos = (pynvml.c_nvmlProcessInfo_v3_t * 2)()
    count.value = 2
    assert fn(handle, ctypes.byref(count), infos) == pynvml.NVML_SUCCESS
    assert (count.value, infos[0].pid, infos[0].usedGpuMemory) == (1, 7, 64 * MIB)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml._nvmlGetFunctionPointer("nvmlDeviceGetConfComputeMemSizeInfo")
