"""dcgm-exporter counters CSVs parse like dcgm-exporter reads them, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import InvalidSpec
from dcgm.counters import load_counters, parse_counters
from dcgm.fields import Kind

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
DCGM_FI_PROF_PCIE_TX_BYTES, gauge, "PCIe TX, headers included"
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


def test_rate_declared_counter_is_exported_as_gauge() -> None:
    """dcgm-exporter's CSV types NVLink bandwidth as counter; it is a rate (fact 2)."""
    counter = parse_counters(_EXPORTER_STYLE).counters[2]
    assert counter.declared == "counter"
    assert counter.field.kind is Kind.GAUGE
    assert counter.retyped


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
    with pytest.raises(InvalidSpec, match=r"cannot read counters CSV .*nope\.csv"):
        load_counters(tmp_path / "nope.csv")


def test_unknown_field_names_line_and_suggests() -> None:
    problems = _problems("# c\nDCGM_FI_DEV_GPU_TEMPERATURE, gauge, t\n")
    assert problems == [
        (
            "c.csv:2",
            "unknown DCGM field 'DCGM_FI_DEV_GPU_TEMPERATURE'; did you mean DCGM_FI_DEV_GPU_TEMP? "
            "(supported fields: docs/metrics.md)",
        )
    ]


def test_exporter_computed_field_points_to_the_xid_counter() -> None:
    ((where, text),) = _problems("DCGM_EXP_XID_ERRORS_COUNT, gauge, x\n")
    assert where == "c.csv:1"
    assert "computed inside dcgm-exporter" in text
    assert "gpu_agent_xid_errors_total" in text


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
    assert [where for where, _ in problems] == ["c.csv:2", "c.csv:3", "c.csv:4"]
    assert problems[1][1] == "DCGM_FI_DEV_GPU_TEMP is already listed on line 1"


def test_a_file_of_comments_selects_nothing_and_is_rejected() -> None:
    assert _problems("# nothing\n\n") == [("c.csv", "selects no fields: every line is a comment")]


def test_empty_help_falls_back_to_the_catalog() -> None:
    (counter,) = parse_counters('DCGM_FI_DEV_GPU_TEMP, gauge, ""\n').counters
    assert counter.help == "GPU temperature."
