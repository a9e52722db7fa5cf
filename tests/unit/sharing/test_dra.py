"""The share spec as NVIDIA's DRA driver config: golden objects, the field-by-field mapping and
its refusals, hostile names, and how agents on several nodes share one DeviceClass."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.dra.mode import Allocation, AllocationMode
from agent.errors import Conflict, InvalidSpec
from agent.kube import InClusterKubeClient
from agent.sharing import dra, parse
from tests.kube.fake_api import FakeKubeApi

GOLDEN = Path(__file__).parent / "golden"
DRA = Allocation(AllocationMode.DRA, "ResourceSlices of gpu.nvidia.com", "gpu.nvidia.com")
DYNAMIC = Allocation(AllocationMode.DRA_DYNAMIC_MIG, "DynamicMIG", "gpu.nvidia.com")


def spec(section: str = "timeSlicing", *resources: tuple[str, int], **extra: Any) -> Any:
    items = [{"name": n, "replicas": r} for n, r in resources or [("nvidia.com/gpu", 4)]]
    return parse({"sharing": {section: {"resources": items, **extra}}})


def refused(config: Any, allocation: Allocation = DRA) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as caught:
        dra.plan(config, allocation)
    return {v.field: v.description for v in caught.value.violations}


def test_time_slicing_renders_the_golden_classes_and_templates() -> None:
    config = spec("timeSlicing", ("nvidia.com/gpu", 4), ("nvidia.com/mig-1g.10gb", 2))
    objects = dra.render(config, DRA, "team-a")
    assert objects == list(yaml.safe_load_all((GOLDEN / "dra-time-slicing.yaml").read_text()))
    assert dra.render(config, DRA, "team-a") == objects  # same spec, same objects


def test_mps_maps_replicas_to_each_clients_share_of_the_sms() -> None:
    config = spec("mps", ("nvidia.com/gpu", 4), ("nvidia.com/mig-3g.40gb", 3))
    objects = dra.render(config, DRA)
    assert objects == list(yaml.safe_load_all((GOLDEN / "dra-mps.yaml").read_text()))
    params = [o["spec"]["config"][0]["opaque"]["parameters"] for o in objects]
    assert [p["kind"] for p in params] == ["GpuConfig", "MigDeviceConfig"]
    assert [p["sharing"]["mpsConfig"]["defaultActiveThreadPercentage"] for p in params] == [25, 33]


def test_what_the_driver_does_not_carry_is_said_not_dropped() -> None:
    notes = {n.field: n.description for n in dra.plan(spec(), DRA).notes}
    assert "not carried" in notes["sharing.timeSlicing.resources[0].replicas"]
    assert "4 is not enforced" in notes["sharing.timeSlicing.resources[0].replicas"]


def test_a_mig_resource_name_selects_the_profile_with_its_plus() -> None:
    (shared,) = dra.plan(spec("timeSlicing", ("mig-1g.10gb.me", 2)), DRA).classes
    expression = dra.device_class(shared)["spec"]["selectors"][0]["cel"]["expression"]
    assert expression.endswith("device.attributes['gpu.nvidia.com'].profile == '1g.10gb+me'")
    assert shared.name == "gpu-agent-time-slicing-mig-1g.10gb.me"


@pytest.mark.parametrize(
    ("document", "field", "allocation"),
    [
        (
            {
                "sharing": {
                    "timeSlicing": {
                        "renameByDefault": True,
                        "resources": [{"name": "gpu", "replicas": 2}],
                    }
                }
            },
            "sharing.timeSlicing.renameByDefault",
            DRA,
        ),
        (
            {
                "sharing": {
                    "mps": {
                        "failRequestsGreaterThanOne": True,
                        "resources": [{"name": "gpu", "replicas": 2}],
                    }
                }
            },
            "sharing.mps.failRequestsGreaterThanOne",
            DRA,
        ),
        (
            {
                "sharing": {
                    "timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "rename": "x"}]}
                }
            },
            "sharing.timeSlicing.resources[0].rename",
            DRA,
        ),
        (
            {
                "sharing": {
                    "timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": [0]}]}
                }
            },
            "sharing.timeSlicing.resources[0].devices",
            DRA,
        ),
        (
            {
                "flags": {"migStrategy": "single"},
                "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}},
            },
            "flags.migStrategy",
            DRA,
        ),
        (
            {
                "flags": {"failOnInitError": True},
                "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}},
            },
            "flags.failOnInitError",
            DRA,
        ),
        (
            {
                "imex": {"channelIDs": [0]},
                "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}},
            },
            "imex",
            DRA,
        ),
        (
            {"sharing": {"timeSlicing": {"resources": [{"name": "gpu.shared", "replicas": 2}]}}},
            "sharing.timeSlicing.resources[0].name",
            DRA,
        ),
        (
            {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 1}]}}},
            "sharing.timeSlicing.resources[0].replicas",
            DRA,
        ),
        (
            {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 49}]}}},
            "sharing.mps.resources[0].replicas",
            DRA,
        ),
        (
            {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}}},
            "sharing.mps",
            DYNAMIC,
        ),
        (
            {
                "sharing": {
                    "timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]},
                    "mps": {"resources": [{"name": "gpu", "replicas": 2}]},
                }
            },
            "sharing",
            DRA,
        ),
        (
            {
                "sharing": {
                    "timeSlicing": {
                        "resources": [
                            {"name": "gpu", "replicas": 2},
                            {"name": "nvidia.com/gpu", "replicas": 3},
                        ]
                    }
                }
            },
            "sharing.timeSlicing.resources[1].name",
            DRA,
        ),
        (
            {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}},
            "sharing",
            Allocation(AllocationMode.DRA, "slices", "gpu.example.com"),
        ),
    ],
)
def test_what_the_driver_cannot_say_is_refused_by_field(
    document: Any, field: str, allocation: Allocation
) -> None:
    assert field in refused(parse(document), allocation)


def test_an_empty_spec_is_refused_pointing_at_clear() -> None:
    assert "clear" in refused(parse({}))["sharing"]


@pytest.mark.parametrize(
    "name",
    [
        "mig-1g.10gb' || true || '",
        "mig-1g.10gb\n",
        "mig-1g.10gb.me'",
        "mig-" + "9" * 60 + "g.1gb",
        "nvidia.com/mig-1g.10gb/../gpu",
    ],
)
def test_a_hostile_resource_name_never_reaches_a_cel_selector(name: str) -> None:
    config = parse({"sharing": {"timeSlicing": {"resources": [{"name": name, "replicas": 2}]}}})
    try:
        shared = dra.plan(config, DRA).classes
    except InvalidSpec:
        return
    raise AssertionError(f"accepted {shared}")


def test_a_thousand_resources_are_planned_or_refused_quickly() -> None:
    items = [{"name": f"mig-{i}g.{i}gb", "replicas": 2} for i in range(1, 1001)]
    config = parse({"sharing": {"timeSlicing": {"resources": items}}})
    start = time.monotonic()
    assert len(dra.plan(config, DRA).classes) == 1000
    assert time.monotonic() - start < 2


def test_the_api_server_takes_every_rendered_object(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    config = spec("mps", ("nvidia.com/gpu", 4), ("nvidia.com/mig-1g.10gb", 2))
    for obj in dra.render(config, DRA, "team-a"):
        if obj["kind"] == "DeviceClass":
            kube.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body=obj)
        else:
            path = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates"
            kube.request("POST", path, body=obj)
    assert len(api.dra("deviceclasses")) == 2
    assert len(api.dra("resourceclaimtemplates")) == 2


# -- several nodes, one DeviceClass -----------------------------------------------------------


def classes(config: Any) -> tuple[dra.SharedClass, ...]:
    return dra.plan(config, DRA).classes


def test_a_class_is_created_once_and_then_left_as_it_is() -> None:
    (first,) = dra.reconcile(classes(spec()), [])
    assert first.action == "create"
    (again,) = dra.reconcile(classes(spec()), [dict(first.body)])
    assert again.action == "unchanged"  # any node, any number of them: nothing to write
    assert "gpu-agent.io/nodes" not in first.body["metadata"]["annotations"]


@pytest.mark.parametrize("strategy", ["timeSlicing", "mps"])
def test_a_class_name_fixes_its_spec(strategy: str) -> None:
    """Nodes with different specs never meet under one name, so no agent ever has to change
    or refuse a class another node created (docs/dra.md, "Several nodes, one class")."""
    specs: dict[str, dict[str, Any]] = {}
    for replicas in range(2, 49):
        for resource in ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"):
            (shared,) = classes(spec(strategy, (resource, replicas)))
            assert specs.setdefault(shared.name, dra.class_spec(shared)) == dra.class_spec(shared)
    (a,) = classes(spec("mps", ("gpu", 4)))
    (b,) = classes(spec("mps", ("gpu", 2)))
    assert (a.name, b.name) == ("gpu-agent-mps-gpu-25pct", "gpu-agent-mps-gpu-50pct")
    assert [c.action for c in dra.reconcile((b,), [dra.device_class(a)])] == ["create"]


def test_a_class_edited_since_it_was_created_is_refused_not_overwritten() -> None:
    (shared,) = classes(spec("mps", ("gpu", 4)))
    edited = dra.device_class(shared)
    edited["spec"]["config"][0]["opaque"]["parameters"]["sharing"]["mpsConfig"] = {}
    with pytest.raises(Conflict, match="kubectl delete deviceclass gpu-agent-mps-gpu-25pct"):
        dra.reconcile((shared,), [edited])


def test_a_class_the_agent_does_not_manage_is_never_taken_over() -> None:
    (shared,) = classes(spec())
    theirs = dra.device_class(shared, rendered=True)  # e.g. applied from share render by GitOps
    with pytest.raises(Conflict, match="not managed by gpu-agent"):
        dra.reconcile(classes(spec()), [theirs])
