"""`gpu-agent doctor` as an operator runs it: through a serving simulated agent and with none
(an embedded one), the same checks either way; the exit code by the worst; the agent's log
starts with the summary and /metrics carries each check's state; a node with no NVML and a
socket directory others may write each named with the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from agent.cli.doctor import DEGRADED_EXIT, FAILED_EXIT
from agent.doctor.service import CHECKS
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from tests.unit.api.support import REPO, AgentProcess, agent_config, wait_for

pytestmark = pytest.mark.integration


def doctor(
    state_dir: Path, config: Path, *args: str, simulate: str | None = "dgx-h100"
) -> subprocess.CompletedProcess[str]:
    node = ["--simulate", simulate] if simulate else []
    return subprocess.run(
        [
            *(sys.executable, "-m", "agent.cli.main", *node),
            *("--state-dir", str(state_dir), "--config", str(config), "doctor", *args),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPU_AGENT_")},
    )


def states(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    data = json.loads(done.stdout)
    assert set(data) == {"node", "checks"}
    for check in data["checks"]:
        assert set(check) == {"duty", "name", "state", "evidence", "fix"}
        assert check["evidence"]
        assert (check["fix"] == "") == (check["state"] == "ok")  # a problem always has a fix
    return {f"{c['duty']}/{c['name']}": c["state"] for c in data["checks"]}


def test_doctor_answers_the_same_through_the_running_agent_and_without_one(
    tmp_path: Path,
) -> None:
    root = tmp_path / "agent"
    root.mkdir(mode=0o700)
    config = agent_config(root)
    state = root / "state"
    alone = doctor(state, config, "-o", "json")
    # No containerd socket on this machine: image prewarm is degraded, so is the node.
    assert alone.returncode == DEGRADED_EXIT, alone.stderr
    embedded = states(alone)
    assert list(embedded) == [f"{d}/{n}" for d, n, _ in CHECKS]
    assert embedded["prewarm/containerd"] == "degraded"
    assert embedded["telemetry/nvml"] == "ok" and embedded["api/socket-dir"] == "ok"
    with AgentProcess(root, config) as agent:
        started = time.monotonic()
        served = doctor(state, config, "-o", "json")
        took = time.monotonic() - started
        assert served.returncode == DEGRADED_EXIT, served.stderr
        assert states(served) == embedded
        assert took < 10, f"doctor took {took:.1f}s"
        # The agent's log: one line per check that is not ok, with its fix, then the counts.
        summary = wait_for(
            lambda: f"doctor: {len(CHECKS)} checks:" in agent.output() and agent.output(),
            "the summary",
        )
        assert "doctor: prewarm/containerd degraded: no CRI socket" in summary
        assert "; fix: mount the host's" in summary
        url = f"http://127.0.0.1:{agent.metrics_port}/metrics"
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'gpu_agent_doctor_check_state{check="containerd",duty="prewarm"} 1.0' in body
        assert 'gpu_agent_doctor_check_state{check="nvml",duty="telemetry"} 0.0' in body
        table = doctor(state, config)
        assert table.returncode == DEGRADED_EXIT
        assert "DUTY" in table.stdout and "To fix, most severe first:" in table.stdout
        assert "prewarm/containerd (degraded): mount the host's" in table.stdout


def test_without_nvml_telemetry_fails_naming_library_not_found(tmp_path: Path) -> None:
    """No --simulate and no NVIDIA driver on this machine: the embedded agent serves without
    GPUs, and the doctor says why and what to do (exit 21)."""
    config = agent_config(tmp_path)
    done = doctor(tmp_path / "state", config, "-o", "json", simulate=None)
    assert done.returncode == FAILED_EXIT, done.stderr
    checks = {f"{c['duty']}/{c['name']}": c for c in json.loads(done.stdout)["checks"]}
    nvml = checks["telemetry/nvml"]
    assert nvml["state"] == "failed" and "library_not_found" in nvml["evidence"]
    assert "install the NVIDIA driver" in nvml["fix"]
    assert checks["mig/pending"]["fix"].startswith("fix telemetry/nvml first")


def test_a_socket_directory_others_may_write_fails_with_the_chmod(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o777)
    config = agent_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["socket_path"] = str(run / "agent.sock")
    config.write_text(yaml.safe_dump(data))
    done = doctor(tmp_path / "state", config, "-o", "json")
    assert done.returncode == FAILED_EXIT, done.stderr
    check = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "socket-dir")
    assert check["state"] == "failed" and "mode 0777" in check["evidence"]
    assert check["fix"] == f"chmod 0700 {run}"


def test_a_gpu_lost_before_the_agent_started_is_named_where_its_gpu_checks_pass_it_over(
    tmp_path: Path,
) -> None:
    """GPU 5 fell off the bus before the agent ever read it. `power/limits` said ok for the seven
    GPUs it read, and `health/xid` named the mark "GPU -1"."""
    state = tmp_path / "state"
    open_driver("dgx-h100", state).close()
    SimControl(state).mark_lost(5)
    done = doctor(state, agent_config(tmp_path), "-o", "json")
    checks = {f"{c['duty']}/{c['name']}": c for c in json.loads(done.stdout)["checks"]}
    power = checks["power/limits"]
    assert power["state"] == "degraded", power
    assert "GPU 5: lost before it was ever read" in power["evidence"]
    assert "GPU 5 failed: GPU lost" in checks["health/xid"]["evidence"]
    assert "GPU -1" not in done.stdout
