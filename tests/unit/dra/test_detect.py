"""The allocation mode from observed facts (agent.dra.detect, agent.dra.slices): every mode,
conflicting evidence, and slices that are malformed, hostile or too many: never a guess."""

from __future__ import annotations

from typing import Any

import pytest

from agent.dra.detect import NodeFacts, configured, detect
from agent.dra.mode import AllocationMode
from agent.dra.slices import MAX_SLICES, read_slices

NODE = "gpu-node-1"
DRIVER = "gpu.nvidia.com"


def gpu(minor: int, uuid: str) -> dict[str, Any]:
    return {
        "name": f"gpu-{minor}",
        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}},
    }


def mig(minor: int, uuid: str | None, start: int = 0) -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"}}
    if uuid is not None:
        attributes["gpu.nvidia.com/uuid"] = {"string": uuid}  # the qualified spelling
    return {"name": f"gpu-{minor}-mig-1g10gb-19-{start}", "attributes": attributes}


def slice_(devices: list[Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{NODE}-{DRIVER}-x"},
        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE}, "devices": devices}
        | spec,
    }


def facts(slices: list[Any] | None, allocatable: dict[str, Any] | None = None, **kw: Any) -> Any:
    read = None if slices is None else read_slices(slices, DRIVER, NODE)
    return NodeFacts(DRIVER, read, {} if allocatable is None else allocatable, **kw)


def test_static_slices_are_dra_with_the_devices_as_evidence() -> None:
    found = detect(facts([slice_([gpu(0, "GPU-a"), mig(1, "MIG-b")])]))
    assert found.mode is AllocationMode.DRA and found.driver == DRIVER
    assert "2 device(s) (1 gpu, 1 mig)" in found.evidence
    assert read_slices([slice_([mig(1, "MIG-b")])], DRIVER, NODE).uuids == ("MIG-b",)


@pytest.mark.parametrize(
    "published",
    [
        slice_([gpu(0, "GPU-a")], sharedCounters=[{"name": "gpu-0-counter-set"}]),
        slice_([gpu(0, "GPU-a") | {"consumesCounters": [{"counterSet": "gpu-0-counter-set"}]}]),
        slice_([gpu(0, "GPU-a"), mig(0, None)]),  # an abstract MIG device: no uuid
    ],
    ids=["shared-counters", "consumes-counters", "mig-without-uuid"],
)
def test_partitionable_devices_are_dynamic_mig(published: dict[str, Any]) -> None:
    found = detect(facts([published]))
    assert found.mode is AllocationMode.DRA_DYNAMIC_MIG
    assert "DynamicMIG" in found.evidence and found.driver == DRIVER


def test_device_plugin_resources_are_device_plugin_and_stale_capacity_is_not() -> None:
    found = detect(facts([], {"nvidia.com/gpu": "8", "cpu": "64"}))
    assert found.mode is AllocationMode.DEVICE_PLUGIN
    assert found.evidence == "Node allocatable nvidia.com/gpu=8"
    assert detect(facts([], {"nvidia.com/mig-1g.10gb": "14"})).mode is (
        AllocationMode.DEVICE_PLUGIN
    )
    stopped = detect(facts([], {"nvidia.com/gpu": "0"}, capacity={"nvidia.com/gpu": "8"}))
    assert stopped.mode is AllocationMode.NONE
    assert "capacity only: a device plugin that stopped" in stopped.evidence


def test_nothing_is_none_and_unread_facts_are_unknown() -> None:
    assert detect(facts([])).mode is AllocationMode.NONE
    unread = detect(facts(None, problem="connection refused"))
    assert unread.mode is AllocationMode.UNKNOWN
    assert "has not answered yet" in unread.evidence and "connection refused" in unread.evidence
    no_node = detect(NodeFacts(DRIVER, read_slices([], DRIVER, NODE), None))
    assert no_node.mode is AllocationMode.UNKNOWN and "allocatable" in no_node.evidence


def test_conflicting_evidence_is_never_resolved_silently() -> None:
    both = detect(facts([slice_([gpu(0, "GPU-a")])], {"nvidia.com/gpu": "8"}))
    assert both.mode is AllocationMode.UNKNOWN
    assert "conflicting evidence" in both.evidence and "set dra.mode" in both.evidence
    # Dynamic MIG beside a device plugin: the stricter mode, and the conflict said.
    strict = detect(facts([slice_([mig(0, None)])], {"nvidia.com/gpu": "8"}))
    assert strict.mode is AllocationMode.DRA_DYNAMIC_MIG and "conflicting" in strict.evidence


def test_other_drivers_and_other_nodes_are_not_evidence() -> None:
    other = slice_([gpu(0, "GPU-a")])
    other["spec"]["driver"] = "compute-domain.nvidia.com"
    elsewhere = slice_([mig(0, None)])
    elsewhere["spec"]["nodeName"] = "gpu-node-2"
    foreign = slice_([{"name": "gpu-0", "attributes": {"other.io/uuid": {"string": "x"}}}])
    assert detect(facts([other, elsewhere])).mode is AllocationMode.NONE
    assert read_slices([foreign], DRIVER, NODE).uuids == ()  # another domain's attribute


@pytest.mark.parametrize(
    "hostile",
    [
        slice_("not a list"),  # type: ignore[arg-type]
        slice_([gpu(0, "GPU-a"), 42]),
        slice_([{"name": "x" * 300, "attributes": {}}]),
        slice_([{"name": "gpu-0", "attributes": {"uuid": {"int": 5}}}]),
        slice_([{"name": "gpu-0", "attributes": {f"a{i}": {"string": "v"} for i in range(40)}}]),
        slice_([gpu(0, "GPU-a")], sharedCounters={"not": "a list"}),
    ],
    ids=["devices-not-list", "device-not-object", "long-name", "uuid-not-string",
         "too-many-attributes", "counters-not-list"],
)  # fmt: skip
def test_malformed_slices_make_the_mode_unknown(hostile: dict[str, Any]) -> None:
    found = detect(facts([hostile]))
    assert found.mode is AllocationMode.UNKNOWN
    assert "could not all be read" in found.evidence


def test_reading_is_bounded() -> None:
    many = [slice_([gpu(0, f"GPU-{i}")]) for i in range(MAX_SLICES + 5)]
    read = read_slices(many, DRIVER, NODE)
    assert read.slices == MAX_SLICES and read.truncated
    assert detect(facts(many)).mode is AllocationMode.UNKNOWN
    huge = read_slices([slice_([gpu(0, f"GPU-{i}") for i in range(1000)])], DRIVER, NODE)
    assert len(huge.devices) == 128 and huge.truncated
    many_resources = detect(facts([], {f"nvidia.com/mig-{i}": "1" for i in range(10_000)}))
    assert many_resources.mode is AllocationMode.DEVICE_PLUGIN
    assert many_resources.evidence.endswith("and 252 more") and len(many_resources.evidence) < 200
    assert detect(facts([], {"nvidia.com/gpu": "1k"})).mode is AllocationMode.NONE
    # "²".isdigit() is True and int("²") a ValueError: not a count, not a crash
    assert detect(facts([], {"nvidia.com/gpu": "²"})).mode is AllocationMode.NONE


def test_a_configured_mode_says_so_and_auto_detects() -> None:
    set_ = configured("dra-dynamic-mig", DRIVER)
    assert set_ is not None and set_.mode is AllocationMode.DRA_DYNAMIC_MIG
    assert set_.evidence == "set in config (dra.mode)" and set_.driver == DRIVER
    plugin = configured("device-plugin", DRIVER)
    assert plugin is not None and plugin.driver == ""
    assert configured("auto", DRIVER) is None
