"""Two `gpu-agent coordinator serve` replicas with no Kubernetes API (so no Lease) against three
real agents (simulated H100 nodes, mTLS), max-unavailable 1: over many rollouts, the agents' own
operation records never show more than one node changing at once (docs/coordinator.md,
"Two replicas without a Lease")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.api.support import REPO, Pki, wait_for
from tests.unit.coordinator.agents import AgentFleet, most_at_once, op_intervals

pytestmark = pytest.mark.integration

NODES = ("n1", "n2", "n3")
#: the layouts the rounds cycle through: every round changes every node
LAYOUTS = (("halves", "3g.40gb: 2"), ("sevenths", "1g.10gb: 7"), ("quarters", "2g.20gb: 3"))
ROUNDS = 10


def desired(layout: str, devices: str) -> str:
    return f"""\
version: v1
rollout: {{max_unavailable: 1, max_failures: 3}}
mig:
  - selector: model=*H100*
    config_name: {layout}
    config: |
      version: v1
      mig-configs:
        {layout}:
          - devices: [0]
            mig-enabled: true
            mig-devices: {{{devices}}}
"""


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    root = tmp_path_factory.mktemp("nolease")
    with AgentFleet(root, Pki(root / "pki"), dict.fromkeys(NODES, "dgx-h100")) as fleet:
        yield fleet


def serve(name: str, agents: AgentFleet, path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`coordinator serve` with no kubeconfig and no in-cluster API: it runs without a Lease."""
    log = agents.root / f"{name}.log"
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["POD_NAME"] = name
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-c",
                "from agent.cli.coordinator import coordinator; coordinator()",
                "serve", "--desired", str(path), "--interval", "1",
                "--retry-backoff", "0", "--listen", "127.0.0.1:0", *agents.args(),
            ],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    return proc, log


def layouts(agents: AgentFleet) -> dict[str, object]:
    out = agents.fleet("status", "--nodes", "-o", "json")
    return {n["name"]: n["gpus"][0]["devices"] for n in json.loads(out.output)["nodes"]}


def test_two_replicas_without_a_lease_never_exceed_max_unavailable(agents: AgentFleet) -> None:
    path = agents.root / "desired.yaml"
    path.write_text(desired(*LAYOUTS[0]))
    replicas = [serve(f"replica-{i}", agents, path) for i in range(2)]
    try:
        for _, log in replicas:
            wait_for(lambda log=log: re.search(r"/fleet/status on", log.read_text()), "serving")
        for round_ in range(ROUNDS):
            name, devices = LAYOUTS[round_ % len(LAYOUTS)]
            path.write_text(desired(name, devices))
            want = {n: {devices.split(":")[0]: int(devices.split(":")[1])} for n in NODES}
            wait_for(lambda w=want: layouts(agents) == w, f"round {round_}", 60, every=0.5)
        intervals = [i for n in NODES for i in op_intervals(agents.operations(n, "mig.apply"))]
        assert len(intervals) >= ROUNDS * len(NODES) - len(NODES)
        assert most_at_once(intervals) == 1, intervals
    finally:
        for proc, _ in replicas:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
