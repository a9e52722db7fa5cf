"""Power caps through a real agent: ``gpu-agent power apply`` sets them, /metrics shows them,
and they come back after a simulated reboot, a driver reload and an agent restart, until
``power restore`` puts the defaults back."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.request
from pathlib import Path

import pytest

from agent.client import AgentClient
from agent.gpu.sim import SimControl
from tests.integration.test_api_cli import cli, cli_config
from tests.unit.api.support import AgentProcess, agent_config, wait_for

pytestmark = pytest.mark.integration

_SPEC = "version: v1\npower:\n  - {gpus: all, limit: 0.8}\n  - {gpus: [0], limit: 500W}\n"
_WANT = [500.0] + [560.0] * 7  # dgx-h100: 700 W default
_DEFAULT = [700.0] * 8
#: The driver is checked (and lost caps set again) this often; the default is 2 s.
_FAST = {
    "driver": {"retry_max_s": 0.2, "check_s": 0.2},
    "telemetry": {"interval_s": 0.2},
}


def _series(port: int, name: str) -> list[float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(rf'^{name}\{{[^}}]*gpu="(\d+)"[^}}]*\}} (\S+)$', text, re.M)
    return [v for _, v in sorted((int(g), float(v)) for g, v in found)]


def _limits(agent: AgentProcess, _config: Path) -> list[float]:
    """Each GPU's limit as the agent's API reports it (its own NVML read), in watts."""
    client = AgentClient.connect(agent.socket)
    assert client is not None
    with contextlib.closing(client):
        return [g.limits.current_mw / 1000 for g in client.get_power().gpus]


def _node(tmp_path: Path) -> tuple[AgentProcess, Path, Path]:
    """An agent (not started) on a simulated dgx-h100, the spec file and the CLI's config."""
    root = tmp_path / "agent"
    root.mkdir()
    spec = tmp_path / "power.yaml"
    spec.write_text(_SPEC)
    return AgentProcess(root, agent_config(root, **_FAST)), spec, cli_config(tmp_path, root)


def test_caps_are_applied_shown_kept_across_reboot_reload_restart_and_restored(
    tmp_path: Path,
) -> None:
    agent, spec, config = _node(tmp_path)
    with agent:
        port = agent.metrics_port
        assert port is not None
        applied = cli(agent.state_dir, config, "power", "apply", "-f", str(spec), "-o", "json")
        assert applied.returncode == 0, applied.stderr
        assert [c["after_w"] for c in json.loads(applied.stdout)["changes"]] == _WANT
        assert _limits(agent, config) == _WANT
        wait_for(
            lambda: _series(port, "DCGM_FI_DEV_POWER_MGMT_LIMIT") == _WANT, "the limit on /metrics"
        )
        assert _series(port, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT") == _WANT
        assert _series(port, "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF") == _DEFAULT

        # A limit out of range: refused naming GPU and range; nothing changed.
        spec.write_text("version: v1\npower: [{gpus: [3], limit: 800W}]\n")
        refused = cli(agent.state_dir, config, "power", "apply", "-f", str(spec))
        assert refused.returncode == 2
        assert "800 W on GPU 3 (NVIDIA H100 80GB HBM3), outside its range 200-700 W" in (
            refused.stderr
        )
        assert _limits(agent, config) == _WANT

        control = SimControl(agent.state_dir)
        control.reboot()  # the driver forgets every limit; the running agent sets them again
        wait_for(lambda: _limits(agent, config) == _WANT, "caps re-applied after a reboot")
        control.driver_absent()  # an upgrade unloads the driver: detached, then attached
        control.driver_present()
        wait_for(lambda: _limits(agent, config) == _WANT, "caps re-applied after a reload")
        assert "power cap re-applied on GPU 0: 700 W -> 500 W" in agent.output()

    control.reboot()  # the node reboots while no agent runs
    with agent:  # the restarted agent sets the caps before it serves
        assert _limits(agent, config) == _WANT
        restored = cli(agent.state_dir, config, "power", "restore", "-o", "json")
        assert restored.returncode == 0, restored.stderr
        assert _limits(agent, config) == _DEFAULT
        port = agent.metrics_port
        assert port is not None
        wait_for(
            lambda: _series(port, "DCGM_FI_DEV_POWER_MGMT_LIMIT") == _DEFAULT,
            "defaults on /metrics",
        )
        control.reboot()
        client = AgentClient.connect(agent.socket)
        assert client is not None
        with contextlib.closing(client):
            view = client.get_power()
        assert view.spec_text == ""
        assert [g.limits.current_mw / 1000 for g in view.gpus] == _DEFAULT  # nothing re-caps now


def test_a_gpu_lost_at_apply_is_said_and_capped_once_it_answers_again(tmp_path: Path) -> None:
    """`power apply` listed the 7 answering GPUs and exit 0: nothing said GPU 3 was not capped.
    It warns now, and the agent caps GPU 3 when it comes back (a reboot here)."""
    agent, spec, config = _node(tmp_path)
    with agent:
        control = SimControl(agent.state_dir)
        control.mark_lost(3)
        wait_for(lambda: len(_limits(agent, config)) == 7, "GPU 3 lost to the agent")
        applied = cli(agent.state_dir, config, "power", "apply", "-f", str(spec))
        assert applied.returncode == 0, applied.stderr
        assert (
            "warning: GPU 3 is lost: not capped now; the agent sets the spec's cap when it "
            "answers again" in applied.stderr
        )
        again = cli(agent.state_dir, config, "power", "apply", "-f", str(spec))
        # not "every limit was already as asked": GPU 3's is not
        assert "no GPU that answers changed; GPU 3 lost: not done there" in again.stdout
        shown = cli(agent.state_dir, config, "power", "show")
        assert "warning: GPU 3 is lost: its limits cannot be read" in shown.stderr
        as_json = cli(agent.state_dir, config, "power", "show", "-o", "json")
        assert json.loads(as_json.stdout)["lost_gpus"] == [3]  # scripts see it too
        control.reboot()  # the GPU answers again
        wait_for(lambda: _limits(agent, config) == _WANT, "GPU 3 capped once it answers")
