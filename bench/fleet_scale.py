#!/usr/bin/env python3
"""The coordinator at fleet scale: 1,000 simulated agents; prints a markdown table.

Agents are lightweight gRPC servers, many per process (``--procs``), each on its own port with
mTLS and the agent's own interceptor (authorization, error mapping). Each serves the real
NodeService answer (``agent.wire.node.gpu_pb`` over layouts read from the simulated driver of
a preset, with canned MIG layouts, busy instances and each GPU's idle seconds); MigService and
OperationsService are stand-ins whose apply takes ``--apply-s`` seconds, so the rollout row
measures the coordinator's scheduling, not a GPU. The coordinator side is the real code:
``Fleet.views`` (the ``fleet status`` sweep), ``plan_fleet``, and ``flows.rollout``.

    .venv/bin/python bench/fleet_scale.py                      # 1,000 agents, 4 processes
    .venv/bin/python bench/fleet_scale.py --agents 200 --procs 2 --apply-s 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import os
import random
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent._proto.gpuagent.v1 import (  # noqa: E402
    agent_pb2,
    agent_pb2_grpc,
    mig_pb2,
    mig_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
)
from agent.api.auth import Policy, Role  # noqa: E402
from agent.api.interceptor import ApiInterceptor  # noqa: E402
from agent.client import ClientTls  # noqa: E402
from agent.coordinator.control import status_http  # noqa: E402
from agent.coordinator.fleet.channels import Fleet  # noqa: E402
from agent.coordinator.fleet.discovery import StaticDiscovery  # noqa: E402
from agent.coordinator.fleet.query import STATUS_PATH  # noqa: E402
from agent.coordinator.fleet.selector import Selector  # noqa: E402
from agent.coordinator.fleet.status import fleet_status  # noqa: E402
from agent.coordinator.flows import layouts_of, rollout, select  # noqa: E402
from agent.coordinator.planning.catalog import preset_layouts  # noqa: E402
from agent.coordinator.planning.demand import Demand, DemandEntry  # noqa: E402
from agent.coordinator.planning.planner import NodeLayouts, plan_fleet  # noqa: E402
from agent.coordinator.rollout.record import RolloutRecord  # noqa: E402
from agent.coordinator.rollout.schedule import parse_max_unavailable  # noqa: E402
from agent.gpu import open_driver  # noqa: E402
from agent.gpu.types import (  # noqa: E402
    ComputeInstance,
    GpuInstance,
    GpuLayout,
    MigMode,
    Placement,
    Process,
)
from agent.http import HttpServer  # noqa: E402
from agent.mig.desired import Desired  # noqa: E402
from agent.mig.plan import plan_gpu  # noqa: E402
from agent.wire.node import gpu_pb  # noqa: E402
from tests.unit.api.support import COORDINATOR, Pki  # noqa: E402

PRESETS = ("dgx-h100", "dgx-a100-80", "hgx-h200", "dgx-a100")
#: per GPU: MIG off, or instances by compute-slice count (resolved per model)
TEMPLATES: tuple[dict[int, int] | None, ...] = (None, {1: 7}, {3: 2}, {1: 2, 2: 1, 3: 1}, {7: 1})
MIG_CONFIG = """\
version: v1
mig-configs:
  bench:
    - devices: all
      mig-enabled: true
      mig-devices: {}
"""


# -- canned agents ----------------------------------------------------------------------------


def _with_instances(
    layout: GpuLayout, slices: dict[int, int] | None, rng: random.Random
) -> GpuLayout:
    if slices is None:
        return layout
    names = {
        p.slice_count: p.name
        for p in reversed(layout.profiles)
        if "+me" not in p.name and (p.slice_count > 1 or p.memory_slices == 1)
    }
    desired = Desired(True, tuple((names[g], n) for g, n in slices.items()))
    target = plan_gpu(layout, desired).target
    assert target is not None
    instances = tuple(
        GpuInstance(
            i + 1,
            gi.profile_id,
            gi.profile_name,
            gi.placement,
            tuple(ComputeInstance(0, ci.slices, Placement(0, ci.slices), None) for ci in gi.cis),
        )
        for i, gi in enumerate(target.instances)
    )
    busy = tuple(
        Process(10_000 + gi.id, 1 << 30, gi.id, 0) for gi in instances if rng.random() < 0.4
    )
    gpu = dataclasses.replace(layout.gpu, mig_mode=MigMode(True, True))
    return GpuLayout(gpu, layout.profiles, instances, busy)


def canned_nodes(count: int, seed: int) -> list[bytes]:
    """GetNodeResponse bytes per agent: the simulator's GPUs with canned MIG layouts."""
    rng = random.Random(seed)
    base: dict[str, tuple[GpuLayout, ...]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in PRESETS:
            driver = open_driver(preset, Path(tmp) / preset)
            try:
                base[preset] = tuple(driver.layout(g.uuid) for g in driver.gpus())
            finally:
                driver.close()
    out = []
    for i in range(count):
        preset = PRESETS[i % len(PRESETS)]
        node = agent_pb2.Node(name=f"node-{i:04}", simulated_preset=preset, agent_version="bench")
        for layout in base[preset]:
            chosen = _with_instances(layout, rng.choice(TEMPLATES), rng)
            gpu = gpu_pb(chosen, idle_seconds=7200.0)
            gpu.uuid = f"GPU-{i:04}-{layout.gpu.index}"
            node.gpus.append(gpu)
        node.health.healthy = True
        out.append(agent_pb2.GetNodeResponse(node=node).SerializeToString())
    return out


class _Agent(
    agent_pb2_grpc.NodeServiceServicer,
    mig_pb2_grpc.MigServiceServicer,
    operations_pb2_grpc.OperationsServiceServicer,
):
    """One canned agent: inventory, and a MIG apply that takes ``apply_s``."""

    def __init__(self, node: bytes, apply_s: float, log: list[tuple[float, float]]) -> None:
        self.node = agent_pb2.GetNodeResponse.FromString(node)
        self.apply_s = apply_s
        self.log = log
        self.applied = ""
        self.ops: dict[str, operations_pb2.Operation] = {}
        self.by_request: dict[str, str] = {}
        self.done: dict[str, asyncio.Event] = {}

    async def GetNode(self, request: object, context: object) -> agent_pb2.GetNodeResponse:
        return self.node

    async def PlanMig(self, request: mig_pb2.PlanMigRequest, context: object) -> object:
        status = (
            mig_pb2.MIG_PLAN_STATUS_UNCHANGED
            if self.applied == request.config_name
            else mig_pb2.MIG_PLAN_STATUS_CHANGE
        )
        return mig_pb2.PlanMigResponse(
            config_name=request.config_name,
            gpus=[
                mig_pb2.GpuMigPlan(gpu_index=g.index, gpu_uuid=g.uuid, status=status)
                for g in self.node.node.gpus
            ],
        )

    async def ApplyMig(self, request: mig_pb2.ApplyMigRequest, context: object) -> object:
        name = self.by_request.get(request.request_id)
        if name is None:
            name = f"operations/{len(self.ops) + 1}"
            self.by_request[request.request_id] = name
            op = operations_pb2.Operation(name=name, kind="mig.apply")
            op.state = operations_pb2.OPERATION_STATE_RUNNING
            op.create_time.GetCurrentTime()
            self.ops[name] = op
            self.done[name] = asyncio.Event()
            asyncio.get_running_loop().create_task(self._finish(name, request.config_name))
        return mig_pb2.ApplyMigResponse(operation=self.ops[name])

    async def _finish(self, name: str, config: str) -> None:
        started = time.time()
        await asyncio.sleep(self.apply_s)
        op = operations_pb2.Operation()
        op.CopyFrom(self.ops[name])
        op.state, op.done = operations_pb2.OPERATION_STATE_SUCCEEDED, True
        op.response.mig_apply.changed_gpu_uuids.extend(g.uuid for g in self.node.node.gpus)
        op.update_time.GetCurrentTime()
        self.ops[name] = op
        self.applied = config
        self.log.append((started, time.time()))
        self.done[name].set()

    async def ListOperations(
        self, request: operations_pb2.ListOperationsRequest, context: object
    ) -> operations_pb2.ListOperationsResponse:
        # The rollout asks for operations still running (started by another coordinator).
        ops = [
            op
            for op in reversed(self.ops.values())
            if (not request.kind or op.kind == request.kind)
            and (not request.HasField("done") or op.done == request.done)
        ]
        return operations_pb2.ListOperationsResponse(operations=ops[: request.page_size or 100])

    async def WatchOperation(self, request: object, context: object) -> AsyncIterator[object]:
        name = request.name  # type: ignore[attr-defined]
        yield operations_pb2.WatchOperationResponse(operation=self.ops[name])
        if not self.ops[name].done:
            await self.done[name].wait()
            yield operations_pb2.WatchOperationResponse(operation=self.ops[name])


def _serve(
    nodes: list[bytes], pki_root: str, apply_s: float, conn: Connection
) -> None:  # pragma: no cover - runs in a child process
    async def main() -> None:
        root = Path(pki_root)
        credentials = grpc.ssl_server_credentials(
            [((root / "server.key").read_bytes(), (root / "server.pem").read_bytes())],
            root_certificates=(root / "ca.pem").read_bytes(),
            require_client_auth=True,
        )
        log: list[tuple[float, float]] = []
        servers, ports = [], []
        for node in nodes:
            agent = _Agent(node, apply_s, log)
            server = grpc.aio.server(
                interceptors=[ApiInterceptor(Policy.of({Role.ADMIN: [COORDINATOR]}))]
            )
            agent_pb2_grpc.add_NodeServiceServicer_to_server(agent, server)
            mig_pb2_grpc.add_MigServiceServicer_to_server(agent, server)
            operations_pb2_grpc.add_OperationsServiceServicer_to_server(agent, server)
            ports.append(server.add_secure_port("127.0.0.1:0", credentials))
            await server.start()
            servers.append(server)
        conn.send(ports)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop
        conn.send(log)
        await asyncio.gather(*(s.stop(None) for s in servers))

    asyncio.run(main())


# -- the measurements ----------------------------------------------------------------------------


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def shifted_demand(views: object) -> Demand:
    """A demand shift: fewer 1g, more 3g and 7g than the fleet holds now."""
    factors = {"1g": 0.8, "2g": 1.0, "3g": 1.3, "4g": 1.0, "7g": 1.5}
    entries = [
        DemandEntry(p.profile, round(p.devices * factors.get(p.profile.split(".")[0], 1.0)))
        for p in fleet_status(views).profiles  # type: ignore[arg-type]
        if p.devices and "c." not in p.profile
    ]
    return Demand(tuple(entries))


async def measure(args: argparse.Namespace, addresses: list[str], pki: Pki) -> dict[str, object]:
    tls = ClientTls(pki.coordinator.cert, pki.coordinator.key, pki.ca)
    fleet = Fleet(StaticDiscovery(addresses), tls, timeout_s=30.0)
    out: dict[str, object] = {}
    try:
        targets = await fleet.targets()
        started, cpu = time.perf_counter(), time.process_time()
        views = await fleet.views(targets, idle_after_s=3600.0)  # as `fleet status` sweeps
        out["sweep_cold"] = (time.perf_counter() - started, time.process_time() - cpu)
        out["unreachable"] = sum(not v.reachable for v in views)
        assert out["unreachable"] == 0, "some canned agents did not answer"
        warm = []
        for _ in range(3):
            started, cpu = time.perf_counter(), time.process_time()
            views = await fleet.views(targets, idle_after_s=3600.0)
            warm.append((time.perf_counter() - started, time.process_time() - cpu))
        out["sweep_warm"] = sorted(warm)[1]
        started, cpu = time.perf_counter(), time.process_time()
        views = await fleet.views(targets)  # the sweep plan and rollouts make
        out["sweep_inventory"] = (time.perf_counter() - started, time.process_time() - cpu)
        out["gpus"] = sum(len(v.layouts) for v in views)
        out["via_coordinator"] = await status_via_coordinator(fleet, len(addresses))
        out["via_coordinator_fresh"] = await status_via_coordinator(
            fleet, len(addresses), fresh=True
        )

        nodes = layouts_of(views)
        demand = shifted_demand(views)
        started = time.perf_counter()
        plan = plan_fleet(nodes, demand)
        out["plan_shift"] = time.perf_counter() - started
        out["plan_shift_detail"] = (
            f"{len(plan.changes)} GPUs change, {plan.created} created, {plan.destroyed} "
            f"destroyed, {sum(u.missing for u in plan.unmet)} devices unmet"
        )
        idle = [
            NodeLayouts(f"n{i:04}", preset_layouts("dgx-h100", f"n{i:04}"))
            for i in range(len(addresses))
        ]
        full = Demand((DemandEntry("1g.10gb", 7 * 8 * len(idle)),))
        started = time.perf_counter()
        plan = plan_fleet(idle, full)
        out["plan_idle"] = time.perf_counter() - started
        out["plan_idle_detail"] = f"{len(plan.changes)} GPUs change, {plan.created} created"

        selection = await select(fleet, Selector())
        record = RolloutRecord.start(
            "mig",
            {"config_yaml": MIG_CONFIG.format("{1g.10gb: 7}"), "config_name": "bench"},
            sorted(v.name for v in selection.views),
            selector="",
            max_unavailable=args.max_unavailable,
            max_failures=1,
            node_timeout_s=600.0,
        )
        started = time.perf_counter()
        result = await rollout(fleet, selection, record)
        out["rollout"] = time.perf_counter() - started
        out["rollout_states"] = dict(Counter(s.value for s in result.record.states().values()))
    finally:
        await fleet.close()
    return out


async def status_via_coordinator(fleet: Fleet, agents: int, *, fresh: bool = False) -> float:
    """`gpu-agent fleet status --coordinator URL -o json` as a user runs it (a new process),
    answered by this process's open channels as `coordinator serve` would: median of 3.

    As in serve, a reconcile pass's sweep feeds the endpoint first (``observe``); ``fresh``
    asks for a new sweep (`--fresh`) instead."""
    endpoint = status_http.StatusEndpoint(fleet, max_age_s=60.0)
    selection = await select(fleet, Selector(), idle_after_s=3600.0)  # the pass's sweep
    endpoint.observe(selection.views, 3600.0, time.time())
    http = HttpServer({STATUS_PATH: endpoint})
    port = await http.start("127.0.0.1", 0)
    times = []
    flags = ["--fresh"] if fresh else []
    try:
        for _ in range(3):
            started = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "from agent.cli.main import main; main()",
                "fleet", "status", "--coordinator", f"http://127.0.0.1:{port}", "-o", "json",
                *flags, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            stdout, _ = await proc.communicate()
            times.append(time.perf_counter() - started)
            assert proc.returncode == 0, "fleet status --coordinator failed"
            assert json.loads(stdout)["totals"]["reachable"] == agents
    finally:
        await http.stop()
    return sorted(times)[1]


def run(args: argparse.Namespace) -> tuple[dict[str, object], int]:
    with tempfile.TemporaryDirectory() as tmp:
        pki = Pki(Path(tmp) / "pki")
        nodes = canned_nodes(args.agents, args.seed)
        ctx = multiprocessing.get_context("spawn")
        pipes, procs = [], []
        for k in range(args.procs):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_serve, args=(nodes[k :: args.procs], str(pki.root), args.apply_s, theirs)
            )
            proc.start()
            pipes.append(mine)
            procs.append(proc)
        try:
            ports = [pipe.recv() for pipe in pipes]
            addresses = [
                f"127.0.0.1:{ports[i % args.procs][i // args.procs]}" for i in range(args.agents)
            ]
            results = asyncio.run(measure(args, addresses, pki))
            for pipe in pipes:
                pipe.send("stop")
            intervals = [iv for pipe in pipes for iv in pipe.recv()]
        finally:
            for proc in procs:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
    return results, most_at_once(intervals)


def table(args: argparse.Namespace, r: dict[str, object], most: int) -> str:
    waves = -(-args.agents // max(1, _limit(args)))
    rows = [
        ("Agents", f"{args.agents} ({args.procs} server processes, mTLS), {r['gpus']} GPUs", ""),
        ("`fleet status` sweep, cold: dial + TLS + GetNode per agent (idle seconds included)",
         _sweep(r["sweep_cold"]), "<= 2 s"),
        ("`fleet status` sweep, warm channels (median of 3)", _sweep(r["sweep_warm"]),
         "<= 2 s"),
        ("Inventory sweep alone (GetNode per agent; what plan and rollouts read)",
         _sweep(r["sweep_inventory"]), ""),
        ("`gpu-agent fleet status --coordinator URL -o json` end to end (a new CLI process; "
         "the coordinator's latest sweep, under --status-max-age; median of 3)",
         f"{r['via_coordinator']:.2f} s", "<= 2 s"),
        ("the same with `--fresh` (a new sweep on the coordinator's open channels)",
         f"{r['via_coordinator_fresh']:.2f} s", ""),
        ("Plan a demand shift on the partitioned fleet",
         f"{r['plan_shift']:.2f} s ({r['plan_shift_detail']})", "<= 5 s"),
        (f"Plan: partition every idle GPU of {args.agents:,} DGX H100 nodes into 7 x 1g",
         f"{r['plan_idle']:.2f} s ({r['plan_idle_detail']})", "<= 5 s"),
        (f"MIG rollout to every node, max-unavailable {args.max_unavailable}",
         f"{r['rollout']:.1f} s (apply {args.apply_s:g} s per node: {waves} waves = "
         f"{waves * args.apply_s:g} s ideal); {r['rollout_states']}; most nodes mid-apply at "
         f"once, from the agents' records: {most}", ""),
    ]  # fmt: skip
    lines = ["| Measure | Result | Goal |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [
        "",
        f"Command: `{' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}`",
        f"Machine: {os.cpu_count()} CPUs, load average {load} at the end.",
    ]
    return "\n".join(lines)


def _sweep(times: object) -> str:
    assert isinstance(times, tuple)
    wall, cpu = times
    return f"{wall:.2f} s ({cpu:.2f} s of coordinator CPU)"


def _limit(args: argparse.Namespace) -> int:
    return parse_max_unavailable(args.max_unavailable, args.agents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--procs", type=int, default=4, help="server processes for the agents")
    parser.add_argument("--apply-s", type=float, default=2.0, help="seconds one MIG apply takes")
    parser.add_argument("--max-unavailable", default="10%")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    results, most = run(args)
    print(table(args, results, most))


if __name__ == "__main__":
    main()
