"""The asyncio client of one agent (the coordinator): its gRPC API over mTLS or a socket.

The same method names and requests as the sync client (agent/client/sync.py); answers are
records (agent/wire), errors the agent's domain errors (agent/wire/errors.py), a dead or
unreachable agent `Unreachable`. ``set_sharing`` and ``submit_prewarm`` take the requests a
rollout record keeps as their messages' JSON (agent.coordinator.rollout.specs).
Channels are made per agent and reused while the caller runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import grpc
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
from agent.client.base import ClientTls, Stubs, channel_options
from agent.client.errors import Unreachable, domain_error
from agent.power import Change, PowerView
from agent.sharing import ApplyResult, SharingView
from agent.wire.doctor import DoctorReport, report_from
from agent.wire.mig import GpuReset, MigPlanView, plan_from, reset_from
from agent.wire.node import NodeView, node_from
from agent.wire.operations import OperationView, operation_from
from agent.wire.power import power_changes_from, power_view_from
from agent.wire.sharing import sharing_change_from, sharing_view_from
from agent.wire.telemetry import TelemetryView, telemetry_from

__all__ = ["AsyncAgentClient"]

_WATCH_RETRY_S = 1.0
M = TypeVar("M", bound=Message)


class AsyncAgentClient(Stubs):
    """Calls on one agent. Every method raises the agent's domain error, or `Unreachable`."""

    def __init__(
        self,
        address: str,
        tls: ClientTls | None,
        *,
        timeout_s: float = 10.0,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
    ) -> None:
        """``server_name`` (see `ClientTls.name_for`) is what the agent's certificate must
        name; None checks the dialled host."""
        self.address = address
        self.timeout_s = timeout_s
        options = channel_options(server_name if tls is not None else None)
        if tls is None or address.startswith("unix:"):
            self._channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self._channel = grpc.aio.secure_channel(
                address, credentials or tls.credentials(), options=options
            )

    async def close(self) -> None:
        await self._channel.close(None)

    async def _call(
        self, method: Callable[..., Awaitable[M]], request: Message, timeout: float | None = None
    ) -> M:
        try:
            return await method(request, timeout=timeout or self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise domain_error(exc, self.address) from exc

    async def node(self) -> NodeView:
        response: agent_pb2.GetNodeResponse = await self._call(
            self._node.GetNode, agent_pb2.GetNodeRequest()
        )
        return node_from(response.node)

    async def doctor(self) -> DoctorReport:
        """Every read-only check of the agent's duties; the agent bounds the run under 10 s,
        so the call waits a little longer than other reads."""
        response: agent_pb2.DoctorResponse = await self._call(
            self._node.Doctor, agent_pb2.DoctorRequest(), timeout=max(self.timeout_s, 15.0)
        )
        return report_from(response)

    async def telemetry(self, field_ids: Sequence[int] = ()) -> TelemetryView:
        """The agent's latest telemetry snapshot (only ``field_ids``, when given)."""
        request = telemetry_pb2.GetTelemetrySnapshotRequest(field_ids=list(field_ids))
        response: telemetry_pb2.GetTelemetrySnapshotResponse = await self._call(
            self._telemetry.GetTelemetrySnapshot, request
        )
        return telemetry_from(response.snapshot)

    async def plan_mig(
        self, config_yaml: str, config_name: str = "", force: bool = False
    ) -> MigPlanView:
        request = mig_pb2.PlanMigRequest(
            config_yaml=config_yaml, config_name=config_name, force=force
        )
        response: mig_pb2.PlanMigResponse = await self._call(self._mig.PlanMig, request)
        return plan_from(response)

    async def apply_mig(
        self,
        config_yaml: str,
        config_name: str = "",
        request_id: str = "",
        force: bool = False,
        claim_holder: str = "",
    ) -> OperationView:
        request = mig_pb2.ApplyMigRequest(
            config_yaml=config_yaml,
            config_name=config_name,
            request_id=request_id,
            force=force,
            claim_holder=claim_holder,
        )
        response: mig_pb2.ApplyMigResponse = await self._call(self._mig.ApplyMig, request)
        return operation_from(response.operation)

    async def claim_mig(
        self, holder: str, rollout: str, max_unavailable: str, ttl_s: int = 0
    ) -> mig_pb2.MigClaim:
        """Claim the node for ``holder``'s next MIG change (Busy while another holds it)."""
        request = mig_pb2.ClaimMigRequest(
            holder=holder, rollout=rollout, max_unavailable=max_unavailable, ttl_seconds=ttl_s
        )
        response: mig_pb2.ClaimMigResponse = await self._call(self._mig.ClaimMig, request)
        return response.claim

    async def mig_claim(self) -> mig_pb2.MigClaim | None:
        """The node's live claim (a running mig.apply counts as one), None when unclaimed."""
        response: mig_pb2.GetMigClaimResponse = await self._call(
            self._mig.GetMigClaim, mig_pb2.GetMigClaimRequest()
        )
        return response.claim if response.HasField("claim") else None

    async def release_mig_claim(self, holder: str) -> bool:
        request = mig_pb2.ReleaseMigClaimRequest(holder=holder)
        response: mig_pb2.ReleaseMigClaimResponse = await self._call(
            self._mig.ReleaseMigClaim, request
        )
        return response.released

    async def reset_gpu(
        self, gpu_index: int, *, validate_only: bool = False, request_id: str = ""
    ) -> GpuReset:
        """Reset one GPU through the agent (refused while processes hold it); with
        ``validate_only`` only whether the agent could try. A reset may take the driver a
        while: the call may take four times the client's timeout."""
        request = mig_pb2.ResetGpuRequest(
            gpu_index=gpu_index, validate_only=validate_only, request_id=request_id
        )
        response: mig_pb2.ResetGpuResponse = await self._call(
            self._mig.ResetGpu, request, timeout=4 * self.timeout_s
        )
        return reset_from(response)

    async def get_power(self) -> PowerView:
        response: power_pb2.GetPowerResponse = await self._call(
            self._power.GetPower, power_pb2.GetPowerRequest()
        )
        return power_view_from(response)

    async def apply_power(self, spec_yaml: str, request_id: str = "") -> list[Change]:
        request = power_pb2.ApplyPowerRequest(spec_yaml=spec_yaml, request_id=request_id)
        response: power_pb2.ApplyPowerResponse = await self._call(self._power.ApplyPower, request)
        return power_changes_from(response.changes)

    async def get_sharing(self) -> SharingView:
        response: sharing_pb2.GetSharingResponse = await self._call(
            self._sharing.GetSharing, sharing_pb2.GetSharingRequest()
        )
        return sharing_view_from(response)

    async def set_sharing(self, request: sharing_pb2.SetSharingRequest) -> ApplyResult:
        """``request``: as a rollout record keeps it (agent.coordinator.rollout.specs)."""
        response: sharing_pb2.SetSharingResponse = await self._call(
            self._sharing.SetSharing, request
        )
        return sharing_change_from(response.change)

    async def submit_prewarm(
        self, targets: Sequence[prewarm_pb2.PrewarmTarget], request_id: str = ""
    ) -> OperationView:
        """``targets``: as a rollout record keeps them (agent.coordinator.rollout.specs)."""
        request = prewarm_pb2.SubmitPrewarmRequest(targets=targets, request_id=request_id)
        response: prewarm_pb2.SubmitPrewarmResponse = await self._call(
            self._prewarm.SubmitPrewarm, request
        )
        return operation_from(response.operation)

    async def pods_on(self, gpu_indices: Iterable[int]) -> set[tuple[str, str]]:
        """(namespace, pod) of the containers the agent attributes to those GPUs or their MIG
        instances (kubelet's pod-resources, as its telemetry labels them)."""
        wanted = set(gpu_indices)
        snapshot = await self.telemetry()
        return {
            (s.pod.namespace, s.pod.name)
            for s in snapshot.samples
            if s.entity.gpu_index in wanted and s.pod is not None and s.pod.name
        }

    async def running_operations(self, kind: str) -> list[OperationView]:
        """The agent's operations of ``kind`` not done yet (whoever started them)."""
        request = operations_pb2.ListOperationsRequest(kind=kind, done=False, page_size=100)
        response: operations_pb2.ListOperationsResponse = await self._call(
            self._ops.ListOperations, request
        )
        return [operation_from(op) for op in response.operations]

    async def cancel_operation(self, name: str) -> OperationView:
        response: operations_pb2.CancelOperationResponse = await self._call(
            self._ops.CancelOperation, operations_pb2.CancelOperationRequest(name=name)
        )
        return operation_from(response.operation)

    async def watch_operation(self, name: str) -> AsyncIterator[OperationView]:
        """The operation at every change until it is done.

        A broken stream (the agent restarted) is watched again: operations outlive restarts.
        """
        while True:
            stream = self._ops.WatchOperation(operations_pb2.WatchOperationRequest(name=name))
            try:
                async for item in stream:
                    yield operation_from(item.operation)
                    if item.operation.done:
                        return
            except grpc.aio.AioRpcError as exc:
                error = domain_error(exc, self.address)
                if not isinstance(error, Unreachable):
                    raise error from exc
            finally:
                stream.cancel()
            await asyncio.sleep(_WATCH_RETRY_S)
