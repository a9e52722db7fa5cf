"""`fleet status`, a rollout and `fleet remediate --apply` against a real agent (a simulated
H100 node) whose GPU 1 is marked failed (XID 48, action reset-gpu), with the Kubernetes API
stand-in: the node is shown failed, a sharing rollout skips it, and remediate cordons it,
evicts the pod the mark names (its process then ends on the simulator), has the agent reset
GPU 1 through its ResetGpu (the simulator's reset; refused while the process ran), and
uncordons once GPU 1 reports healthy.

The real agent's own mark names no pod (no kubelet runs here), so its GetNode answers pass
through a proxy on a Unix socket (tests/unit/coordinator/fakeagents.py, upstream mode) that sets
GPU 1's mark with the pod: failed until the agent has reset it, healthy after (as the agent's
own mark now clears at its reset: tests/integration/test_health_marks.py). Every other call,
ResetGpu included, goes to the real agent over real gRPC (its admin socket) unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent._proto.gpuagent.v1 import agent_pb2
from agent.cli.fleet import fleet
from tests.kube.fake_api import FakeKubeApi, Pod
from tests.kube.fixtures import stand_in_kubeconfig
from tests.unit.api.support import REPO, Pki
from tests.unit.coordinator.agents import AgentFleet, invoke
from tests.unit.coordinator.fakeagents import FakeAgent, FakeAgents, fake_agents, mark

pytestmark = pytest.mark.integration

XID48 = "XID 48 (double-bit ECC error): needs a GPU reset"
POD = ("team", "train-0")


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[AgentFleet, FakeAgents, FakeAgent]]:
    real = AgentFleet(tmp_path, Pki(tmp_path / "pki"), {"n1": "dgx-h100"})
    with real, fake_agents() as proxies:

        def marks(answer: Any) -> None:
            for gpu in answer.gpus:
                failed = gpu.index == 1 and not proxy.resets
                gpu.condition.CopyFrom(
                    mark("failed", XID48, "reset-gpu", ("team/train-0",))
                    if failed
                    else mark("healthy")
                )

        proxy = proxies.add(
            agent_pb2.Node(name="n1"),
            upstream=f"unix:{real.agents['n1'].socket}",
            rewrite=marks,
        )
        yield real, proxies, proxy


def test_a_failed_gpu_is_shown_skipped_by_rollouts_and_reset_by_remediate(
    proxied: tuple[AgentFleet, FakeAgents, FakeAgent],
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real, proxies, proxy = proxied
    api, url = kube_api
    args = [*proxies.args(), "--namespace", "gpu-agent"]

    status = json.loads(invoke(fleet, ["status", "--nodes", "-o", "json", *args]).output)
    (n1,) = status["nodes"]
    assert n1["gpu_health"] == "failed"
    assert n1["gpus"][1]["health"]["state"] == "failed"
    assert n1["gpus"][1]["health"]["pods"] == ["team/train-0"]
    assert status["totals"]["gpu_health"]["healthy"] == 7

    share = ["apply", "share", "--strategy", "time-slicing", "--replicas", "2", "-o", "json"]
    skipped = invoke(fleet, [*share, *args])
    assert skipped.exit_code == 10, skipped.output
    record = json.loads(skipped.output.split("\nerror:")[0])["record"]
    assert record["nodes"]["n1"]["detail"].startswith(f"skipped: GPU 1 failed: {XID48}")
    assert "SharingService/SetSharing" not in proxy.calls

    real.sim("n1", "process", "start", "4242", "--gpu", "1", "--memory-mib", "1024")
    for gpu in ("1", "2"):
        real.sim("n1", "workload", gpu, "--sm", "0.5")
    api.nodes["n1"] = {}
    api.pods.append(Pod(*POD, "n1", {}))
    api.on_evict = lambda ns, name: real.sim("n1", "process", "stop", "4242")
    monkeypatch.setenv("KUBECONFIG", str(stand_in_kubeconfig(real.root / "kc", url, tls_cert[0])))
    result = invoke(fleet, ["remediate", "n1", "--apply", "-o", "json", *args])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["outcome"]["result"] == "healthy", doc
    assert proxy.resets == [1]
    assert api.unschedulable == set() and POD not in {(p.namespace, p.name) for p in api.pods}
    patches = [r.body["spec"]["unschedulable"] for r in api.requests if r.method == "PATCH"]
    assert patches == [True, False]
    # The reset was the simulator's (the agent's configured reset): GPU 1's workload is gone,
    # GPU 2's is not.
    workloads = [g["workload"] for g in _sim_state(real)["gpus"][1:3]]
    assert workloads == [{}, {"sm_active": 0.5}]


def _sim_state(real: AgentFleet) -> Any:
    agent = real.agents["n1"]
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "--simulate",
            agent.preset,
            "--state-dir",
            str(agent.state_dir),
            "sim",
            "show",
            "-o",
            "json",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return json.loads(shown.stdout)


def test_the_agents_reset_is_refused_while_a_process_runs_and_for_a_gpu_it_lacks(
    proxied: tuple[AgentFleet, FakeAgents, FakeAgent],
) -> None:
    """ResetGpu on the real agent (its admin socket): validate_only changes nothing, a process
    on the GPU refuses the reset naming its pid, an index the node lacks is NOT_FOUND."""
    import grpc

    from agent._proto.gpuagent.v1 import mig_pb2, mig_pb2_grpc

    real, _, _ = proxied
    real.sim("n1", "process", "start", "4343", "--gpu", "3")
    real.sim("n1", "workload", "3", "--sm", "0.5")
    with grpc.insecure_channel(f"unix:{real.agents['n1'].socket}") as channel:
        mig = mig_pb2_grpc.MigServiceStub(channel)
        checked = mig.ResetGpu(mig_pb2.ResetGpuRequest(gpu_index=3, validate_only=True))
        assert checked.gpu_uuid.startswith("GPU-") and not checked.reset

        with pytest.raises(grpc.RpcError) as caught:
            mig.ResetGpu(mig_pb2.ResetGpuRequest(gpu_index=3), timeout=30)
        busy = caught.value
        assert busy.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "GPU 3 runs processes 4343" in (busy.details() or "")
        with pytest.raises(grpc.RpcError) as missing:
            mig.ResetGpu(mig_pb2.ResetGpuRequest(gpu_index=42), timeout=30)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert _sim_state(real)["gpus"][3]["workload"] == {"sm_active": 0.5}  # not reset


def test_a_prewarm_rollout_warms_a_node_with_a_failed_gpu(
    proxied: tuple[AgentFleet, FakeAgents, FakeAgent], tmp_path: Path
) -> None:
    """A sharing rollout skips the node whose GPU 1 failed; `fleet prewarm` skipped it too and
    exited 10, though a prewarm touches no GPU: the other seven still serve pods that want the
    file, and the cache outlives the reboot or reset the GPU needs. It is warmed."""
    import os

    from tests.integration.prewarm_fixtures.origin import Origin

    _, proxies, proxy = proxied
    (tmp_path / "origin").mkdir()
    with Origin(tmp_path / "origin") as origin:
        sha = origin.add("weights.bin", os.urandom(64 * 1024))
        args = ["prewarm", "--url", origin.url("weights.bin"), "--sha256", sha]
        result = invoke(fleet, [*args, "--name", "weights", "-o", "json", *proxies.args()])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{") :])
    assert doc["record"]["nodes"]["n1"]["state"] == "succeeded", doc
    assert doc["unhealthy"] == {}
    assert "PrewarmService/SubmitPrewarm" in proxy.calls
