"""GPM: two samples of one entity give back the workload held between them (telemetry.md §3)."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from agent.gpu.sim import SimNvml

from .conftest import Opener, create_at, enable_mig

MIB = float(1 << 20)
SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL
SM_OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
TENSOR = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
DRAM = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
FP16 = pynvml.NVML_GPM_METRIC_FP16_UTIL
PCIE_TX = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
PCIE_RX = pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
NVLINK_TX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
NVLINK_L0_TX = pynvml.NVML_GPM_METRIC_NVLINK_L0_TX_PER_SEC


def metrics(nvml: SimNvml, first: Any, second: Any, ids: list[int]) -> dict[int, tuple[int, float]]:
    """What DCGM does (telemetry.md §3.4): version 1, numMetrics, two samples, metric ids."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for i, metric_id in enumerate(ids):
        request.metrics[i].metricId = metric_id
    result = nvml.nvmlGpmMetricsGet(request)
    return {m.metricId: (m.nvmlReturn, m.value) for m in result.metrics[: len(ids)]}


def two_samples(nvml: SimNvml, take: Any) -> tuple[Any, Any]:
    first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    take(first)
    take(second)
    return first, second


def test_ampere_has_no_gpm(node: Opener) -> None:
    nvml, _ = node("dgx-a100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    support = nvml.nvmlGpmQueryDeviceSupport(handle)
    assert isinstance(support, pynvml.c_nvmlGpmSupport_t)
    assert support.isSupportedDevice == 0
    sample = nvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlGpmSampleGet(handle, sample)
    nvml.nvmlGpmSampleFree(sample)


def test_hopper_returns_a_constant_workload_exactly(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    control.set_workload(
        0,
        sm_active=0.3,
        sm_occupancy=0.25,
        tensor_active=0.6,
        dram_active=0.45,
        fp16_active=0.1,
        pcie_tx_bytes_per_s=1e9,
        pcie_rx_bytes_per_s=2.5e8,
        nvlink_tx_bytes_per_s=9e9,
    )
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
    first, second = two_samples(nvml, lambda s: nvml.nvmlGpmSampleGet(handle, s))
    ids = [SM_UTIL, SM_OCCUPANCY, TENSOR, DRAM, FP16, PCIE_TX, PCIE_RX, NVLINK_TX, NVLINK_L0_TX]
    got = metrics(nvml, first, second, ids)
    assert all(code == pynvml.NVML_SUCCESS for code, _ in got.values())
    values = {k: v for k, (_, v) in got.items()}
    assert values[SM_UTIL] / 100 == 0.3
    assert values[SM_OCCUPANCY] / 100 == 0.25
    assert values[TENSOR] / 100 == 0.6
    assert values[DRAM] / 100 == 0.45
    assert values[FP16] / 100 == 0.1
    assert values[PCIE_TX] * MIB == 1e9
    assert values[PCIE_RX] * MIB == 2.5e8
    assert values[NVLINK_TX] * MIB == 9e9
    assert values[NVLINK_L0_TX] * MIB * 18 == pytest.approx(9e9)


def test_rates_average_over_a_workload_change(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    first = nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(handle, first)
    control.set_workload(0, sm_active=1.0)
    second = nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(handle, second)
    _, value = metrics(nvml, first, second, [SM_UTIL])[SM_UTIL]
    assert 0.0 < value < 100.0


def test_per_gpu_instance_values_and_gpu_aggregate(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    big = create_at(nvml, handle, 9, 4, 4)  # 3g: 3 of 7 compute slices, 4 of 8 memory slices
    small = create_at(nvml, handle, 19, 0, 1)  # 1g
    for gi, ci_profile in ((big, 2), (small, 0)):
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
    big_id, small_id = (nvml.nvmlGpuInstanceGetInfo(g).id for g in (big, small))
    control.set_workload(0, gpu_instance=big_id, sm_active=0.7, dram_active=0.5)
    control.set_workload(0, gpu_instance=small_id, sm_active=0.35)

    per_gi = two_samples(nvml, lambda s: nvml.nvmlGpmMigSampleGet(handle, big_id, s))
    got = metrics(nvml, *per_gi, [SM_UTIL, DRAM, PCIE_TX])
    assert got[SM_UTIL] == (pynvml.NVML_SUCCESS, 70.0)
    assert got[DRAM] == (pynvml.NVML_SUCCESS, 50.0)
    assert got[PCIE_TX][0] == pynvml.NVML_ERROR_NOT_SUPPORTED  # GPU-level only

    whole = two_samples(nvml, lambda s: nvml.nvmlGpmSampleGet(handle, s))
    got = metrics(nvml, *whole, [SM_UTIL, DRAM])
    assert got[SM_UTIL][1] == pytest.approx(100 * (0.7 * 3 / 7 + 0.35 * 1 / 7))
    assert got[DRAM][1] == pytest.approx(100 * 0.5 * 4 / 8)

    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    per_device = two_samples(nvml, lambda s: nvml.nvmlGpmSampleGet(mig, s))
    assert metrics(nvml, *per_device, [SM_UTIL])[SM_UTIL] == (pynvml.NVML_SUCCESS, 70.0)


def test_mig_sample_of_a_missing_instance(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = enable_mig(nvml, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlGpmMigSampleGet(handle, 3, nvml.nvmlGpmSampleAlloc())


def test_samples_of_different_entities_do_not_compare(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(nvml.nvmlDeviceGetHandleByIndex(0), first)
    nvml.nvmlGpmSampleGet(nvml.nvmlDeviceGetHandleByIndex(1), second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        metrics(nvml, first, second, [SM_UTIL])


def test_unmodelled_and_unknown_metrics_fail_per_metric(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    first, second = two_samples(nvml, lambda s: nvml.nvmlGpmSampleGet(handle, s))
    got = metrics(
        nvml,
        first,
        second,
        [SM_UTIL, pynvml.NVML_GPM_METRIC_C2C_TOTAL_TX_PER_SEC, pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL],
    )
    assert got[SM_UTIL] == (pynvml.NVML_SUCCESS, 0.0)
    assert got[pynvml.NVML_GPM_METRIC_C2C_TOTAL_TX_PER_SEC][0] == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert got[pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL] == (pynvml.NVML_SUCCESS, 0.0)


def test_wrong_struct_version_is_a_version_mismatch(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    first, second = two_samples(nvml, lambda s: nvml.nvmlGpmSampleGet(handle, s))
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = 2
    request.sample1, request.sample2 = first, second
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlGpmMetricsGet(request)
