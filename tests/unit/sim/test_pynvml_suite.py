"""A representative set of pynvml's own test cases (test_nvml.py, test_smi.py of
gpuopenanalytics/pynvml), rewritten here, run against the simulator as they run on a GPU node;
then the answers checked against the preset they come from (serials, NVLink topology, NUMA)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.gpu.sim import SimNvml, open_simulator


@pytest.fixture
def nvml(tmp_path: Path) -> Iterator[SimNvml]:
    module = open_simulator(tmp_path, "dgx-h100")
    module.nvmlInit()
    yield module
    module.nvmlShutdown()


def _handles(nvml: SimNvml) -> list[Any]:
    count = nvml.nvmlDeviceGetCount()
    assert count > 0
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]


def _bits(words: Any) -> list[int]:
    return [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]


# -- pynvml's cases ---------------------------------------------------------------------------


def test_system_versions_and_process_name(nvml: SimNvml) -> None:
    assert nvml.nvmlSystemGetNVMLVersion() == "12.550.90.07"
    assert nvml.nvmlSystemGetDriverVersion() == "550.90.07"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert nvml.nvmlSystemGetProcessName(os.getpid())  # this test's own process


def test_handles_by_serial_uuid_and_pci_bus_id(nvml: SimNvml) -> None:
    handles = _handles(nvml)
    for i, h in enumerate(handles):
        for other in (
            nvml.nvmlDeviceGetHandleBySerial(nvml.nvmlDeviceGetSerial(h)),
            nvml.nvmlDeviceGetHandleByUUID(nvml.nvmlDeviceGetUUID(h)),
            nvml.nvmlDeviceGetHandleByPciBusId(nvml.nvmlDeviceGetPciInfo(h).busId),
        ):
            assert nvml.nvmlDeviceGetIndex(other) == i
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleBySerial("0000000000000")


@pytest.mark.parametrize("scope", ["NODE", "SOCKET"])
def test_memory_and_cpu_affinity(nvml: SimNvml, scope: str) -> None:
    value = getattr(nvml, f"NVML_AFFINITY_SCOPE_{scope}")
    for h in _handles(nvml):
        assert _bits(nvml.nvmlDeviceGetMemoryAffinity(h, 1024, value))
        assert _bits(nvml.nvmlDeviceGetCpuAffinityWithinScope(h, 1024, value))


#: nvml.h's nvmlGpuP2PCapsIndex_t; pynvml's NVML_P2P_CAPS_INDEX_READ is the 1-tuple ``(0,)`` (a
#: stray comma), which neither ctypes nor the simulator takes, so its READ case passes nvml.h's 0.
_P2P_INDEX = {"READ": 0, "WRITE": 1, "NVLINK": 2, "ATOMICS": 3, "PROP": 4, "UNKNOWN": 5}


@pytest.mark.parametrize("index", list(_P2P_INDEX))
def test_p2p_status(nvml: SimNvml, index: str) -> None:
    handles = _handles(nvml)
    for a in handles:
        for b in handles:
            if a is not b:
                status = nvml.nvmlDeviceGetP2PStatus(a, b, _P2P_INDEX[index])
                assert nvml.NVML_P2P_STATUS_OK <= status <= nvml.NVML_P2P_STATUS_UNKNOWN


def test_power_energy_memory_utilisation_and_pcie(nvml: SimNvml) -> None:
    for h in _handles(nvml):
        assert nvml.nvmlDeviceGetPowerUsage(h) >= 0
        first = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
        deadline = time.monotonic() + 0.15
        while nvml.nvmlDeviceGetTotalEnergyConsumption(h) <= first:
            assert time.monotonic() < deadline, "energy did not increase across 150 ms"
            time.sleep(0.015)
        memory = nvml.nvmlDeviceGetMemoryInfo(h)
        assert memory.used <= memory.total and memory.free <= memory.total
        rates = nvml.nvmlDeviceGetUtilizationRates(h)
        assert rates.gpu >= 0 and rates.memory >= 0
        for counter in (nvml.NVML_PCIE_UTIL_TX_BYTES, nvml.NVML_PCIE_UTIL_RX_BYTES):
            assert nvml.nvmlDeviceGetPcieThroughput(h, counter) >= 0


@pytest.mark.parametrize(
    "cap",
    ["P2P_SUPPORTED", "SYSMEM_ACCESS", "P2P_ATOMICS", "SYSMEM_ATOMICS", "SLI_BRIDGE", "VALID"],
)
def test_nvlink_capability(nvml: SimNvml, cap: str) -> None:
    for h in _handles(nvml):
        # pynvml's case loops to NVML_NVLINK_MAX_LINKS, 36 since Blackwell; H100 SXM has 18.
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetNvLinkCapability(h, 18, getattr(nvml, f"NVML_NVLINK_CAP_{cap}"))
        for link in range(18):
            assert (
                nvml.nvmlDeviceGetNvLinkCapability(h, link, getattr(nvml, f"NVML_NVLINK_CAP_{cap}"))
                >= 0
            )


def test_smi_style_power_state_and_temperature_thresholds(nvml: SimNvml) -> None:
    """What test_smi's nvidia-smi queries read: performance state and the temperature limits."""
    h = _handles(nvml)[0]
    assert nvml.nvmlDeviceGetPowerState(h) == nvml.nvmlDeviceGetPerformanceState(h)
    shutdown = nvml.nvmlDeviceGetTemperatureThreshold(h, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    slowdown = nvml.nvmlDeviceGetTemperatureThreshold(h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    gpu_max = nvml.nvmlDeviceGetTemperatureThreshold(h, nvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)
    assert (
        nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU) < gpu_max < slowdown < shutdown
    )
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetTemperatureThreshold(h, nvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN)


# -- consistent with the preset ----------------------------------------------------------------


def test_p2p_follows_the_presets_nvlink_topology(tmp_path: Path) -> None:
    for preset, expected in (("h100-nvl", "OK"), ("a30-node", "NOT_SUPPORTED")):
        nvml = open_simulator(tmp_path / preset, preset)
        nvml.nvmlInit()
        a, b = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
        status = nvml.nvmlDeviceGetP2PStatus(a, b, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
        assert status == getattr(nvml, f"NVML_P2P_STATUS_{expected}"), preset
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetP2PStatus(a, a, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
        nvml.nvmlShutdown()


def test_dgx_a100_affinity_is_its_numa_layout(tmp_path: Path) -> None:
    """GPU 0 of a DGX A100 sits on NUMA node 3: cores 48-63 and their threads 176-191."""
    nvml = open_simulator(tmp_path, "dgx-a100")
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    node, socket = nvml.NVML_AFFINITY_SCOPE_NODE, nvml.NVML_AFFINITY_SCOPE_SOCKET
    assert _bits(nvml.nvmlDeviceGetCpuAffinityWithinScope(h, 4, node)) == [
        *range(48, 64),
        *range(176, 192),
    ]
    assert _bits(nvml.nvmlDeviceGetCpuAffinity(h, 4)) == [*range(48, 64), *range(176, 192)]
    assert _bits(nvml.nvmlDeviceGetMemoryAffinity(h, 1, node)) == [3]
    assert _bits(nvml.nvmlDeviceGetMemoryAffinity(h, 1, socket)) == [0, 1, 2, 3]
    nvml.nvmlShutdown()
