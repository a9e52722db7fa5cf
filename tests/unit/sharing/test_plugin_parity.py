"""Our verdict on k8s-device-plugin config files matches the plugin's, case by case.

The cases (tests/fixtures/device-plugin-configs/cases.yaml) are the plugin's own config tests
rewritten as whole files, plus what its reader does with the values they leave out. Where we
refuse what the plugin would silently ignore (per-GPU ``devices``, ``rename``), the fixture says
so and why; everywhere else the verdicts are the same, and a refusal names the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.errors import InvalidSpec
from agent.gpu.types import GpuLayout
from agent.sharing import parse
from agent.sharing.flagtypes import parse_go_duration
from agent.sharing.validate import violations
from tests.unit.sharing.layouts import full_gpu, mig_gpu

CASES = yaml.safe_load(
    (Path(__file__).parents[2] / "fixtures" / "device-plugin-configs" / "cases.yaml").read_text()
)["cases"]


def layouts(case: dict[str, object]) -> list[GpuLayout]:
    # MPS runs on full GPUs only; the other cases use a node with one full and one MIG GPU.
    if "mps:" in str(case["config"]):
        return [full_gpu(0), full_gpu(1)]
    return [full_gpu(0), mig_gpu(1, "1g.10gb", "1g.10gb")]


def verdict(config: str, on: list[GpuLayout]) -> dict[str, str]:
    """The fields we refuse (empty: accepted), from parsing and the rules alike."""
    try:
        parsed = parse(config)
    except InvalidSpec as exc:
        return {v.field: v.description for v in exc.violations}
    return {v.field: v.description for v in violations(parsed, on)}


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_our_verdict_matches_the_plugins(case: dict[str, object]) -> None:
    expected = case.get("ours", case["plugin"])
    if "ours" in case:
        assert case["why"], "a deliberate difference says why"
    found = verdict(str(case["config"]), layouts(case))
    assert ("refuse" if found else "accept") == expected, found
    if expected == "refuse":
        assert case["field"] in found, found


def test_the_fixtures_cover_the_plugins_test_files() -> None:
    sources = {str(c["from"]).split(" ")[0] for c in CASES}
    for test in (
        "TestUnmarshalFlags",
        "TestNewConfigDefaultsMPSFailRequestsGreaterThanOne",
        "TestUnmarshalReplicatedResources",
        "TestUnmarshalReplicatedResource",
        "TestUnmarshalReplicatedDevices",
        "TestImexUnmarshal",
    ):
        assert test in sources


def test_a_refused_flag_says_what_the_plugin_expects() -> None:
    found = verdict("flags: {gfd: {sleepInterval: 1 minute}}", [full_gpu(0)])
    message = found["flags.gfd.sleepInterval"]
    assert "a Go duration such as 30s" in message
    assert "unknown unit ' minute'" in message
    assert "does not start" in message
    found = verdict('flags: {failOnInitError: "false"}', [full_gpu(0)])
    assert found["flags.failOnInitError"].startswith("must be true or false (a YAML boolean")


@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        ("0", 0),
        ("-0", 0),
        ("1.5h", 5400 * 10**9),
        ("1h30m", 5400 * 10**9),
        ("300ms", 300 * 10**6),
        ("-1.5s", -1500 * 10**6),
        ("1\u03bcs1ns", 1001),
        ("2562047h47m16.854775807s", 2**63 - 1),
    ],
)
def test_go_durations_read_as_go_reads_them(text: str, nanoseconds: int) -> None:
    assert parse_go_duration(text) == nanoseconds


@pytest.mark.parametrize("text", ["", "1", "s", ".s", "1.5", "1h 2m", "1H", "+", "2562048h"])
def test_strings_go_refuses_as_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_go_duration(text)
