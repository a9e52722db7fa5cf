"""mig-parted v1 config files: the rules of reference/mig.md §3.1, with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.errors import InvalidSpec
from agent.mig.spec import (
    ALL,
    DeviceFilter,
    ExportedGpu,
    export_document,
    load_spec,
    parse_spec,
    select_gpus,
)
from tests.unit.mig.layouts import make_layout

OPERATOR_CONFIG = Path(__file__).with_name("gpu-operator-default-mig-config.yaml")


def _fields(text: str) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(text)
    return {v.field: v.description for v in info.value.violations}


def test_operator_default_config_loads_unchanged() -> None:
    """The GPU Operator's default config parses with its names, filters and counts intact."""
    spec = load_spec(OPERATOR_CONFIG)
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.10gb"} <= set(spec.names)
    _, entries = spec.select("all-1g.10gb")
    assert [dict(e.mig_devices) for e in entries] == [{"1g.10gb": 7}, {"1g.10gb": 4}]
    assert DeviceFilter(0x20B010DE) in entries[1].device_filter
    _, (disabled,) = spec.select("all-disabled")
    assert disabled.devices == ALL and not disabled.mig_enabled and dict(disabled.mig_devices) == {}
    _, (enabled,) = spec.select("all-enabled")
    assert enabled.mig_enabled and dict(enabled.mig_devices) == {}


def test_version_is_required_and_must_be_v1() -> None:
    assert "version" in _fields("mig-configs: {a: [{devices: all, mig-enabled: false}]}")
    assert (
        "unknown version: v2"
        in _fields("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}")["version"]
    )


def test_unknown_keys_are_rejected_at_every_level() -> None:
    bad = _fields(
        "version: v1\nextra: 1\nmig-configs:\n  a:\n"
        "    - {devices: all, mig-enabled: false, gpus: 3}\n"
    )
    assert "unexpected field: extra" in bad["extra"]
    assert "unexpected field: gpus" in bad["mig-configs.a[0].gpus"]


def test_configs_and_entries_may_not_be_empty() -> None:
    assert "mig-configs" in _fields("version: v1\nmig-configs: {}")
    assert (
        "at least one entry in 'a'" in _fields("version: v1\nmig-configs: {a: []}")["mig-configs.a"]
    )


def test_devices_and_mig_enabled_are_required() -> None:
    bad = _fields("version: v1\nmig-configs: {a: [{mig-devices: {}}]}")
    assert bad["mig-configs.a[0].devices"] == "missing required field: devices"
    assert bad["mig-configs.a[0].mig-enabled"] == "missing required field: mig-enabled"


def test_devices_is_all_or_a_list_of_indices_or_uuids() -> None:
    bad = _fields("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}")
    assert "invalid string input for 'devices': some" in bad["mig-configs.a[0].devices"]
    bad = _fields("version: v1\nmig-configs: {a: [{devices: [0, x1], mig-enabled: false}]}")
    assert "mig-configs.a[0].devices[1]" in bad
    spec = parse_spec(
        "version: v1\nmig-configs: {a: [{devices: [0, GPU-abc], mig-enabled: false}]}"
    )
    assert spec.select("a")[1][0].devices == (0, "GPU-abc")


def test_mig_devices_required_when_enabled_and_forbidden_when_disabled() -> None:
    bad = _fields("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}")
    assert "'mig-devices' when 'mig-enabled' is true" in bad["mig-configs.a[0].mig-devices"]
    bad = _fields(
        "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, "
        "mig-devices: {1g.5gb: 1}}]}"
    )
    assert "included when 'mig-enabled' is false" in bad["mig-configs.a[0].mig-devices"]


def test_counts_must_be_non_negative_and_not_all_zero() -> None:
    bad = _fields(
        "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
        "mig-devices: {1g.5gb: -1}}]}"
    )
    assert "invalid count" in bad["mig-configs.a[0].mig-devices.1g.5gb"]
    bad = _fields(
        "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
        "mig-devices: {1g.5gb: 0}}]}"
    )
    assert "all counts for all MigProfiles are 0" in bad["mig-configs.a[0].mig-devices"]


def test_profile_keys_must_parse() -> None:
    bad = _fields(
        "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
        "mig-devices: {3g.20: 1, 1g.5gb+me-x: 1}}]}"
    )
    assert set(bad) == {
        "mig-configs.a[0].mig-devices.3g.20",
        "mig-configs.a[0].mig-devices.1g.5gb+me-x",
    }


def test_profile_keys_are_normalised_and_zero_counts_dropped() -> None:
    spec = parse_spec(
        "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
        "mig-devices: {3c.3g.20gb: 1, 3g.20gb: 1, 1g.5gb: 0, 1c.3g.20gb: 3}}]}"
    )
    assert dict(spec.select("a")[1][0].mig_devices) == {"3g.20gb": 2, "1c.3g.20gb": 3}


def test_device_filter_is_a_string_or_list_with_optional_subsystem() -> None:
    spec = parse_spec(
        "version: v1\nmig-configs:\n  a:\n"
        "    - {device-filter: '0x20B010DE:0x134F10DE', devices: all, mig-enabled: false}\n"
        "    - {device-filter: ['0x20B210DE', '0x233010DE'], devices: all, mig-enabled: false}\n"
    )
    first, second = spec.select("a")[1]
    assert first.device_filter == (DeviceFilter(0x20B010DE, 0x134F10DE),)
    assert [str(f) for f in second.device_filter] == ["0x20B210DE", "0x233010DE"]
    bad = _fields(
        "version: v1\nmig-configs: {a: [{device-filter: 'A100', devices: all, mig-enabled: false}]}"
    )
    assert "invalid DeviceID format 'A100'" in bad["mig-configs.a[0].device-filter"]


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(
            "version: v1\nmig-configs:\n  a: [{devices: x, mig-enabled: 1}]\n"
            "  b: [{mig-enabled: true}]\n"
        )
    assert len(info.value.violations) == 4
    assert "(and 3 more)" in str(info.value)


def test_duplicate_keys_are_an_error_not_a_silent_override() -> None:
    with pytest.raises(InvalidSpec, match="duplicate key"):
        parse_spec(
            "version: v1\nmig-configs:\n  a: [{devices: all, mig-enabled: false}]\n  a: []\n"
        )


def test_select_needs_a_name_only_with_several_configs() -> None:
    one = parse_spec("version: v1\nmig-configs: {only: [{devices: all, mig-enabled: false}]}")
    assert one.select(None)[0] == "only"
    two = load_spec(OPERATOR_CONFIG)
    with pytest.raises(InvalidSpec, match="missing required flag 'selected-config'"):
        two.select(None)
    with pytest.raises(InvalidSpec, match="selected mig-config not present: nope") as info:
        two.select("nope")
    assert info.value.violations[0].field == "selected-config"


def test_an_unknown_config_is_named_with_a_few_names_and_the_near_ones_not_the_whole_file() -> None:
    """`mig generate-config` writes about 140 configs: the error listed every one twice (10 KB)."""
    many = parse_spec(
        "version: v1\nmig-configs:\n"
        + "".join(f"  layout-{i}: [{{devices: all, mig-enabled: false}}]\n" for i in range(140))
    )
    with pytest.raises(InvalidSpec) as info:
        many.select("layout-13x")
    message = str(info.value)
    assert "layout-0, layout-1, " in message and "and 132 more" in message
    assert "did you mean layout-13 " in message
    assert len(message) < 400 and len(info.value.violations[0].description) < 300
    with pytest.raises(InvalidSpec) as huge:
        many.select("x" * 100_000)
    assert len(str(huge.value)) < 500


def test_entries_apply_in_order_and_the_last_match_wins() -> None:
    spec = parse_spec(
        "version: v1\nmig-configs:\n  a:\n"
        "    - {devices: all, mig-enabled: true, mig-devices: {1g.5gb: 7}}\n"
        "    - {devices: [1], mig-enabled: false}\n"
    )
    gpus = [make_layout("A100-SXM4-40GB", index=i).gpu for i in range(3)]
    chosen = select_gpus(spec.select("a")[1], gpus)
    assert [(s.gpu.index, s.entry.mig_enabled) for s in chosen] == [
        (0, True),
        (1, False),
        (2, True),
    ]


def test_device_filter_and_uuid_select_gpus() -> None:
    a100 = make_layout("A100-SXM4-40GB", index=0).gpu
    h100 = make_layout("H100-SXM5-80GB", index=1).gpu
    spec = parse_spec(
        "version: v1\nmig-configs:\n  a:\n"
        "    - {device-filter: '0x233010DE', devices: all, mig-enabled: false}\n"
        f"    - {{devices: [{a100.uuid}], mig-enabled: false}}\n"
    )
    chosen = select_gpus(spec.select("a")[1], [a100, h100])
    assert {s.gpu.index: s.entry.path for s in chosen} == {
        0: "mig-configs.a[1]",
        1: "mig-configs.a[0]",
    }
    wrong_subsystem = DeviceFilter(0x233010DE, 0x12345678)
    assert not wrong_subsystem.matches(h100)
    assert DeviceFilter(0x233010DE, h100.pci_subsystem_id).matches(h100)


def test_export_merges_like_mig_parted() -> None:
    """Equal GPUs share one entry with ``devices: all``; filters only on mixed nodes."""
    same = [ExportedGpu(i, "0x20B010DE", True, {"1g.5gb": 7}) for i in range(4)]
    doc = export_document(same, "current")
    assert doc == {
        "version": "v1",
        "mig-configs": {
            "current": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}]
        },
    }
    mixed = [
        ExportedGpu(0, "0x20B210DE", True, {"3g.40gb": 2}),
        ExportedGpu(1, "0x20B210DE", False, {}),
        ExportedGpu(2, "0x233010DE", True, {"3g.40gb": 2}),
    ]
    entries = export_document(mixed, "now")["mig-configs"]["now"]
    assert entries == [
        {
            "device-filter": ["0x20B210DE", "0x233010DE"],
            "devices": [0, 2],
            "mig-enabled": True,
            "mig-devices": {"3g.40gb": 2},
        },
        {"device-filter": "0x20B210DE", "devices": [1], "mig-enabled": False, "mig-devices": {}},
    ]
    # What export writes parses back.
    assert parse_spec(yaml.safe_dump(export_document(mixed, "now"))).names == ("now",)


def test_a_profile_size_past_18_digits_is_refused_naming_it() -> None:
    """Any well-formed size loads (0g.0gb), as in mig-parted, but a size is at most 18 digits
    (go-nvlib's strconv.Atoi stops at 64 bits): a hostile 5000-digit size is refused, not int()."""
    key = "1" * 5000 + "g.5gb"
    bad = _fields(
        "version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: true\n"
        f"    mig-devices:\n      ? {key}\n      : 1\n      0g.0gb: 8\n"
    )
    assert "invalid MIG profile" in bad[f"mig-configs.a[0].mig-devices.{key}"]
    assert "invalid count for '0g.0gb': 8" in bad["mig-configs.a[0].mig-devices.0g.0gb"]


@pytest.mark.parametrize(
    "key",
    ["\u0661g.\u0665gb", "\uff101g.5gb", "1g.5\u0660gb", '"1g.5gb\\n"'],
    ids=["arabic-indic", "fullwidth-leading-zero", "arabic-indic-zero", "trailing-newline"],
)
def test_a_profile_with_digits_go_nvlib_would_not_read_is_refused(key: str) -> None:
    """go-nvlib reads sizes with strconv.Atoi, ASCII digits only; Python's \\d and int() take
    any script's digits (Arabic-Indic 1 and 5 were applied as 1g.5gb) and $ matched before a
    newline."""
    bad = _fields(
        "version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: true\n"
        f"    mig-devices:\n      {key}: 1\n"
    )
    assert any("invalid MIG profile" in said for said in bad.values()), bad
