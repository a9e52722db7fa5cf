"""The coordinator acts on the agents' health marks: `fleet status` shows them, rollouts skip
nodes with a failed GPU and stop when a node turns unhealthy, `coordinator serve` counts GPUs
per verdict. Fake agents over real gRPC (tests/unit/coordinator/fakeagents.py) answer GetNode
with the marks set."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import generate_latest

from agent._proto.gpuagent.v1 import agent_pb2
from agent.coordinator.control import reconcile
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.inventory import node_view
from agent.coordinator.flows import Selection
from agent.wire.node import node_from
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


@pytest.fixture
def agents() -> Iterator[FakeAgents]:
    with fake_agents() as found:
        yield found


def run(agents: FakeAgents, *args: str) -> Outcome:
    return invoke_process(["fleet", *args, *agents.args()], timeout=60)


def _mixed(agents: FakeAgents) -> None:
    """a: GPU 0 failed, GPU 1 degraded, GPU 2 healthy; b: an agent that gives no verdict."""
    agents.add(
        node(
            "a",
            mark("failed", XID48, "reset-gpu", ("team/train-0",)),
            mark("degraded", "XID 63 (row remap pending)", "none"),
            mark("healthy"),
        )
    )
    agents.add(node("b", None, None))


def test_fleet_status_shows_each_gpus_verdict_and_the_nodes_worst(agents: FakeAgents) -> None:
    _mixed(agents)
    result = run(agents, "status", "--nodes", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    a, b = doc["nodes"]
    assert (a["gpu_health"], b["gpu_health"]) == ("failed", "unknown")
    health = [g["health"] for g in a["gpus"]]
    assert [h["state"] for h in health] == ["failed", "degraded", "healthy"]
    assert (health[0]["reason"], health[0]["action"], health[0]["pods"]) == (
        XID48,
        "reset-gpu",
        ["team/train-0"],
    )
    # No verdict is unknown, never healthy unchecked.
    assert [g["health"]["state"] for g in b["gpus"]] == ["unknown", "unknown"]
    assert doc["totals"]["gpu_health"] == {"healthy": 1, "unknown": 2, "degraded": 1, "failed": 1}
    assert a["health"] == "unhealthy" and f"GPU 0 failed: {XID48}" in a["detail"]

    # By default only a, whose GPUs failed and degraded, is listed; b gave no verdict.
    summary = json.loads(run(agents, "status", "-o", "json").output)
    assert [n["name"] for n in summary["attention"]] == ["a"]
    assert summary["totals"]["node_gpu_health"] == {
        "healthy": 0,
        "unknown": 1,
        "degraded": 0,
        "failed": 1,
    }
    table = run(agents, "status", "--nodes")
    assert table.exit_code == 0, table.output
    rows = table.output.splitlines()
    assert any(r.split()[:3] == ["a", "unhealthy:", "GPU"] and "failed" in r for r in rows)
    assert any(r.startswith("b ") and " unknown " in r for r in rows)
    failed = next(r for r in rows if r.startswith("a ") and " reset-gpu " in r)
    assert "XID 48" in failed and "team/train-0" in failed
    assert any(r.startswith("a ") and "degraded" in r and "XID 63" in r for r in rows)
    assert "GPU health: 1 healthy, 2 unknown, 1 degraded, 1 failed." in table.output


def test_local_agents_by_their_sockets_need_no_client_certificate(
    agents: FakeAgents, tmp_path: Path
) -> None:
    """`--agents unix:PATH` reaches a local agent, which serves its socket without TLS: with no
    client files (and no --insecure) the fleet answers; a TCP agent beside it still needs them,
    and the refusal names the option before any agent is called."""
    agents.add(node("a", mark("healthy")))
    (local,) = [a.address for a in agents.agents.values()]
    no_tls = ["--tls-dir", str(tmp_path)]
    result = invoke_process(["fleet", "status", "--agents", local, *no_tls, "-o", "json"], 60)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["totals"]["reachable"] == 1
    both = f"{local},127.0.0.1:1"
    refused = invoke_process(["fleet", "status", "--agents", both, *no_tls], 60)
    assert refused.exit_code != 0
    assert f"cannot read the client TLS file {tmp_path / 'ca.crt'} (--tls-ca" in refused.output


def test_an_unspecified_state_and_instance_marks_count_as_the_agent_said() -> None:
    """A mark set with state UNSPECIFIED is no verdict (unknown); a failed MIG instance makes
    its GPU, and so its node, failed; an instance without a verdict of its own is its GPU's."""
    answer = node("n", mark("healthy"), mark("healthy"))
    answer.gpus[0].condition.state = 0  # HEALTH_STATE_UNSPECIFIED, set
    answer.gpus[1].instances.add(id=7, profile_name="1g.10gb")
    bad = answer.gpus[1].instances.add(id=8, profile_name="3g.40gb")
    bad.condition.CopyFrom(mark("failed", "XID 94 (contained ECC)", "restart-application"))
    view = node_view(Target("unix:/x", "n"), node_from(answer))
    assert [m.state for m in view.marks] == ["unknown", "failed"]
    assert view.gpu_health == "failed"
    assert view.failed_gpus[0].describe() == (
        "GPU 1 GI 8 (3g.40gb) failed: XID 94 (contained ECC) (action restart-application)"
    )


def test_a_reason_that_names_its_action_is_not_followed_by_it_again() -> None:
    """The agent's XID reasons end `needs reboot-node`: fleet status printed `...: needs
    reboot-node (action reboot-node)` in every attention row."""
    from agent.coordinator.fleet.health import GpuMark, Mark

    said = "XID 79 (GPU has fallen off the bus): needs reboot-node"
    assert GpuMark(2, "GPU-2", Mark("failed", said, "reboot-node")).describe() == (
        f"GPU 2 failed: {said}"
    )


def _share(agents: FakeAgents, *extra: str) -> Outcome:
    return run(
        agents,
        "apply",
        "share",
        "--strategy",
        "time-slicing",
        "--replicas",
        "2",
        "-o",
        "json",
        *extra,
    )


def _set_sharing(agent: FakeAgent) -> int:
    return agent.calls.count("SharingService/SetSharing")


def test_a_rollout_skips_a_node_with_a_failed_gpu_and_shows_degraded_ones(
    agents: FakeAgents,
) -> None:
    a = agents.add(node("a", mark("failed", XID48, "reset-gpu")))
    b = agents.add(node("b", mark("healthy")))
    c = agents.add(node("c", mark("degraded", "XID 63 (row remap pending)", "none")))
    dry = _share(agents, "--dry-run")
    assert dry.exit_code == 0, dry.output
    previews = {p["node"]: p for p in json.loads(dry.output)["previews"]}
    assert (previews["a"]["would"], previews["b"]["would"]) == ("skipped", "change")
    assert previews["a"]["detail"] == f"GPU 0 failed: {XID48} (action reset-gpu)"

    result = _share(agents, "--max-unavailable", "3")
    assert result.exit_code == 10, result.output
    doc = json.loads(result.output.split("\nerror:")[0])
    nodes = doc["record"]["nodes"]
    assert nodes["a"]["state"] == "pending"
    assert nodes["a"]["detail"] == f"skipped: GPU 0 failed: {XID48} (action reset-gpu)"
    assert (nodes["b"]["state"], nodes["c"]["state"]) == ("succeeded", "succeeded")
    assert (_set_sharing(a), _set_sharing(b), _set_sharing(c)) == (0, 1, 1)
    assert doc["unhealthy"] == {"a": f"GPU 0 failed: {XID48} (action reset-gpu)"}
    assert doc["degraded"] == {"c": "GPU 0 degraded: XID 63 (row remap pending)"}
    assert "1 node(s) skipped for a failed GPU (a)" in result.output

    text = run(agents, "apply", "share", "--strategy", "time-slicing", "--replicas", "2")
    assert f"Skipped (GPU failed): a: GPU 0 failed: {XID48}" in text.output
    assert "Degraded (changed all the same): c: GPU 0 degraded" in text.output


def _fails_on_change(agent: FakeAgent, method: str) -> None:
    if method == "SharingService/SetSharing":
        failed = mark("failed", "XID 79 (fell off the bus)", "reboot-node")
        agent.node.gpus[0].condition.CopyFrom(failed)


@pytest.mark.parametrize(("policy", "c_changed"), [("stop", 0), ("skip", 1)])
def test_a_node_that_turns_unhealthy_during_the_rollout_stops_it(
    agents: FakeAgents, policy: str, c_changed: int
) -> None:
    """One node at a time; b's GPU fails as it is changed. With --on-unhealthy stop (the
    default) the rollout halts there, whatever --max-failures says: c is never started. With
    skip only b fails and c goes on."""
    a = agents.add(node("a", mark("healthy")))
    b = agents.add(node("b", mark("healthy")), on_call=_fails_on_change)
    c = agents.add(node("c", mark("healthy")))
    extra = ["--max-failures", "0", "--max-unavailable", "1"]
    if policy == "skip":
        extra += ["--on-unhealthy", "skip"]
    result = _share(agents, *extra)
    assert result.exit_code == 10, result.output
    record = json.loads(result.output.split("\nerror:")[0])["record"]
    assert record["nodes"]["a"]["state"] == "succeeded"
    assert record["nodes"]["b"]["state"] == "failed"
    assert record["nodes"]["b"]["detail"] == (
        "succeeded: config written; then GPU 0 failed: XID 79 (fell off the bus) "
        "(action reboot-node)"
    )
    assert (_set_sharing(a), _set_sharing(b), _set_sharing(c)) == (1, 1, c_changed)
    if policy == "stop":
        assert record["halted"].startswith("halted: b turned unhealthy during the rollout")
        assert record["nodes"]["c"]["state"] == "pending"
    else:
        assert record["halted"] is None and record["nodes"]["c"]["state"] == "succeeded"


def test_coordinator_metrics_count_gpus_per_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    views = (
        node_view(
            Target("unix:/a", "a"), node_from(node("a", mark("failed", XID48), mark("healthy")))
        ),
        node_view(Target("unix:/b", "b"), node_from(node("b", None))),
    )

    async def select(fleet: object, selector: object, **_: object) -> Selection:
        return Selection(views, {v.name: Target(v.address, v.name) for v in views})

    monkeypatch.setattr(reconcile, "select", select)
    reconciler = reconcile.Reconciler(cast(Fleet, object()), Path("/nonexistent/desired.yaml"))
    asyncio.run(reconciler.pass_once())
    text = generate_latest(reconciler.registry).decode()
    found: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("gpu_agent_coordinator_gpus{"):
            state = line.split('"')[1]
            found[state] = float(line.rsplit(" ", 1)[1])
    assert found == {"healthy": 1.0, "unknown": 1.0, "degraded": 0.0, "failed": 1.0}


def test_a_node_that_fails_before_its_turn_is_not_changed(agents: FakeAgents) -> None:
    """c was healthy at the sweep; its GPU fails while b is changed. When c's turn comes its
    agent is asked again: c is not changed, and the rollout halts (--on-unhealthy stop)."""
    b = agents.add(node("b", mark("healthy")))
    c = agents.add(node("c", mark("healthy")))

    def c_fails(agent: FakeAgent, method: str) -> None:
        if method == "SharingService/SetSharing":
            c.node.gpus[0].condition.CopyFrom(mark("failed", XID48, "reset-gpu"))

    b.on_call = c_fails
    result = _share(agents, "--max-failures", "0", "--max-unavailable", "1")
    assert result.exit_code == 10, result.output
    record = json.loads(result.output.split("\nerror:")[0])["record"]
    assert record["nodes"]["b"]["state"] == "succeeded"
    assert record["nodes"]["c"] == record["nodes"]["c"] | {
        "state": "failed",
        "detail": f"not changed: GPU 0 failed: {XID48} (action reset-gpu)",
    }
    assert _set_sharing(c) == 0
    assert record["halted"].startswith("halted: c turned unhealthy during the rollout")


def test_a_plan_names_the_lost_gpus_it_leaves_out_and_the_nodes_a_rollout_would_skip() -> None:
    """`fleet plan` counted a node with a failed GPU as if its changes would apply (a rollout
    skips it) and left a lost GPU out without a word."""
    from agent.cli.fleet.plan import _dra_plan_data, _dra_plan_lines
    from agent.coordinator.flows import plan
    from agent.coordinator.planning.demand import Demand, DemandEntry

    answer = node("n", mark("healthy"), mark("failed", XID48, "reset-gpu"), mark("healthy"))
    answer.gpus[2].health = agent_pb2.GPU_HEALTH_LOST
    answer.allocation.mode = agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN  # a mode MIG may change
    views = (node_view(Target("unix:/n", "n"), node_from(answer)),)
    result = plan(Selection(views, {}), Demand((DemandEntry("1g.10gb", 1),)), time_limit_s=5)
    lines = _dra_plan_lines(result)
    assert "Not planned: n GPU 2: lost: the driver does not answer for it" in lines
    assert (
        f"Planned, but a rollout skips n until it is healthy: GPU 1 failed: {XID48} "
        "(action reset-gpu)" in lines
    )
    data = _dra_plan_data(result)
    assert data["unhealthy"] == {"n": f"GPU 1 failed: {XID48} (action reset-gpu)"}
    assert {"node": "n GPU 2", "reason": "lost: the driver does not answer for it"} in (
        data["not_planned"]
    )


def test_a_gpu_whose_processes_were_not_read_is_left_out_of_the_plan_and_not_idle() -> None:
    """The agent could not read GPU 1's processes (GetNode's unread): its empty list read as
    idle to `fleet plan` and `fleet status`. The plan leaves it out, saying why, and status
    counts its devices as neither idle nor in use."""
    from agent.cli.fleet.plan import _dra_plan_lines
    from agent.coordinator.fleet.status import fleet_status
    from agent.coordinator.flows import plan
    from agent.coordinator.planning.demand import Demand, DemandEntry

    answer = node("n", mark("healthy"), mark("healthy"))
    answer.gpus[1].unread = "nvmlDeviceGetComputeRunningProcesses: Unknown Error"
    answer.allocation.mode = agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN
    view = node_view(Target("unix:/n", "n"), node_from(answer))
    result = plan(Selection((view,), {}), Demand((DemandEntry("1g.10gb", 1),)), time_limit_s=5)
    assert (
        "Not planned: n GPU 1: not read: nvmlDeviceGetComputeRunningProcesses: Unknown Error: "
        "its processes are not known" in _dra_plan_lines(result)
    )
    [status] = fleet_status([view]).nodes
    assert status.gpus[1].idle is None and status.gpus[0].idle is not None
    assert status.idle is None  # the node's, with one GPU's unknown: not a partial count


def test_a_failed_gpu_is_left_out_of_the_plan_and_its_instances_are_not_counted() -> None:
    """GPU 1 failed (XID 48, reset-gpu): its devices serve no pod. `fleet plan` counted its
    7g.80gb as met demand and would plan new instances on it. It is left out, saying why:
    the demand goes to the healthy GPU, and what the failed one holds is not counted as met."""
    from agent.cli.fleet.plan import _dra_plan_lines
    from agent.coordinator.fleet.health import FAILED, HEALTHY, GpuMark, Mark
    from agent.coordinator.fleet.inventory import NodeView
    from agent.coordinator.flows import plan
    from agent.coordinator.planning.demand import Demand, DemandEntry
    from agent.dra.mode import Allocation, AllocationMode
    from tests.unit.coordinator.fleets import gpu

    held = gpu("n", 1, instances=[("7g.80gb", 0)])
    view = NodeView(
        "n",
        "unix:/n",
        layouts=(gpu("n", 0), held),
        marks=(
            GpuMark(0, "GPU-n-0", Mark(HEALTHY)),
            GpuMark(1, "GPU-n-1", Mark(FAILED, XID48, "reset-gpu")),
        ),
        allocation=Allocation(AllocationMode.DEVICE_PLUGIN, "test"),
    )
    result = plan(Selection((view,), {}), Demand((DemandEntry("7g.80gb", 2),)), time_limit_s=5)
    assert [c.index for c in result.plan.changes] == [0]  # never GPU 1
    (unmet,) = result.plan.unmet
    assert (unmet.profile, unmet.missing) == ("7g.80gb", 1)  # GPU 1's instance serves no pod
    lines = _dra_plan_lines(result)
    assert f"Not planned: n GPU 1: failed: {XID48} (action reset-gpu): it serves no pod" in lines


def test_a_node_whose_gpus_were_not_read_is_named_as_not_planned() -> None:
    """Its driver is not ready, so its agent lists no GPU: `fleet plan` planned it as a node
    without GPUs and said nothing of it, neither planned nor "Not planned"."""
    from agent.cli.fleet.plan import _dra_plan_data, _dra_plan_lines
    from agent.coordinator.flows import plan
    from agent.coordinator.planning.demand import Demand, DemandEntry

    answer = node("n", mark("healthy"))
    answer.allocation.mode = agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN
    driverless = driverless_node("m")
    driverless.allocation.mode = agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN
    views = tuple(
        node_view(Target(f"unix:/{a.name}", a.name), node_from(a)) for a in (answer, driverless)
    )
    result = plan(Selection(views, {}), Demand((DemandEntry("1g.10gb", 1),)), time_limit_s=5)
    said = [line for line in _dra_plan_lines(result) if line.startswith("Not planned: m: ")]
    assert said and "GPUs not read" in said[0] and "no module" in said[0], said
    reasons = {n["node"]: n["reason"] for n in _dra_plan_data(result)["not_planned"]}
    assert "no module" in reasons.get("m", ""), reasons


def test_a_rollout_says_a_driver_not_ready_apart_from_a_failed_gpu() -> None:
    """a's driver is not ready, b has a failed GPU, c both (its failed GPU is the verdict):
    all three are left out, pending; the reasons `fleet apply` gives and the left-out nodes
    `coordinator serve` counts come from one result, with a waiting for its driver and b and
    c skipped for a failed GPU."""
    from agent.coordinator.flows import rollout
    from agent.coordinator.rollout.record import RolloutRecord

    c = node("c", mark("failed", XID48, "reset-gpu"))
    c.driver.CopyFrom(driverless_node("c").driver)
    answers = (driverless_node("a"), node("b", mark("failed", XID48, "reset-gpu")), c)
    views = tuple(node_view(Target(f"unix:/{n.name}", n.name), node_from(n)) for n in answers)
    selection = Selection(views, {v.name: Target(v.address, v.name) for v in views})
    record = RolloutRecord.start(
        "share",
        {},
        ["a", "b", "c"],
        selector="",
        max_unavailable="3",
        max_failures=1,
        node_timeout_s=60.0,
    )
    result = asyncio.run(rollout(cast(Fleet, object()), selection, record))
    assert {n: r.state for n, r in record.nodes.items()} == dict.fromkeys("abc", "pending")
    assert result.unread == {"a"}
    assert result.incomplete() == [
        "2 node(s) skipped for a failed GPU (b, c)",
        "1 node(s) skipped until their driver is ready (a)",
    ]
    left = result.left_out()
    assert sorted(left["unhealthy"]) == ["a", "b", "c"]
    assert left["unhealthy"]["a"].startswith("GPUs not read: waiting for the NVIDIA driver"), left
    assert left["unhealthy"]["c"] == f"GPU 0 failed: {XID48} (action reset-gpu)", left
