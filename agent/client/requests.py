"""Every request of the agent's API, built once for both clients (httpx's ``build_request``).

Each method of `Requests` turns a call's arguments into a `Call`: which stub method to send
it to, the request message, and how to read the answer into a record (agent/wire). The `rpc`
decorator makes it a method of both clients: the sync `AgentClient` sends the call and returns
the record, the asyncio `AsyncAgentClient` returns an awaitable of it. So an RPC is added here
alone; the clients only send and map errors (`_send`), and stream (`_watch`).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from google.protobuf.message import Message

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    mig_pb2,
    operations_pb2,
    power_pb2,
    prewarm_pb2,
    sharing_pb2,
    telemetry_pb2,
)
from agent.client.base import Stubs
from agent.mig.node_plan import AssertResult
from agent.power import PowerResult, PowerView
from agent.prewarm.model import CacheItem
from agent.prewarm.source import SourceRequest
from agent.sharing import ApplyResult, PluginConfig, SharingView
from agent.wire.doctor import DoctorReport, report_from
from agent.wire.mig import (
    AdvisedGpu,
    GpuReset,
    MigPlanView,
    advice_from,
    assert_from,
    plan_from,
    reset_from,
)
from agent.wire.node import NodeView, node_from
from agent.wire.operations import OperationView, operation_from
from agent.wire.power import power_result_from, power_view_from
from agent.wire.prewarm import (
    CacheContents,
    cache_contents_from,
    cache_item_from,
    prewarm_targets_pb,
)
from agent.wire.sharing import set_sharing_request, sharing_change_from, sharing_view_from
from agent.wire.telemetry import Scrape, TelemetryView, scrape_from, telemetry_from

__all__ = ["AsyncSender", "Call", "Requests", "SyncSender", "rpc"]

R = TypeVar("R")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Call(Generic[R]):
    """One call, built: ``stub`` names a service (`STUB_TYPES`), ``method`` its method."""

    stub: str
    method: str
    request: Message
    decode: Callable[[Any], R]
    #: The client's timeout -> this call's (a slow RPC waits longer); None keeps it.
    timeout: Callable[[float], float] | None = None

    def target(self, stubs: Stubs) -> Any:
        """The stub's method this call goes to, over ``stubs``' channel."""
        return getattr(stubs.stub(self.stub), self.method)

    def timeout_s(self, default_s: float) -> float:
        return default_s if self.timeout is None else self.timeout(default_s)


class SyncSender(Stubs, ABC):
    """A client that sends a call and waits for its answer (`agent.client.sync`)."""

    @abstractmethod
    def _send(self, call: Call[R]) -> R: ...


class AsyncSender(Stubs, ABC):
    """A client whose calls are awaited (`agent.client.aio`)."""

    @abstractmethod
    async def _send(self, call: Call[R]) -> R: ...


class rpc(Generic[P, R]):  # a decorator, named as property is
    """A `Requests` method that builds a `Call`, seen on a client as the method sending it."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[R]]) -> None:
        self._build = build

    @overload
    def __get__(self, obj: SyncSender, owner: type) -> Callable[P, R]: ...
    @overload
    def __get__(self, obj: AsyncSender, owner: type) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __get__(self, obj: None, owner: type) -> rpc[P, R]: ...

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        build = self._build

        @functools.wraps(build)
        def send(*args: P.args, **kwargs: P.kwargs) -> Any:
            return obj._send(build(obj, *args, **kwargs))

        return send


def _operation(answer: Any) -> OperationView:
    return operation_from(answer.operation)


def _item(answer: Any) -> CacheItem:
    return cache_item_from(answer.item)


def _change(answer: Any) -> ApplyResult:
    return sharing_change_from(answer.change)


def _list_operations(kind: str, done: bool | None, page_size: int = 0) -> Call[list[OperationView]]:
    request = operations_pb2.ListOperationsRequest(kind=kind, done=done, page_size=page_size)
    return Call(
        "_ops", "ListOperations", request, lambda a: [operation_from(o) for o in a.operations]
    )


class Requests(Stubs):
    """The agent's API, one method per call, shared by both clients."""

    # -- node -------------------------------------------------------------------------------------

    @rpc
    def node(self) -> Call[NodeView]:
        return Call("_node", "GetNode", agent_pb2.GetNodeRequest(), lambda a: node_from(a.node))

    @rpc
    def doctor(self) -> Call[DoctorReport]:
        """Every read-only check of the agent's duties, run now: the agent bounds the run
        under 10 s, so the call waits a little longer than other reads."""
        request = agent_pb2.DoctorRequest()
        return Call("_node", "Doctor", request, report_from, lambda t: max(t, 15.0))

    @rpc
    def telemetry(self, field_ids: Sequence[int] = ()) -> Call[TelemetryView]:
        """The agent's latest telemetry snapshot (only ``field_ids``, when given)."""
        request = telemetry_pb2.GetTelemetrySnapshotRequest(field_ids=list(field_ids))
        return Call(
            "_telemetry", "GetTelemetrySnapshot", request, lambda a: telemetry_from(a.snapshot)
        )

    @rpc
    def metrics(self, *, openmetrics: bool = False) -> Call[Scrape]:
        """What the agent's /metrics returns now, with the time of the sample rendered."""
        request = telemetry_pb2.GetMetricsRequest(openmetrics=openmetrics)
        return Call("_telemetry", "GetMetrics", request, scrape_from)

    # -- operations -------------------------------------------------------------------------------

    @rpc
    def list_operations(
        self, kind: str = "", done: bool | None = None
    ) -> Call[list[OperationView]]:
        return _list_operations(kind, done)

    @rpc
    def running_operations(self, kind: str) -> Call[list[OperationView]]:
        """The agent's operations of ``kind`` not done yet (whoever started them)."""
        return _list_operations(kind, False, page_size=100)

    @rpc
    def get_operation(self, name: str) -> Call[OperationView]:
        request = operations_pb2.GetOperationRequest(name=name)
        return Call("_ops", "GetOperation", request, _operation)

    @rpc
    def cancel_operation(self, name: str) -> Call[OperationView]:
        request = operations_pb2.CancelOperationRequest(name=name)
        return Call("_ops", "CancelOperation", request, _operation)

    def _watch(self, name: str) -> Call[OperationView]:
        """The stream of an operation's changes (each client reads it its own way)."""
        request = operations_pb2.WatchOperationRequest(name=name)
        return Call("_ops", "WatchOperation", request, _operation)

    # -- MIG --------------------------------------------------------------------------------------

    @rpc
    def plan_mig(
        self, config_yaml: str, config_name: str = "", force: bool = False
    ) -> Call[MigPlanView]:
        """What an apply of ``config_yaml`` would do, GPU by GPU; changes nothing."""
        request = mig_pb2.PlanMigRequest(
            config_yaml=config_yaml, config_name=config_name, force=force
        )
        return Call("_mig", "PlanMig", request, plan_from)

    @rpc
    def apply_mig(
        self,
        config_yaml: str,
        config_name: str = "",
        request_id: str = "",
        force: bool = False,
        mode_only: bool = False,
        skip_reset: bool = False,
        claim_holder: str = "",
    ) -> Call[OperationView]:
        """Starts the apply; follow it with `watch_operation` or `follow`."""
        request = mig_pb2.ApplyMigRequest(
            config_yaml=config_yaml,
            config_name=config_name,
            request_id=request_id,
            force=force,
            mode_only=mode_only,
            skip_reset=skip_reset,
            claim_holder=claim_holder,
        )
        return Call("_mig", "ApplyMig", request, _operation)

    @rpc
    def assert_mig(
        self, config_yaml: str, config_name: str = "", mode_only: bool = False
    ) -> Call[AssertResult]:
        """Whether the node holds the config now, as the agent reads it (mig-parted ``assert``);
        a lost GPU the config selects is never applied."""
        request = mig_pb2.AssertMigRequest(
            config_yaml=config_yaml, config_name=config_name, mode_only=mode_only
        )
        return Call("_mig", "AssertMig", request, assert_from)

    @rpc
    def export_mig(self, config_name: str = "current") -> Call[str]:
        request = mig_pb2.ExportMigRequest(config_name=config_name)
        return Call("_mig", "ExportMig", request, lambda a: a.config_yaml)

    @rpc
    def advise_mig(
        self, gpu_index: int | None = None, profile: str = ""
    ) -> Call[tuple[AdvisedGpu, ...]]:
        request = mig_pb2.AdviseMigRequest(gpu_index=gpu_index, profile=profile)
        return Call("_mig", "AdviseMig", request, advice_from)

    @rpc
    def restore_mig(
        self, checkpoint: bytes, *, mode_only: bool = False, request_id: str = ""
    ) -> Call[OperationView]:
        """Starts restoring a mig-parted checkpoint; follow it with `follow`."""
        request = mig_pb2.RestoreMigRequest(
            checkpoint=checkpoint, mode_only=mode_only, request_id=request_id
        )
        return Call("_mig", "RestoreMig", request, _operation)

    @rpc
    def claim_mig(
        self, holder: str, rollout: str, max_unavailable: str, ttl_s: int = 0
    ) -> Call[mig_pb2.MigClaim]:
        """Claim the node for ``holder``'s next MIG change (Busy while another holds it)."""
        request = mig_pb2.ClaimMigRequest(
            holder=holder, rollout=rollout, max_unavailable=max_unavailable, ttl_seconds=ttl_s
        )
        return Call("_mig", "ClaimMig", request, lambda a: a.claim)

    @rpc
    def mig_claim(self) -> Call[mig_pb2.MigClaim | None]:
        """The node's live claim (a running mig.apply counts as one), None when unclaimed."""
        request = mig_pb2.GetMigClaimRequest()
        return Call(
            "_mig", "GetMigClaim", request, lambda a: a.claim if a.HasField("claim") else None
        )

    @rpc
    def release_mig_claim(self, holder: str) -> Call[bool]:
        request = mig_pb2.ReleaseMigClaimRequest(holder=holder)
        return Call("_mig", "ReleaseMigClaim", request, lambda a: a.released)

    @rpc
    def reset_gpu(
        self, gpu_index: int, *, validate_only: bool = False, request_id: str = ""
    ) -> Call[GpuReset]:
        """Reset one GPU through the agent (refused while processes hold it); with
        ``validate_only`` only whether the agent could try. A reset may take the driver a
        while: the call may take four times the client's timeout."""
        request = mig_pb2.ResetGpuRequest(
            gpu_index=gpu_index, validate_only=validate_only, request_id=request_id
        )
        return Call("_mig", "ResetGpu", request, reset_from, lambda t: 4 * t)

    # -- prewarm ----------------------------------------------------------------------------------

    @rpc
    def submit_prewarm(
        self,
        requests: Sequence[SourceRequest] | Sequence[prewarm_pb2.PrewarmTarget],
        request_id: str = "",
    ) -> Call[OperationView]:
        """Starts warming what ``requests`` ask for; follow it with `watch_operation` or
        `follow`. Domain requests (any registered kind) are sent as the targets the agent
        reads back into the same requests; targets as a rollout record keeps them
        (agent.coordinator.rollout.specs) are sent as they are."""
        targets = [r for r in requests if isinstance(r, prewarm_pb2.PrewarmTarget)]
        targets += prewarm_targets_pb(
            r for r in requests if not isinstance(r, prewarm_pb2.PrewarmTarget)
        )
        request = prewarm_pb2.SubmitPrewarmRequest(targets=targets, request_id=request_id)
        return Call("_prewarm", "SubmitPrewarm", request, _operation)

    @rpc
    def list_prewarm_items(self) -> Call[list[CacheItem]]:
        request = prewarm_pb2.ListPrewarmItemsRequest()
        return Call(
            "_prewarm", "ListPrewarmItems", request, lambda a: [cache_item_from(i) for i in a.items]
        )

    @rpc
    def cancel_prewarm_item(self, item: str) -> Call[CacheItem]:
        request = prewarm_pb2.CancelPrewarmItemRequest(item=item)
        return Call("_prewarm", "CancelPrewarmItem", request, _item)

    @rpc
    def delete_prewarm_item(self, item: str) -> Call[CacheItem]:
        request = prewarm_pb2.DeletePrewarmItemRequest(item=item)
        return Call("_prewarm", "DeletePrewarmItem", request, _item)

    @rpc
    def list_cache(self) -> Call[CacheContents]:
        request = prewarm_pb2.ListCacheRequest()
        return Call("_prewarm", "ListCache", request, lambda a: cache_contents_from(a.cache))

    @rpc
    def evict_cache_item(self, item: str) -> Call[CacheItem]:
        request = prewarm_pb2.EvictCacheItemRequest(item=item)
        return Call("_prewarm", "EvictCacheItem", request, _item)

    @rpc
    def pin_cache_item(self, item: str, pinned: bool = True) -> Call[CacheItem]:
        request = prewarm_pb2.PinCacheItemRequest(item=item, pinned=pinned)
        return Call("_prewarm", "PinCacheItem", request, _item)

    # -- sharing ----------------------------------------------------------------------------------

    @rpc
    def get_sharing(self) -> Call[SharingView]:
        return Call("_sharing", "GetSharing", sharing_pb2.GetSharingRequest(), sharing_view_from)

    @rpc
    def set_sharing(
        self, config: PluginConfig | sharing_pb2.SetSharingRequest
    ) -> Call[ApplyResult]:
        """Make ``config`` the node's sharing, sent as the plugin's own file; or send the
        request as a rollout record keeps it (agent.coordinator.rollout.specs)."""
        request = config if isinstance(config, Message) else set_sharing_request(config)
        return Call("_sharing", "SetSharing", request, _change)

    @rpc
    def clear_sharing(self) -> Call[ApplyResult]:
        return Call("_sharing", "ClearSharing", sharing_pb2.ClearSharingRequest(), _change)

    @rpc
    def rollback_sharing(self) -> Call[ApplyResult]:
        return Call("_sharing", "RollbackSharing", sharing_pb2.RollbackSharingRequest(), _change)

    # -- power ------------------------------------------------------------------------------------

    @rpc
    def get_power(self) -> Call[PowerView]:
        return Call("_power", "GetPower", power_pb2.GetPowerRequest(), power_view_from)

    @rpc
    def apply_power(self, spec_yaml: str, request_id: str = "") -> Call[PowerResult]:
        request = power_pb2.ApplyPowerRequest(spec_yaml=spec_yaml, request_id=request_id)
        return Call("_power", "ApplyPower", request, power_result_from)

    @rpc
    def restore_power(self) -> Call[PowerResult]:
        return Call("_power", "RestorePower", power_pb2.RestorePowerRequest(), power_result_from)
