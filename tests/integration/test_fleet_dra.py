"""A MIG rollout over a fleet where one node's DRA driver makes MIG instances itself: the
coordinator leaves that node out (pending, with the reason; the agent would refuse the change
anyway, docs/dra.md) and changes the other, as the planner leaves it out of plans.

Both nodes are real agents on the simulator. Their GetNode answers pass through a proxy on a
Unix socket (tests/unit/coordinator/fakeagents.py, upstream mode) that reports n1's allocation
mode as dra-dynamic-mig, since detecting it needs the node's DRA driver; every other call goes
to the real agents unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent._proto.gpuagent.v1 import agent_pb2
from agent.cli.fleet import fleet
from tests.unit.api.support import Pki
from tests.unit.coordinator.agents import AgentFleet, invoke
from tests.unit.coordinator.fakeagents import FakeAgent, FakeAgents, fake_agents
from tests.unit.mig.layouts import MIG_HALVES

pytestmark = pytest.mark.integration


def _dynamic(answer: Any) -> None:
    answer.allocation.CopyFrom(
        agent_pb2.Allocation(
            mode=agent_pb2.ALLOCATION_MODE_DRA_DYNAMIC_MIG,
            evidence="ResourceSlices of gpu.nvidia.com carry shared counters",
            dra_driver="gpu.nvidia.com",
        )
    )


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[AgentFleet, FakeAgents, dict[str, FakeAgent]]]:
    real = AgentFleet(tmp_path, Pki(tmp_path / "pki"), {"n1": "dgx-h100", "n2": "dgx-h100"})
    with real, fake_agents() as proxies:
        found = {
            name: proxies.add(
                agent_pb2.Node(name=name),
                upstream=f"unix:{real.agents[name].socket}",
                rewrite=_dynamic if name == "n1" else lambda answer: None,
            )
            for name in ("n1", "n2")
        }
        yield real, proxies, found


def test_a_mig_rollout_leaves_a_dynamic_mig_node_out_and_changes_the_other(
    proxied: tuple[AgentFleet, FakeAgents, dict[str, FakeAgent]],
) -> None:
    real, proxies, found = proxied
    mig = real.root / "mig.yaml"
    mig.write_text(MIG_HALVES)
    apply = ["apply", "mig", "-f", str(mig), "-c", "halves", "-o", "json", *proxies.args()]

    dry = invoke(fleet, [*apply, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    previews = {p["node"]: p for p in json.loads(dry.output)["previews"]}
    assert previews["n1"]["would"] == "skipped"
    assert "dynamic MIG: advice only" in previews["n1"]["detail"]

    result = invoke(fleet, [*apply, "--max-unavailable", "2"])
    assert result.exit_code == 10, result.output  # incomplete: n1 is left pending
    doc = json.loads(result.output.split("\nerror:")[0])
    nodes = doc["record"]["nodes"]
    assert nodes["n1"]["state"] == "pending"
    assert nodes["n1"]["detail"].startswith("skipped: dynamic MIG: advice only")
    assert nodes["n2"]["state"] == "succeeded"
    assert list(doc["not_allowed"]) == ["n1"]
    assert "MigService/ApplyMig" not in found["n1"].calls
    assert "MigService/ApplyMig" in found["n2"].calls
    assert "allocation mode allows no MIG change (n1)" in result.output
