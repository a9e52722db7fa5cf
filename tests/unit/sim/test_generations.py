"""Driver generations: the installed version decides which NVML symbols exist, and a missing one
fails inside pynvml as NVMLError_FunctionNotFound (agent/gpu/sim/generations.py)."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from agent.errors import InvalidSpec
from agent.gpu.sim import SimControl, SimNvml, generations, open_simulator

from .conftest import Opener, enable_mig


def _on_driver(tmp_path: Path, preset: str, version: str) -> SimNvml:
    open_simulator(tmp_path, preset)
    SimControl(tmp_path).install_driver(version)
    nvml = open_simulator(tmp_path)  # a fresh process's view: symbols resolve after the install
    nvml.nvmlInit()
    return nvml


@pytest.mark.parametrize(
    "version, has_v3",
    [("470.256.02", False), ("510.47.03", True), ("535.86.10", True), ("535.98", False),
     ("535.104.05", True), ("550.90.07", True)],
)  # fmt: skip
def test_process_list_v3_follows_nvitops_history(version: str, has_v3: bool) -> None:
    assert generations.has_symbol("nvmlDeviceGetComputeRunningProcesses_v3", version) is has_v3
    assert generations.has_symbol("nvmlDeviceGetComputeRunningProcesses_v2", version)


def test_a_missing_symbol_is_function_not_found_and_the_older_call_works(tmp_path: Path) -> None:
    nvml = _on_driver(tmp_path, "dgx-a100", "470.256.02")
    SimControl(tmp_path).start_process(4242, 0, used_memory_mib=64)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetComputeRunningProcesses_v3(h)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses_v2(h)] == [4242]
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert nvml.nvmlDeviceGetMemoryInfo(h).total == 40960 * 2**20
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == pynvml.nvmlClocksEventReasonGpuIdle
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlGpmQueryDeviceSupport(h)
    assert nvml.nvmlSystemGetDriverVersion() == "470.256.02"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 11040
    nvml.nvmlShutdown()


def test_a_current_driver_has_every_symbol(node: Opener) -> None:
    nvml, _ = node("dgx-b200")  # 570.133.20
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v3(h) == []
    assert nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1  # Blackwell: GPM
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) == pynvml.nvmlClocksEventReasonGpuIdle


def test_installing_a_driver_reboots_the_node(node: Opener, tmp_path: Path) -> None:
    nvml, control = node("dgx-a100")
    h = enable_mig(nvml, 0)
    nvml.nvmlDeviceCreateGpuInstance(h, 9)
    control.install_driver("550.90.07")
    state = control.describe()
    assert state["driver_version"] == "550.90.07" and state["cuda_driver_version"] == 12040
    gpu0 = state["gpus"][0]
    assert gpu0["mig"]["current"] and not gpu0["gpu_instances"]  # the mode persists, GIs do not


@pytest.mark.parametrize(
    "preset, version, why",
    [
        ("dgx-h100", "470.256.02", "H100-SXM5-80GB needs 525.85.12"),
        ("dgx-a100", "460.91.03", "the simulator models R470 and later"),
        ("dgx-a100", "latest", r"BRANCH\.MINOR\[\.PATCH\]"),
        ("dgx-a100", "535.98; rm -rf /", r"BRANCH\.MINOR\[\.PATCH\]"),
    ],
)
def test_an_unusable_driver_is_refused_naming_the_field(
    tmp_path: Path, preset: str, version: str, why: str
) -> None:
    open_simulator(tmp_path, preset)
    control = SimControl(tmp_path)
    before = control.describe()
    with pytest.raises(InvalidSpec, match=why) as err:
        control.install_driver(version)
    assert [v.field for v in err.value.violations] == ["driver_version"]
    assert control.describe() == before
