"""`coordinator serve`'s reconcile passes against the API stand-in: requests O(changes), not
O(nodes) (issue 35). After the first paged lists and the two watches (agent pods, nodes), a pass
over 200 nodes makes no API request at all, and a node's label change reaches the next pass by
the watch, again with no request; bench/coordinator_kube.py measures the same at 5,000 nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.coordinator.control.cluster import ClusterReport
from agent.coordinator.control.reconcile import Reconciler
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import AGENT_SELECTOR, KubeDiscovery
from agent.coordinator.kube import KubeLister
from tests.kube.fake_api import Pod
from tests.kube.fake_edge import EdgeKubeApi
from tests.unit.api.support import wait_for

NODES = 200
PAGE = 50
DESIRED = """\
version: v1
prewarm:
  - selector: pool=warm
    files: [{url: "https://origin.example/m.bin", name: m}]
"""


def test_a_steady_pass_makes_no_api_request_and_a_label_change_none_either(
    tmp_path: Path, edge_api: tuple[EdgeKubeApi, str], tls_cert: tuple[Path, Path]
) -> None:
    api, url = edge_api
    labels = dict(kv.split("=") for kv in AGENT_SELECTOR.split(","))
    for i in range(NODES):
        api.nodes[f"gpu-{i:03}"] = {"pool": "a"}
        # Not ready: no agent is dialled, the passes count only their API requests.
        api.pods.append(Pod("gpu-agent", f"agent-{i:03}", f"gpu-{i:03}", labels, ready=False))
    lister = KubeLister(url, api.token_path, ca_path=tls_cert[0], timeout=5.0)
    lister.page_size = PAGE
    discovery = KubeDiscovery(lister, "gpu-agent", watch=True)
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED)
    reconciler = Reconciler(
        Fleet(discovery, None),
        desired,
        cluster=ClusterReport(lister, "gpu-agent", "test"),
        identity="test",
    )

    def requests() -> list[str]:
        return [f"{c.method} {c.path}" for c in api.since(0) if not c.watch]

    try:
        asyncio.run(reconciler.pass_once())
        first = requests()
        pages = -(-(NODES + 2) // PAGE)  # the fixture's two nodes besides
        assert first.count("GET /api/v1/nodes") == pages
        assert first.count("GET /api/v1/namespaces/gpu-agent/pods") == -(-NODES // PAGE)
        assert len(first) == first.count("GET /api/v1/nodes") + -(-NODES // PAGE)
        for _ in range(3):
            asyncio.run(reconciler.pass_once())
        assert requests() == first, "a steady pass made API requests"
        assert reconciler.stats.passes["ok"] == 4
        assert reconciler.stats.nodes["unreachable"] == NODES

        api.set_labels("gpu-007", {"pool": "warm"})

        def relabelled() -> bool:
            found = asyncio.run(discovery.targets())
            return any(t.labels.get("pool") == "warm" for t in found)

        wait_for(relabelled, "the label by the watch", timeout=10)
        asyncio.run(reconciler.pass_once())
        assert requests() == first, "a label change made the pass list again"
        assert api.open_watches == 2
    finally:
        discovery.close()
