"""Cheap agents for the coordinator's fleet benches (bench/fleet_scale.py,
bench/coordinator_kube.py): canned inventories and a MIG stand-in, over real mTLS gRPC with the
agent's own interceptor.

``canned_nodes`` builds GetNode answers from the simulated driver's presets (the real
``agent.wire.node.gpu_pb`` over canned MIG layouts, some instances busy, each GPU idle for 2 h).
`CannedAgents` answers NodeService, MigService and OperationsService for one agent, or for
many agents on one server (``by_peer``: the coordinator holds one channel, so one connection,
per agent, so a connection stands for a node). A MIG apply takes ``apply_s`` seconds; a claim
lives until the apply bound to it ends, as on an agent.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    mig_pb2,
    mig_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
)
from agent.api.auth import Policy, Role
from agent.api.interceptor import ApiInterceptor
from agent.gpu import open_driver
from agent.gpu.types import GpuLayout
from agent.wire.node import gpu_pb
from bench.fleet_planner import TEMPLATES, with_instances
from tests.unit.api.support import COORDINATOR

__all__ = ["PRESETS", "CannedAgents", "agent_server", "canned_nodes", "server_credentials"]

PRESETS = ("dgx-h100", "dgx-a100-80", "hgx-h200", "dgx-a100")


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
            chosen = with_instances(layout, rng.choice(TEMPLATES), rng, 0.4)
            gpu = gpu_pb(chosen, idle_seconds=7200.0)
            gpu.uuid = f"GPU-{i:04}-{layout.gpu.index}"
            node.gpus.append(gpu)
        node.health.healthy = True
        # The device plugin hands the GPUs out: MIG changes are allowed (a node whose mode is
        # unknown is left out of plans and rollouts).
        node.allocation.mode = agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN
        node.allocation.evidence = "nvidia.com/gpu in the Node's allocatable"
        out.append(agent_pb2.GetNodeResponse(node=node).SerializeToString())
    return out


class CannedAgents(
    agent_pb2_grpc.NodeServiceServicer,
    mig_pb2_grpc.MigServiceServicer,
    operations_pb2_grpc.OperationsServiceServicer,
):
    """One agent (``by_peer`` False: ``nodes[0]``), or one per connection (``by_peer``: the
    n-th connection answers ``nodes[n % len(nodes)]``), with its MIG state; ``log`` gets each
    apply's (start, end)."""

    def __init__(
        self,
        nodes: list[bytes],
        apply_s: float,
        log: list[tuple[float, float]],
        *,
        by_peer: bool = False,
    ) -> None:
        self.nodes = [agent_pb2.GetNodeResponse.FromString(n) for n in nodes]
        self.apply_s = apply_s
        self.log = log
        self.by_peer = by_peer
        self.peers: dict[str, int] = {}
        self.applied: dict[str, str] = {}
        self.claims: dict[str, mig_pb2.MigClaim] = {}
        self.ops: dict[str, dict[str, operations_pb2.Operation]] = {}
        self.by_request: dict[str, str] = {}
        self.done: dict[str, asyncio.Event] = {}

    def _key(self, context: Any) -> str:
        return str(context.peer()) if self.by_peer else ""

    def _node(self, key: str) -> agent_pb2.GetNodeResponse:
        index = self.peers.setdefault(key, len(self.peers))
        return self.nodes[index % len(self.nodes)]

    async def GetNode(self, request: object, context: Any) -> agent_pb2.GetNodeResponse:
        return self._node(self._key(context))

    async def PlanMig(self, request: mig_pb2.PlanMigRequest, context: Any) -> object:
        key = self._key(context)
        done = self.applied.get(key) == request.config_name
        status = mig_pb2.MIG_PLAN_STATUS_UNCHANGED if done else mig_pb2.MIG_PLAN_STATUS_CHANGE
        return mig_pb2.PlanMigResponse(
            config_name=request.config_name,
            gpus=[
                mig_pb2.GpuMigPlan(gpu_index=g.index, gpu_uuid=g.uuid, status=status)
                for g in self._node(key).node.gpus
            ],
        )

    async def ClaimMig(self, request: mig_pb2.ClaimMigRequest, context: Any) -> object:
        claim = mig_pb2.MigClaim(
            holder=request.holder,
            rollout=request.rollout,
            max_unavailable=request.max_unavailable,
            expires_in_seconds=float(request.ttl_seconds or 30),
        )
        self.claims[self._key(context)] = claim
        return mig_pb2.ClaimMigResponse(claim=claim)

    async def GetMigClaim(self, request: object, context: Any) -> object:
        found = self.claims.get(self._key(context))
        return mig_pb2.GetMigClaimResponse(claim=found) if found else mig_pb2.GetMigClaimResponse()

    async def ReleaseMigClaim(self, request: object, context: Any) -> object:
        found = self.claims.pop(self._key(context), None)
        return mig_pb2.ReleaseMigClaimResponse(released=found is not None)

    async def ApplyMig(self, request: mig_pb2.ApplyMigRequest, context: Any) -> object:
        key = self._key(context)
        mine = self.ops.setdefault(key, {})
        name = self.by_request.get(request.request_id)
        if name is None:
            name = f"operations/{key}/{len(mine) + 1}" if key else f"operations/{len(mine) + 1}"
            self.by_request[request.request_id] = name
            op = operations_pb2.Operation(name=name, kind="mig.apply")
            op.state = operations_pb2.OPERATION_STATE_RUNNING
            op.create_time.GetCurrentTime()
            mine[name] = op
            self.done[name] = asyncio.Event()
            asyncio.get_running_loop().create_task(self._finish(key, name, request.config_name))
        return mig_pb2.ApplyMigResponse(operation=mine[name])

    async def _finish(self, key: str, name: str, config: str) -> None:
        started = time.time()
        await asyncio.sleep(self.apply_s)
        op = operations_pb2.Operation()
        op.CopyFrom(self.ops[key][name])
        op.state, op.done = operations_pb2.OPERATION_STATE_SUCCEEDED, True
        op.response.mig_apply.changed_gpu_uuids.extend(g.uuid for g in self._node(key).node.gpus)
        op.update_time.GetCurrentTime()
        self.ops[key][name] = op
        self.applied[key] = config
        self.claims.pop(key, None)  # the claim ends with the operation bound to it
        self.log.append((started, time.time()))
        self.done[name].set()

    async def ListOperations(
        self, request: operations_pb2.ListOperationsRequest, context: Any
    ) -> operations_pb2.ListOperationsResponse:
        # The rollout asks for operations still running (started by another coordinator).
        ops = [
            op
            for op in reversed(self.ops.get(self._key(context), {}).values())
            if (not request.kind or op.kind == request.kind)
            and (not request.HasField("done") or op.done == request.done)
        ]
        return operations_pb2.ListOperationsResponse(operations=ops[: request.page_size or 100])

    async def GetOperation(self, request: Any, context: Any) -> operations_pb2.Operation:
        return self.ops[self._key(context)][request.name]

    async def WatchOperation(self, request: Any, context: Any) -> AsyncIterator[object]:
        ops = self.ops[self._key(context)]
        yield operations_pb2.WatchOperationResponse(operation=ops[request.name])
        if not ops[request.name].done:
            await self.done[request.name].wait()
            yield operations_pb2.WatchOperationResponse(operation=ops[request.name])


def server_credentials(pki_root: Path) -> grpc.ServerCredentials:
    """mTLS with the bench PKI's server certificate (tests.unit.api.support.Pki)."""
    return grpc.ssl_server_credentials(
        [((pki_root / "server.key").read_bytes(), (pki_root / "server.pem").read_bytes())],
        root_certificates=(pki_root / "ca.pem").read_bytes(),
        require_client_auth=True,
    )


def agent_server(agents: CannedAgents, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Server:
    """A gRPC server with the agent's interceptor (the coordinator as admin) serving
    ``agents``; ``options`` are gRPC channel arguments."""
    server = grpc.aio.server(
        interceptors=[ApiInterceptor(Policy.of({Role.ADMIN: [COORDINATOR]}))],
        options=list(options),
    )
    agent_pb2_grpc.add_NodeServiceServicer_to_server(agents, server)
    mig_pb2_grpc.add_MigServiceServicer_to_server(agents, server)
    operations_pb2_grpc.add_OperationsServiceServicer_to_server(agents, server)
    return server
