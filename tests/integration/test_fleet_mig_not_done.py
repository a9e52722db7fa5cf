"""A node the fleet apply did not bring to the config is never `succeeded` or `unchanged`: on
a passthrough VM the MIG mode change waits for a reboot (the agent's apply says pending, exit
14), and a config none of whose entries select the node's GPUs (another model's device filter)
changes nothing there but is not held. Both read `succeeded`/`unchanged` with exit 0, so
`fleet resume` skipped them. Two A30 agent processes on simulated nodes, over mTLS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.api.support import REPO, Pki
from tests.unit.coordinator.agents import AgentFleet

pytestmark = pytest.mark.integration

A30 = """\
version: v1
mig-configs:
  halves:
    - devices: all
      mig-enabled: true
      mig-devices: {"2g.12gb": 2}
"""


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    root = tmp_path_factory.mktemp("fleet-mig-not-done")
    with AgentFleet(root, Pki(root / "pki"), {"vm": "a30-node", "a30": "a30-node"}) as fleet:
        yield fleet


def _json(output: str) -> dict:
    """The JSON document in the output (stderr's lines are mixed in, before and after)."""
    found, _ = json.JSONDecoder().raw_decode(output[output.index("{") :])
    return found


def test_a_mode_change_pending_a_vm_reboot_fails_the_node_and_resume_redoes_it(
    agents: AgentFleet, tmp_path: Path
) -> None:
    config = tmp_path / "a30.yaml"
    config.write_text(A30)
    record = tmp_path / "rollout.json"
    agents.sim("vm", "passthrough", "true")
    try:
        applied = agents.fleet(
            "apply", "mig", "-f", str(config), "-c", "halves", "--record", str(record),
            "-o", "json", names=["vm"],
        )  # fmt: skip
        assert applied.exit_code != 0, applied.output
        node = _json(applied.output)["record"]["nodes"]["vm"]
        assert node["state"] == "failed", node
        assert (
            "MIG mode change pending: GPU 0: the driver needs a reboot of this (passthrough) VM"
            in node["detail"]
        ), node
        # The node's agent says the same of its operation: failed, not succeeded.
        (op,) = agents.operations("vm", "mig.apply")
        assert op.error.reason == "NotApplied", op
        # The dry run says so too: a VM reboot applies that mode, no apply does.
        preview = agents.fleet(
            "apply", "mig", "-f", str(config), "-c", "halves", "--dry-run", "-o", "json",
            names=["vm"],
        )  # fmt: skip
        (seen,) = _json(preview.output)["previews"]
        assert seen["would"] == "refused", seen
        assert (
            "MIG mode change pending: a reboot of this (passthrough) VM applies it on GPU 0"
            in seen["detail"]
        ), seen
        # Resume redoes it (a failed node), and it stays failed until the VM reboots.
        resumed = agents.fleet("resume", str(record), "-o", "json")
        assert resumed.exit_code != 0, resumed.output
        again = _json(resumed.output)["record"]["nodes"]["vm"]
        assert (again["state"], again["attempt"]) == ("failed", 2), again
    finally:
        agents.sim("vm", "passthrough", "false")
        agents.sim("vm", "reboot")


def test_a_config_that_selects_no_gpu_of_the_node_is_refused_not_unchanged(
    agents: AgentFleet,
) -> None:
    """examples/mig-config.yaml's all-1g is for H100 and H200 boards: on an A30 node it selects
    no GPU, so `mig assert` of it fails there."""
    example = str(REPO / "examples" / "mig-config.yaml")
    preview = agents.fleet(
        "apply", "mig", "-f", example, "-c", "all-1g", "--dry-run", "-o", "json", names=["a30"]
    )
    (seen,) = _json(preview.output)["previews"]
    assert seen["would"] == "refused", seen
    assert "the config selects no GPU of this node" in seen["detail"], seen
    applied = agents.fleet(
        "apply", "mig", "-f", example, "-c", "all-1g", "-o", "json", names=["a30"]
    )
    assert applied.exit_code != 0, applied.output
    node = _json(applied.output)["record"]["nodes"]["a30"]
    assert node["state"] == "failed", node
    assert "the config selects no GPU of this node" in node["detail"], node
    assert "GPU 0 is not selected by any entry" in node["detail"], node
    assert agents.operations("a30", "mig.apply") == []  # nothing was asked of its GPUs
