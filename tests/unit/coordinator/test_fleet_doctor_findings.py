"""`fleet doctor`'s findings: the example evidence is one the fix shown answers, and the nodes
with another cause of the same check are named, not handed that fix."""

from __future__ import annotations

from agent.coordinator.fleet.doctor import NodeDoctor, doctor_document, findings
from agent.wire.doctor import Check, CheckState, DoctorReport

F = CheckState.FAILED


def _node(name: str, *checks: Check) -> NodeDoctor:
    return NodeDoctor(name, f"{name}:9401", DoctorReport(name, checks))


def test_a_check_failing_for_two_causes_shows_evidence_its_fix_answers_and_names_the_rest() -> None:
    """health/xid failed on node-a for want of NVML and on node-b and node-c after XID 79: the
    group showed node-a's evidence beside the commonest fix (reboot), as if the node without a
    driver wanted a reboot, and nothing said node-a's fix differs."""
    no_nvml = Check("health", "xid", F, "no NVML: XID events are not watched", "install it")
    xid79 = Check("health", "xid", F, "GPU 3 failed: XID 79", "reboot-node (docs/health.md)")
    nodes = [_node("node-a", no_nvml), _node("node-b", xid79), _node("node-c", xid79)]
    (found,) = findings(nodes)
    assert found.nodes == ("node-a", "node-b", "node-c")
    assert (found.check.evidence, found.check.fix) == (xid79.evidence, xid79.fix)
    assert found.other_fix == ("node-a",)
    (doc,) = doctor_document(nodes)["findings"]
    assert doc["other_fix_nodes"] == ["node-a"]
