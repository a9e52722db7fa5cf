"""Two `gpu-agent coordinator serve` replicas against three real agents (simulated H100 nodes,
mTLS) and the Kubernetes API stand-in: they take turns on one Lease, so at most
max_unavailable nodes change at once by the agents' own operation records, through a rollout
and a handover after the leader is killed; the standby is ready but does not act; a hand-run
`fleet apply` is refused naming the holder."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.cli.fleet import fleet
from tests.integration.coordinators import NODES, Replica, desired, h100_fleet, layouts
from tests.kube.fake_api import FakeKubeApi, Pod
from tests.kube.fixtures import stand_in_kubeconfig
from tests.unit.api.support import wait_for
from tests.unit.coordinator.agents import AgentFleet, invoke, most_at_once, op_intervals

pytestmark = pytest.mark.integration

LEASE = ("gpu-agent", "gpu-agent-coordinator")
#: Waits on a rollout's steps: generous, the replicas, agents and API stand-in share two cores.
STEP_S = 120.0


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    with h100_fleet(tmp_path_factory.mktemp("replicas")) as fleet:
        yield fleet


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def replica(name: str, agents: AgentFleet, desired: Path, kubeconfig: Path) -> Replica:
    """The leader keeps the Lease unless it dies: a renewal may wait seconds on a loaded
    machine (a 2 s renew deadline once handed a live leader's rollout to the standby, which
    started its nodes again), and a killed leader's Lease is free 15 s later."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    lease = ("--namespace", "gpu-agent", "--lease-duration", "15", "--renew-deadline", "10")
    return Replica(name, agents, desired, env, *lease, "--retry-period", "1")


def test_two_replicas_take_turns_and_never_exceed_max_unavailable(
    agents: AgentFleet,
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, url = kube_api
    config = stand_in_kubeconfig(agents.root / "kubeconfig", url, tls_cert[0], "token-1")
    path = agents.root / "desired.yaml"
    path.write_text(desired("halves", "3g.40gb: 2"))
    replicas = [replica(f"replica-{i}", agents, path, config) for i in range(2)]
    try:
        for r in replicas:
            r.serving()

        def holder() -> str:
            lease = api.leases.get(LEASE)
            return str(lease["spec"]["holderIdentity"]) if lease else ""

        first = wait_for(holder, "a replica to take the lease", STEP_S)
        leader = next(r for r in replicas if first.startswith(r.name + "_"))
        standby = next(r for r in replicas if r is not leader)
        wait_for(
            lambda: layouts(agents) == {n: {"3g.40gb": 2} for n in NODES},
            "the leader to roll out the first layout",
            timeout=STEP_S,
            every=1.0,
        )

        # Every node's steps are Events on the Node; the rollout's status is in a ConfigMap.
        def reasons(node: str) -> list[str]:
            return [e["reason"] for e in api.events if e["involvedObject"]["name"] == node]

        for node in NODES:
            # Posted once the leader saw the node's operation end, after the layout changed.
            wait_for(lambda n=node: "MigConfigChanged" in reasons(n), f"{node}'s events", STEP_S)
            assert reasons(node)[:2] == ["RolloutStarted", "MigConfigChanged"]
        event = next(e for e in api.events if e["reason"] == "MigConfigChanged")
        assert event["involvedObject"] == {
            "apiVersion": "v1", "kind": "Node", "name": event["involvedObject"]["name"],
            "uid": event["involvedObject"]["name"],
        }  # fmt: skip
        assert event["metadata"]["namespace"] == "default" and event["reportingInstance"] == first

        def mig_status() -> dict | None:
            found = api.configmaps.get(("gpu-agent", "gpu-agent-rollout-status"))
            return json.loads(found["data"]["mig"]) if found else None

        status = wait_for(
            lambda: (m := mig_status()) and m["state"] == "done" and m, "status", STEP_S
        )
        assert status["leader"] == first and status["max_unavailable"] == "1"
        assert {n: r["state"] for n, r in status["nodes"].items()} == dict.fromkeys(
            NODES, "succeeded"
        )

        # The standby is ready (a working standby) and live, and says it is not leading.
        status, body = _get(standby.base + "/readyz")
        assert status == 200 and f"standby: the lease is held by {first}" in body
        assert _get(standby.base + "/healthz")[0] == 200
        assert "gpu_agent_coordinator_leader 0.0" in _get(standby.base + "/metrics")[1]
        assert "gpu_agent_coordinator_leader 1.0" in _get(leader.base + "/metrics")[1]

        # A human's change by hand is refused, naming the holder.
        monkeypatch.setenv("KUBECONFIG", str(config))
        mig = agents.root / "mig.yaml"
        mig.write_text(yaml.safe_load(desired("halves", "3g.40gb: 2"))["mig"][0]["config"])
        hand = agents.fleet("apply", "mig", "-f", str(mig), "--namespace", "gpu-agent")
        assert hand.exit_code == 4 and f"held by {first}" in hand.output, hand.output

        # The leader dies mid-way through the next rollout; the standby takes over and ends it.
        before = sum(len(agents.operations(n, "mig.apply")) for n in NODES)
        path.write_text(desired("sevenths", "1g.10gb: 7"))
        wait_for(
            lambda: sum(len(agents.operations(n, "mig.apply")) for n in NODES) > before,
            "the second rollout to start",
            timeout=STEP_S,
        )
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(10)
        second = wait_for(
            lambda: holder() if holder().startswith(standby.name) else None,
            "the standby to take the lease",
            timeout=60,
        )
        wait_for(
            lambda: layouts(agents) == {n: {"1g.10gb": 7} for n in NODES},
            "the new leader to finish the rollout",
            timeout=2 * STEP_S,
            every=1.0,
        )
        assert api.leases[LEASE]["spec"]["leaseTransitions"] >= 1
        wait_for(
            lambda: (m := mig_status()) and m["leader"] == second, "the new leader's status", STEP_S
        )
        assert _get(standby.base + "/readyz") == (200, f"leading as {second}\n")
        intervals = [i for n in NODES for i in op_intervals(agents.operations(n, "mig.apply"))]
        assert len(intervals) >= 2 * len(NODES)
        assert most_at_once(intervals) == 1
    finally:
        for r in replicas:
            r.stop()


def test_fleet_status_from_a_laptop_with_a_kubeconfig(
    agents: AgentFleet,
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside a pod, `--kubernetes` uses the kubeconfig (KUBECONFIG) to find the agent pods
    and their nodes' labels, as kubectl would."""
    api, url = kube_api
    selector = {"app.kubernetes.io/name": "gpu-agent", "app.kubernetes.io/component": "agent"}
    for name in NODES:
        api.nodes[name] = {"pool": "train" if name == "n2" else "batch"}
        port = agents.agents[name].tcp_port
        api.pods.append(
            Pod("gpu-agent", f"gpu-agent-{name}", name, dict(selector), "127.0.0.1", port)
        )
    config = stand_in_kubeconfig(agents.root / "laptop-kubeconfig", url, tls_cert[0], "token-1")
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    tls = agents.args()[2:]  # the client certificate flags, without --agents
    args = ["status", "--kubernetes", "--namespace", "gpu-agent", "--server-name", "localhost"]
    result = invoke(fleet, [*args, *tls, "--nodes", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert {n["name"] for n in json.loads(result.output)["nodes"]} == set(NODES)
    picked = invoke(fleet, [*args, *tls, "-l", "pool=train", "--nodes", "-o", "json"])
    assert [n["name"] for n in json.loads(picked.output)["nodes"]] == ["n2"]


def test_a_change_by_hand_takes_the_free_lease_and_posts_node_events(
    agents: AgentFleet,
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no coordinator acting, `fleet apply` holds the Lease while it runs, releases it,
    and leaves an Event on each Node it changed."""
    api, url = kube_api
    monkeypatch.setenv(
        "KUBECONFIG", str(stand_in_kubeconfig(agents.root / "kc", url, tls_cert[0], "token-1"))
    )
    mig = agents.root / "hand.yaml"
    mig.write_text(yaml.safe_load(desired("quarters", "2g.20gb: 3"))["mig"][0]["config"])
    result = agents.fleet("apply", "mig", "-f", str(mig), "--namespace", "gpu-agent")
    assert result.exit_code == 0, result.output
    lease = api.leases[LEASE]["spec"]
    assert lease["holderIdentity"] == "" and lease["leaseDurationSeconds"] == 1  # released
    changed = {e["involvedObject"]["name"] for e in api.events if e["reason"] == "MigConfigChanged"}
    assert changed == set(NODES)
    assert all(e["reportingInstance"].startswith("fleet-apply/") for e in api.events)
