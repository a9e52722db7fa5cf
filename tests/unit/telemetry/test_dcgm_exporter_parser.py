"""Counters CSVs get dcgm-exporter's verdict: what it starts with, we start with (serving what we
can and reporting the rest unserved); what stops it, stops us. The few deliberate differences are
listed in the fixture, each with its reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.errors import InvalidSpec
from dcgm.catalog import catalogue
from dcgm.counters import parse_counters

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parents[2] / "fixtures" / "dcgm-exporter-parser.yaml").read_text()
)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_verdict_matches_dcgm_exporter_or_a_listed_difference(case: dict[str, Any]) -> None:
    assert (case["ours"] == case["dcgm_exporter"]) == ("difference" not in case)
    if case["ours"] == "refuse":
        with pytest.raises(InvalidSpec):
            parse_counters(case["csv"], source="c.csv")
        return
    counters = parse_counters(case["csv"], source="c.csv")
    assert [c.name for c in counters.counters] == case.get("served", [])
    assert [u.name for u in counters.unserved] == case.get("unserved", [])
    if "help" in case:
        assert [c.help for c in counters.counters] == case["help"]
    for unserved in counters.unserved:
        assert unserved.reason  # every unserved field says why


def test_every_name_dcgm_knows_starts_the_agent() -> None:
    """All of DCGM 4.6's field names, current and deprecated, in one CSV: no refusal."""
    rows = [
        f"{name}, {'label' if f.type == 'string' else 'gauge'}, x"
        for f in catalogue().fields
        for name in (f.name, *f.aliases)
    ]
    assert len(rows) > 900
    counters = parse_counters("\n".join(rows) + "\n", source="all.csv")
    taken = len(counters.counters) + len(counters.unserved)
    assert taken == len(catalogue().fields)  # each field once; its other names are noted repeats
    assert len(counters.notes) == len(rows) - taken


def test_dcgm_46_names_of_served_fields_are_served_under_the_rows_name() -> None:
    (temp, reasons) = parse_counters(
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, t\nDCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, r\n"
    ).counters
    assert temp.field.id == 150 and temp.name == "DCGM_FI_DEV_GPU_TEMP_CELSIUS"
    assert reasons.field.name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
    assert reasons.name == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("DCGM_FI_DEV_NVSWITCH_LINK_CRC_ERRORS", "NVSwitch"),
        ("DCGM_FI_DEV_CPU_UTIL_TOTAL", "Grace CPU"),
        ("DCGM_FI_DEV_VGPU_TYPE", "vGPU"),
        ("DCGM_FI_DEV_ACCOUNTING_DATA", "binary"),
        ("DCGM_FI_DEV_FB_USED_PERCENT", "no NVML reading"),
    ],
)
def test_an_unserved_field_says_why(name: str, reason: str) -> None:
    (unserved,) = parse_counters(f"{name}, gauge, x\n").unserved
    assert reason in unserved.reason
