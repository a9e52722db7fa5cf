"""Two `gpu-agent coordinator serve` replicas with no Kubernetes API (so no Lease) against three
real agents (simulated H100 nodes, mTLS), max-unavailable 1: over many rollouts, the agents' own
operation records never show more than one node changing at once (docs/coordinator.md,
"Two replicas without a Lease")."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.integration.coordinators import NODES, Replica, desired, h100_fleet, layouts
from tests.unit.api.support import wait_for
from tests.unit.coordinator.agents import AgentFleet, most_at_once, op_intervals

pytestmark = pytest.mark.integration

#: the layouts the rounds cycle through: every round changes every node
LAYOUTS = (("halves", "3g.40gb: 2"), ("sevenths", "1g.10gb: 7"), ("quarters", "2g.20gb: 3"))
ROUNDS = 10


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    with h100_fleet(tmp_path_factory.mktemp("nolease")) as fleet:
        yield fleet


def test_two_replicas_without_a_lease_never_exceed_max_unavailable(agents: AgentFleet) -> None:
    path = agents.root / "desired.yaml"
    path.write_text(desired(*LAYOUTS[0]))
    # No kubeconfig and no in-cluster API: it runs without a Lease.
    apis = ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    env = {k: v for k, v in os.environ.items() if k not in apis}
    replicas = [
        Replica(f"replica-{i}", agents, path, env, "--retry-backoff", "0") for i in range(2)
    ]
    try:
        for replica in replicas:
            replica.serving()
        for round_ in range(ROUNDS):
            name, devices = LAYOUTS[round_ % len(LAYOUTS)]
            path.write_text(desired(name, devices))
            want = {n: {devices.split(":")[0]: int(devices.split(":")[1])} for n in NODES}
            wait_for(lambda w=want: layouts(agents) == w, f"round {round_}", 120, every=0.5)
        intervals = [i for n in NODES for i in op_intervals(agents.operations(n, "mig.apply"))]
        assert len(intervals) >= ROUNDS * len(NODES) - len(NODES)
        assert most_at_once(intervals) == 1, intervals
    finally:
        for replica in replicas:
            replica.stop()
