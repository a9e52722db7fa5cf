"""Every per-device telemetry reading, and the NVML call that answers it.

:class:`Reading` names a value in NVML's own unit; ``GETTERS`` maps each to the call that yields
it (readings that share a call, such as utilisation or memory, share one call per tick) and
``FIELD_VALUES`` the ones ``nvmlDeviceGetFieldValues`` batches. A new reading is a row here;
how they are read, cached and their failures told apart is :class:`agent.gpu.readings.NodeReader`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

__all__ = [
    "FIELD_VALUES",
    "GETTERS",
    "INSTANCE_READINGS",
    "NVLINK_TRAFFIC",
    "NVLINK_TRAFFIC_READINGS",
    "Getter",
    "Reading",
    "field_value",
]


class Reading(Enum):
    """One per-device NVML value, in NVML's own unit (the suffix names it)."""

    # Members are singletons: identity hashing spares Enum's Python-level hash in every lookup
    # of the per-tick read paths (thousands per tick on a MIG node).
    __hash__ = object.__hash__

    SM_CLOCK_MHZ = "sm_clock_mhz"
    MEMORY_CLOCK_MHZ = "memory_clock_mhz"
    GPU_TEMPERATURE_C = "gpu_temperature_c"
    MEMORY_TEMPERATURE_C = "memory_temperature_c"
    POWER_MW = "power_mw"
    #: the power management limit set (nvidia-smi -pl, the agent's power caps, or the default)
    POWER_LIMIT_MW = "power_limit_mw"
    #: the limit the board enforces
    ENFORCED_POWER_LIMIT_MW = "enforced_power_limit_mw"
    #: the limit after a reboot or driver reload
    DEFAULT_POWER_LIMIT_MW = "default_power_limit_mw"
    ENERGY_MJ = "energy_mj"
    PCIE_TX_KB_S = "pcie_tx_kb_s"
    PCIE_RX_KB_S = "pcie_rx_kb_s"
    PCIE_REPLAYS = "pcie_replays"
    GPU_UTIL_PERCENT = "gpu_util_percent"
    MEMORY_UTIL_PERCENT = "memory_util_percent"
    ENCODER_UTIL_PERCENT = "encoder_util_percent"
    DECODER_UTIL_PERCENT = "decoder_util_percent"
    FB_TOTAL_BYTES = "fb_total_bytes"
    FB_FREE_BYTES = "fb_free_bytes"
    FB_USED_BYTES = "fb_used_bytes"
    FB_RESERVED_BYTES = "fb_reserved_bytes"
    POWER_VIOLATION_NS = "power_violation_ns"
    THERMAL_VIOLATION_NS = "thermal_violation_ns"
    SYNC_BOOST_VIOLATION_NS = "sync_boost_violation_ns"
    BOARD_LIMIT_VIOLATION_NS = "board_limit_violation_ns"
    LOW_UTIL_VIOLATION_NS = "low_util_violation_ns"
    RELIABILITY_VIOLATION_NS = "reliability_violation_ns"
    ECC_SBE_VOLATILE = "ecc_sbe_volatile"
    ECC_DBE_VOLATILE = "ecc_dbe_volatile"
    ECC_SBE_AGGREGATE = "ecc_sbe_aggregate"
    ECC_DBE_AGGREGATE = "ecc_dbe_aggregate"
    RETIRED_PAGES_SBE = "retired_pages_sbe"
    RETIRED_PAGES_DBE = "retired_pages_dbe"
    RETIRED_PAGES_PENDING = "retired_pages_pending"
    REMAPPED_ROWS_CORRECTABLE = "remapped_rows_correctable"
    REMAPPED_ROWS_UNCORRECTABLE = "remapped_rows_uncorrectable"
    ROW_REMAP_FAILURE = "row_remap_failure"
    #: 1 while a row remap waits for the next GPU reset
    ROW_REMAP_PENDING = "row_remap_pending"
    NVLINK_CRC_FLIT_ERRORS = "nvlink_crc_flit_errors"
    NVLINK_CRC_DATA_ERRORS = "nvlink_crc_data_errors"
    NVLINK_REPLAY_ERRORS = "nvlink_replay_errors"
    NVLINK_RECOVERY_ERRORS = "nvlink_recovery_errors"
    #: cumulative NVLink data traffic, TX + RX over all links
    NVLINK_TRAFFIC_KIB = "nvlink_traffic_kib"
    #: the same on link 0 only
    NVLINK_L0_TRAFFIC_KIB = "nvlink_l0_traffic_kib"
    #: why clocks are held down now: a bitmask of nvmlClocksEventReason* (was ThrottleReasons)
    CLOCK_EVENT_REASONS = "clock_event_reasons"


#: Readings a MIG device handle answers (per GPU instance); all others are physical-GPU only.
INSTANCE_READINGS = frozenset(
    {
        Reading.FB_TOTAL_BYTES,
        Reading.FB_FREE_BYTES,
        Reading.FB_USED_BYTES,
        Reading.FB_RESERVED_BYTES,
    }
)


Getter = Callable[[Any, Any], Mapping[Reading, float]]


def _utilization(n: Any, h: Any) -> Mapping[Reading, float]:
    u = n.nvmlDeviceGetUtilizationRates(h)
    return {Reading.GPU_UTIL_PERCENT: u.gpu, Reading.MEMORY_UTIL_PERCENT: u.memory}


def _memory(n: Any, h: Any) -> Mapping[Reading, float]:
    m = n.nvmlDeviceGetMemoryInfo(h)  # the gateway picks v2 (reserved apart, R515+) or v1
    out = {
        Reading.FB_TOTAL_BYTES: m.total,
        Reading.FB_FREE_BYTES: m.free,
        Reading.FB_USED_BYTES: m.used,
    }
    reserved = getattr(m, "reserved", None)
    if reserved is not None:
        out[Reading.FB_RESERVED_BYTES] = reserved
    return out


def _remapped(n: Any, h: Any) -> Mapping[Reading, float]:
    corr, unc, pending, failure = n.nvmlDeviceGetRemappedRows(h)
    return {
        Reading.REMAPPED_ROWS_CORRECTABLE: corr,
        Reading.REMAPPED_ROWS_UNCORRECTABLE: unc,
        Reading.ROW_REMAP_FAILURE: failure,
        Reading.ROW_REMAP_PENDING: pending,
    }


def _one(reading: Reading, call: Callable[[Any, Any], float]) -> Getter:
    return lambda n, h: {reading: call(n, h)}


def _violation(reading: Reading, policy: str) -> Getter:
    return _one(
        reading, lambda n, h: n.nvmlDeviceGetViolationStatus(h, getattr(n, policy)).violationTime
    )


def _ecc(reading: Reading, error_type: str, counter: str) -> Getter:
    return _one(
        reading,
        lambda n, h: n.nvmlDeviceGetTotalEccErrors(h, getattr(n, error_type), getattr(n, counter)),
    )


def _retired(reading: Reading, cause: str) -> Getter:
    return _one(reading, lambda n, h: len(n.nvmlDeviceGetRetiredPages(h, getattr(n, cause))))


_R = Reading
_UTILIZATION: Getter = _utilization
_MEMORY: Getter = _memory
_REMAPPED: Getter = _remapped
#: Reading -> the NVML call that yields it; readings sharing a getter share one call per tick.
GETTERS: dict[Reading, Getter] = {
    _R.SM_CLOCK_MHZ: _one(
        _R.SM_CLOCK_MHZ, lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
    ),
    _R.MEMORY_CLOCK_MHZ: _one(
        _R.MEMORY_CLOCK_MHZ, lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)
    ),
    _R.GPU_TEMPERATURE_C: _one(
        _R.GPU_TEMPERATURE_C, lambda n, h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
    ),
    _R.POWER_MW: _one(_R.POWER_MW, lambda n, h: n.nvmlDeviceGetPowerUsage(h)),
    _R.POWER_LIMIT_MW: _one(_R.POWER_LIMIT_MW, lambda n, h: n.nvmlDeviceGetPowerManagementLimit(h)),
    _R.ENFORCED_POWER_LIMIT_MW: _one(
        _R.ENFORCED_POWER_LIMIT_MW, lambda n, h: n.nvmlDeviceGetEnforcedPowerLimit(h)
    ),
    _R.DEFAULT_POWER_LIMIT_MW: _one(
        _R.DEFAULT_POWER_LIMIT_MW, lambda n, h: n.nvmlDeviceGetPowerManagementDefaultLimit(h)
    ),
    _R.ENERGY_MJ: _one(_R.ENERGY_MJ, lambda n, h: n.nvmlDeviceGetTotalEnergyConsumption(h)),
    _R.PCIE_TX_KB_S: _one(
        _R.PCIE_TX_KB_S, lambda n, h: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES)
    ),
    _R.PCIE_RX_KB_S: _one(
        _R.PCIE_RX_KB_S, lambda n, h: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES)
    ),
    _R.PCIE_REPLAYS: _one(_R.PCIE_REPLAYS, lambda n, h: n.nvmlDeviceGetPcieReplayCounter(h)),
    _R.GPU_UTIL_PERCENT: _UTILIZATION,
    _R.MEMORY_UTIL_PERCENT: _UTILIZATION,
    _R.ENCODER_UTIL_PERCENT: _one(
        _R.ENCODER_UTIL_PERCENT, lambda n, h: n.nvmlDeviceGetEncoderUtilization(h)[0]
    ),
    _R.DECODER_UTIL_PERCENT: _one(
        _R.DECODER_UTIL_PERCENT, lambda n, h: n.nvmlDeviceGetDecoderUtilization(h)[0]
    ),
    _R.FB_TOTAL_BYTES: _MEMORY,
    _R.FB_FREE_BYTES: _MEMORY,
    _R.FB_USED_BYTES: _MEMORY,
    _R.FB_RESERVED_BYTES: _MEMORY,
    _R.POWER_VIOLATION_NS: _violation(_R.POWER_VIOLATION_NS, "NVML_PERF_POLICY_POWER"),
    _R.THERMAL_VIOLATION_NS: _violation(_R.THERMAL_VIOLATION_NS, "NVML_PERF_POLICY_THERMAL"),
    _R.SYNC_BOOST_VIOLATION_NS: _violation(
        _R.SYNC_BOOST_VIOLATION_NS, "NVML_PERF_POLICY_SYNC_BOOST"
    ),
    _R.BOARD_LIMIT_VIOLATION_NS: _violation(
        _R.BOARD_LIMIT_VIOLATION_NS, "NVML_PERF_POLICY_BOARD_LIMIT"
    ),
    _R.LOW_UTIL_VIOLATION_NS: _violation(
        _R.LOW_UTIL_VIOLATION_NS, "NVML_PERF_POLICY_LOW_UTILIZATION"
    ),
    _R.RELIABILITY_VIOLATION_NS: _violation(
        _R.RELIABILITY_VIOLATION_NS, "NVML_PERF_POLICY_RELIABILITY"
    ),
    _R.ECC_SBE_VOLATILE: _ecc(
        _R.ECC_SBE_VOLATILE, "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"
    ),
    _R.ECC_DBE_VOLATILE: _ecc(
        _R.ECC_DBE_VOLATILE, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"
    ),
    _R.ECC_SBE_AGGREGATE: _ecc(
        _R.ECC_SBE_AGGREGATE, "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"
    ),
    _R.ECC_DBE_AGGREGATE: _ecc(
        _R.ECC_DBE_AGGREGATE, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"
    ),
    _R.RETIRED_PAGES_SBE: _retired(
        _R.RETIRED_PAGES_SBE, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"
    ),
    _R.RETIRED_PAGES_DBE: _retired(
        _R.RETIRED_PAGES_DBE, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"
    ),
    _R.RETIRED_PAGES_PENDING: _one(
        _R.RETIRED_PAGES_PENDING, lambda n, h: n.nvmlDeviceGetRetiredPagesPendingStatus(h)
    ),
    _R.REMAPPED_ROWS_CORRECTABLE: _REMAPPED,
    _R.REMAPPED_ROWS_UNCORRECTABLE: _REMAPPED,
    _R.ROW_REMAP_FAILURE: _REMAPPED,
    _R.ROW_REMAP_PENDING: _REMAPPED,
    # The gateway falls back to the pre-R535 name (nvmlDeviceGetCurrentClocksThrottleReasons).
    _R.CLOCK_EVENT_REASONS: _one(
        _R.CLOCK_EVENT_REASONS, lambda n, h: n.nvmlDeviceGetCurrentClocksEventReasons(h)
    ),
}

#: Readings served by nvmlDeviceGetFieldValues, batched into one call: Reading -> NVML_FI_* name.
FIELD_VALUES: dict[Reading, str] = {
    _R.MEMORY_TEMPERATURE_C: "NVML_FI_DEV_MEMORY_TEMP",
    _R.NVLINK_CRC_FLIT_ERRORS: "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    _R.NVLINK_CRC_DATA_ERRORS: "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    _R.NVLINK_REPLAY_ERRORS: "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    _R.NVLINK_RECOVERY_ERRORS: "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}
# Per-link KiB counters summed into NVLINK_TRAFFIC_KIB (scope id = link number).
NVLINK_TRAFFIC = ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")
NVLINK_TRAFFIC_READINGS = (Reading.NVLINK_TRAFFIC_KIB, Reading.NVLINK_L0_TRAFFIC_KIB)
_FIELD_VALUE_KINDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def field_value(value: Any) -> float:
    kind = int(value.valueType)
    name = _FIELD_VALUE_KINDS[kind] if 0 <= kind < len(_FIELD_VALUE_KINDS) else "ullVal"
    return float(getattr(value.value, name))
