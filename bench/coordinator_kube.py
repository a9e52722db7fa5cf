#!/usr/bin/env python3
"""The coordinator against the Kubernetes API at fleet scale: 5,000 nodes and 5,000 agent pods.

    .venv/bin/python bench/coordinator_kube.py                  # 5,000 nodes, 2 agent processes
    .venv/bin/python bench/coordinator_kube.py --nodes 500 --steady-passes 2

Real parts: `gpu-agent coordinator serve --kubernetes` (a subprocess: leader election on the
Lease, pod and node informers, reconcile passes, the rollout, Events and the status ConfigMap,
GET /fleet/status) reaching the Kubernetes API stand-in (tests/kube/fake_api.py with
tests/kube/fake_edge.py's counts; schema validation off: it costs far more CPU than the answers)
through a kubeconfig over HTTPS, and `gpu-agent fleet status --coordinator URL` as a user runs
it. The stand-in holds ``--nodes`` Nodes (GPU Operator / GFD labels) and one agent pod per node
(ready, its pod IP 127.0.0.1 and its own ``grpc`` container port).

Cheap agents: every pod's port is a real mTLS gRPC listener with the agent's interceptor, but
one gRPC server per process listens on all of that process's ports and answers for all of them
(``--procs`` processes). Each answers GetNode with a canned inventory (a simulated DGX preset,
MIG layouts, no node name, so the coordinator names the view by the pod's node) and keeps MIG
state per connection: the coordinator holds one channel, so one connection, per agent, so a
connection stands for a node. A MIG apply takes ``--apply-s`` seconds.

Phases, every API call counted by the stand-in:
- start: the first lists (paged) and watches, the Lease taken, the first pass;
- steady: ``--steady-passes`` passes with nothing changing: requests per pass beside the Lease;
- `fleet status` end to end (a new CLI process, the leader's latest sweep; median of 3), and
  GET /fleet/status alone; the coordinator's CPU per pass from /proc;
- one node's label changes so a MIG rule picks it: that node rolled out, requests counted;
- ``--rollout-nodes`` nodes' labels change at once (0: skipped): the rollout's scheduling and
  its requests. A rollout not done in ``--wait-s`` is recorded as such, with its requests.

Each row is printed to stderr as it is measured; the table at the end. At 5,000 nodes on 2
busy cores a run takes about 12 minutes (BENCHMARKS.md, "Coordinator against the Kubernetes
API: 5,000 nodes").

Goals (issue 35): `fleet status` from the leader's sweep <= 2 s end to end at 5,000 nodes;
a pass's API requests O(changes), not O(nodes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent._proto.gpuagent.v1 import agent_pb2  # noqa: E402
from agent.coordinator.fleet.query import STATUS_PATH  # noqa: E402
from agent.coordinator.rollout.schedule import parse_max_unavailable  # noqa: E402
from bench.canned_agents import (  # noqa: E402
    CannedAgents,
    agent_server,
    canned_nodes,
    server_credentials,
)
from tests.kube.fake_api import Pod  # noqa: E402
from tests.kube.fake_edge import Call, EdgeKubeApi  # noqa: E402
from tests.kube.fixtures import make_tls_cert, stand_in_kubeconfig  # noqa: E402
from tests.unit.api.support import Pki  # noqa: E402

NAMESPACE = "gpu-agent"
AGENT_LABELS = {"app.kubernetes.io/name": "gpu-agent", "app.kubernetes.io/component": "agent"}
#: the label a rollout phase sets on a node so the desired MIG rule picks it
PICK = "bench.gpu-agent.io/mig"
DESIRED = f"""\
version: v1
rollout: {{max_unavailable: "10%", max_failures: 5, node_timeout_s: 300}}
mig:
  - selector: {PICK}=on
    config_name: bench
    config: |
      version: v1
      mig-configs:
        bench:
          - devices: all
            mig-enabled: true
            mig-devices: {{"1g.10gb": 7}}
"""


# -- cheap agents: one gRPC server per process, listening on many ports ------------------------


def _serve(
    count: int, nodes: list[bytes], pki_root: str, apply_s: float, conn: Connection
) -> None:  # pragma: no cover - runs in a child process
    async def main() -> None:
        answers = []
        for raw in nodes:
            answer = agent_pb2.GetNodeResponse.FromString(raw)
            answer.node.name = ""  # named by the pod's node, as the coordinator knows it
            answers.append(answer.SerializeToString())
        log: list[tuple[float, float]] = []
        agents = CannedAgents(answers, apply_s, log, by_peer=True)
        server = agent_server(agents, [("grpc.so_reuseport", 0)])
        credentials = server_credentials(Path(pki_root))
        ports = [server.add_secure_port("127.0.0.1:0", credentials) for _ in range(count)]
        await server.start()
        conn.send(ports)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop
        conn.send(log)
        await server.stop(None)

    asyncio.run(main())


# -- the run -------------------------------------------------------------------------------------


def node_labels(i: int) -> dict[str, str]:
    """What GPU Feature Discovery and the GPU Operator put on a GPU node."""
    product = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H200")[i % 3]
    return {
        "kubernetes.io/hostname": f"gpu-{i:05}",
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "topology.kubernetes.io/zone": f"zone-{i % 4}",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/cuda.driver.major": "550",
        "gpu-agent.io/health": "healthy",
    }


class Coordinator:
    """`gpu-agent coordinator serve --kubernetes` as a subprocess, and its /metrics."""

    def __init__(self, tmp: Path, config: Path, desired: Path, pki: Pki, args: Any) -> None:
        self.log = tmp / "coordinator.log"
        env = {**os.environ, "KUBECONFIG": str(config), "POD_NAME": "coordinator-0"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-c",
                    "from agent.cli.coordinator import coordinator; coordinator()",
                    "serve", "--kubernetes", "--namespace", NAMESPACE,
                    "--desired", str(desired), "--interval", str(args.interval),
                    "--listen", "127.0.0.1:0", "--timeout", "60",
                    "--tls-cert", str(pki.coordinator.cert), "--tls-key",
                    str(pki.coordinator.key), "--tls-ca", str(pki.ca),
                    "--server-name", "localhost", "--log-level", "info",
                ],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        self.base = ""

    def started(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the coordinator exited:\n{self.log.read_text()[-3000:]}")
        found = re.search(r"/fleet/status on 127\.0\.0\.1:(\d+)", self.log.read_text())
        if found:
            self.base = f"http://127.0.0.1:{found.group(1)}"
        return bool(found)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as response:
            text = response.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("gpu_agent_coordinator_"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def passes(self) -> int:
        m = self.metrics()
        return int(sum(v for k, v in m.items() if "reconcile_passes_total" in k))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def wait(what: str, check: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    say(f"waiting for {what}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise TimeoutError(f"waited {timeout:.0f} s for {what}")


def kind_of(call: Call) -> str:
    """A call's row: what the API server was asked for."""
    path = call.path
    if "/leases" in path:
        return "Lease " + call.method
    if call.watch:
        return "watch " + ("pods" if path.endswith("/pods") else path.rsplit("/", 1)[-1])
    if call.method == "GET" and path == "/api/v1/nodes":
        return "list nodes (page)"
    if call.method == "GET" and path.endswith("/pods"):
        return "list pods (page)"
    if "/events" in path:
        return "Event " + call.method
    if "/configmaps" in path:
        return "ConfigMap " + call.method
    return f"{call.method} {path}"


def summary(calls: list[Call]) -> str:
    found = Counter(kind_of(c) for c in calls)
    return ", ".join(f"{n} {k}" for k, n in sorted(found.items())) or "none"


def beside_lease(calls: list[Call]) -> list[Call]:
    return [c for c in calls if "/leases" not in c.path]


def status_end_to_end(base: str, nodes: int, fresh: bool = False) -> tuple[float, float, int]:
    """`gpu-agent fleet status --coordinator URL -o json` as a user runs it: (wall s, CPU s of
    the CLI process, bytes printed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", "from agent.cli.main import main; main()", "fleet", "status",
         "--coordinator", base, "-o", "json", *(["--fresh"] if fresh else [])],
        cwd=REPO, capture_output=True, check=True,
    )  # fmt: skip
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    doc = json.loads(out.stdout)
    reachable = doc["totals"]["reachable"]
    assert reachable == nodes, f"fleet status saw {reachable} reachable of {nodes}"
    return took, cpu, len(out.stdout)


def http_status(base: str, query: str = "") -> tuple[float, int]:
    """GET /fleet/status alone (no CLI): (wall s, bytes)."""
    started = time.perf_counter()
    with urllib.request.urlopen(base + STATUS_PATH + query, timeout=300) as response:
        body = response.read()
    return time.perf_counter() - started, len(body)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_LAST: list[object] = [None]


def lease_losses(api: EdgeKubeApi, coordinator: Coordinator) -> str:
    lease = api.leases.get((NAMESPACE, "gpu-agent-coordinator")) or {}
    transitions = (lease.get("spec") or {}).get("leaseTransitions", 0)
    log = coordinator.log.read_text()
    lost = log.count("lost the lease")
    stepped = log.count("not leading")
    return f"{transitions} transitions; {lost} passes stopped; {stepped} 'not leading' lines"


def rollout_done(api: EdgeKubeApi, names: list[str]) -> bool:
    found = api.configmaps.get((NAMESPACE, "gpu-agent-rollout-status"))
    if not found:
        return False
    doc = json.loads(found.get("data", {}).get("mig", "{}"))
    _LAST[0] = doc
    states = {n: s["state"] for n, s in doc.get("nodes", {}).items()}
    return doc.get("state") == "done" and all(states.get(n) == "succeeded" for n in names)


def start_agents(args: argparse.Namespace, pki: Pki) -> tuple[list[Any], list[Any]]:
    """The stand-in agents: ``args.procs`` processes sharing ``args.nodes`` mTLS ports; each
    sends its ports down its pipe once it listens."""
    ctx = multiprocessing.get_context("spawn")
    canned = canned_nodes(16, args.seed)
    pipes, procs = [], []
    for k in range(args.procs):
        mine, theirs = ctx.Pipe()
        count = len(range(k, args.nodes, args.procs))
        proc = ctx.Process(target=_serve, args=(count, canned, str(pki.root), args.apply_s, theirs))
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    return pipes, procs


def run(args: argparse.Namespace) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="coordinator-kube-") as name:
        tmp = Path(name)
        pki = Pki(tmp / "pki")
        cert, key = make_tls_cert(tmp)
        token = tmp / "token"
        token.write_text("token-1\n")
        pipes, procs = start_agents(args, pki)
        api = EdgeKubeApi(token_path=token, validate=False)
        server = None
        coordinator = None
        intervals: list[tuple[float, float]] = []
        try:
            ports = [pipe.recv() for pipe in pipes]
            for i in range(args.nodes):
                node = f"gpu-{i:05}"
                api.nodes[node] = node_labels(i)
                port = ports[i % args.procs][i // args.procs]
                api.pods.append(
                    Pod(NAMESPACE, f"gpu-agent-{i:05}", node, dict(AGENT_LABELS), "127.0.0.1", port)
                )
            server, url = api.serve(cert, key)
            config = stand_in_kubeconfig(tmp / "kubeconfig", url, cert, "token-1")
            desired = tmp / "desired.yaml"
            desired.write_text(DESIRED)
            began = time.monotonic()
            coordinator = Coordinator(tmp, config, desired, pki, args)
            wait("the coordinator to serve", coordinator.started, 120)
            wait("the first pass", lambda: coordinator.passes() >= 1, 600, 1.0)
            first = time.monotonic() - began
            calls = api.since(0)
            add(rows, "Start to the end of the first pass (cold: lists, watches, Lease, a TLS "
                "dial and GetNode per agent)", f"{first:.1f} s")  # fmt: skip
            add(rows, "Start: API requests (lists paged at 500 items, watches, Lease)",
                f"{len(calls)}: {summary(calls)}")  # fmt: skip
            steady(api, coordinator, args, rows)
            status(coordinator, args, rows)
            change(api, coordinator, args, rows, ["gpu-00000"], "One node's label changes")
            if args.rollout_nodes:
                picked = [f"gpu-{i:05}" for i in range(1, args.rollout_nodes + 1)]
                change(api, coordinator, args, rows, picked,
                       f"{len(picked)} nodes' labels change at once")  # fmt: skip
            add(rows, "Watches open at the end (at most, whole run)",
                f"{api.open_watches} ({api.most_watches}): agent pods and nodes")  # fmt: skip
            add(rows, "Lease over the whole run: leader changes (leaseTransitions), passes "
                "stopped for a lost lease (log)", lease_losses(api, coordinator))  # fmt: skip
        except BaseException:
            if coordinator is not None:
                say("coordinator log (end):\n" + coordinator.log.read_text()[-4000:])
                say(f"last rollout status: {json.dumps(_LAST[0])[:3000]}")
            raise
        finally:
            if coordinator is not None:
                coordinator.stop()
            api.close()
            for pipe in pipes:
                pipe.send("stop")
            for pipe in pipes:
                if pipe.poll(30):
                    intervals += pipe.recv()
            for proc in procs:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
            if server is not None:
                server.shutdown()
                server.server_close()
        add(rows, "Most nodes mid-apply at once (the agents' records)", str(_most(intervals)))
    return rows


def add(rows: list[tuple[str, str]], measure: str, result: str) -> None:
    rows.append((measure, result))
    say(f"| {measure} | {result} |")


def steady(api: EdgeKubeApi, coordinator: Coordinator, args: Any, rows: list[Any]) -> None:
    """Passes with nothing changing: their API requests, the Lease's, the CPU they cost."""
    at = time.monotonic()
    before = coordinator.passes()
    cpu = cpu_s(coordinator.proc.pid)
    wait("steady passes", lambda: coordinator.passes() >= before + args.steady_passes, 900, 1.0)
    seconds = time.monotonic() - at
    cpu = cpu_s(coordinator.proc.pid) - cpu
    calls = api.since(at)
    passes = coordinator.passes() - before
    m = coordinator.metrics()
    others = beside_lease(calls)
    add(rows, f"Steady: {passes} passes in {seconds:.0f} s, nothing changing: API requests "
        "beside the Lease", f"{len(others)} ({len(others) / max(passes, 1):.1f} per pass): "
        f"{summary(others)}")  # fmt: skip
    lease = [c for c in calls if "/leases" in c.path]
    add(rows, "Steady: Lease requests (a GET and a PUT every --retry-period, 2 s)",
        f"{len(lease)} = {len(lease) / seconds:.2f}/s, whatever the node count")  # fmt: skip
    add(rows, "Watches open (at most so far)",
        f"{api.open_watches} ({api.most_watches}): agent pods and nodes")  # fmt: skip
    pass_s = m.get("gpu_agent_coordinator_last_pass_duration_seconds", 0.0)
    add(rows, "Steady pass: wall (`last_pass_duration_seconds`: a GetNode to every agent, the "
        "rules matched) and coordinator CPU per pass (whole process, /proc)",
        f"{pass_s:.1f} s wall; {cpu / max(passes, 1):.1f} s CPU")  # fmt: skip


def status(coordinator: Coordinator, args: Any, rows: list[Any]) -> None:
    """`fleet status` end to end from the leader's latest sweep, and its HTTP answer alone."""
    runs = [status_end_to_end(coordinator.base, args.nodes) for _ in range(3)]
    wall = statistics.median(t for t, _, _ in runs)
    cpu = statistics.median(c for _, c, _ in runs)
    add(rows, f"`gpu-agent fleet status --coordinator URL -o json` end to end, {args.nodes:,} "
        "nodes (a new CLI process; the leader's latest sweep; median of 3)",
        f"{wall:.2f} s wall (runs {', '.join(f'{t:.2f}' for t, _, _ in runs)} s), CLI process "
        f"{cpu:.2f} s CPU; {runs[0][2] / 1e3:.1f} KB printed")  # fmt: skip
    answers = [http_status(coordinator.base) for _ in range(3)]
    add(rows, "GET /fleet/status alone (the coordinator's answer, no CLI; median of 3)",
        f"{statistics.median(t for t, _ in answers):.2f} s, "
        f"{answers[0][1] / 1e3:.1f} KB")  # fmt: skip
    took, size = http_status(coordinator.base, "?nodes=1")
    add(rows, "GET /fleet/status?nodes=1 (every node's record; once)",
        f"{took:.2f} s, {size / 1e6:.1f} MB")  # fmt: skip


def change(
    api: EdgeKubeApi, coordinator: Coordinator, args: Any, rows: list[Any], picked: list[str],
    what: str,
) -> None:  # fmt: skip
    """Label ``picked`` so the MIG rule picks them: until each is rolled out, then a pass."""
    at = time.monotonic()
    for node in picked:
        api.set_labels(node, {PICK: "on"})
    limit = parse_max_unavailable("10%", len(picked))
    waves = -(-len(picked) // limit)
    measure = (
        f"{what} (the MIG rule picks them): from the label until every one is rolled out and "
        f"one more pass ends; max-unavailable 10% = {limit}, apply {args.apply_s:g} s "
        f"({waves} wave(s) = {waves * args.apply_s:g} s ideal)"
    )
    try:
        wait(what, lambda: rollout_done(api, picked), args.wait_s, 0.5)
    except TimeoutError:
        others = beside_lease(api.since(at))
        add(rows, measure, f"not done in {args.wait_s:.0f} s; {len(others)} API requests "
            f"beside the Lease so far: {summary(others)}")  # fmt: skip
        return
    took = time.monotonic() - at
    before = coordinator.passes()
    wait("the pass after", lambda: coordinator.passes() >= before + 1, 900, 1.0)
    others = beside_lease(api.since(at))
    add(rows, measure, f"{took:.1f} s; {len(others)} API requests beside the Lease "
        f"({len(others) / len(picked):.1f} per changed node): {summary(others)}")  # fmt: skip


def _most(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--procs", type=int, default=2, help="agent server processes")
    parser.add_argument("--interval", type=float, default=5.0, help="coordinator --interval")
    parser.add_argument("--steady-passes", type=int, default=3)
    parser.add_argument("--rollout-nodes", type=int, default=10)
    parser.add_argument("--apply-s", type=float, default=2.0, help="seconds one MIG apply takes")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--wait-s", type=float, default=600.0, help="longest wait for a rollout")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the coordinator and agents
    started = time.monotonic()
    rows = run(args)
    print("| Measure | Result |")
    print("|---|---|")
    for a, b in rows:
        print(f"| {a} | {b} |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print()
    print(f"Command: `{' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}`")
    print(
        f"Machine: {os.cpu_count()} CPUs, load average {load} at the end; "
        f"{time.monotonic() - started:.0f} s in all."
    )


if __name__ == "__main__":
    main()
