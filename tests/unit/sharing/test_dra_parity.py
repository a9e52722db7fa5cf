"""Our verdict on NVIDIA DRA driver opaque configs matches the driver's, case by case.

The cases (tests/fixtures/dra-driver-configs/cases.yaml) are the driver's own API and webhook
tests rewritten as parameters, plus what its decoder, Normalize and Validate do with the values
they leave out. Where we differ (a config the driver panics on, a kind that is not sharing) the
fixture says so and why; a refusal names the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.errors import InvalidSpec
from agent.sharing import dra_api

FIXTURES = yaml.safe_load(
    (Path(__file__).parents[2] / "fixtures" / "dra-driver-configs" / "cases.yaml").read_text()
)
CASES: list[dict[str, Any]] = FIXTURES["configs"]
LIMITS: list[dict[str, Any]] = FIXTURES["pinned_limits"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_our_verdict_matches_the_drivers(case: dict[str, Any]) -> None:
    expected = case.get("ours", case["driver"])
    if "ours" in case:
        assert case["why"], "a deliberate difference says why"
    gates = case.get("gates", sorted(dra_api.SHARING_GATES))
    found = {v.field: v.description for v in dra_api.violations(case["parameters"], gates=gates)}
    assert ("refuse" if found else "accept") == expected, found
    if expected == "refuse":
        assert case["field"] in found, found


@pytest.mark.parametrize("case", LIMITS, ids=[c["id"] for c in LIMITS])
def test_pinned_memory_limits_normalize_as_the_drivers(case: dict[str, Any]) -> None:
    run = lambda: dra_api.normalize_pinned_limits(  # noqa: E731
        case.get("per_device", {}), case.get("uuids", []), case.get("default")
    )
    if "error" in case:
        with pytest.raises(InvalidSpec, match=case["error"]):
            run()
    else:
        assert run() == case["limits"]


def test_the_fixtures_cover_the_drivers_test_files() -> None:
    sources = {str(c["from"]).split(" ")[0] for c in CASES}
    assert "TestResourceClaimValidatingWebhook" in sources
    assert len(LIMITS) == 14  # every case of TestMpsPerDevicePinnedMemoryLimitNormalize


@pytest.mark.parametrize(
    ("text", "value"),
    [("1Gi", 1 << 30), ("10M", 10_000_000), ("1.5Ki", 1536), ("1e3", 1000), ("100m", 1), ("0", 0)],
)
def test_quantities_read_as_kubernetes_reads_them(text: str, value: int) -> None:
    assert dra_api.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1 Gi", "1GiB", "Gi", "1" * 65, "1e9999", "--1"])
def test_a_bad_quantity_is_refused_bounded(text: str) -> None:
    with pytest.raises(ValueError):
        dra_api.parse_quantity(text)


HOSTILE: list[object] = [
    None,
    [],
    "GpuConfig",
    {"apiVersion": dra_api.API_VERSION, "kind": ["GpuConfig"]},
    {"apiVersion": dra_api.API_VERSION, "kind": "GpuConfig", "sharing": []},
    {"apiVersion": dra_api.API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": {"a": 1}}},
    {
        "apiVersion": dra_api.API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": "Long"},
    },
    {
        "apiVersion": dra_api.API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": True}},
    },
    {
        "apiVersion": dra_api.API_VERSION,
        "kind": "MigDeviceConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultPerDevicePinnedMemoryLimit": {str(i): "1Ki" for i in range(2000)}
            },
        },
    },
]


@pytest.mark.parametrize("parameters", HOSTILE)
def test_hostile_parameters_are_refused_by_field_never_crash(parameters: object) -> None:
    """What `share show` reads back from the cluster may be anything a person wrote."""
    found = dra_api.violations(parameters)
    assert found and all(v.field.startswith("parameters") for v in found)
    assert len(found) <= 2001
