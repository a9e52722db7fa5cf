"""API requests and watches of one agent, in steady state and during a change burst.

    .venv/bin/python -m bench.kube_steady [--steady-s 600] [--items 8]

Real parts: the whole agent (`agent.node.Node`, in process) on a simulated dgx-h100, reaching
the Kubernetes API stand-in (tests/kube/fake_api.py with tests/kube/fake_edge.py's counts) over
HTTPS as it would in a pod; a local HTTP origin for prewarm. Every call the agent makes is
counted by the server. Phases, each measured from its first change until the agent has made no
request for 2 s:

- steady: nothing changes for ``--steady-s`` seconds (after the start's requests ended);
- prewarm burst: ``--items`` files submitted at once, each turning ready (a cache label each);
- health flap: a fatal XID on GPU 0 (failed), cleared after the 3 s hold-down (healthy);
- MIG rollout: ``nvidia.com/mig.config=all-balanced`` set on the Node (the GPU Operator's
  protocol: pending with operands paused, applied, success with operands restored).

Goals (issue 35): steady, 0 writes and <= 0.01 requests/s, <= 2 watches; one write per burst
(per subresource: a condition is the status subresource's); none for an unchanged state.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.gpu.sim import SimControl
from agent.kube import InClusterKubeClient
from agent.prewarm.model import FileRequest
from tests.integration.prewarm_fixtures.origin import Origin
from tests.kube.fake_edge import Call, EdgeKubeApi
from tests.kube.fixtures import NODE, make_tls_cert
from tests.unit.api.support import REPO, InProcessAgent, agent_config, wait_for

#: all-balanced for the dgx-h100's boards, as shipped.
MIG_CONFIG = REPO / "examples" / "mig-config.yaml"


def _settle(api: EdgeKubeApi, quiet_s: float = 2.0, timeout: float = 120.0) -> float:
    """Until no call for ``quiet_s``; the time of the last call."""

    def quiet() -> bool:
        calls = api.since(0)
        return not calls or time.monotonic() - calls[-1].at >= quiet_s

    wait_for(quiet, "the agent to go quiet", timeout=timeout, every=0.1)
    calls = api.since(0)
    return calls[-1].at if calls else time.monotonic()


def _row(name: str, calls: list[Call], seconds: float, watches: int) -> str:
    requests = [c for c in calls if not c.watch]
    writes = Counter(
        "Node" if c.path == f"/api/v1/nodes/{NODE}" else
        "Node status" if c.path.endswith("/status") else
        "Event" if c.path.endswith("/events") else c.path.rsplit("/", 1)[-1]
        for c in calls if c.write
    )  # fmt: skip
    said = ", ".join(f"{n} {k}" for k, n in sorted(writes.items())) or "none"
    rate = len(requests) / seconds if seconds else 0.0
    return (
        f"| {name} | {seconds:.0f} | {len(requests)} | {rate:.4f} | {sum(writes.values())} "
        f"({said}) | {sum(c.watch for c in calls)} | {watches} |"
    )


def _phase(api: EdgeKubeApi, name: str, act: object) -> str:
    began = time.monotonic()
    most = api.open_watches
    assert callable(act)
    act()
    end = _settle(api)
    most = max(most, api.most_watches)
    return _row(name, api.since(began), max(end - began, 1.0), most)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steady-s", type=float, default=600.0)
    parser.add_argument("--items", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kube-steady-") as tmp:
        run(Path(tmp), args.steady_s, args.items)


def run(tmp: Path, steady_s: float, items: int) -> None:
    cert, key = make_tls_cert(tmp)
    token = tmp / "token"
    token.write_text("token-1\n")
    api = EdgeKubeApi(token_path=token)
    api.nodes[NODE] = {"kubernetes.io/hostname": NODE, "feature.node.kubernetes.io/x": "true"}
    server, url = api.serve(cert, key)
    client = InClusterKubeClient(url, token, ca_path=cert, timeout=5.0)
    InClusterKubeClient.in_pod = classmethod(lambda cls: client)  # type: ignore[method-assign,assignment]
    root = tmp / "agent"
    (tmp / "origin").mkdir()
    config = agent_config(
        root,
        node_name=NODE,
        telemetry={"kubelet_socket": str(root / "kubelet.sock"), "idle_reclaim_after_s": 3600},
        health={"hold_down_s": 3.0},
        mig={"watch_node_label": True, "config_file": str(MIG_CONFIG)},
    )
    rows = []
    try:
        with Origin(tmp / "origin") as origin, InProcessAgent(root, config) as agent:
            wait_for(lambda: api.nodes[NODE].get("gpu-agent.io/health") == "healthy", "marks")
            start = _settle(api)
            rows.append(_row("start (to quiet)", api.since(0), start - api.calls[0].at, 2))
            began = time.monotonic()
            time.sleep(steady_s)
            rows.append(_row("steady", api.since(began), steady_s, api.most_watches))
            prewarm = agent.node.services.prewarm
            for i in range(items):
                origin.add(f"f{i}.bin", bytes([i]) * 4096)

            def burst() -> None:
                ids = [
                    prewarm.submit(FileRequest(origin.url(f"f{i}.bin"), name=f"f{i}")).id
                    for i in range(items)
                ]
                for op in ids:
                    prewarm.run(op)
                wait_for(lambda: sum(k.startswith("gpu-agent.io/cache.") for k in api.nodes[NODE])
                         == items, "the cache labels")  # fmt: skip

            rows.append(_phase(api, f"prewarm burst ({items} items)", burst))
            control = SimControl(root / "state")

            def flap() -> None:
                control.raise_xid(0, 79)
                wait_for(lambda: api.nodes[NODE].get("gpu-agent.io/health") == "failed", "fail")
                wait_for(lambda: api.nodes[NODE].get("gpu-agent.io/health") == "healthy", "ok")

            rows.append(_phase(api, "health flap (failed, then healthy)", flap))

            def rollout() -> None:
                api.set_labels(NODE, {"nvidia.com/mig.config": "all-balanced"})
                wait_for(lambda: api.nodes[NODE].get("nvidia.com/mig.config.state") == "success",
                         "the MIG config applied", timeout=120)  # fmt: skip

            rows.append(_phase(api, "MIG rollout (label to success)", rollout))
    finally:
        api.close()
        server.shutdown()
        server.server_close()
    print("| phase | seconds | requests (not watches) | requests/s | writes | watches opened "
          "| watches open at most |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
