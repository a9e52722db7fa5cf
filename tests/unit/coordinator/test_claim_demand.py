"""Demand from DRA ResourceClaims: pending claims of pending pods, allocated claims held,
templates through the pod's status, and every form that is not one MIG profile left out with
its reason."""

from __future__ import annotations

from typing import Any

from agent.coordinator.planning.claimdemand import (
    MAX_SELECTOR,
    PendingRequest,
    demand_from_claims,
    request_profile,
)
from agent.coordinator.planning.clusterdemand import demand_from_pods, with_claims
from agent.coordinator.planning.demand import DemandEntry

DRA = "allocation=dra"
PROFILE = "device.attributes['gpu.nvidia.com'].profile == '{}'"


def mig_request(profile: str | None, name: str = "r", count: int | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "mig.nvidia.com"}
    if profile is not None:
        exactly["selectors"] = [{"cel": {"expression": PROFILE.format(profile)}}]
    if count is not None:
        exactly["count"] = count
    return {"name": name, "exactly": exactly}


def claim(
    name: str, *requests: dict[str, Any], allocated: bool = False, ns: str = "ml"
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": list(requests)}},
    }
    if allocated:
        out["status"] = {"allocation": {"devices": {"results": []}}}
    return out


def pod(
    name: str,
    phase: str,
    claims: list[dict[str, Any]],
    *,
    statuses: list[dict[str, Any]] | None = None,
    priority: int | None = None,
    selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}], "resourceClaims": claims}
    if priority is not None:
        spec["priority"] = priority
    if selector:
        spec["nodeSelector"] = selector
    status: dict[str, Any] = {"phase": phase}
    if statuses is not None:
        status["resourceClaimStatuses"] = statuses
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec, "status": status}


def test_pending_claims_of_pending_pods_are_demand_and_allocated_ones_are_held() -> None:
    claims = [
        claim("train", mig_request("3g.40gb")),
        claim("serve", mig_request("1g.10gb", count=2), allocated=True),
        claim("shared", mig_request("1g.10gb")),
        claim("orphan", mig_request("7g.80gb")),  # no pod waits on it
    ]
    pods = [
        pod("t", "Pending", [{"name": "gpu", "resourceClaimName": "train"}], priority=100),
        pod("s", "Running", [{"name": "gpu", "resourceClaimName": "serve"}]),
        pod("a", "Pending", [{"name": "gpu", "resourceClaimName": "shared"}]),
        pod("b", "Pending", [{"name": "gpu", "resourceClaimName": "shared"}]),
        pod("done", "Succeeded", [{"name": "gpu", "resourceClaimName": "orphan"}]),
    ]
    found = demand_from_claims(pods, claims)
    assert found.wanted == {("3g.40gb", 100, DRA): 1, ("1g.10gb", 0, DRA): 3}
    assert (found.pending_claims, found.allocated_claims) == (2, 1)
    assert found.pending == (
        PendingRequest("ml/shared", "1g.10gb", 1),
        PendingRequest("ml/train", "3g.40gb", 1, 100),
    )


def test_template_claims_are_found_through_the_pods_status_or_read_from_the_template() -> None:
    template = {
        "metadata": {"name": "mig-3g", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [mig_request("3g.40gb")]}}},
    }
    generated = claim("p1-gpu-x7k2q", mig_request("3g.40gb"))
    ref = [{"name": "gpu", "resourceClaimTemplateName": "mig-3g"}]
    pods = [
        # generated, not allocated yet
        pod("p1", "Pending", ref, statuses=[{"name": "gpu", "resourceClaimName": "p1-gpu-x7k2q"}]),
        # the claim controller has not made its claim yet: the template is what it waits for
        pod("p2", "Pending", ref, selector={"pool": "train"}),
        # no claim was needed (the status entry names none)
        pod("p3", "Pending", ref, statuses=[{"name": "gpu"}]),
    ]
    found = demand_from_claims(pods, [generated], [template])
    assert found.wanted == {("3g.40gb", 0, DRA): 1, ("3g.40gb", 0, f"{DRA},pool=train"): 1}
    assert [p.who for p in found.pending] == [
        "ml/p1-gpu-x7k2q",
        "ml/p2/gpu (template mig-3g, not generated yet)",
    ]


def test_only_the_documented_profile_equality_maps_to_a_profile() -> None:
    assert request_profile(mig_request("3g.40gb")) == ("3g.40gb", 1)
    double = mig_request(None)
    double["exactly"]["selectors"] = [
        {"cel": {"expression": ' device.attributes["gpu.nvidia.com"].profile=="1g.10gb+me" '}}
    ]
    assert request_profile(double) == ("1g.10gb+me", 1)
    assert request_profile(mig_request("2g.20gb", count=3)) == ("2g.20gb", 3)
    refused = {
        "compound": PROFILE.format("3g.40gb") + " && device.attributes['gpu.nvidia.com'].x == 1",
        "another attribute": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100'",
        "not equality": "device.attributes['gpu.nvidia.com'].profile != '3g.40gb'",
        "a list": "device.attributes['gpu.nvidia.com'].profile in ['3g.40gb', '4g.40gb']",
    }
    for what, expression in refused.items():
        request = mig_request(None)
        request["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
        reason = request_profile(request)
        assert isinstance(reason, str) and "is not the form" in reason, what
    assert "without a profile selector" in str(request_profile(mig_request(None)))
    assert "compute-instance" in str(request_profile(mig_request("1c.3g.40gb")))
    assert "not a MIG profile" in str(request_profile(mig_request("lots")))
    first = {"name": "r", "firstAvailable": [mig_request("3g.40gb")["exactly"]]}
    assert "firstAvailable" in str(request_profile(first))
    every = mig_request("1g.10gb")
    every["exactly"]["allocationMode"] = "All"
    assert "allocationMode All" in str(request_profile(every))
    whole = {"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    assert request_profile(whole) == "whole GPU"


def test_hostile_and_oversized_objects_are_left_out_with_a_reason() -> None:
    long = mig_request(None)
    long["exactly"]["selectors"] = [{"cel": {"expression": " " * MAX_SELECTOR + "x"}}]
    silly = mig_request("1g.10gb", count=True)  # type: ignore[arg-type]
    claims: list[Any] = [
        "not an object",
        claim("long", long),
        claim("silly", silly),
        claim("many", *[mig_request("1g.10gb", f"r{i}") for i in range(33)]),
        {"metadata": {"name": "bad", "namespace": "ml"}, "spec": {"devices": {"requests": 7}}},
        claim("first", {"name": "r", "firstAvailable": []}),
    ]
    names = ["long", "silly", "many", "bad", "first", "gone"]
    pods: list[Any] = [pod(n, "Pending", [{"name": "gpu", "resourceClaimName": n}]) for n in names]
    pods += [None, {"status": {"phase": "Pending"}, "spec": {"resourceClaims": "x"}}]
    found = demand_from_claims(pods, claims)
    assert found.wanted == {} and found.pending == ()
    text = "\n".join(found.notes)
    assert f"ml/long request r: a CEL selector longer than {MAX_SELECTOR}" in text
    assert "ml/silly request r: count must be an integer" in text
    assert "ml/many: spec.devices.requests is not a list of at most 32" in text
    assert "ml/bad: spec.devices.requests is not a list" in text
    assert "ml/first request r: firstAvailable" in text
    assert "claim ml/gone not found (1 pod reference(s))" in text


def test_claims_and_extended_resources_make_one_demand() -> None:
    pods = [
        {
            "metadata": {"name": "old", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {
                "nvidia.com/mig-3g.40gb": 1}}}]},
            "status": {"phase": "Pending"},
        },
        pod("new", "Pending", [{"name": "gpu", "resourceClaimName": "train"}]),
    ]  # fmt: skip
    claims = [claim("train", mig_request("3g.40gb"))]
    found = with_claims(demand_from_pods(pods), demand_from_claims(pods, claims))
    assert found.demand.entries == (DemandEntry("3g.40gb", 1), DemandEntry("3g.40gb", 1, pool=DRA))
    assert [w.who for w in found.waiting] == ["ml/old", "ml/train"]
    assert "1 ResourceClaim(s) pending, 0 allocated with MIG devices" in found.notes
