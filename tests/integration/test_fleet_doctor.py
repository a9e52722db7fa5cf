"""`gpu-agent fleet doctor` over mTLS against real agent processes on simulated nodes: one
row per node, the problems grouped by check with how many nodes have them, and a node that
does not answer grouped as unreachable, never dropped."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.unit.api.support import Pki
from tests.unit.coordinator.agents import AgentFleet

pytestmark = pytest.mark.integration

PRESETS = {"h100": "dgx-h100", "a30": "a30-node", "nvl": "h100-nvl"}


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    root = tmp_path_factory.mktemp("fleet-doctor")
    # One node whose cache may reach every address: a problem only it has.
    config = {
        "nvl": {
            "prewarm": {
                "cache_dir": str(root / "nvl" / "cache"),
                "egress_allow": ["0.0.0.0/0"],
                "containerd_socket": str(root / "nvl" / "containerd.sock"),
            }
        }
    }
    with AgentFleet(root, Pki(root / "pki"), PRESETS, config) as fleet:
        yield fleet


def test_problems_are_grouped_by_check_with_their_nodes(agents: AgentFleet) -> None:
    result = agents.fleet("doctor", "-o", "json")
    assert result.exit_code == 20, result.output  # the worst: degraded
    doc = json.loads(result.output)
    assert [n["name"] for n in doc["nodes"]] == ["a30", "h100", "nvl"]
    assert doc["totals"] == {"nodes": 3, "ok": 0, "degraded": 3, "failed": 0}
    found = {f"{f['duty']}/{f['name']}": f for f in doc["findings"]}
    containerd = found["prewarm/containerd"]
    assert containerd["count"] == 3 and containerd["nodes"] == ["a30", "h100", "nvl"]
    assert containerd["state"] == "degraded" and "mount the host's" in containerd["fix"]
    assert found["prewarm/egress"]["nodes"] == ["nvl"]
    # Most nodes first: the fleet-wide problem before the one node's.
    names = [f"{f['duty']}/{f['name']}" for f in doc["findings"]]
    assert names.index("prewarm/containerd") < names.index("prewarm/egress")
    rows = {n["name"]: n for n in doc["nodes"]}
    assert "prewarm/egress" in rows["nvl"]["degraded"] and rows["nvl"]["failed"] == []
    assert "prewarm/egress" not in rows["h100"]["degraded"]


def test_the_table_leads_with_the_counts(agents: AgentFleet) -> None:
    result = agents.fleet("doctor")
    assert result.exit_code == 20, result.output
    lines = result.output.splitlines()
    assert lines[0] == "3 node(s): 0 ok, 3 degraded, 0 failed"
    assert "prewarm/containerd (degraded): a30, h100, nvl" in result.output


def test_a_node_that_does_not_answer_is_its_own_failed_group(agents: AgentFleet) -> None:
    address = agents.address("a30")
    agents.agents["a30"].stop()
    try:
        result = agents.fleet("doctor", "-o", "json")
        assert result.exit_code == 21, result.output
        doc = json.loads(result.output)
        unreachable = next(f for f in doc["findings"] if f["duty"] == "agent")
        assert unreachable["name"] == "reachable" and unreachable["nodes"] == [address]
        assert doc["findings"][0] is not None and doc["findings"][0]["duty"] == "agent"
        assert doc["totals"]["failed"] == 1
    finally:
        agents.agents["a30"].start(timeout=120)
