"""The DCGM field catalog is consistent data with exact unit conversions."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml
import pytest

from dcgm.fields import BY_ID, BY_NAME, FIELDS, Gpm, Kind, Level, Nvml, Scale, close_matches

_GPM_NAMES = {
    1001: "GRAPHICS_UTIL",
    1002: "SM_UTIL",
    1003: "SM_OCCUPANCY",
    1004: "ANY_TENSOR_UTIL",
    1005: "DRAM_BW_UTIL",
    1006: "FP64_UTIL",
    1007: "FP32_UTIL",
    1008: "FP16_UTIL",
    1009: "PCIE_TX_PER_SEC",
    1010: "PCIE_RX_PER_SEC",
    1011: "NVLINK_TOTAL_TX_PER_SEC",
    1012: "NVLINK_TOTAL_RX_PER_SEC",
    1013: "IMMA_TENSOR_UTIL",
    1014: "HMMA_TENSOR_UTIL",
    1015: "DFMA_TENSOR_UTIL",
    1016: "INTEGER_UTIL",
}


def test_ids_and_names_are_unique() -> None:
    assert len(BY_ID) == len(FIELDS) == len(BY_NAME)
    assert len({f.native for f in FIELDS}) == len(FIELDS)


@pytest.mark.parametrize("field_id", sorted(_GPM_NAMES))
def test_gpm_metric_ids_are_the_nvml_constants(field_id: int) -> None:
    """Each DCP field reads the GPM metric DCGM maps it to (reference/telemetry.md §2)."""
    source = BY_ID[field_id].source
    assert isinstance(source, Gpm)
    assert source.metric_id == getattr(pynvml, f"NVML_GPM_METRIC_{_GPM_NAMES[field_id]}")


def test_physical_fields_are_gpu_level_only() -> None:
    """PCIe, NVLink, power, temperature and clocks exist once per physical GPU (fact 4)."""
    for name in (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    ):
        assert BY_NAME[name].level is Level.GPU, name
    assert BY_NAME["DCGM_FI_PROF_DRAM_ACTIVE"].level is Level.GPU_I
    assert BY_NAME["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].level is Level.GPU_CI
    assert BY_NAME["DCGM_FI_DEV_FB_USED"].level is Level.GPU_I


def test_rates_are_gauges_and_accumulators_are_counters() -> None:
    """Fact 2: bandwidth and bytes/s values are gauges; energy and error totals count up."""
    for name in ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_PROF_PCIE_TX_BYTES"):
        assert BY_NAME[name].kind is Kind.GAUGE
    for name in (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ):
        assert BY_NAME[name].kind is Kind.COUNTER


def test_native_names_follow_prometheus_conventions() -> None:
    for f in FIELDS:
        if f.kind is Kind.LABEL:
            assert re.fullmatch(r"[a-z_]+", f.native)
            continue
        assert re.fullmatch(r"gpu_agent_[a-z0-9_]+", f.native), f.native
        assert not f.native.endswith("_total"), "the client appends _total to counters"
        if f.unit in ("%", "ratio"):
            assert f.native.endswith("_ratio"), f.native
        if f.unit in ("MiB", "KB/s", "KiB/s", "bytes/s"):
            assert "_bytes" in f.native, f.native


@pytest.mark.parametrize(
    ("name", "raw", "dcgm", "base"),
    [
        ("DCGM_FI_DEV_POWER_USAGE", 312_500, 312.5, 312.5),  # mW -> W
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 9_876_543, 9_876_543, 9_876.543),  # mJ -> J
        ("DCGM_FI_DEV_SM_CLOCK", 1980, 1980, 1.98e9),  # MHz -> Hz
        ("DCGM_FI_DEV_FB_USED", 3 * 1024**3, 3072, 3 * 1024**3),  # bytes -> MiB -> bytes
        ("DCGM_FI_DEV_GPU_UTIL", 42, 42, 0.42),  # % -> ratio
        ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 1000, 1000, 1_024_000),  # KB/s -> bytes/s
        ("DCGM_FI_DEV_POWER_VIOLATION", 2_500_000_000, 2_500_000_000, 2.5),  # ns -> s
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 37.5, 0.375, 0.375),  # GPM % -> ratio
        ("DCGM_FI_PROF_PCIE_TX_BYTES", 1500.0, 1500 * 1024**2, 1500 * 1024**2),  # MiB/s
    ],
)
def test_unit_conversions_are_exact(name: str, raw: float, dcgm: float, base: float) -> None:
    field = BY_NAME[name]
    assert isinstance(field.source, Nvml | Gpm)
    value = field.source.scale(raw)
    assert value == dcgm
    assert field.to_base(value) == base


def test_scale_keeps_percent_exact() -> None:
    """Multiplying by 0.01 would give 0.42000000000000004; dividing by 100 gives 0.42."""
    assert Scale(div=100)(42) == 0.42


def test_close_matches_suggests_spellings() -> None:
    assert close_matches("DCGM_FI_DEV_GPU_TEMPERATURE")[0] == "DCGM_FI_DEV_GPU_TEMP"
    assert close_matches("DCGM_FI_DEV_CLOCK_EVENT_REASONS")[0] == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"


def test_docs_list_every_field_with_its_native_name() -> None:
    docs = (Path(__file__).parents[3] / "docs" / "metrics.md").read_text()
    for f in FIELDS:
        assert f"`{f.name}`" in docs, f.name
        assert f.native in docs, f.native
