"""What a reconcile pass asks of the agents and the API. Only the rule's nodes: a MIG rule
that picks one node of a 300-node fleet reads claims and running operations of that pool, not
of every node, while a node of the pool that another holder is changing still counts against
max-unavailable. And a few writes of the status ConfigMap per rollout, not one per node.

The agents are in-process stand-ins that count every call; the coordinator's own flows (the
real `Reconciler`, `rollout`, claims, the health gate) run over them."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

from agent._proto.gpuagent.v1 import agent_pb2
from agent.coordinator.control.cluster import STATUS_CONFIGMAP, ClusterReport
from agent.coordinator.control.reconcile import Reconciler
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.inventory import NodeView, node_view
from agent.errors import NotFound
from agent.wire.node import node_from
from tests.unit.coordinator.fakeagents import node

PENDING = "MIG mode change pending; the driver needs a reboot of this (passthrough) VM to apply it"

DESIRED = """\
version: v1
rollout: {{max_unavailable: {limit}, max_failures: 1}}
mig:
  - selector: pool=train
    config_name: half
    config: |
      version: v1
      mig-configs:
        half:
          - devices: [0]
            mig-enabled: true
            mig-devices: {{"3g.40gb": 2}}
"""


def answer(name: str) -> Any:
    """A node whose GPUs the device plugin hands out (so MIG changes are allowed)."""
    found = node(name)
    found.allocation.mode = agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN
    return node_from(found)


class Agent:
    """One node's agent: its MIG claim book of one, a plan that changes GPU 0 until applied,
    and the operations running on it; ``calls`` counts every call by name."""

    def __init__(self, name: str, calls: Counter[str]) -> None:
        self.name = name
        self.calls = calls
        self.applied = False
        self.claim: NS | None = None
        self.running: tuple[NS, ...] = ()
        self.apply_s = 0.0
        #: GPUs the config selects that are lost: planned and applied without them
        self.lost: tuple[int, ...] = ()
        #: GPUs the config selects that answer but cannot be read, with the failing call
        self.unread: tuple[tuple[int, str], ...] = ()
        #: GPU 0's MIG mode change is left pending (an agent that called that succeeded)
        self.pending = False

    def _count(self, call: str) -> None:
        self.calls[call] += 1

    async def node(self) -> Any:
        self._count("GetNode")
        return answer(self.name)

    async def plan_mig(self, text: str, name: str) -> NS:
        self._count("PlanMig")
        status = "unchanged" if self.applied else "change"
        gpu = NS(
            gpu_index=0,
            status=status,
            keep=(),
            destroy=(),
            create=(),
            blockers=(),
            infeasible_reason="",
            deferred=False,
            mode_pending="",
        )
        return NS(gpus=(gpu,), lost_gpus=self.lost, unread_gpus=self.unread)

    async def claim_mig(self, holder: str, rollout: str, max_unavailable: str) -> NS:
        self._count("ClaimMig")
        self.claim = NS(holder=holder, operation="")
        return self.claim

    async def mig_claim(self) -> NS | None:
        self._count("GetMigClaim")
        return self.claim

    async def release_mig_claim(self, holder: str) -> bool:
        self._count("ReleaseMigClaim")
        self.claim = None
        return True

    async def running_operations(self, kind: str) -> tuple[NS, ...]:
        self._count("ListOperations")
        return self.running

    async def apply_mig(self, text: str, name: str, request_id: str, **kw: Any) -> NS:
        self._count("ApplyMig")
        self.applied = True
        return NS(name=f"operations/{self.name}")

    async def watch_operation(self, name: str) -> AsyncIterator[NS]:
        self._count("WatchOperation")
        await asyncio.sleep(self.apply_s)
        lost = tuple(NS(gpu_index=i, status="lost") for i in self.lost)
        gpu = NS(gpu_index=0, status="applied", message="")
        if self.pending:
            self.applied = False  # the plan still changes it
            gpu = NS(gpu_index=0, status="pending", message=f"GPU 0: {PENDING}")
        done = NS(changed_gpu_uuids=("u",), gpus=(gpu, *lost), assert_mismatches=())
        yield NS(progress="", state="succeeded", failure="", mig_result=done)


class CountingFleet(Fleet):
    """``size`` nodes n000...; those in ``train`` carry the label pool=train."""

    def __init__(self, size: int, train: set[str]) -> None:
        super().__init__(NS(), None)  # type: ignore[arg-type]  # targets() is overridden
        self.calls: Counter[str] = Counter()
        names = [f"n{i:03d}" for i in range(size)]
        self.agents = {n: Agent(n, self.calls) for n in names}
        self._targets = tuple(
            Target(f"10.0.{i // 250}.{i % 250}:9401", n, {"pool": "train"} if n in train else {})
            for i, n in enumerate(names)
        )
        self._by_address = {t.address: t.node for t in self._targets}

    async def targets(self) -> tuple[Target, ...]:
        return self._targets

    def client(self, target: Target) -> Any:
        return self.agents[str(self._by_address[target.address])]

    async def views(
        self, targets: Any = None, *, idle_after_s: float | None = None
    ) -> tuple[NodeView, ...]:
        self.calls["GetNode"] += len(self._targets)  # the sweep: one GetNode each
        return tuple(node_view(t, answer(str(t.node))) for t in self._targets)


def _pass(fleet: CountingFleet, tmp_path: Path, limit: int = 1) -> Reconciler:
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(limit=limit))
    reconciler = Reconciler(fleet, desired, interval_s=60.0, identity="coordinator-0")
    asyncio.run(reconciler.pass_once())
    return reconciler


def test_a_one_node_rollout_in_a_large_fleet_asks_only_that_node(tmp_path: Path) -> None:
    fleet = CountingFleet(300, train={"n042"})
    reconciler = _pass(fleet, tmp_path)
    assert fleet.agents["n042"].applied
    assert reconciler.stats.changes[("mig", "succeeded")] == 1
    sweep = fleet.calls.pop("GetNode")
    assert sweep >= 300  # the pass's sweep, plus the health gate's two reads of n042
    # Beside the sweep: the rule's one node, a handful of calls, none to the other 299.
    assert fleet.calls == {
        "PlanMig": 2,  # the pass's preview and the apply's own plan
        "ListOperations": 1,
        "ClaimMig": 1,
        "GetMigClaim": 1,
        "ApplyMig": 1,
        "WatchOperation": 1,
        "ReleaseMigClaim": 1,
    }


def test_a_node_of_the_pool_changed_by_another_holder_still_counts(tmp_path: Path) -> None:
    """n001 is in the rule's pool and in sync, but a hand-run apply is changing it: with
    max-unavailable 1 nothing else of the pool may start. An apply on a node outside the
    pool (n200) takes nothing from this pool's budget."""
    fleet = CountingFleet(300, train={"n000", "n001"})
    fleet.agents["n001"].applied = True
    fleet.agents["n001"].running = (NS(name="operations/by-hand"),)
    fleet.agents["n200"].running = (NS(name="operations/other-pool"),)
    reconciler = _pass(fleet, tmp_path)
    assert not fleet.agents["n000"].applied and fleet.calls["ApplyMig"] == 0
    assert reconciler.stats.drift["mig"] == 1
    assert fleet.calls["ListOperations"] == 2  # the pool's two nodes

    fleet.agents["n001"].running = ()  # the hand-run apply ended
    _pass(fleet, tmp_path)
    assert fleet.agents["n000"].applied


def test_the_nodes_of_a_wave_share_their_claim_reads(tmp_path: Path) -> None:
    """20 nodes of the pool at max-unavailable 5: each claim is verified by a read of the
    pool's claims that began after it, but a wave's nodes share those reads (a read per
    node would be 20 x 20 GetMigClaim)."""
    pool = {f"n{i:03d}" for i in range(20)}
    fleet = CountingFleet(100, train=pool)
    _pass(fleet, tmp_path, limit=5)
    assert all(fleet.agents[n].applied for n in pool)
    assert fleet.calls["ClaimMig"] == 20
    assert fleet.calls["GetMigClaim"] <= 20 * 2 * 4  # two reads of the pool per wave of 5


class ConfigMaps:
    """The API's ConfigMaps in memory (the `Requests` a ClusterReport calls); Events are
    dropped. ``writes`` counts the ConfigMap POSTs and PUTs."""

    def __init__(self) -> None:
        self.data: dict[str, str] | None = None
        self.writes = 0

    def request(self, method: str, path: str, *, body: Any = None, **kw: Any) -> Any:
        if "/events" in path:
            return {}
        if method == "GET":
            if self.data is None:
                raise NotFound("no ConfigMap")
            return {"metadata": {"name": STATUS_CONFIGMAP}, "data": dict(self.data)}
        self.writes += 1
        self.data = dict(body["data"])
        return body


def test_a_20_node_rollout_writes_its_status_a_bounded_number_of_times(tmp_path: Path) -> None:
    """20 nodes one at a time, 50 ms each, status at most every 0.25 s: the ConfigMap is
    written at the start, a few times while nodes end, and at the end with every node."""
    pool = {f"n{i:03d}" for i in range(20)}
    fleet = CountingFleet(40, train=pool)
    for n in pool:
        fleet.agents[n].apply_s = 0.05
    maps = ConfigMaps()
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(limit=1))
    cluster = ClusterReport(maps, "gpu-agent", "coordinator-0")
    reconciler = Reconciler(
        fleet, desired, cluster=cluster, identity="coordinator-0", status_every_s=0.25
    )

    async def main() -> float:
        began = time.monotonic()
        await reconciler.pass_once()
        took = time.monotonic() - began
        await reconciler.flush_reports()
        return took

    took = asyncio.run(main())
    assert took >= 1.0  # 20 x 50 ms
    # The start, at most one per interval while nodes end, and the end: never one per node.
    assert 3 <= maps.writes <= 2 + took / 0.25 + 1 < 20
    assert maps.data is not None
    status = json.loads(maps.data["mig"])
    assert status["state"] == "done" and status["counts"] == {"succeeded": 20}
    assert {n: r["state"] for n, r in status["nodes"].items()} == dict.fromkeys(pool, "succeeded")


def test_a_node_whose_selected_gpu_is_lost_is_never_in_sync(tmp_path: Path) -> None:
    """GPU 3 is lost: the apply reached the GPUs that answer, and the node was counted
    succeeded, then "already as asked" on every pass, though GPU 3 holds nothing it was asked.
    It is failed, and held back, until the GPU answers (its health mark may lag the loss)."""
    fleet = CountingFleet(3, train={"n001"})
    fleet.agents["n001"].lost = (3,)
    reconciler = _pass(fleet, tmp_path)
    assert fleet.agents["n001"].applied
    assert reconciler.stats.changes[("mig", "failed")] == 1
    assert reconciler.stats.changes[("mig", "succeeded")] == 0
    asyncio.run(reconciler.pass_once())  # the GPUs read hold it now; GPU 3 still does not
    assert reconciler.stats.drift["mig"] == 1  # this pass's count: still not in sync
    assert reconciler.stats.changes[("mig", "succeeded")] == 0


def _one_pass(fleet: CountingFleet, tmp_path: Path) -> tuple[Reconciler, ConfigMaps]:
    """One reconcile pass at max-unavailable 1, its report flushed to the ConfigMap."""
    maps = ConfigMaps()
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(limit=1))
    cluster = ClusterReport(maps, "gpu-agent", "coordinator-0")
    reconciler = Reconciler(fleet, desired, cluster=cluster, identity="coordinator-0")

    async def main() -> None:
        await reconciler.pass_once()
        await reconciler.flush_reports()

    asyncio.run(main())
    return reconciler, maps


def test_a_node_whose_mode_change_an_agent_called_succeeded_is_pending_is_failed(
    tmp_path: Path,
) -> None:
    """An agent before the operation's failed_response ended an apply that left GPU 0's MIG
    mode pending (until this passthrough VM reboots) succeeded: the node was counted succeeded
    though it holds nothing it was asked. It is failed, naming what the mode waits for."""
    fleet = CountingFleet(3, train={"n001"})
    fleet.agents["n001"].pending = True
    reconciler, maps = _one_pass(fleet, tmp_path)
    assert reconciler.stats.changes[("mig", "failed")] == 1
    assert reconciler.stats.changes[("mig", "succeeded")] == 0
    assert maps.data is not None
    node = json.loads(maps.data["mig"])["nodes"]["n001"]
    assert node["state"] == "failed"
    assert "MIG mode change pending: GPU 0: the driver needs a reboot" in node["detail"], node


def test_a_node_whose_selected_gpu_cannot_be_read_is_failed_naming_the_call_not_lost(
    tmp_path: Path,
) -> None:
    """GPU 1 answers NVML but its MIG-mode read fails (it needs a reset): the plan listed it
    among the lost GPUs, and the rollout and its dry run said "GPU 1 is lost". The agent names
    it unread with the failing call; the node is failed saying that, and the preview refuses."""
    from agent.coordinator.rollout.actions import _preview_mig

    fleet = CountingFleet(3, train={"n001"})
    agent = fleet.agents["n001"]
    agent.unread = ((1, "nvmlDeviceGetMigMode: Unknown Error"),)
    agent.applied = True  # the GPUs read hold it: only GPU 1 keeps the node from it
    reconciler, maps = _one_pass(fleet, tmp_path)
    assert reconciler.stats.changes[("mig", "failed")] == 1
    assert maps.data is not None
    said = json.loads(maps.data["mig"])["nodes"]["n001"]
    assert "GPU 1 cannot be read (nvmlDeviceGetMigMode: Unknown Error): not applied" in str(said)
    assert "is lost" not in str(said), said
    record = NS(spec={"config_yaml": "x", "config_name": "half"})
    preview = asyncio.run(_preview_mig(agent, record, "n001"))  # type: ignore[arg-type]
    assert preview.would == "refused", preview
    assert "GPU 1 cannot be read (nvmlDeviceGetMigMode: Unknown Error)" in preview.detail
