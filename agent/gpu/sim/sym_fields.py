"""``nvmlDeviceGetFieldValues``: batched field reads into a caller-allocated array.

nvml.h: the caller fills ``fieldId`` (and ``scopeId``, the NVLink link for per-link fields) of
each ``nvmlFieldValue_t``; the driver writes ``nvmlReturn``, ``valueType``, ``value``,
``timestamp`` (CPU clock, microseconds) and ``latencyUsec`` into every entry and returns
NVML_SUCCESS for the call as a whole, even when single fields fail: a field the board lacks gets
NOT_SUPPORTED in its own ``nvmlReturn``, a link past the board's count INVALID_ARGUMENT.

The fields served are the ones the agent exports (reference/telemetry.md §4): HBM temperature,
NVLink link count, per-link NVLink data traffic, NVLink error totals, PCIe byte counters and
power. Other valid field ids answer NOT_SUPPORTED per field; ids outside NVML's range
INVALID_ARGUMENT. NVLink error counters read 0: the simulator injects no link errors.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pynvml

from agent.gpu.sim import activity
from agent.gpu.sim.abi import OutArray, fail, symbol, to_int

if TYPE_CHECKING:
    from agent.gpu.sim.driver import SimDriver, Target

_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_HBM_ABOVE_GPU_C = 4  # HBM runs a few degrees above the GPU die (illustrative)

# A field's reading on one target and scope: (valueType, value) or an NVML error code.
_Reading = tuple[int, int] | int
_Reader = Callable[["Target", int, dict[str, float]], _Reading]


def _memory_temperature(t: Target, scope: int, totals: dict[str, float]) -> _Reading:
    if not t.model.hbm:
        return pynvml.NVML_ERROR_NOT_SUPPORTED  # GDDR boards report no memory temperature
    return _UINT, activity.temperature_c(t.gpu.activity.rates) + _HBM_ABOVE_GPU_C


def _link_count(t: Target, scope: int, totals: dict[str, float]) -> _Reading:
    if t.model.nvlink_links == 0:
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    return _UINT, t.model.nvlink_links


def _nvlink_data(rate: str) -> _Reader:
    """Cumulative KiB on link ``scope``: the GPU's traffic shared evenly over its links."""

    def read(t: Target, scope: int, totals: dict[str, float]) -> _Reading:
        links = t.model.nvlink_links
        if links == 0:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        if not 0 <= scope < links:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return _ULL, int(totals.get(rate, 0.0) / links) // 1024

    return read


def _nvlink_errors(t: Target, scope: int, totals: dict[str, float]) -> _Reading:
    return pynvml.NVML_ERROR_NOT_SUPPORTED if t.model.nvlink_links == 0 else (_ULL, 0)


def _pcie_bytes(rate: str) -> _Reader:
    def read(t: Target, scope: int, totals: dict[str, float]) -> _Reading:
        return _ULL, int(totals.get(rate, 0.0))

    return read


def _power_mw(t: Target, scope: int, totals: dict[str, float]) -> _Reading:
    return _UINT, int(t.gpu.activity.rates.get(activity.POWER_MW, 0.0))


_FIELDS: dict[int, _Reader] = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP: _memory_temperature,
    pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: _link_count,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: _nvlink_data("nvlink_tx_bytes_per_s"),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: _nvlink_data("nvlink_rx_bytes_per_s"),
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: _nvlink_errors,
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: _nvlink_errors,
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: _nvlink_errors,
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: _nvlink_errors,
    pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: _pcie_bytes("pcie_tx_bytes_per_s"),
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: _pcie_bytes("pcie_rx_bytes_per_s"),
    pynvml.NVML_FI_DEV_POWER_INSTANT: _power_mw,
    pynvml.NVML_FI_DEV_POWER_AVERAGE: _power_mw,
}
FIELDS_SERVED = frozenset(_FIELDS)

_VALUE_MEMBER = {_UINT: "uiVal", _ULL: "ullVal"}


@symbol("nvmlDeviceGetFieldValues")
def field_values(drv: SimDriver, handle: Any, count: Any, values: Any) -> None:
    t = drv.physical(handle)
    n = to_int(count)
    if n < 0 or values is None:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    out = OutArray(values)
    out.require(n)
    totals = activity.totals_at(t.gpu.activity, drv.now())
    stamp = time.time_ns() // 1000
    for i in range(n):
        entry = out[i]
        if not isinstance(entry, pynvml.c_nvmlFieldValue_t):
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        field, scope = int(entry.fieldId), int(entry.scopeId)
        reader = _FIELDS.get(field)
        if reader is None:
            valid = 0 < field < pynvml.NVML_FI_MAX
            reading: _Reading = (
                pynvml.NVML_ERROR_NOT_SUPPORTED if valid else pynvml.NVML_ERROR_INVALID_ARGUMENT
            )
        else:
            reading = reader(t, scope, totals)
        entry.timestamp, entry.latencyUsec = stamp, 0
        if isinstance(reading, int):
            entry.nvmlReturn = reading
            continue
        kind, value = reading
        entry.nvmlReturn = pynvml.NVML_SUCCESS
        entry.valueType = kind
        ctypes.memset(ctypes.byref(entry.value), 0, ctypes.sizeof(entry.value))
        setattr(entry.value, _VALUE_MEMBER[kind], value)
