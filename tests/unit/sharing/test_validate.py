"""The sharing rules: each refusal names the field and the rule (reference/mig.md §5.1, §7.12)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.types import GpuLayout
from agent.sharing.schema import parse
from agent.sharing.validate import validate, violations
from tests.unit.sharing.layouts import full_gpu, mig_gpu, node


def check(doc: dict[str, object], layouts: Sequence[GpuLayout]) -> dict[str, str]:
    """field -> description of every violation."""
    return {v.field: v.description for v in violations(parse(doc), layouts)}


def ts(*resources: dict[str, object], strategy: str | None = None, **section: object) -> dict:
    doc: dict[str, object] = {"sharing": {"timeSlicing": {"resources": list(resources), **section}}}
    if strategy:
        doc["flags"] = {"migStrategy": strategy}
    return doc


def mps(*resources: dict[str, object], strategy: str | None = None) -> dict:
    doc: dict[str, object] = {"sharing": {"mps": {"resources": list(resources)}}}
    if strategy:
        doc["flags"] = {"migStrategy": strategy}
    return doc


GPU4 = {"name": "nvidia.com/gpu", "replicas": 4}


def test_plain_time_slicing_on_full_gpus_is_valid() -> None:
    validate(parse(ts(GPU4)), node(8))


def test_no_sharing_is_valid() -> None:
    validate(parse({}), node(2))


def test_replicas_below_two_are_refused() -> None:
    """The plugin refuses the file: "number of replicas must be >= 2"."""
    found = check(ts({"name": "gpu", "replicas": 1}), node(1))
    assert list(found) == ["sharing.timeSlicing.resources[0].replicas"]
    assert ">= 2" in found["sharing.timeSlicing.resources[0].replicas"]


def test_zero_and_negative_replicas_are_refused_for_mps_too() -> None:
    found = check(mps({"name": "gpu", "replicas": 0}), node(1))
    assert list(found) == ["sharing.mps.resources[0].replicas"]


def test_empty_resources_are_refused() -> None:
    """The plugin refuses a sharing section without resources: "no resources specified"."""
    assert list(check({"sharing": {"timeSlicing": {"renameByDefault": True}}}, node(1))) == [
        "sharing.timeSlicing.resources"
    ]
    assert list(check({"sharing": {"mps": {"resources": []}}}, node(1))) == [
        "sharing.mps.resources"
    ]


def test_time_slicing_and_mps_together_are_refused() -> None:
    """The plugin would apply MPS and silently drop timeSlicing."""
    doc = {
        "sharing": {
            "timeSlicing": {"resources": [GPU4]},
            "mps": {"resources": [{"name": "gpu", "replicas": 2}]},
        }
    }
    found = check(doc, node(2))
    assert list(found) == ["sharing"]
    assert "mutually exclusive" in found["sharing"]


def test_mps_with_the_mixed_strategy_is_refused() -> None:
    found = check(mps({"name": "gpu", "replicas": 2}, strategy="mixed"), node(2))
    assert "flags.migStrategy" in found
    assert "mixed" in found["flags.migStrategy"]


def test_mps_on_a_node_with_mig_enabled_gpus_is_refused() -> None:
    layouts = [full_gpu(0), mig_gpu(1, "7g.80gb")]
    found = check(mps({"name": "gpu", "replicas": 2}), layouts)
    assert list(found) == ["sharing.mps"]
    assert "GPU 1" in found["sharing.mps"]


def test_mps_shares_only_full_gpus() -> None:
    layouts = [full_gpu(0), mig_gpu(1, "1g.10gb")]
    found = check(mps({"name": "mig-1g.10gb", "replicas": 2}, strategy="mixed"), layouts)
    assert "MPS shares only nvidia.com/gpu" in found["sharing.mps.resources[0].name"]


def test_per_gpu_devices_are_refused_as_ignored_by_the_plugin() -> None:
    """The plugin forces devices to "all"; per-GPU replica counts are not possible."""
    for devices in ([0, 1], 2, ["GPU-8f0e2b1c-0000-0000-0000-000000000000"], ["0:1"]):
        found = check(ts({"name": "gpu", "replicas": 2, "devices": devices}), node(2))
        assert list(found) == ["sharing.timeSlicing.resources[0].devices"]
        assert "ignored by the device plugin" in found["sharing.timeSlicing.resources[0].devices"]


def test_devices_all_is_what_the_plugin_does_anyway_and_is_accepted() -> None:
    assert check(ts({"name": "gpu", "replicas": 2, "devices": "all"}), node(2)) == {}


def test_rename_is_refused_as_ignored_by_the_plugin() -> None:
    found = check(ts({"name": "gpu", "replicas": 2, "rename": "gpu-shared"}), node(2))
    assert list(found) == ["sharing.timeSlicing.resources[0].rename"]
    assert "renameByDefault" in found["sharing.timeSlicing.resources[0].rename"]


def test_resource_names_longer_than_63_characters_are_refused() -> None:
    found = check(ts({"name": "mig-" + "a" * 60, "replicas": 2}), node(1))
    assert "63 characters" in found["sharing.timeSlicing.resources[0].name"]


def test_resource_names_must_be_dns_subdomains() -> None:
    for bad in ("GPU", "gpu_", "-gpu", "amd.com/gpu"):
        found = check(ts({"name": bad, "replicas": 2}), node(1))
        assert "DNS subdomain" in found["sharing.timeSlicing.resources[0].name"], bad


def test_a_resource_listed_twice_is_refused() -> None:
    found = check(ts(GPU4, {"name": "gpu", "replicas": 2}), node(1))
    assert list(found) == ["sharing.timeSlicing.resources[1].name"]
    assert "resources[0]" in found["sharing.timeSlicing.resources[1].name"]


def test_mig_resources_need_the_mixed_strategy() -> None:
    layouts = [mig_gpu(0, "1g.10gb", "1g.10gb")]
    for strategy in (None, "none", "single"):
        found = check(ts({"name": "mig-1g.10gb", "replicas": 3}, strategy=strategy), layouts)
        assert "migStrategy: mixed" in found["sharing.timeSlicing.resources[0].name"]


def test_mig_resources_under_mixed_must_exist_on_the_node() -> None:
    """The plugin skips sharing entries for resources it does not advertise, without a word."""
    layouts = [mig_gpu(0, "1g.10gb", "3g.40gb"), full_gpu(1)]
    ok = ts({"name": "mig-1g.10gb", "replicas": 3}, {"name": "mig-3g.40gb", "replicas": 2}, GPU4)
    assert check({**ok, "flags": {"migStrategy": "mixed"}}, layouts) == {}
    found = check(ts({"name": "mig-2g.20gb", "replicas": 2}, strategy="mixed"), layouts)
    message = found["sharing.timeSlicing.resources[0].name"]
    assert "nvidia.com/mig-1g.10gb, nvidia.com/mig-3g.40gb" in message


def test_sub_gi_compute_instances_are_not_shareable_resources() -> None:
    """Only profiles with C == G are advertised under mixed, so 1c.3g.40gb is not a resource."""
    found = check(
        ts({"name": "mig-1c.3g.40gb", "replicas": 2}, strategy="mixed"), [mig_gpu(0, "1c.3g.40gb")]
    )
    assert "does not advertise" in found["sharing.timeSlicing.resources[0].name"]


def test_me_profiles_are_named_with_a_dot() -> None:
    layouts = [mig_gpu(0, "1g.10gb+me")]
    assert check(ts({"name": "mig-1g.10gb.me", "replicas": 2}, strategy="mixed"), layouts) == {}
    found = check(ts({"name": "mig-1g.10gb+me", "replicas": 2}, strategy="mixed"), layouts)
    assert "sharing.timeSlicing.resources[0].name" in found


def test_gpu_under_mixed_needs_a_mig_disabled_gpu() -> None:
    all_mig = [mig_gpu(0, "7g.80gb"), mig_gpu(1, "7g.80gb")]
    found = check(ts(GPU4, strategy="mixed"), all_mig)
    assert "every GPU has MIG enabled" in found["sharing.timeSlicing.resources[0].name"]
    assert check(ts(GPU4, strategy="mixed"), [*all_mig, full_gpu(2)]) == {}


def test_gpu_under_single_needs_a_consistent_layout() -> None:
    assert check(ts(GPU4, strategy="single"), [mig_gpu(0, "1g.10gb"), mig_gpu(1, "1g.10gb")]) == {}
    found = check(ts(GPU4, strategy="single"), [mig_gpu(0, "1g.10gb"), full_gpu(1)])
    assert "single MIG strategy" in found["sharing.timeSlicing.resources[0].name"]


def test_gpu_under_none_is_valid_even_with_mig_enabled() -> None:
    """Under "none" the plugin hands out MIG-enabled GPUs whole."""
    assert check(ts(GPU4), [mig_gpu(0, "1g.10gb")]) == {}


def test_a_node_without_gpus_has_nothing_to_share() -> None:
    found = check(ts(GPU4), [])
    assert "valid here: none" in found["sharing.timeSlicing.resources[0].name"]


def test_every_violation_is_reported_at_once() -> None:
    doc = {
        "flags": {"migStrategy": "mixed"},
        "sharing": {
            "timeSlicing": {"resources": [{"name": "gpu", "replicas": 1, "rename": "x"}]},
            "mps": {"resources": [{"name": "gpu", "replicas": 1, "devices": [0]}]},
        },
    }
    with pytest.raises(InvalidSpec) as exc:
        validate(parse(doc), [mig_gpu(0, "7g.80gb"), full_gpu(1)])
    assert [v.field for v in exc.value.violations] == [
        "sharing",
        "sharing.timeSlicing.resources[0].replicas",
        "sharing.timeSlicing.resources[0].rename",
        "flags.migStrategy",
        "sharing.mps",
        "sharing.mps.resources[0].replicas",
        "sharing.mps.resources[0].devices",
    ]
    assert "7 problems" in str(exc.value)
    assert all(isinstance(v, FieldViolation) and v.description for v in exc.value.violations)
