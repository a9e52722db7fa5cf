"""`fleet remediate NODE`: a failed GPU's mark acted on. Fake agents over real gRPC answer
GetNode with the marks (tests/unit/coordinator/fakeagents.py); the Kubernetes API stand-in
(tests/kube/fake_api.py) serves cordons (spec.unschedulable) and evictions with PDB refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.fake_api import FakeKubeApi, Pod
from tests.kube.fixtures import stand_in_kubeconfig
from tests.unit.coordinator.agents import Outcome, invoke_process
from tests.unit.coordinator.fakeagents import (
    FakeAgent,
    FakeAgents,
    driverless_node,
    fake_agents,
    mark,
    node,
)

XID48 = "XID 48 (double-bit ECC error): needs a GPU reset"
XID79 = "XID 79 (GPU has fallen off the bus): needs a reboot"
TRAIN = ("team", "train-0")
SERVE = ("team", "serve-1")


@pytest.fixture
def agents() -> Iterator[FakeAgents]:
    with fake_agents() as found:
        yield found


@pytest.fixture
def api(
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> FakeKubeApi:
    fake, url = kube_api
    monkeypatch.setenv("KUBECONFIG", str(stand_in_kubeconfig(tmp_path / "kc", url, tls_cert[0])))
    fake.nodes["n1"] = {}
    fake.pods += [Pod(*TRAIN, "n1", {}), Pod(*SERVE, "n1", {})]
    return fake


def remediate(agents: FakeAgents, *args: str) -> Outcome:
    return invoke_process(
        ["fleet", "remediate", *args, *agents.args(), "--namespace", "gpu-agent"], timeout=60
    )


def _failed_gpu1(agents: FakeAgents, action: str = "reset-gpu", reason: str = XID48) -> FakeAgent:
    """n1: GPU 0 healthy; GPU 1 failed, its mark naming team/train-0 and running pid 4242;
    the agent attributes team/serve-1 to GPU 1 now."""
    answer = node(
        "n1",
        mark("healthy"),
        mark("failed", reason, action, ("team/train-0",)),
        processes={1: [4242]},
    )
    return agents.add(answer, pods={1: [SERVE]})


def _steps(api: FakeKubeApi) -> list[str]:
    out = []
    for r in api.requests:
        if r.method == "PATCH" and isinstance(r.body, dict) and "spec" in r.body:
            out.append("cordon" if r.body["spec"]["unschedulable"] else "uncordon")
        elif r.path.endswith("/eviction"):
            out.append("evict " + r.path.split("/")[-2])
    return out


def test_a_dry_run_says_what_would_happen_and_changes_nothing(
    agents: FakeAgents, api: FakeKubeApi
) -> None:
    agent = _failed_gpu1(agents)
    result = remediate(agents, "n1", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["apply"], doc["cordon"], doc["outcome"]) == (False, True, None)
    (gpu,) = doc["gpus"]
    assert (gpu["index"], gpu["action"]) == (1, "reset-gpu")
    assert gpu["failures"] == [f"GPU 1: {XID48}"]
    assert doc["evict"] == ["team/train-0", "team/serve-1"]
    assert doc["steps"] == [
        "cordon n1",
        "evict team/train-0 (Eviction API: PodDisruptionBudgets respected)",
        "evict team/serve-1 (Eviction API: PodDisruptionBudgets respected)",
        "reset GPU 1 through its agent once its processes have ended",
        "uncordon n1 once GPU 1 reports healthy",
    ]
    text = remediate(agents, "n1")
    assert "Would (dry run; --apply to do it):" in text.output and "1. cordon n1" in text.output
    assert agent.resets == [] and _steps(api) == [] and api.unschedulable == set()


def _heals_on_reset(agent: FakeAgent, method: str) -> None:
    """The agent's health machine: GPU 1 healthy again after its reset."""
    if method == "NodeService/GetNode" and agent.resets:
        agent.node.gpus[1].condition.CopyFrom(mark("healthy"))


def test_apply_cordons_evicts_within_the_budget_resets_and_uncordons_once_healthy(
    agents: FakeAgents, api: FakeKubeApi
) -> None:
    agent = _failed_gpu1(agents)
    agent.on_call = _heals_on_reset
    api.pdb_refusals[TRAIN] = 1  # its PodDisruptionBudget refuses once: retried
    api.pdb_retry_after = 1  # after the server's Retry-After

    def stopped(namespace: str, pod: str) -> None:  # the kubelet ends the pod's process
        if (namespace, pod) == TRAIN:
            del agent.node.gpus[1].processes[:]

    api.on_evict = stopped
    result = remediate(agents, "n1", "--gpu", "1", "--apply", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["outcome"] == {
        "result": "healthy",
        "detail": "GPU 1 healthy; uncordoned n1",
        "cordoned": False,
    }
    assert _steps(api) == [
        "cordon",
        "evict train-0",
        "evict train-0",
        "evict serve-1",
        "uncordon",
    ]
    assert agent.resets == [1] and api.unschedulable == set()
    assert {(p.namespace, p.name) for p in api.pods} & {TRAIN, SERVE} == set()
    # The reset came after the evictions, once the GPU's processes had ended.
    resets = agent.calls.index("MigService/ResetGpu")  # the validate_only check, first
    assert agent.calls[resets:].count("MigService/ResetGpu") == 2


def test_a_gpu_that_does_not_turn_healthy_leaves_the_node_cordoned(
    agents: FakeAgents, api: FakeKubeApi
) -> None:
    agent = _failed_gpu1(agents)
    api.on_evict = lambda ns, pod: agent.node.gpus[1].ClearField("processes")
    result = remediate(agents, "n1", "--apply", "--wait", "1")
    assert result.exit_code == 10, result.output
    assert "Outcome: not-healthy: not healthy in time (GPU 1 failed: XID 48" in result.output
    assert "n1 left cordoned; uncordon it (kubectl uncordon n1) once the GPU is" in result.output
    assert agent.resets == [1] and api.unschedulable == {"n1"}


def test_a_gpu_whose_process_list_the_agent_cannot_read_is_not_reset(
    agents: FakeAgents, api: FakeKubeApi
) -> None:
    """After the evictions GPU 1's process list failed to read: the agent sends it empty,
    saying why (GetNode's unread). It was taken for "no process" and the GPU reset; it is
    waited on as a busy one, and past the wait not reset, naming why."""
    agent = _failed_gpu1(agents)

    def unread(ns: str, pod: str) -> None:
        agent.node.gpus[1].ClearField("processes")
        agent.node.gpus[1].unread = "nvmlDeviceGetComputeRunningProcesses: Unknown Error"

    api.on_evict = unread
    result = remediate(agents, "n1", "--apply", "--wait", "1")
    assert result.exit_code != 0, result.output
    assert "GPU 1's processes are not known (nvmlDeviceGetComputeRunningProcesses" in result.output
    assert agent.resets == []


def test_a_node_that_needs_a_reboot_is_drained_and_stays_cordoned_never_rebooted(
    agents: FakeAgents, api: FakeKubeApi
) -> None:
    agent = _failed_gpu1(agents, "reboot-node", XID79)
    dry = json.loads(remediate(agents, "n1", "-o", "json").output)
    assert dry["steps"][-2:] == [
        "GPU 1: n1 needs a reboot: not done here (reboot it)",
        "n1 stays cordoned until it is rebooted",
    ]
    result = remediate(agents, "n1", "--apply", "-o", "json")
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.output)["outcome"]
    assert outcome["result"] == "reboot-needed" and outcome["cordoned"] is True
    assert f"n1 needs a reboot (GPU 1: {XID79})" in outcome["detail"]
    assert _steps(api) == ["cordon", "evict train-0", "evict serve-1"]
    assert api.unschedulable == {"n1"} and agent.resets == []


def test_a_restart_application_mark_evicts_without_cordoning(
    agents: FakeAgents, api: FakeKubeApi
) -> None:
    _failed_gpu1(agents, "restart-application", "XID 13 (graphics engine exception)")
    result = remediate(agents, "n1", "--apply", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["outcome"]["result"] == "restarted"
    assert _steps(api) == ["evict train-0", "evict serve-1"]


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        (["--gpu", "0"], 4, "GPU 0 of n1 is healthy, not failed: nothing to remediate"),
        (["--gpu", "5"], 2, "n1 has no GPU 5 (GPUs: 0, 1)"),
    ],
)
def test_a_gpu_that_is_not_failed_is_refused(
    agents: FakeAgents, api: FakeKubeApi, args: list[str], exit_code: int, message: str
) -> None:
    agent = _failed_gpu1(agents)
    result = remediate(agents, "n1", *args, "--apply")
    assert result.exit_code == exit_code and message in result.output, result.output
    assert _steps(api) == [] and agent.resets == []


def test_a_node_without_a_failed_gpu_is_refused(agents: FakeAgents, api: FakeKubeApi) -> None:
    agents.add(node("n1", mark("healthy"), None))
    result = remediate(agents, "n1")
    assert result.exit_code == 4
    assert "no GPU of n1 is failed (GPU 0 healthy, GPU 1 unknown): nothing to remediate" in (
        result.output
    )


@pytest.mark.parametrize("args", [[], ["--gpu", "3"]])
def test_a_node_whose_gpus_were_not_read_is_not_said_to_have_none(
    agents: FakeAgents, api: FakeKubeApi, args: list[str]
) -> None:
    """Its driver is not loaded: the refusal said `no GPU of n1 is failed (no GPU)`, or `n1 has
    no GPU 3 (GPUs: none)` (exit 2, a bad --gpu), for GPUs nobody read. It says they were not
    read and why, with DriverNotReady's exit code, and changes nothing."""
    from agent.errors import DriverNotReady

    driverless = driverless_node("n1")
    agents.add(driverless)
    result = remediate(agents, "n1", *args, "--apply")
    assert result.exit_code == DriverNotReady.exit_code, result.output
    assert "GPUs of n1 were not read" in result.output and "no module" in result.output
    assert "no GPU" not in result.output
    assert _steps(api) == []


def test_an_action_it_cannot_take_is_refused_before_any_change(
    agents: FakeAgents, api: FakeKubeApi
) -> None:
    _failed_gpu1(agents, "none")
    result = remediate(agents, "n1", "--apply")
    assert result.exit_code == 6
    assert "GPU 1 is failed but its mark asks for action 'none', which names no action" in (
        result.output
    )
    assert _steps(api) == []


def test_an_agent_that_cannot_reset_is_refused_before_the_node_is_cordoned(
    agents: FakeAgents, api: FakeKubeApi
) -> None:
    import grpc

    agent = _failed_gpu1(agents)
    agent.reset_error = (grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
    result = remediate(agents, "n1", "--apply")
    assert result.exit_code == 6, result.output
    assert _steps(api) == [] and api.unschedulable == set()


def test_a_gpu_wide_fault_is_said_once_not_once_per_mig_instance() -> None:
    """An XID 79 on a GPU with 5 MIG instances marks all six alike; the dry run printed the
    same reason six times on one line. It is said once, with how many instances carry it;
    an instance failed for a reason of its own is still named with it."""
    from agent.coordinator.fleet.health import GpuMark, InstanceMark, Mark
    from agent.coordinator.rollout.remediate import failures

    fault = Mark("failed", XID79, "reboot-node")
    own = Mark("failed", "XID 94 (Contained ECC error): needs an application restart", "")
    instances = tuple(InstanceMark(gi, "1g.10gb", fault) for gi in (7, 8, 9, 10))
    gpu = GpuMark(2, "GPU-2", fault, (*instances, InstanceMark(2, "3g.40gb", own)))
    assert failures(gpu) == (
        f"GPU 2 and 4 MIG instance(s) on it: {XID79}",
        f"GPU 2 GI 2 (3g.40gb): {own.reason}",
    )
    alone = GpuMark(1, "GPU-1", Mark("failed", XID48, "reset-gpu"))
    assert failures(alone) == (f"GPU 1: {XID48}",)
