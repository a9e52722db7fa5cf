"""One lost GPU degrades the node, it does not black it out (issue 15).

The agent runs as a real ``gpu-agent serve`` process on the simulator; ``gpu-agent sim lost N``
makes every NVML call on GPU N fail with GPU_IS_LOST, at start or while the agent runs. The lost
GPU is ``gpu_agent_gpu_up 0`` and ``health: lost`` in ``status`` (table and json) and GetNode;
every other GPU keeps its series and accepts MIG changes; ``/readyz`` stays ready, also when
every GPU is lost, naming them (docs/operations.md, "A lost GPU").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.client import AgentClient
from agent.gpu.sim import SimControl, open_simulator
from tests.kube.fake_api import FakeKubeApi
from tests.unit.api.support import REPO, AgentProcess, agent_config, http_get, wait_for

pytestmark = pytest.mark.integration

_METRICS_PORT = re.compile(r"agent serving: metrics [^ ]*:(\d+)")
_MIG = (
    "version: v1\nmig-configs:\n  half:\n"
    "    - {devices: [0], mig-enabled: true, mig-devices: {3g.40gb: 2}}\n"
)


def _cli(
    state_dir: Path, *args: str, config: Path | None = None
) -> subprocess.CompletedProcess[str]:
    extra = ["--config", str(config)] if config is not None else []
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "--simulate",
            "dgx-h100",
            "--state-dir",
            str(state_dir),
            *extra,
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _up(metrics: str) -> dict[str, float]:
    """gpu label -> gpu_agent_gpu_up value."""
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^gpu_agent_gpu_up\{[^}]*gpu="(\d+)"[^}]*\} (\S+)$', metrics, re.M)
    }


def _temps(metrics: str) -> set[str]:
    return set(re.findall(r'^DCGM_FI_DEV_GPU_TEMP\{[^}]*gpu="(\d+)"', metrics, re.M))


def _lost_in_getnode(client: AgentClient) -> set[int]:
    return {g.layout.gpu.index for g in client.node().gpus if g.lost}


def test_a_gpu_lost_before_start_leaves_the_agent_serving_the_others(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    open_simulator(agent.state_dir, "dgx-h100")  # the node exists before the agent
    SimControl(agent.state_dir).mark_lost(3)
    with agent:
        port = int(_METRICS_PORT.search(agent.output()).group(1))  # type: ignore[union-attr]
        status, metrics = http_get(port, "/metrics")
        assert status == 200
        assert _up(metrics) == {str(i): (0.0 if i == 3 else 1.0) for i in range(8)}
        assert _temps(metrics) == {str(i) for i in range(8) if i != 3}
        assert http_get(port, "/readyz") == (200, "ready\n")

        client = AgentClient.connect(agent.socket)
        assert client is not None
        assert _lost_in_getnode(client) == {3}
        config = agent_config(tmp_path)
        shown = _cli(agent.state_dir, "status", "-o", "json", config=config)
        assert shown.returncode == 0, shown.stderr
        gpus = json.loads(shown.stdout)["gpus"]
        health = {g["index"]: g["health"] for g in gpus}
        assert health == {i: ("lost" if i == 3 else "ok") for i in range(8)}
        assert "GPU is lost" in gpus[3]["detail"] and gpus[3]["uuid"] is None
        table = _cli(agent.state_dir, "status", config=config)
        assert table.returncode == 0, table.stderr
        assert re.search(r"^3\s+lost\s", table.stdout, re.M), table.stdout
        assert "GPU 3 is lost" in table.stdout

        # Another GPU still takes a MIG change, through the running agent.
        spec = tmp_path / "mig.yaml"
        spec.write_text(_MIG)
        applied = _cli(agent.state_dir, "mig", "apply", "-f", str(spec), config=config)
        assert applied.returncode == 0, applied.stdout + applied.stderr

        def gpu0_has_two_instances() -> bool:
            return len(client.node().gpus[0].layout.instances) == 2

        wait_for(gpu0_has_two_instances, "GPU 0's new instances in GetNode", 20)
        client.close()
    assert "Traceback" not in agent.output()


def test_a_gpu_lost_while_serving_goes_down_alone(tmp_path: Path) -> None:
    with AgentProcess(tmp_path, agent_config(tmp_path)) as agent:
        port = int(_METRICS_PORT.search(agent.output()).group(1))  # type: ignore[union-attr]
        client = AgentClient.connect(agent.socket)
        assert client is not None
        assert _lost_in_getnode(client) == set()
        lost = _cli(agent.state_dir, "sim", "lost", "5")
        assert lost.returncode == 0, lost.stderr

        wait_for(lambda: _lost_in_getnode(client) == {5}, "GPU 5 lost in GetNode", 20)
        # It keeps its identity: the agent saw it answer before.
        gpu5 = client.node().gpus[5].layout.gpu
        assert gpu5.uuid.startswith("GPU-") and gpu5.name
        wait_for(
            lambda: _up(http_get(port, "/metrics")[1]).get("5") == 0.0, "gpu_up 0 for GPU 5", 20
        )
        metrics = http_get(port, "/metrics")[1]
        assert _temps(metrics) == {str(i) for i in range(8) if i != 5}
        assert http_get(port, "/readyz") == (200, "ready\n")
        client.close()
        assert agent.proc is not None and agent.proc.poll() is None


def test_a_node_whose_every_gpu_is_lost_stays_ready_and_the_fleet_sees_them_lost(
    tmp_path: Path,
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/readyz said 503 "no GPU answers" once every GPU was lost: the pod went unready, so the
    coordinator's discovery skipped it ("agent pod ... is not ready") and `fleet status` showed
    that instead of the lost GPUs, while the agent's API and prewarm still served. Now /readyz
    stays 200 and names them; the pod's readiness here is what kubelet's probe of /readyz
    gives, and `fleet status --kubernetes` reaches the node and shows every GPU lost."""
    from agent.cli.fleet import fleet
    from tests.kube.fake_api import Pod
    from tests.kube.fixtures import stand_in_kubeconfig
    from tests.unit.api.support import Pki
    from tests.unit.coordinator.agents import AgentFleet, invoke

    api, url = kube_api
    with AgentFleet(tmp_path, Pki(tmp_path / "pki"), {"nvl": "h100-nvl"}) as agents:
        agent = agents.agents["nvl"]
        port = agent.metrics_port
        assert port is not None
        control = SimControl(agent.state_dir)
        count = len(AgentClient.connect(agent.socket).node().gpus)  # type: ignore[union-attr]
        for i in range(count - 1):
            control.mark_lost(i)
        wait_for(lambda: _up(http_get(port, "/metrics")[1]).get(str(count - 2)) == 0.0, "lost", 20)
        assert http_get(port, "/readyz") == (200, "ready\n")
        control.mark_lost(count - 1)
        every = ", ".join(map(str, range(count)))
        said = (
            f"ready; no GPU answers: every GPU is lost (GPU {every}); the API, prewarm and "
            "/metrics serve\n"
        )
        wait_for(lambda: http_get(port, "/readyz") == (200, said), "/readyz names them", 20)
        # kubelet's readinessProbe: the pod is Ready while /readyz answers 200
        selector = {"app.kubernetes.io/name": "gpu-agent", "app.kubernetes.io/component": "agent"}
        ready = http_get(port, "/readyz")[0] == 200
        pod = Pod("gpu-agent", "gpu-agent-nvl", "nvl", selector, "127.0.0.1", agent.tcp_port)
        pod.ready = ready
        api.pods.append(pod)
        api.nodes["nvl"] = {}
        config = stand_in_kubeconfig(tmp_path / "kubeconfig", url, tls_cert[0], "token-1")
        monkeypatch.setenv("KUBECONFIG", str(config))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        tls = agents.args()[2:]  # the client certificate flags, without --agents
        args = ["status", "--kubernetes", "--namespace", "gpu-agent", "--server-name", "localhost"]
        result = invoke(fleet, [*args, *tls, "--nodes", "-o", "json"])
        assert result.exit_code == 0, result.output
        (row,) = json.loads(result.output)["nodes"]
        assert row["health"] == "unhealthy", row  # reached: not "not ready", not unreachable
        assert [g["mig"] for g in row["gpus"]] == ["lost"] * count, row
        assert all(f"GPU {i} lost: GPU is lost" in row["detail"] for i in range(count)), row
        assert "not ready" not in result.output


def test_direct_mode_commands_work_beside_a_lost_gpu(tmp_path: Path) -> None:
    """Without an agent: `metrics`, `status` and `mig apply` of another GPU all work."""
    state = tmp_path / "state"
    open_simulator(state, "dgx-h100")
    SimControl(state).mark_lost(3)
    metrics = _cli(state, "metrics")
    assert metrics.returncode == 0, metrics.stderr
    assert _up(metrics.stdout)["3"] == 0.0 and _up(metrics.stdout)["0"] == 1.0
    shown = _cli(state, "status", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    gpu3 = json.loads(shown.stdout)["gpus"][3]
    assert gpu3["health"] == "lost" and gpu3["uuid"] is None
    spec = tmp_path / "mig.yaml"
    spec.write_text(_MIG)
    applied = _cli(state, "mig", "apply", "-f", str(spec), "-o", "json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    refused = _cli(state, "mig", "show")
    assert refused.returncode == 0, refused.stderr
