"""An agent without hostPID (in a PID namespace of its own) cannot see the device plugin's
process. It said "not-loaded" all the same, so every pass of the coordinator found the node
drifted and had it signal a plugin it cannot see. Now it says the pickup is not observable, and
why; status says the sharing part is degraded for it; the coordinator leaves the node be.

Two agent processes on simulated nodes, ``sighup`` reload, no plugin running: ``host`` sees the
node's processes (hostPID), ``pod`` is told by its simulator's /proc that it runs in a child PID
namespace (``self/ns/pid`` not the node's, as a pod without hostPID reads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gpu.sim import SimControl
from tests.unit.api.support import Pki, wait_for
from tests.unit.coordinator.agents import AgentFleet
from tests.unit.sharing.pidns_fixtures import POD_NAMESPACE, a_proc

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

#: What the agent says of a plugin it cannot see (agent.sharing.reload.NO_HOSTPID).
NO_HOSTPID = "agent has no hostPID; plugin process not visible"
#: No such process runs: nothing to signal on either node.
PLUGIN = f"nvidia-device-plugin-{os.getpid()}"


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    root = tmp_path_factory.mktemp("hostpid")
    config = {
        name: {
            "sharing": {
                "config_path": str(root / name / "plugin" / "config.yaml"),
                "reload": "sighup",
                "plugin_process_name": PLUGIN,
            }
        }
        for name in ("host", "pod")
    }
    with AgentFleet(root, Pki(root / "pki"), dict.fromkeys(config, "h100-nvl"), config) as fleet:
        a_proc(SimControl(fleet.agents["pod"].state_dir).proc_root, POD_NAMESPACE, nspid="7")
        yield fleet


def local(agents: AgentFleet, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpu-agent ARGS` on that node, answered by its running agent."""
    agent = agents.agents[name]
    node = ("--simulate", agent.preset, "--state-dir", str(agent.state_dir))
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.main", *node, "--config", str(agent.config), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def fleet_json(agents: AgentFleet, *args: str, code: int = 0) -> dict:
    result = agents.fleet(*args, "-o", "json")
    assert result.exit_code == code, result.output
    return json.loads(result.output[result.output.index("{") :].split("\nerror:")[0])


def test_without_hostpid_the_pickup_is_not_observable_and_no_pass_retries_it(
    agents: AgentFleet,
) -> None:
    args = ("apply", "share", "--strategy", "time-slicing", "--replicas", "2")
    applied = fleet_json(agents, *args, "--max-failures", "3", code=10)["record"]["nodes"]
    assert applied["pod"]["state"] == "failed"  # written, not reloaded: said, and why
    assert applied["pod"]["detail"].startswith(f"written, not reloaded: {NO_HOSTPID}")
    assert applied["host"]["detail"].startswith("written, not reloaded: no process named")

    def said() -> dict[str, dict]:  # the agents re-read the plugin's config every few seconds
        rows = {r["name"]: r for r in fleet_json(agents, "status", "--nodes")["nodes"]}
        return rows if all("x2" in rows[n]["sharing"] for n in ("pod", "host")) else {}

    rows = wait_for(said, "both nodes to show the config written", timeout=30, every=1.0)
    # hostPID: no plugin runs, so it has not loaded the file. Without: that is not known.
    assert rows["host"]["sharing"] == "time-slicing nvidia.com/gpu x2 (not loaded)"
    assert rows["pod"]["sharing"] == "time-slicing nvidia.com/gpu x2"
    assert f"sharing: plugin unknown: {NO_HOSTPID}" in rows["pod"]["detail"]

    # What a pass of the coordinator would do: set the host again (its set retries the reload),
    # and leave the pod's node alone.
    previews = {p["node"]: p for p in fleet_json(agents, *args, "--dry-run")["previews"]}
    assert previews["host"]["would"] == "change", previews["host"]
    assert previews["pod"]["would"] == "unchanged", previews["pod"]


def test_status_and_doctor_on_the_node_say_the_agent_has_no_hostpid(agents: AgentFleet) -> None:
    """`gpu-agent status` listed no degraded part (or, once written, a false "not-loaded"), and
    the doctor's sharing/reload said the plugin might just not run."""
    written = local(agents, "pod", "share", "set", "--time-slicing", "gpu=3")
    assert written.returncode == 15, written.stdout + written.stderr  # written, not reloaded
    shown = local(agents, "pod", "share", "show")
    assert f"Plugin:    unknown: {NO_HOSTPID}" in shown.stdout, shown.stdout + shown.stderr
    status = local(agents, "pod", "status")
    assert f"degraded: sharing: plugin unknown: {NO_HOSTPID}" in status.stdout, status.stderr
    doctor = json.loads(local(agents, "pod", "doctor", "-o", "json").stdout)
    (reload,) = [c for c in doctor["checks"] if (c["duty"], c["name"]) == ("sharing", "reload")]
    assert (
        reload["state"] == "degraded" and f"reload sighup, but {NO_HOSTPID}" in reload["evidence"]
    )
    assert "hostPID: true" in reload["fix"]
    (strategy,) = [c for c in doctor["checks"] if c["name"] == "mig-strategy"]
    assert NO_HOSTPID in strategy["evidence"]  # the plugin's own setting is not seen either
    doctor = json.loads(local(agents, "host", "doctor", "-o", "json").stdout)
    (reload,) = [c for c in doctor["checks"] if (c["duty"], c["name"]) == ("sharing", "reload")]
    assert NO_HOSTPID not in reload["evidence"]  # there the plugin is just not running
