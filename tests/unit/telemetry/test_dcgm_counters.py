"""dcgm-exporter counters CSVs parse like dcgm-exporter reads them, with clear errors."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from agent.errors import InvalidSpec
from dcgm.counters import DEFAULT_COUNTERS, load_counters, parse_counters
from dcgm.fields import BY_NAME, Kind

# Shaped like dcgm-exporter's own CSVs: "# Format,," comments, padding, a space before a comma,
# rate fields declared as counters.
_EXPORTER_STYLE = """\
# Format,,
# If line starts with a '#' it is considered a comment,,
# DCGM FIELD, Prometheus metric type, help message

DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock (in MHz).
DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,            counter, NVLink bandwidth for all lanes
DCGM_FI_DRIVER_VERSION,        label, Driver Version
DCGM_FI_PROF_PCIE_TX_BYTES, gauge,"PCIe TX, headers included"
"""


def _problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(InvalidSpec) as info:
        parse_counters(text, source="c.csv")
    return [(v.field, v.description) for v in info.value.violations]


def test_exporter_style_file_parses() -> None:
    counters = parse_counters(_EXPORTER_STYLE, source="c.csv")
    names = [c.field.name for c in counters.counters]
    assert names == [
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DRIVER_VERSION",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
    ]
    assert [c.line for c in counters.counters] == [5, 6, 7, 8, 9]
    assert counters.counters[4].help == "PCIe TX, headers included"
    assert [c.field.name for c in counters.labels] == ["DCGM_FI_DRIVER_VERSION"]
    assert len(counters.values) == 4


def test_rate_declared_counter_is_exported_as_the_counter_it_is_declared() -> None:
    """dcgm-exporter's CSV types NVLink bandwidth as counter; it is a rate (fact 2). Under DCGM
    names the row's type wins, as in dcgm-exporter; the mismatch is noted for the log."""
    counter = parse_counters(_EXPORTER_STYLE).counters[2]
    assert counter.declared == "counter"
    assert counter.field.kind is Kind.GAUGE
    assert counter.exported_kind is Kind.COUNTER
    assert counter.mistyped


def test_default_file_selects_every_dashboard_and_issue_field() -> None:
    names = {c.field.name for c in load_counters().counters}
    for required in (
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DRIVER_VERSION",
    ):
        assert required in names, required


def test_file_is_read_from_disk(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, temp\n")
    counters = load_counters(path)
    assert counters.source == str(path)
    assert [c.field.name for c in counters.counters] == ["DCGM_FI_DEV_GPU_TEMP"]


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match=r"counters CSV .*nope\.csv does not exist"):
        load_counters(tmp_path / "nope.csv")


def test_unknown_field_names_line_and_suggests() -> None:
    problems = _problems("# c\nDCGM_FI_DEV_GPU_TEMPERATURE, gauge, t\n")
    assert problems == [
        (
            "c.csv:2",
            "unknown DCGM field 'DCGM_FI_DEV_GPU_TEMPERATURE'; did you mean DCGM_FI_DEV_GPU_TEMP"
            " or DCGM_FI_DEV_GPU_PSTATE or DCGM_FI_DEV_GPU_TEMP_CELSIUS? (DCGM's fields:"
            " dcgm/dcgm-catalog.tsv; served: docs/metrics.md)",
        )
    ]


def test_an_exporter_field_it_does_not_know_is_named_as_such() -> None:
    ((where, text),) = _problems("DCGM_EXP_XID_ERRORS_COUNTXXX, gauge, x\n")
    assert where == "c.csv:1"
    assert text.startswith(
        "unknown dcgm-exporter field 'DCGM_EXP_XID_ERRORS_COUNTXXX'; "
        "did you mean DCGM_EXP_XID_ERRORS_COUNT?"
    )


#: Every row (field, declared type) of dcgm-exporter's shipped CSVs (etc/ at d5e5f51), commented
#: rows included: the facts, without its help texts.
SHIPPED: dict[str, tuple[tuple[str, str], ...]] = {
    "default-counters.csv": (
        ("DCGM_FI_DEV_SM_CLOCK", "gauge"),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge"),
        ("DCGM_FI_DEV_MEMORY_TEMP", "gauge"),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", "counter"),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", "counter"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"),
        ("DCGM_FI_DEV_ENC_UTIL", "gauge"),
        ("DCGM_FI_DEV_DEC_UTIL", "gauge"),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
        ("DCGM_FI_DEV_POWER_VIOLATION", "counter"),
        ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter"),
        ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "counter"),
        ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter"),
        ("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "counter"),
        ("DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter"),
        ("DCGM_EXP_CLOCK_EVENTS_COUNT", "counter"),
        ("DCGM_EXP_XID_ERRORS_COUNT", "counter"),
        ("DCGM_EXP_GPU_HEALTH_STATUS", "counter"),
        ("DCGM_EXP_P2P_STATUS", "counter"),
        ("DCGM_FI_DEV_FB_FREE", "gauge"),
        ("DCGM_FI_DEV_FB_USED", "gauge"),
        ("DCGM_FI_DEV_FB_RESERVED", "gauge"),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter"),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter"),
        ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter"),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter"),
        ("DCGM_FI_DEV_RETIRED_SBE", "counter"),
        ("DCGM_FI_DEV_RETIRED_DBE", "counter"),
        ("DCGM_FI_DEV_RETIRED_PENDING", "counter"),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", "counter"),
        ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge"),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
        ("DCGM_FI_DRIVER_VERSION", "label"),
        ("DCGM_FI_NVML_VERSION", "label"),
        ("DCGM_FI_DEV_BRAND", "label"),
        ("DCGM_FI_DEV_SERIAL", "label"),
        ("DCGM_FI_DEV_OEM_INFOROM_VER", "label"),
        ("DCGM_FI_DEV_ECC_INFOROM_VER", "label"),
        ("DCGM_FI_DEV_POWER_INFOROM_VER", "label"),
        ("DCGM_FI_DEV_INFOROM_IMAGE_VER", "label"),
        ("DCGM_FI_DEV_VBIOS_VERSION", "label"),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_SM_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge"),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge"),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge"),
    ),
    "dcp-metrics-included.csv": (
        ("DCGM_FI_DEV_SM_CLOCK", "gauge"),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge"),
        ("DCGM_FI_DEV_MEMORY_TEMP", "gauge"),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", "counter"),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", "counter"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"),
        ("DCGM_FI_DEV_ENC_UTIL", "gauge"),
        ("DCGM_FI_DEV_DEC_UTIL", "gauge"),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
        ("DCGM_FI_DEV_POWER_VIOLATION", "counter"),
        ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter"),
        ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "counter"),
        ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter"),
        ("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "counter"),
        ("DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter"),
        ("DCGM_FI_DEV_FB_FREE", "gauge"),
        ("DCGM_FI_DEV_FB_USED", "gauge"),
        ("DCGM_FI_DEV_FB_RESERVED", "gauge"),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter"),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter"),
        ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter"),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter"),
        ("DCGM_FI_DEV_RETIRED_SBE", "counter"),
        ("DCGM_FI_DEV_RETIRED_DBE", "counter"),
        ("DCGM_FI_DEV_RETIRED_PENDING", "counter"),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", "counter"),
        ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge"),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
        ("DCGM_FI_DRIVER_VERSION", "label"),
        ("DCGM_FI_NVML_VERSION", "label"),
        ("DCGM_FI_DEV_BRAND", "label"),
        ("DCGM_FI_DEV_SERIAL", "label"),
        ("DCGM_FI_DEV_OEM_INFOROM_VER", "label"),
        ("DCGM_FI_DEV_ECC_INFOROM_VER", "label"),
        ("DCGM_FI_DEV_POWER_INFOROM_VER", "label"),
        ("DCGM_FI_DEV_INFOROM_IMAGE_VER", "label"),
        ("DCGM_FI_DEV_VBIOS_VERSION", "label"),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_SM_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge"),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge"),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge"),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge"),
    ),
    "1.x-compatibility-metrics.csv": (
        ("dcgm_sm_clock", "gauge"),
        ("dcgm_memory_clock", "gauge"),
        ("dcgm_memory_temp", "gauge"),
        ("dcgm_gpu_temp", "gauge"),
        ("dcgm_power_usage", "gauge"),
        ("dcgm_total_energy_consumption", "counter"),
        ("dcgm_fi_prof_pcie_tx_bytes", "counter"),
        ("dcgm_fi_prof_pcie_rx_bytes", "counter"),
        ("dcgm_pcie_replay_counter", "counter"),
        ("dcgm_gpu_utilization", "gauge"),
        ("dcgm_mem_copy_utilization", "gauge"),
        ("dcgm_enc_utilization", "gauge"),
        ("dcgm_dec_utilization", "gauge"),
        ("dcgm_xid_errors", "gauge"),
        ("dcgm_power_violation", "counter"),
        ("dcgm_thermal_violation", "counter"),
        ("dcgm_sync_boost_violation", "counter"),
        ("dcgm_board_limit_violation", "counter"),
        ("dcgm_low_util_violation", "counter"),
        ("dcgm_reliability_violation", "counter"),
        ("dcgm_fb_free", "gauge"),
        ("dcgm_fb_used", "gauge"),
        ("dcgm_ecc_sbe_volatile_total", "counter"),
        ("dcgm_ecc_dbe_volatile_total", "counter"),
        ("dcgm_ecc_sbe_aggregate_total", "counter"),
        ("dcgm_ecc_dbe_aggregate_total", "counter"),
        ("dcgm_retired_pages_sbe", "counter"),
        ("dcgm_retired_pages_dbe", "counter"),
        ("dcgm_retired_pages_pending", "counter"),
        ("dcgm_nvlink_flit_crc_error_count_total", "counter"),
        ("dcgm_nvlink_data_crc_error_count_total", "counter"),
        ("dcgm_nvlink_replay_error_count_total", "counter"),
        ("dcgm_nvlink_recovery_error_count_total", "counter"),
        ("dcgm_nvlink_bandwidth_total", "counter"),
        ("dcgm_fi_prof_gr_engine_active", "gauge"),
        ("dcgm_fi_prof_sm_active", "gauge"),
        ("dcgm_fi_prof_sm_occupancy", "gauge"),
        ("dcgm_fi_prof_pipe_tensor_active", "gauge"),
        ("dcgm_fi_prof_dram_active", "gauge"),
        ("dcgm_fi_prof_pcie_tx_bytes", "counter"),
        ("dcgm_fi_prof_pcie_rx_bytes", "counter"),
    ),
}


@pytest.mark.parametrize("csv_name", sorted(SHIPPED))
def test_every_row_of_dcgm_exporters_shipped_csvs_is_accepted(csv_name: str) -> None:
    """Commented rows enabled too: DCGM_EXP_*, label fields, NVLINK_BANDWIDTH_L0, 1.x names."""
    rows = SHIPPED[csv_name]
    text = "".join(f"{name}, {kind}, help\n" for name, kind in rows)
    counters = parse_counters(text, source=csv_name)
    taken = {c.name for c in counters.counters}
    noted = {n.split(": ")[1].split(" ")[0] for n in counters.notes}
    assert {name for name, _ in rows} == taken  # repeats (the 1.x PCIe bytes) are taken once
    assert noted <= taken


def test_a_legacy_row_is_exported_under_its_own_name() -> None:
    (counter,) = parse_counters("dcgm_gpu_temp, gauge, t\n").counters
    assert counter.field.name == "DCGM_FI_DEV_GPU_TEMP" and counter.name == "dcgm_gpu_temp"


def test_a_repeated_field_is_taken_once_with_a_note() -> None:
    counters = parse_counters("DCGM_FI_DEV_GPU_TEMP, gauge, t\ndcgm_gpu_temp, gauge, t\n", "c.csv")
    assert [c.line for c in counters.counters] == [1]
    assert counters.notes == ("c.csv:2: dcgm_gpu_temp is already listed on line 1; ignored",)


_COLUMNS = "expected 3 comma-separated columns (DCGM field, type, help)"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "DCGM_FI_DEV_GPU_TEMP, gage, t",
            "unknown type 'gage' for DCGM_FI_DEV_GPU_TEMP; allowed: gauge, counter, label",
        ),
        (
            "DCGM_FI_DEV_GPU_TEMP, histogram, t",
            "DCGM_FI_DEV_GPU_TEMP is one value per sample; type histogram does not apply"
            " (use gauge)",
        ),
        ("DCGM_FI_DEV_GPU_TEMP, label, t", "DCGM_FI_DEV_GPU_TEMP is numeric: use gauge, not label"),
        (
            "DCGM_FI_DRIVER_VERSION, gauge, v",
            "DCGM_FI_DRIVER_VERSION is a string: its type must be label",
        ),
        ("DCGM_FI_DEV_GPU_TEMP, gauge", f"{_COLUMNS}, got 2: 'DCGM_FI_DEV_GPU_TEMP,gauge'"),
        (
            "DCGM_FI_DEV_GPU_TEMP, gauge, a, b",
            f"{_COLUMNS}, got 4: 'DCGM_FI_DEV_GPU_TEMP,gauge,a,b'",
        ),
    ],
)
def test_bad_rows_are_named(row: str, message: str) -> None:
    assert _problems(row + "\n") == [("c.csv:1", message)]


def test_every_problem_is_reported_at_once() -> None:
    text = (
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
        "NOPE, gauge, x\n"
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
        "DCGM_FI_DEV_SM_CLOCK, foo, c\n"
    )
    problems = _problems(text)
    assert [where for where, _ in problems] == ["c.csv:2", "c.csv:4"]


def test_a_file_of_comments_selects_nothing_and_is_rejected() -> None:
    assert _problems("# nothing\n\n") == [("c.csv", "selects no fields: every line is a comment")]


def test_empty_help_falls_back_to_the_catalog() -> None:
    for empty in ("", '""'):
        (counter,) = parse_counters(f"DCGM_FI_DEV_GPU_TEMP, gauge,{empty}\n").counters
        assert counter.help == "GPU temperature."


@pytest.mark.parametrize(
    "row",
    [
        'DCGM_FI_PROF_PCIE_TX_BYTES, gauge, "PCIe TX, headers included"',  # space before the quote
        'DCGM_FI_DEV_GPU_TEMP, gauge, 5" wide',
        'DCGM_FI_DEV_GPU_TEMP, gauge,"hot" indeed',
        'DCGM_FI_DEV_GPU_TEMP, gauge,"unclosed',
        'DCGM_FI_PROF_PCIE_TX_BYTES, gauge,"PCIe TX, headers included" ',  # space after it
        '  "DCGM_FI_PROF_PCIE_TX_BYTES", gauge, PCIe TX',  # indented opening quote
    ],
)
def test_quoting_dcgm_exporter_refuses_is_refused_naming_the_line(row: str) -> None:
    """Go's encoding/csv (dcgm-exporter's reader) quotes a column only from its first
    character; any other quote stops it, and stops us with the line and the fix."""
    text = f"# c\nDCGM_FI_DEV_SM_CLOCK, gauge, c\n{row}\nNOPE, gauge, x\n"
    (quoting, unknown) = _problems(text)
    assert quoting[0] == "c.csv:3" and "with no space between" in quoting[1]
    assert unknown[0] == "c.csv:4"  # the other problems are still reported at once


def test_a_quoted_help_over_two_lines_is_one_problem_on_the_line_that_opens_it() -> None:
    """dcgm-exporter reads on to the closing quote; a line break in a help breaks its # HELP."""
    text = 'DCGM_FI_PROF_PCIE_TX_BYTES, gauge,"PCIe TX,\nheaders included"\nNOPE, gauge, x\n'
    (quoting, unknown) = _problems(text)
    assert quoting[0] == "c.csv:1" and "must close on its own line" in quoting[1]
    assert unknown[0] == "c.csv:3"  # the help's second line is no row of its own


def test_a_quoted_help_with_a_doubled_quote_keeps_one() -> None:
    (counter,) = parse_counters('DCGM_FI_DEV_GPU_TEMP, gauge,"5"" wide, hot"\n').counters
    assert counter.help == '5" wide, hot'


@pytest.mark.parametrize("declared", ["gage", "histogram", "label", "Summary"])
def test_the_type_of_a_dcgm_exporter_field_is_not_checked_like_dcgm_exporter(
    declared: str,
) -> None:
    """dcgm-exporter takes its DCGM_EXP_* rows without looking at the type column; we load the
    file too and export the field's own type (a TYPE line Prometheus can parse), with a note."""
    counters = parse_counters(f"DCGM_EXP_XID_ERRORS_COUNT, {declared}, x\n", source="c.csv")
    (counter,) = counters.counters
    assert counter.exported_kind is Kind.GAUGE
    assert counters.notes == (
        f"c.csv:1: dcgm-exporter ignores the type of its own field DCGM_EXP_XID_ERRORS_COUNT; "
        f"{declared.lower()!r} exported as gauge",
    )


def test_the_default_files_help_names_each_fields_own_unit() -> None:
    """The help text of the shipped counters CSV is the series' HELP (what Prometheus and
    Grafana show): a unit it names is the unit the value is in, on its enabled rows and on the
    commented ones a user enables. DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL said "(in KiB/s)" while
    its value is DCGM's MB/s of 1000 KiB, so a reader scaled it 1000 times too low."""
    text = resources.files("dcgm").joinpath(DEFAULT_COUNTERS).read_text(encoding="utf-8")
    named = 0
    for line in text.splitlines():
        row = re.fullmatch(r"#?\s*(DCGM_\w+)\s*,\s*\w+\s*,\s*(.*)", line.strip())
        unit = re.search(r"\(in (\S+?)[\s)]", row.group(2)) if row else None
        if row and unit and row.group(1) in BY_NAME:
            named += 1
            assert unit.group(1) == BY_NAME[row.group(1)].unit, line
    assert named > 20
