"""What a node says of MIG work it has not done, through a serving agent on a simulated node.

An apply whose rollback failed keeps its journal, and every later apply is refused until a
rollback succeeds; `status` said the node healthy, every doctor check was ok, and `mig plan`
exited 0 with a plan. And on a passthrough VM, where the apply said the MIG mode waits for a
reboot of the VM, doctor's mig/pending said it waits for a GPU reset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.cli.mig import PENDING_EXIT
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from tests.unit.api.support import REPO, AgentProcess, agent_config

pytestmark = pytest.mark.integration

EXAMPLE = str(REPO / "examples" / "mig-config.yaml")


def _cli(agent: AgentProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpu-agent ARGS`` against the serving agent (an embedded one when it is stopped)."""
    config = agent.state_dir.parent / "cli.yaml"
    config.write_text(yaml.safe_dump({"socket_path": str(agent.socket)}))
    return subprocess.run(
        [
            *(sys.executable, "-m", "agent.cli.main", "--simulate", agent.preset),
            *("--state-dir", str(agent.state_dir), "--config", str(config), *args),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _check(agent: AgentProcess, name: str) -> dict[str, str]:
    done = _cli(agent, "doctor", "-o", "json")
    checks = {f"{c['duty']}/{c['name']}": c for c in json.loads(done.stdout)["checks"]}
    return checks[name]


def _degraded(agent: AgentProcess) -> dict[str, str]:
    """`gpu-agent status`'s degraded components: name -> detail."""
    shown = _cli(agent, "status", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    return {d["component"]: d["detail"] for d in json.loads(shown.stdout)["degraded"]}


def _error(done: subprocess.CompletedProcess[str]) -> str:
    return next(line for line in done.stderr.splitlines() if line.startswith("error: "))


def test_a_failed_rollback_is_said_by_status_and_doctor_and_refuses_the_plan(
    tmp_path: Path,
) -> None:
    root = tmp_path / "agent"
    root.mkdir()
    agent = AgentProcess(root, agent_config(root))
    with agent:
        control = SimControl(agent.state_dir)
        control.inject_fault(
            "nvmlDeviceCreateGpuInstanceWithPlacement", "InsufficientResources", nth=6
        )
        control.inject_fault("nvmlGpuInstanceDestroy", "Unknown", count=100)
        failed = _cli(agent, "mig", "apply", "-f", EXAMPLE, "-c", "all-balanced")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "rolling back also failed" in failed.stderr, failed.stderr

        detail = _degraded(agent)["mig"]
        assert "could not be rolled back, its journal is kept (GPU " in detail, detail
        assert "every MIG apply is refused until the rollback succeeds" in detail, detail
        assert "run `gpu-agent mig apply` again or restart the agent" in detail, detail
        journal = _check(agent, "mig/journal")
        assert journal["state"] == "failed", journal
        assert "its journal is kept (GPU " in journal["evidence"], journal
        assert "restart the agent" in journal["fix"], journal

        # The plan is refused as the apply is: the same error, the same exit code.
        again = _cli(agent, "mig", "apply", "-f", EXAMPLE, "-c", "all-balanced")
        planned = _cli(agent, "mig", "plan", "-f", EXAMPLE, "-c", "all-balanced")
        assert again.returncode == 4, again.stdout + again.stderr
        assert planned.returncode == again.returncode, planned.stdout + planned.stderr
        assert _error(planned) == _error(again), (planned.stderr, again.stderr)
        assert "could not be rolled back yet" in _error(planned)

        # Once the rollback succeeds (the next apply retries it first), none of it is said.
        control.clear_faults()
        done = _cli(agent, "mig", "apply", "-f", EXAMPLE, "-c", "all-balanced")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "mig" not in _degraded(agent)
        assert _check(agent, "mig/journal")["state"] == "ok"
        assert _cli(agent, "mig", "plan", "-f", EXAMPLE, "-c", "all-balanced").returncode == 0


def test_doctor_says_a_passthrough_vms_mode_waits_for_a_reboot_as_the_apply_said(
    tmp_path: Path,
) -> None:
    root = tmp_path / "agent"
    root.mkdir()
    agent = AgentProcess(root, agent_config(root), preset="a30-node")
    open_driver("a30-node", agent.state_dir).close()  # the node's state file exists from here on
    SimControl(agent.state_dir).set_passthrough_vm(True)
    config = tmp_path / "a30.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  halves:\n    - devices: all\n      mig-enabled: true\n"
        '      mig-devices: {"2g.12gb": 2}\n'
    )
    with agent:
        applied = _cli(agent, "mig", "apply", "-f", str(config), "-c", "halves")
        assert applied.returncode == PENDING_EXIT, applied.stdout + applied.stderr
        assert "needs a reboot of this (passthrough) VM" in applied.stdout
        served = _check(agent, "mig/pending")
    alone = _check(agent, "mig/pending")  # an embedded agent: after a restart, as it was
    for pending in (served, alone):
        assert pending["state"] == "degraded", pending
        assert "until a GPU reset" not in pending["evidence"], pending
        assert "needs a reboot of this (passthrough) VM" in pending["evidence"], pending
        assert "GPU 0 on, GPU 1 on, GPU 2 on, GPU 3 on" in pending["evidence"], pending
        assert pending["fix"].startswith("reboot this VM"), pending
