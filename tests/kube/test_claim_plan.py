"""The fleet plan from a cluster that allocates GPUs with DRA, against the API stand-in: pending
ResourceClaims become demand placed on static-DRA nodes only, a dra-dynamic-mig node gets
fragmentation advice and no MIG change, a node whose mode is unknown is not planned."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent._proto.gpuagent.v1 import agent_pb2
from agent.cli.fleet.plan import _cluster_claims, _dra_plan_lines, _with_claims
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.inventory import NodeView, node_view
from agent.coordinator.fleet.selector import parse_selector
from agent.coordinator.flows import (
    DYNAMIC_MIG,
    Selection,
    not_mig_plannable,
    plan,
    replay_trace,
)
from agent.coordinator.planning.clusterdemand import demand_from_pods, list_pods
from agent.coordinator.planning.demand import Demand, DemandEntry, TraceStep
from agent.dra.mode import Allocation, AllocationMode
from agent.kube import InClusterKubeClient
from agent.wire.node import node_from
from tests.unit.coordinator.fleets import A100_40, H100, gpu
from tests.unit.coordinator.test_cluster_demand import PodsApi

PROFILE = "device.attributes['gpu.nvidia.com'].profile == '{}'"


def mig_claim(name: str, profile: str, *, allocated: bool = False) -> dict[str, Any]:
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": PROFILE.format(profile)}}],
        },
    }
    out: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [request]}},
    }
    if allocated:
        out["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "static",
                         "device": "gpu-0-mig-1g10gb-0"}
                    ]
                }
            }
        }  # fmt: skip
    return out


def claim_pod(name: str, claim: str, phase: str, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec, "status": {"phase": phase}}


@pytest.fixture
def cluster(
    tmp_path: Path, tls_cert: tuple[Path, Path]
) -> Iterator[tuple[PodsApi, InClusterKubeClient]]:
    token = tmp_path / "token"
    token.write_text("t\n")
    api = PodsApi(token_path=token)
    api.put_dra("resourceclaims", mig_claim("train", "3g.20gb"))
    api.put_dra("resourceclaims", mig_claim("serve", "1g.10gb"))
    api.put_dra("resourceclaims", mig_claim("held", "1g.10gb", allocated=True))
    api.items = [
        claim_pod("train-0", "train", "Pending"),
        claim_pod("serve-0", "serve", "Pending"),
        claim_pod("held-0", "held", "Running", node="static"),
    ]
    server, url = api.serve(*tls_cert)
    try:
        yield api, InClusterKubeClient(url, token, ca_path=tls_cert[0], timeout=5.0)
    finally:
        api.close()
        server.shutdown()
        server.server_close()


def view(name: str, mode: AllocationMode, *gpus: Any, evidence: str = "") -> NodeView:
    return NodeView(name, f"{name}:9401", layouts=gpus, allocation=Allocation(mode, evidence))


def test_pending_claims_are_demand_and_a_dynamic_mig_node_gets_advice_not_a_change(
    cluster: tuple[PodsApi, InClusterKubeClient],
) -> None:
    _, client = cluster
    pods = list_pods(client)
    found = _with_claims(demand_from_pods(pods), pods, _cluster_claims(client))
    views = (
        # dynamic MIG, A100-40GB: its driver made 1g.5gb instances at slices 2 and 5, so a
        # 3g.20gb has the free slices but no free placement
        view(
            "dyn",
            AllocationMode.DRA_DYNAMIC_MIG,
            gpu("dyn", 0, A100_40, [("1g.5gb", 2), ("1g.5gb", 5)], busy=[(7, 2)]),
        ),
        view("static", AllocationMode.DRA, gpu("static", 0, H100)),
        view("plugin", AllocationMode.DEVICE_PLUGIN, gpu("plugin", 0, H100)),
        view(
            "unsure",
            AllocationMode.UNKNOWN,
            gpu("unsure", 0, H100),
            evidence="the API server has not answered",
        ),
    )
    result = plan(Selection(views, {}), found.demand, time_limit_s=10, waiting=found.waiting)

    # Claims are DRA demand: their devices go to the static-DRA node, nowhere else.
    assert [(c.node, c.after) for c in result.plan.changes] == [("static", (("1g.10gb", 2),))]
    totals = {(t.profile, t.pool): (t.demand, t.after) for t in result.plan.totals}
    assert totals[("1g.10gb", "allocation=dra")] == (2, 2)
    assert [(n.node, n.reason) for n in result.not_planned] == [
        ("dyn", DYNAMIC_MIG),
        (
            "unsure",
            "allocation mode unknown (the API server has not answered): not planned until "
            "the agent knows it",
        ),
    ]
    # The dynamic node's pending 3g.20gb: advice naming the move, nothing executed. The
    # instance at slice 5 runs a process, so the idle one at slice 2 is the one to move.
    (frag,) = result.fragmented
    assert frag.text == (
        "ml/train 3g.20gb fits dyn GPU 0 (at slice 0) if the 1g.5gb at slice 2 were at slice 4"
    )
    assert "2 ResourceClaim(s) pending, 1 allocated with MIG devices" in found.notes
    lines = _dra_plan_lines(result)
    assert f"Not planned: dyn: {DYNAMIC_MIG}" in lines
    assert any(line.startswith("FRAGMENTED ml/train 3g.20gb fits dyn GPU 0") for line in lines)


def test_a_cluster_without_the_dra_api_is_planned_from_pods_and_says_so(
    cluster: tuple[PodsApi, InClusterKubeClient],
) -> None:
    api, client = cluster
    api.forbidden.add(("GET", "/apis/resource.k8s.io/v1/resourceclaims"))
    pods = list_pods(client)
    found = _with_claims(demand_from_pods(pods), pods, _cluster_claims(client))
    assert found.demand.entries == ()
    (note,) = [n for n in found.notes if "ResourceClaims" in n]
    assert note.startswith("ResourceClaims not read (") and "403" in note
    assert note.endswith("demand from pods' resources only")


def test_an_agent_that_reports_no_allocation_mode_is_not_planned_on_a_guess() -> None:
    """An agent from before allocation modes sends no Node.allocation: its mode is unknown,
    said why, and no layout is planned on it; the modes that allow MIG changes are planned."""
    old = node_view(Target("old", "old:9401"), node_from(agent_pb2.Node(name="old")))
    assert old.allocation is not None and old.allocation.mode is AllocationMode.UNKNOWN
    why = not_mig_plannable(old)
    assert why is not None and "older version" in why
    assert not_mig_plannable(view("plugin", AllocationMode.DEVICE_PLUGIN)) is None
    assert not_mig_plannable(view("none", AllocationMode.NONE)) is None
    assert not_mig_plannable(view("static", AllocationMode.DRA)) is None
    assert not_mig_plannable(view("dyn", AllocationMode.DRA_DYNAMIC_MIG)) == DYNAMIC_MIG


def test_the_allocation_mode_is_a_selector_fact() -> None:
    dyn = view("dyn", AllocationMode.DRA_DYNAMIC_MIG)
    old = NodeView("old", "old:9401")
    chosen = parse_selector("allocation=dra*")
    assert chosen.matches(dyn) and not chosen.matches(old)
    assert parse_selector("allocation!=dra-dynamic-mig").matches(old)
    assert not chosen.needs_labels and chosen.needs_inventory


def test_a_replay_leaves_dynamic_mig_nodes_out_as_the_plan_does() -> None:
    views = (
        view("dyn", AllocationMode.DRA_DYNAMIC_MIG, gpu("dyn", 0, H100)),
        view("static", AllocationMode.DRA, gpu("static", 0, H100)),
    )
    step = TraceStep(0.0, "0", Demand((DemandEntry("7g.80gb", 2),)))
    (result,) = replay_trace(Selection(views, {}), [], [step])
    assert (result.demand, result.met) == (2, 1)  # only the static node's GPU is planned
