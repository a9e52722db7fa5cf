"""Our verdict on mig-parted config entries and device-filter spellings matches mig-parted's.

The cases (tests/fixtures/mig-parted-parity/cases.yaml) are mig-parted's own tests rewritten,
plus the spellings its parser (Go's strconv.ParseUint) takes or refuses beyond them. A refusal
names its field and never escapes as anything but InvalidSpec.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.errors import InvalidSpec
from agent.mig.node_plan import check_layouts, plan_layouts
from agent.mig.spec import parse_filter, parse_spec, select_gpus
from agent.wire.node import gpu_pb, layout_from
from tests.unit.mig.layouts import make_layout
from tests.unit.sharing.layouts import full_gpu

CASES = yaml.safe_load(
    (Path(__file__).parents[2] / "fixtures" / "mig-parted-parity" / "cases.yaml").read_text()
)


def ids(kind: str) -> list[str]:
    return [c["id"] for c in CASES[kind]]


def one_entry(entry: dict[str, Any]) -> str:
    return yaml.safe_dump({"version": "v1", "mig-configs": {"c": [entry]}})


@pytest.mark.parametrize("case", CASES["filters"], ids=ids("filters"))
def test_a_filter_spelling_gets_mig_parteds_verdict(case: dict[str, Any]) -> None:
    text = one_entry({"device-filter": case["filter"], "devices": "all", "mig-enabled": False})
    if case["verdict"] == "refuse":
        with pytest.raises(InvalidSpec) as info:
            parse_spec(text)
        [violation] = info.value.violations
        assert violation.field == "mig-configs.c[0].device-filter"
        assert "expected '0xDDDDVVVV' or '0xDDDDVVVV:0xSSSSVVVV'" in violation.description
        return
    [entry] = parse_spec(text).select("c")[1]
    [parsed] = entry.device_filter
    assert (parsed.device_id, parsed.subsystem_id) == (case["device"], case.get("subsystem"))


@pytest.mark.parametrize("case", CASES["matches"], ids=ids("matches"))
def test_a_filter_matches_the_gpus_mig_parted_matches(case: dict[str, Any]) -> None:
    gpu = dataclasses.replace(
        full_gpu(0).gpu, pci_device_id=case["device"], pci_subsystem_id=case["subsystem"]
    )
    assert parse_filter(case["filter"]).matches(gpu) is case["match"]


def ours(case: dict[str, Any]) -> str:
    """Our verdict: mig-parted's, or the listed difference's."""
    assert ("ours" in case) == ("difference" in case)
    return str(case.get("ours", case["verdict"]))


@pytest.mark.parametrize("case", CASES["entries"], ids=ids("entries"))
def test_an_entry_gets_mig_parteds_verdict(case: dict[str, Any]) -> None:
    if ours(case) == "accept":
        parse_spec(one_entry(case["entry"]))
        return
    with pytest.raises(InvalidSpec) as info:
        parse_spec(one_entry(case["entry"]))
    fields = [v.field for v in info.value.violations]
    assert f"mig-configs.c[0].{case['field']}" in fields


@pytest.mark.parametrize("case", CASES["specs"], ids=ids("specs"))
def test_a_file_gets_mig_parteds_verdict(case: dict[str, Any]) -> None:
    if ours(case) == "refuse":
        with pytest.raises(InvalidSpec) as info:
            parse_spec(case["text"])
        assert case["field"] in [v.field for v in info.value.violations]
        return
    spec = parse_spec(case["text"])
    assert list(spec.names) == case["configs"]
    if not spec.names:  # then selecting fails, naming the selection, as in mig-parted
        for name in (None, "all-disabled"):
            with pytest.raises(InvalidSpec, match="selected mig-config not present") as info:
                spec.select(name, flag="config")
            assert [v.field for v in info.value.violations] == ["config"]


@pytest.mark.parametrize(
    "case", CASES["profiles"], ids=[repr(c["profile"]) for c in CASES["profiles"]]
)
def test_a_profile_name_gets_go_nvlibs_verdict(case: dict[str, Any]) -> None:
    text = one_entry({"devices": "all", "mig-enabled": True, "mig-devices": {case["profile"]: 1}})
    if case["verdict"] == "accept":
        parse_spec(text)
        return
    with pytest.raises(InvalidSpec) as info:
        parse_spec(text)
    fields = [v.field for v in info.value.violations]
    assert fields == [f"mig-configs.c[0].mig-devices.{case['profile']}"]


def test_a_profile_no_gpu_has_fails_its_config_when_planned_naming_it() -> None:
    """mig-parted reads a well-formed name (0g.0gb, 2c.1g.10gb) and fails only the config that
    uses it, when applied; the file's other configs still apply."""
    spec = parse_spec(
        "version: v1\nmig-configs:\n"
        "  sevens: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}]\n"
        "  zero: [{devices: all, mig-enabled: true, mig-devices: {0g.0gb: 1}}]\n"
        "  wide: [{devices: all, mig-enabled: true, mig-devices: {2c.1g.10gb: 1}}]\n"
        "  no-ci: [{devices: all, mig-enabled: true, mig-devices: {0c.1g.10gb: 1}}]\n"
    )
    layouts = [make_layout("H100-SXM5-80GB", [])]
    assert plan_layouts(spec, "sevens", layouts).changes
    for config, profile in (("zero", "0g.0gb"), ("wide", "2c.1g.10gb"), ("no-ci", "0c.1g.10gb")):
        with pytest.raises(InvalidSpec, match=profile) as info:
            plan_layouts(spec, config, layouts)
        assert [v.field for v in info.value.violations] == [
            f"mig-configs.{config}[0].mig-devices.{profile}"
        ]
        assert not check_layouts(spec, config, layouts).applied


def test_a_subsystem_filter_selects_the_same_gpus_through_the_api() -> None:
    """plan and assert read the node through the API (agent/wire/node.py), apply reads the
    driver: the subsystem id must survive the conversion, or the filter matches nothing there."""
    spec = parse_spec(
        one_entry(
            {"device-filter": "0x233010DE:0x16C110DE", "devices": "all", "mig-enabled": False}
        )
    )
    driver = [full_gpu(0), full_gpu(1)]
    through_api = [layout_from(gpu_pb(layout)) for layout in driver]
    assert through_api[0].gpu.pci_subsystem_id == 0x16C110DE
    entries = spec.select("c")[1]
    on_driver = [s.gpu.index for s in select_gpus(entries, [g.gpu for g in driver])]
    on_api = [s.gpu.index for s in select_gpus(entries, [g.gpu for g in through_api])]
    assert on_api == on_driver == [0, 1]


def test_a_checkpoint_of_an_instance_under_no_listed_constant_is_refused_not_a_crash() -> None:
    """`ProfileID` is the profile's NVML constant, found among the profiles the driver lists;
    an instance whose profile the list lacks (the driver answered NOT_SUPPORTED for its
    constant) raised a bare KeyError out of `mig checkpoint`. It is a refusal naming it."""
    from agent.errors import NotSupported
    from agent.mig.checkpoint import checkpoint_document
    from tests.unit.mig.layouts import make_layout

    layout = make_layout("A30", [("2g.12gb", 0)])
    listed = tuple(p for p in layout.profiles if p.name != "2g.12gb")
    with pytest.raises(NotSupported, match="under no profile constant"):
        checkpoint_document([dataclasses.replace(layout, profiles=listed)])
    assert checkpoint_document([layout])["MigState"]["Devices"][0]["GpuInstances"]
