"""Power caps from the coordinator's desired file: `coordinator serve --once` against two agents
on simulated nodes, over mTLS, caps the nodes a rule selects and leaves the others alone; a
second pass finds nothing to change."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.client import AgentClient
from tests.unit.api.support import Pki, wait_for
from tests.unit.coordinator.agents import AgentFleet

pytestmark = pytest.mark.integration

DESIRED = """\
version: v1
power:
  - selector: model=*H100*
    limits:
      - {gpus: all, limit: 0.8}
      - {gpus: [0], limit: 500W}
"""


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    root = tmp_path_factory.mktemp("fleet-power")
    with AgentFleet(root, Pki(root / "pki"), {"h100": "dgx-h100", "a30": "a30-node"}) as fleet:
        yield fleet


def _watts(agents: AgentFleet, name: str) -> list[float]:
    client = AgentClient.connect(agents.agents[name].socket)
    assert client is not None
    try:
        return [g.limits.current_mw / 1000 for g in client.get_power().gpus]
    finally:
        client.close()


def test_the_desired_file_caps_the_selected_nodes_once(agents: AgentFleet) -> None:
    desired = agents.root / "desired.yaml"
    desired.write_text(DESIRED)
    a30_before = _watts(agents, "a30")
    first = agents.coordinator("serve", "--once", "--desired", str(desired))
    assert first.exit_code == 0, first.output
    assert "power h100: succeeded 8 GPU(s) capped" in first.output
    assert "power a30" not in first.output
    assert _watts(agents, "h100") == [500.0] + [560.0] * 7
    assert _watts(agents, "a30") == a30_before  # the rule selects H100 nodes only
    again = agents.coordinator("serve", "--once", "--desired", str(desired))
    assert again.exit_code == 0, again.output
    assert "differ from the desired state" not in again.output  # preview: unchanged


def test_a_bad_power_rule_is_refused_naming_its_field(agents: AgentFleet) -> None:
    desired = agents.root / "bad.yaml"
    desired.write_text(
        "version: v1\npower:\n  - {selector: '', limits: [{gpus: all, limit: 500}]}\n"
    )
    outcome = agents.coordinator("serve", "--once", "--desired", str(desired))
    assert "power[0].limits[0].limit" in outcome.output, outcome.output


def test_a_node_whose_gpu_fell_off_the_bus_is_left_alone_and_said(agents: AgentFleet) -> None:
    """GPU 0 of the H100 node fell off the bus: the rule `gpus: [0]` said "GPU 0 does not
    exist" when the coordinator rolled it out. The agent marks the GPU failed (XID 79, a node
    reboot): the node is left out as unhealthy, saying why, and no GPU is changed. (The
    agent's own refusal of a spec naming a lost GPU, "GPU 0 is lost", is
    tests/unit/power/test_service.py's; a pass before the mark reached it raced the XID.)"""
    desired = agents.root / "lost.yaml"
    desired.write_text(DESIRED.replace("limit: 0.8", "limit: 0.7"))
    before = _watts(agents, "h100")
    agents.sim("h100", "lost", "0")
    client = AgentClient.connect(agents.agents["h100"].socket)
    assert client is not None
    try:
        wait_for(
            lambda: any(g.lost and g.condition for g in client.node().gpus), "GPU 0 marked", 30
        )
        outcome = agents.coordinator("serve", "--once", "--desired", str(desired))
        assert outcome.exit_code == 10, outcome.output
        assert "h100 (unhealthy: GPU 0 failed: XID 79" in outcome.output, outcome.output
        assert _watts(agents, "h100") == before[1:]  # the GPUs that answer, unchanged
    finally:
        client.close()
        agents.sim("h100", "reboot")
