"""The agent on every driver generation the simulator models (issue #15).

A driver generation decides which NVML symbols exist (agent/gpu/sim/generations.py): R470 and the
upstream 535.98 lack nvmlDeviceGetComputeRunningProcesses_v3, R470 also lacks
nvmlDeviceGetMemoryInfo_v2 and the clocks-event-reasons call, and so on. Each generation runs
`status` and `metrics` directly, then `serve` as a real process scraped over HTTP with `status`
through it; a process on GPU 0 makes the process-list path run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from agent.gpu import open_driver
from agent.gpu.sim import SimControl, generations
from tests.unit.api.support import REPO, AgentProcess, agent_config

pytestmark = pytest.mark.integration

# R470 and 535.98 lack the _v3 process calls: the NVML gateway falls back through the versions.
GENERATIONS = [
    pytest.param("dgx-a100", "470.256.02", id="R470-A100"),
    pytest.param("dgx-a100", "535.98", id="535.98-A100"),
    pytest.param("dgx-a100", "535.183.01", id="R535-A100"),
    pytest.param("dgx-h100", "550.90.07", id="R550-H100"),
    pytest.param("dgx-b200", "570.133.20", id="R570-B200"),
]
_METRICS_PORT = re.compile(r"agent serving: metrics [\d.]+:(\d+)")


def _node(state_dir: Path, preset: str, driver: str) -> SimControl:
    open_driver(preset, state_dir).close()
    control = SimControl(state_dir)
    control.install_driver(driver)
    control.start_process(4242, 0, used_memory_mib=1024)
    return control


def _cli(state_dir: Path, preset: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agent.cli.main", "--simulate", preset]
    return subprocess.run(
        [*command, "--state-dir", str(state_dir), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GPU_AGENT_TELEMETRY__KUBELET_SOCKET": str(state_dir / "absent.sock")},
    )


def _gpu_temperatures(exposition: str) -> list[str]:
    return [line for line in exposition.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]


@pytest.mark.parametrize("preset, driver", GENERATIONS)
def test_status_and_metrics_without_an_agent(tmp_path: Path, preset: str, driver: str) -> None:
    _node(tmp_path, preset, driver)
    status = _cli(tmp_path, preset, "status", "-o", "json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert driver in json.dumps(shown)
    assert "4242" in json.dumps(shown)
    metrics = _cli(tmp_path, preset, "metrics")
    assert metrics.returncode == 0, metrics.stderr
    assert len(_gpu_temperatures(metrics.stdout)) == 8
    assert "FunctionNotFound" not in metrics.stderr


@pytest.mark.parametrize("preset, driver", GENERATIONS)
def test_serve_exports_and_answers_status(tmp_path: Path, preset: str, driver: str) -> None:
    root = tmp_path / "agent"
    root.mkdir()
    agent = AgentProcess(root, agent_config(root), preset=preset)
    _node(agent.state_dir, preset, driver)
    with agent:
        match = _METRICS_PORT.search(agent.output())
        assert match, agent.output()
        url = f"http://127.0.0.1:{match.group(1)}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            body = response.read().decode()
        assert len(_gpu_temperatures(body)) == 8
        status = _cli(
            agent.state_dir, preset, "--config", str(agent.config), "status", "-o", "json"
        )
        assert status.returncode == 0, status.stderr
        assert "4242" in status.stdout
    assert "FunctionNotFound" not in agent.output()


def test_the_generations_lack_what_nvitop_history_says() -> None:
    """The table the tests above run on: the symbols each generation lacks."""
    assert generations.missing_symbols("470.256.02") == (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetTemperatureV",
        "nvmlGpmMetricsGet",
        "nvmlGpmMigSampleGet",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
        "nvmlGpmSampleGet",
    )
    assert generations.missing_symbols("535.98") == (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetTemperatureV",
    )
    assert generations.missing_symbols("535.104.05") == ("nvmlDeviceGetTemperatureV",)
    assert generations.missing_symbols("570.133.20") == ()
