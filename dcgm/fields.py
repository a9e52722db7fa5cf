"""The DCGM field catalog: what each dcgm-exporter field means and where the agent reads it.

Pure data (reference/telemetry.md §1.2, §2, §3.3, §4). One row per DCGM field the agent can be asked
for in a counters CSV: its DCGM id and name, the *true* Prometheus kind (rates are gauges even
where dcgm-exporter's CSVs say counter), DCGM's entity level, the NVML / GPM source with the exact
unit conversion into the unit dcgm-exporter exports, and the Prometheus-idiomatic ("native") name
with the conversion from that unit into base units.

Values flow: NVML or GPM reading --``source.scale``--> DCGM unit (snapshot, ``dcgm`` names)
--``to_base``--> base unit (``native`` names).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from enum import Enum

from agent.gpu.reading_calls import Reading
from agent.gpu.readings import GpuString
from dcgm.catalog import catalogue

__all__ = [
    "BY_ID",
    "BY_NAME",
    "CLOCK_EVENT_NAMES",
    "CLOCK_EVENT_WINDOW_S",
    "FIELDS",
    "LEGACY_NAMES",
    "P2P_STATUS_NAMES",
    "ClockEventWindow",
    "Field",
    "Gpm",
    "GpuStrings",
    "Info",
    "Kind",
    "Level",
    "Nvml",
    "NvmlRate",
    "P2pStatus",
    "Scale",
    "Unavailable",
    "XidEvents",
    "XidWindow",
    "close_matches",
    "lookup",
]


class Kind(Enum):
    """What a field is in Prometheus terms."""

    GAUGE = "gauge"
    COUNTER = "counter"  # monotonic since driver load: rate() works
    LABEL = "label"  # a string attached as a label (dcgm) or an info-metric label (native)


class Level(Enum):
    """DCGM's entity level: the finest entity the field exists for."""

    GPU = "GPU"  # physical GPU only: emitted once per GPU, never on GPU-instance series
    GPU_I = "GPU_I"  # per GPU instance too
    GPU_CI = "GPU_CI"  # per compute instance in DCGM; the agent exports it per GPU instance


@dataclass(frozen=True, slots=True)
class Scale:
    """``value * mul / div``; two exact factors so MiB, mJ and % conversions stay exact."""

    mul: float = 1.0
    div: float = 1.0

    def __call__(self, value: float) -> float:
        return value * self.mul / self.div


_ONE = Scale()
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Nvml:
    """A per-tick NVML reading; DCGM value = ``scale(reading)``."""

    reading: Reading
    scale: Scale = _ONE


@dataclass(frozen=True, slots=True)
class NvmlRate:
    """The per-second rate of a cumulative NVML counter between two ticks."""

    reading: Reading
    scale: Scale = _ONE


@dataclass(frozen=True, slots=True)
class Gpm:
    """An NVML GPM metric (Hopper+) averaged between two samples; ``metric_id`` is
    NVML_GPM_METRIC_*. On GPUs without GPM the DCGM backend serves the field, when present."""

    metric_id: int
    scale: Scale = _ONE


@dataclass(frozen=True, slots=True)
class XidEvents:
    """XID error events, counted by the event thread."""


@dataclass(frozen=True, slots=True)
class XidWindow:
    """dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT: XIDs per GPU and XID within the last window
    (its ``--xid-count-window-size``, 5 minutes)."""


@dataclass(frozen=True, slots=True)
class ClockEventWindow:
    """dcgm-exporter's DCGM_EXP_CLOCK_EVENTS_COUNT: per GPU and clock-event reason, the samples
    within the last window (its ``--clock-events-count-window-size``, 5 minutes) that had the
    reason set."""

    reading: Reading = Reading.CLOCK_EVENT_REASONS


@dataclass(frozen=True, slots=True)
class P2pStatus:
    """dcgm-exporter's DCGM_EXP_P2P_STATUS: the NVLink P2P status of each GPU to each peer
    (labels peer_gpu, link_status); read again every 30 s and on a layout change: links fail
    and retrain at runtime."""


#: nvmlGpuP2PStatus_t -> dcgm-exporter's link_status label
P2P_STATUS_NAMES: dict[int, str] = {
    0: "OK",
    1: "ChipsetNotSupported",
    2: "GPUNotSupported",
    3: "TopologyNotSupported",
    4: "DisabledByRegKey",
    5: "NotSupported",
    6: "Unknown",
}

#: dcgm-exporter's --clock-events-count-window-size default (300000 ms)
CLOCK_EVENT_WINDOW_S = 300.0

#: nvmlClocksEventReason* bit -> dcgm-exporter's ``clock_event`` label (dcgmi's names)
CLOCK_EVENT_NAMES: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "clocks_setting",
    0x4: "power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


@dataclass(frozen=True, slots=True)
class Info:
    """A node-wide string: ``driver_version`` or ``nvml_version``."""

    key: str


@dataclass(frozen=True, slots=True)
class GpuStrings:
    """A per-GPU static string (brand, serial, VBIOS and InfoROM versions), read once."""

    key: GpuString


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A field the agent has no source for; selecting it reports it unsupported, never 0."""

    reason: str


Source = (
    Nvml
    | NvmlRate
    | Gpm
    | XidEvents
    | XidWindow
    | ClockEventWindow
    | P2pStatus
    | Info
    | GpuStrings
    | Unavailable
)


@dataclass(frozen=True, slots=True)
class Field:
    id: int
    name: str
    kind: Kind
    level: Level
    source: Source
    #: unit of the value under the DCGM name, as dcgm-exporter exports it
    unit: str
    #: Prometheus-idiomatic name (counters without ``_total``; the client appends it), or for a
    #: LABEL field the label name on ``gpu_agent_gpu_info``
    native: str
    #: DCGM unit -> base unit of the native name
    to_base: Scale
    help: str

    @property
    def profiling(self) -> bool:
        """A DCP field (DCGM_FI_PROF_*): GPM on Hopper+, the DCGM profiling module before."""
        return isinstance(self.source, Gpm)


_G, _C, _L = Kind.GAUGE, Kind.COUNTER, Kind.LABEL
_GPU, _GI, _CI = Level.GPU, Level.GPU_I, Level.GPU_CI
_PCT = Scale(div=100)  # percent -> ratio
_MHZ = Scale(mul=1_000_000)  # MHz -> Hz
_TO_MIB = Scale(div=_MIB)  # bytes -> MiB
_FROM_MIB = Scale(mul=_MIB)  # MiB -> bytes


def _f(
    id: int,
    name: str,
    kind: Kind,
    level: Level,
    source: Source,
    unit: str,
    native: str,
    to_base: Scale,
    help: str,
) -> Field:
    return Field(id, f"DCGM_FI_{name}", kind, level, source, unit, native, to_base, help)


def _violation(id: int, name: str, reading: Reading, what: str) -> Field:
    return _f(
        id,
        f"DEV_{name.upper()}_VIOLATION",
        _C,
        _GPU,
        Nvml(reading),
        "ns",
        f"gpu_agent_{name}_violation_seconds",
        Scale(div=1e9),
        f"Time clocks were held down by {what}.",
    )


def _prof_ratio(id: int, name: str, level: Level, metric: int, native: str, what: str) -> Field:
    return _f(
        id,
        f"PROF_{name}",
        _G,
        level,
        Gpm(metric, _PCT),
        "ratio",
        f"gpu_agent_{native}_ratio",
        _ONE,
        what,
    )


def _prof_rate(id: int, name: str, metric: int, native: str, what: str) -> Field:
    return _f(
        id,
        f"PROF_{name}",
        _G,
        _GPU,
        Gpm(metric, _FROM_MIB),  # GPM reports MiB/s
        "bytes/s",
        f"gpu_agent_{native}_bytes_per_second",
        _ONE,
        what,
    )


_R = Reading
FIELDS: tuple[Field, ...] = (
    # -- node-wide strings (label type) -----------------------------------------------------------
    _f(1, "DRIVER_VERSION", _L, _GPU, Info("driver_version"), "", "driver_version", _ONE,
       "NVIDIA driver version."),
    _f(2, "NVML_VERSION", _L, _GPU, Info("nvml_version"), "", "nvml_version", _ONE,
       "NVML library version."),
    # -- per-GPU strings (label type) -------------------------------------------------------------
    _f(51, "DEV_BRAND", _L, _GPU, GpuStrings(GpuString.BRAND), "", "brand", _ONE, "Device brand."),
    _f(53, "DEV_SERIAL", _L, _GPU, GpuStrings(GpuString.SERIAL), "", "serial", _ONE,
       "Board serial number."),
    _f(56, "DEV_OEM_INFOROM_VER", _L, _GPU, GpuStrings(GpuString.INFOROM_OEM), "",
       "inforom_oem_version", _ONE, "OEM InfoROM version."),
    _f(80, "DEV_ECC_INFOROM_VER", _L, _GPU, GpuStrings(GpuString.INFOROM_ECC), "",
       "inforom_ecc_version", _ONE, "ECC InfoROM version."),
    _f(81, "DEV_POWER_INFOROM_VER", _L, _GPU, GpuStrings(GpuString.INFOROM_POWER), "",
       "inforom_power_version", _ONE, "Power management InfoROM version."),
    _f(82, "DEV_INFOROM_IMAGE_VER", _L, _GPU, GpuStrings(GpuString.INFOROM_IMAGE), "",
       "inforom_image_version", _ONE, "InfoROM image version."),
    _f(85, "DEV_VBIOS_VERSION", _L, _GPU, GpuStrings(GpuString.VBIOS_VERSION), "",
       "vbios_version", _ONE, "VBIOS version."),
    # -- clocks, temperatures, power --------------------------------------------------------------
    _f(100, "DEV_SM_CLOCK", _G, _GPU, Nvml(_R.SM_CLOCK_MHZ), "MHz", "gpu_agent_sm_clock_hertz",
       _MHZ, "SM clock frequency."),
    _f(101, "DEV_MEM_CLOCK", _G, _GPU, Nvml(_R.MEMORY_CLOCK_MHZ), "MHz",
       "gpu_agent_memory_clock_hertz", _MHZ, "Memory clock frequency."),
    # A bitmask of nvmlClocksEventReason* (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS before DCGM 3.2).
    _f(112, "DEV_CLOCKS_EVENT_REASONS", _G, _GPU, Nvml(_R.CLOCK_EVENT_REASONS), "bitmask",
       "gpu_agent_clock_event_reasons", _ONE,
       "Why clocks are held down now: a bitmask of NVML's clock-event reasons."),
    _f(140, "DEV_MEMORY_TEMP", _G, _GPU, Nvml(_R.MEMORY_TEMPERATURE_C), "C",
       "gpu_agent_memory_temperature_celsius", _ONE, "Memory (HBM) temperature."),
    _f(150, "DEV_GPU_TEMP", _G, _GPU, Nvml(_R.GPU_TEMPERATURE_C), "C",
       "gpu_agent_temperature_celsius", _ONE, "GPU temperature."),
    _f(155, "DEV_POWER_USAGE", _G, _GPU, Nvml(_R.POWER_MW, Scale(div=1000)), "W",
       "gpu_agent_power_watts", _ONE, "Power draw."),
    _f(156, "DEV_TOTAL_ENERGY_CONSUMPTION", _C, _GPU, Nvml(_R.ENERGY_MJ), "mJ",
       "gpu_agent_energy_joules", Scale(div=1000), "Energy consumed since the driver loaded."),
    _f(160, "DEV_POWER_MGMT_LIMIT", _G, _GPU, Nvml(_R.POWER_LIMIT_MW, Scale(div=1000)), "W",
       "gpu_agent_power_limit_watts", _ONE,
       "Power management limit set (the agent's power caps, nvidia-smi -pl, or the default)."),
    _f(163, "DEV_POWER_MGMT_LIMIT_DEF", _G, _GPU,
       Nvml(_R.DEFAULT_POWER_LIMIT_MW, Scale(div=1000)), "W",
       "gpu_agent_power_limit_default_watts", _ONE,
       "Power management limit after a reboot or driver reload."),
    _f(164, "DEV_ENFORCED_POWER_LIMIT", _G, _GPU,
       Nvml(_R.ENFORCED_POWER_LIMIT_MW, Scale(div=1000)), "W",
       "gpu_agent_power_limit_enforced_watts", _ONE,
       "Power limit the board enforces: the lowest of the limits in force."),
    # -- PCIe and utilisation ---------------------------------------------------------------------
    # NVML's PCIe throughput is a rate over a 20 ms window in KB/s (KiB/s, as nvitop reads it).
    _f(200, "DEV_PCIE_TX_THROUGHPUT", _G, _GPU, Nvml(_R.PCIE_TX_KB_S), "KB/s",
       "gpu_agent_pcie_tx_throughput_bytes_per_second", Scale(mul=1024),
       "PCIe transmit throughput over NVML's 20 ms window."),
    _f(201, "DEV_PCIE_RX_THROUGHPUT", _G, _GPU, Nvml(_R.PCIE_RX_KB_S), "KB/s",
       "gpu_agent_pcie_rx_throughput_bytes_per_second", Scale(mul=1024),
       "PCIe receive throughput over NVML's 20 ms window."),
    _f(202, "DEV_PCIE_REPLAY_COUNTER", _C, _GPU, Nvml(_R.PCIE_REPLAYS), "count",
       "gpu_agent_pcie_replays", _ONE, "PCIe replays (retries)."),
    _f(203, "DEV_GPU_UTIL", _G, _GPU, Nvml(_R.GPU_UTIL_PERCENT), "%",
       "gpu_agent_utilization_ratio", _PCT,
       "Share of time a kernel ran (NVML; not available with MIG enabled)."),
    _f(204, "DEV_MEM_COPY_UTIL", _G, _GPU, Nvml(_R.MEMORY_UTIL_PERCENT), "%",
       "gpu_agent_memory_copy_utilization_ratio", _PCT,
       "Share of time device memory was read or written."),
    _f(206, "DEV_ENC_UTIL", _G, _GPU, Nvml(_R.ENCODER_UTIL_PERCENT), "%",
       "gpu_agent_encoder_utilization_ratio", _PCT, "Video encoder utilisation."),
    _f(207, "DEV_DEC_UTIL", _G, _GPU, Nvml(_R.DECODER_UTIL_PERCENT), "%",
       "gpu_agent_decoder_utilization_ratio", _PCT, "Video decoder utilisation."),
    # -- errors -----------------------------------------------------------------------------------
    # DCGM name: the last XID seen (a gauge, kept for dashboards); native: occurrences per XID.
    _f(230, "DEV_XID_ERRORS", _G, _GPU, XidEvents(), "xid", "gpu_agent_xid_errors", _ONE,
       "XID errors from NVML events."),
    _violation(240, "power", _R.POWER_VIOLATION_NS, "the power limit"),
    _violation(241, "thermal", _R.THERMAL_VIOLATION_NS, "thermal limits"),
    _violation(242, "sync_boost", _R.SYNC_BOOST_VIOLATION_NS, "sync boost"),
    _violation(243, "board_limit", _R.BOARD_LIMIT_VIOLATION_NS, "the board limit"),
    _violation(244, "low_util", _R.LOW_UTIL_VIOLATION_NS, "low utilisation"),
    _violation(245, "reliability", _R.RELIABILITY_VIOLATION_NS, "board reliability limits"),
    # -- framebuffer (per GPU instance through the MIG device) -----------------------------------
    _f(250, "DEV_FB_TOTAL", _G, _GI, Nvml(_R.FB_TOTAL_BYTES, _TO_MIB), "MiB",
       "gpu_agent_memory_bytes", _FROM_MIB, "Framebuffer size."),
    _f(251, "DEV_FB_FREE", _G, _GI, Nvml(_R.FB_FREE_BYTES, _TO_MIB), "MiB",
       "gpu_agent_memory_free_bytes", _FROM_MIB, "Framebuffer free."),
    _f(252, "DEV_FB_USED", _G, _GI, Nvml(_R.FB_USED_BYTES, _TO_MIB), "MiB",
       "gpu_agent_memory_used_bytes", _FROM_MIB, "Framebuffer used."),
    _f(253, "DEV_FB_RESERVED", _G, _GI, Nvml(_R.FB_RESERVED_BYTES, _TO_MIB), "MiB",
       "gpu_agent_memory_reserved_bytes", _FROM_MIB, "Framebuffer reserved by the driver."),
    # -- ECC, retired pages, row remapping --------------------------------------------------------
    _f(310, "DEV_ECC_SBE_VOL_TOTAL", _C, _GPU, Nvml(_R.ECC_SBE_VOLATILE), "count",
       "gpu_agent_ecc_single_bit_volatile_errors", _ONE, "Single-bit ECC errors since boot."),
    _f(311, "DEV_ECC_DBE_VOL_TOTAL", _C, _GPU, Nvml(_R.ECC_DBE_VOLATILE), "count",
       "gpu_agent_ecc_double_bit_volatile_errors", _ONE, "Double-bit ECC errors since boot."),
    _f(312, "DEV_ECC_SBE_AGG_TOTAL", _C, _GPU, Nvml(_R.ECC_SBE_AGGREGATE), "count",
       "gpu_agent_ecc_single_bit_aggregate_errors", _ONE, "Single-bit ECC errors, lifetime."),
    _f(313, "DEV_ECC_DBE_AGG_TOTAL", _C, _GPU, Nvml(_R.ECC_DBE_AGGREGATE), "count",
       "gpu_agent_ecc_double_bit_aggregate_errors", _ONE, "Double-bit ECC errors, lifetime."),
    _f(390, "DEV_RETIRED_SBE", _C, _GPU, Nvml(_R.RETIRED_PAGES_SBE), "count",
       "gpu_agent_retired_pages_single_bit", _ONE, "Pages retired for single-bit errors."),
    _f(391, "DEV_RETIRED_DBE", _C, _GPU, Nvml(_R.RETIRED_PAGES_DBE), "count",
       "gpu_agent_retired_pages_double_bit", _ONE, "Pages retired for double-bit errors."),
    # A yes/no status, not a count: a gauge although dcgm-exporter's CSV says counter.
    _f(392, "DEV_RETIRED_PENDING", _G, _GPU, Nvml(_R.RETIRED_PAGES_PENDING), "bool",
       "gpu_agent_retired_pages_pending", _ONE, "1 when page retirements await a reboot."),
    _f(393, "DEV_UNCORRECTABLE_REMAPPED_ROWS", _C, _GPU, Nvml(_R.REMAPPED_ROWS_UNCORRECTABLE),
       "count", "gpu_agent_remapped_rows_uncorrectable", _ONE,
       "Rows remapped for uncorrectable errors."),
    _f(394, "DEV_CORRECTABLE_REMAPPED_ROWS", _C, _GPU, Nvml(_R.REMAPPED_ROWS_CORRECTABLE),
       "count", "gpu_agent_remapped_rows_correctable", _ONE,
       "Rows remapped for correctable errors."),
    _f(395, "DEV_ROW_REMAP_FAILURE", _G, _GPU, Nvml(_R.ROW_REMAP_FAILURE), "bool",
       "gpu_agent_row_remap_failed", _ONE, "1 when a row remapping has failed."),
    # -- NVLink -----------------------------------------------------------------------------------
    _f(409, "DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", _C, _GPU, Nvml(_R.NVLINK_CRC_FLIT_ERRORS),
       "count", "gpu_agent_nvlink_crc_flit_errors", _ONE, "NVLink flow-control CRC errors."),
    _f(419, "DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", _C, _GPU, Nvml(_R.NVLINK_CRC_DATA_ERRORS),
       "count", "gpu_agent_nvlink_crc_data_errors", _ONE, "NVLink data CRC errors."),
    _f(429, "DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", _C, _GPU, Nvml(_R.NVLINK_REPLAY_ERRORS),
       "count", "gpu_agent_nvlink_replay_errors", _ONE, "NVLink replays."),
    _f(439, "DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", _C, _GPU, Nvml(_R.NVLINK_RECOVERY_ERRORS),
       "count", "gpu_agent_nvlink_recovery_errors", _ONE, "NVLink recoveries."),
    # DCGM 4.6 (DcgmCacheManager::ReadAndCacheNvLinkBandwidth) derives these rates from NVML's
    # cumulative KiB counters (TX + RX) and divides KiB/s by 1000: its unit is "MB/s" of
    # 1000 KiB (1,024,000 bytes). dcgm-exporter types them counter; they are rates.
    _f(440, "DEV_NVLINK_BANDWIDTH_L0", _G, _GPU,
       NvmlRate(_R.NVLINK_L0_TRAFFIC_KIB, Scale(div=1000)), "MB/s",
       "gpu_agent_nvlink_l0_bandwidth_bytes_per_second", Scale(mul=1_024_000),
       "NVLink data traffic on link 0 (TX + RX)."),
    _f(449, "DEV_NVLINK_BANDWIDTH_TOTAL", _G, _GPU,
       NvmlRate(_R.NVLINK_TRAFFIC_KIB, Scale(div=1000)), "MB/s",
       "gpu_agent_nvlink_bandwidth_bytes_per_second", Scale(mul=1_024_000),
       "NVLink data traffic (TX + RX, all links)."),
    _f(526, "DEV_VGPU_LICENSE_STATUS", _G, _GPU,
       Unavailable("vGPU licensing applies to vGPU guests, which the agent does not run in"),
       "enum", "gpu_agent_vgpu_license_status", _ONE, "vGPU license status."),
    # -- profiling (DCP): GPM metric ids are NVML_GPM_METRIC_* -----------------------------------
    _prof_ratio(1001, "GR_ENGINE_ACTIVE", _CI, 1, "graphics_engine_active",
                "Share of time the graphics or compute engine was busy."),
    _prof_ratio(1002, "SM_ACTIVE", _CI, 2, "sm_active",
                "Share of cycles an SM had at least one warp, averaged over SMs."),
    _prof_ratio(1003, "SM_OCCUPANCY", _CI, 3, "sm_occupancy",
                "Resident warps over the theoretical maximum, averaged over SMs."),
    _prof_ratio(1004, "PIPE_TENSOR_ACTIVE", _CI, 5, "tensor_active",
                "Share of cycles any tensor pipe was active."),
    _prof_ratio(1005, "DRAM_ACTIVE", _GI, 10, "dram_active",
                "Share of cycles the device-memory interface was sending or receiving."),
    _prof_ratio(1006, "PIPE_FP64_ACTIVE", _CI, 11, "fp64_active",
                "Share of cycles the FP64 pipe was active."),
    _prof_ratio(1007, "PIPE_FP32_ACTIVE", _CI, 12, "fp32_active",
                "Share of cycles the FP32 pipe was active."),
    _prof_ratio(1008, "PIPE_FP16_ACTIVE", _CI, 13, "fp16_active",
                "Share of cycles the FP16 pipe was active (tensor excluded)."),
    _prof_rate(1009, "PCIE_TX_BYTES", 20, "pcie_tx",
               "PCIe transmit rate, headers included (device to host)."),
    _prof_rate(1010, "PCIE_RX_BYTES", 21, "pcie_rx",
               "PCIe receive rate, headers included (host to device)."),
    _prof_rate(1011, "NVLINK_TX_BYTES", 61, "nvlink_tx", "NVLink transmit rate, all links."),
    _prof_rate(1012, "NVLINK_RX_BYTES", 60, "nvlink_rx", "NVLink receive rate, all links."),
    _prof_ratio(1013, "PIPE_TENSOR_IMMA_ACTIVE", _CI, 9, "tensor_imma_active",
                "Share of cycles the integer tensor pipe was active."),
    _prof_ratio(1014, "PIPE_TENSOR_HMMA_ACTIVE", _CI, 7, "tensor_hmma_active",
                "Share of cycles the half-precision tensor pipe was active."),
    _prof_ratio(1015, "PIPE_TENSOR_DFMA_ACTIVE", _CI, 6, "tensor_dfma_active",
                "Share of cycles the FP64 tensor pipe was active."),
    _prof_ratio(1016, "PIPE_INT_ACTIVE", _CI, 4, "integer_active",
                "Share of cycles the integer pipe was active."),
    # -- computed by dcgm-exporter (DCGM_EXP_*; ids are the agent's own, above DCGM's) -----------
    Field(100_001, "DCGM_EXP_XID_ERRORS_COUNT", _G, _GPU, XidWindow(), "count",
          "gpu_agent_xid_errors_in_window", _ONE,
          "XIDs within the last window, by XID (labels xid, window_size_in_ms)."),
    Field(100_002, "DCGM_EXP_CLOCK_EVENTS_COUNT", _G, _GPU, ClockEventWindow(), "count",
          "gpu_agent_clock_events_in_window", _ONE,
          "Samples within the last window with a clock-event reason set (labels clock_event, "
          "window_size_in_ms)."),
    Field(100_003, "DCGM_EXP_GPU_HEALTH_STATUS", _G, _GPU,
          Unavailable("DCGM health checks need the hostengine; gpu_agent_gpu_up reports a lost "
                      "GPU and gpu_agent_xid_errors_total its XIDs"),
          "enum", "gpu_agent_health_status", _ONE, "DCGM health status."),
    Field(100_004, "DCGM_EXP_P2P_STATUS", _G, _GPU, P2pStatus(), "enum",
          "gpu_agent_p2p_status", _ONE,
          "NVLink P2P status to each peer GPU, 0 = OK (labels peer_gpu, link_status)."),
)  # fmt: skip

#: dcgm-exporter 1.x series names (its etc/1.x-compatibility-metrics.csv) -> the DCGM field. A
#: counters row may name a field either way; it is exported under the name the row uses.
LEGACY_NAMES: dict[str, str] = {
    "dcgm_sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "dcgm_memory_clock": "DCGM_FI_DEV_MEM_CLOCK",
    "dcgm_memory_temp": "DCGM_FI_DEV_MEMORY_TEMP",
    "dcgm_gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "dcgm_power_usage": "DCGM_FI_DEV_POWER_USAGE",
    "dcgm_total_energy_consumption": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "dcgm_pcie_replay_counter": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "dcgm_gpu_utilization": "DCGM_FI_DEV_GPU_UTIL",
    "dcgm_mem_copy_utilization": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "dcgm_enc_utilization": "DCGM_FI_DEV_ENC_UTIL",
    "dcgm_dec_utilization": "DCGM_FI_DEV_DEC_UTIL",
    "dcgm_xid_errors": "DCGM_FI_DEV_XID_ERRORS",
    "dcgm_power_violation": "DCGM_FI_DEV_POWER_VIOLATION",
    "dcgm_thermal_violation": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "dcgm_sync_boost_violation": "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "dcgm_board_limit_violation": "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "dcgm_low_util_violation": "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "dcgm_reliability_violation": "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "dcgm_fb_free": "DCGM_FI_DEV_FB_FREE",
    "dcgm_fb_used": "DCGM_FI_DEV_FB_USED",
    "dcgm_ecc_sbe_volatile_total": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "dcgm_ecc_dbe_volatile_total": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "dcgm_ecc_sbe_aggregate_total": "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "dcgm_ecc_dbe_aggregate_total": "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "dcgm_retired_pages_sbe": "DCGM_FI_DEV_RETIRED_SBE",
    "dcgm_retired_pages_dbe": "DCGM_FI_DEV_RETIRED_DBE",
    "dcgm_retired_pages_pending": "DCGM_FI_DEV_RETIRED_PENDING",
    "dcgm_nvlink_flit_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_data_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_replay_error_count_total": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_recovery_error_count_total": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_bandwidth_total": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "dcgm_fi_prof_gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "dcgm_fi_prof_sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "dcgm_fi_prof_sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "dcgm_fi_prof_pipe_tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "dcgm_fi_prof_dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "dcgm_fi_prof_pcie_tx_bytes": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "dcgm_fi_prof_pcie_rx_bytes": "DCGM_FI_PROF_PCIE_RX_BYTES",
}

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
BY_ID: dict[int, Field] = {f.id: f for f in FIELDS}


def lookup(name: str) -> Field | None:
    """The served field called ``name``, or None: a dcgm-exporter 1.x name, or any name DCGM
    gives the field (the name this catalog uses, DCGM 4.6's new name or a deprecated one)."""
    field = BY_NAME.get(LEGACY_NAMES.get(name, name))
    if field is None:
        known = catalogue().lookup(name)
        field = BY_ID.get(known.id) if known is not None else None
    return field


def close_matches(name: str) -> list[str]:
    """Served and DCGM names that look like ``name``, for error messages."""
    names = list(dict.fromkeys([*BY_NAME, *sorted(catalogue().names)]))
    return difflib.get_close_matches(name.upper(), names, n=3, cutoff=0.8)
