"""nvmlDeviceGetFieldValues as pynvml drives it: caller-allocated c_nvmlFieldValue_t, per-field
nvmlReturn (agent/gpu/sim/sym_fields.py; nvml.h)."""

from __future__ import annotations

import ctypes
import time

import pynvml
import pytest

from .conftest import Opener, enable_mig

FI_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP
FI_LINKS = pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT
FI_TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
FI_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
ERRORS = (
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
)


def test_each_field_gets_its_own_return_code_value_type_and_timestamp(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    before = time.time_ns() // 1000
    temp, links, tx, bad_link, unmodelled, invalid = nvml.nvmlDeviceGetFieldValues(
        h, [FI_TEMP, FI_LINKS, (FI_TX, 17), (FI_TX, 18), pynvml.NVML_FI_DEV_ECC_CURRENT, 99999]
    )
    assert (temp.nvmlReturn, temp.valueType) == (0, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
    assert temp.value.uiVal > nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert (links.nvmlReturn, links.value.uiVal) == (0, 18)
    assert (tx.nvmlReturn, tx.valueType) == (0, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
    assert tx.scopeId == 17 and tx.timestamp >= before and tx.latencyUsec == 0
    assert bad_link.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT  # link 18 of 0..17
    assert unmodelled.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert invalid.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_nvlink_data_counters_are_cumulative_kib_shared_over_the_links(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    control.set_workload(0, nvlink_tx_bytes_per_s=18 * 2**30, nvlink_rx_bytes_per_s=9 * 2**30)
    ids = [(FI_TX, 0), (FI_RX, 0)]
    first = [(v.value.ullVal, v.timestamp) for v in nvml.nvmlDeviceGetFieldValues(h, ids)]
    time.sleep(0.05)
    second = [(v.value.ullVal, v.timestamp) for v in nvml.nvmlDeviceGetFieldValues(h, ids)]
    (tx0, t0), (rx0, _) = first
    (tx1, t1), (rx1, _) = second
    tx_kib_s = (tx1 - tx0) / ((t1 - t0) / 1e6)
    assert tx_kib_s == pytest.approx(2**20, rel=0.2)  # 1 GiB/s per link = 2**20 KiB/s
    assert (rx1 - rx0) == pytest.approx((tx1 - tx0) / 2, rel=0.01)


def test_nvlink_error_totals_are_zero_on_a_healthy_board(node: Opener) -> None:
    nvml, _ = node("dgx-a100")
    values = nvml.nvmlDeviceGetFieldValues(nvml.nvmlDeviceGetHandleByIndex(0), list(ERRORS))
    assert [(v.nvmlReturn, v.value.ullVal) for v in values] == [(0, 0)] * 4


@pytest.mark.parametrize("preset", ["a30-node", "rtx-pro-6000"])
def test_boards_without_nvlink_answer_not_supported_per_field(node: Opener, preset: str) -> None:
    nvml, _ = node(preset)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    values = nvml.nvmlDeviceGetFieldValues(h, [FI_LINKS, (FI_TX, 0), *ERRORS])
    assert {v.nvmlReturn for v in values} == {pynvml.NVML_ERROR_NOT_SUPPORTED}


def test_gddr_board_has_no_memory_temperature(node: Opener) -> None:
    nvml, _ = node("rtx-pro-6000")
    (temp,) = nvml.nvmlDeviceGetFieldValues(nvml.nvmlDeviceGetHandleByIndex(0), [FI_TEMP])
    assert temp.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_pcie_byte_counters_and_power(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    control.set_workload(0, sm_active=0.5, pcie_tx_bytes_per_s=1e9)
    ids = [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_POWER_INSTANT]
    (tx0, power), (tx1, _) = (nvml.nvmlDeviceGetFieldValues(h, ids) for _ in range(2))
    assert tx1.value.ullVal >= tx0.value.ullVal
    assert power.value.uiVal == nvml.nvmlDeviceGetPowerUsage(h)


def test_the_call_fails_as_a_whole_only_for_bad_arguments(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    small = (pynvml.c_nvmlFieldValue_t * 1)()
    assert fn(h, ctypes.c_int32(2), ctypes.byref(small)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert fn(h, ctypes.c_int32(1), None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert fn(h, ctypes.c_int32(0), ctypes.byref(small)) == pynvml.NVML_SUCCESS


def test_a_mig_device_handle_is_not_supported(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    h = enable_mig(nvml, 0)
    gi = nvml.nvmlDeviceCreateGpuInstance(h, 9)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetFieldValues(mig, [FI_TEMP])
