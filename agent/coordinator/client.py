"""The coordinator's client of one agent: its gRPC API over mTLS (grpc.aio).

Errors come back as the domain errors the agent raised (same class, message, field violations
and blockers), rebuilt from the rich status in one place; a dead or unreachable agent is
`Unreachable`. Channels are made per agent and reused while the coordinator runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypeVar, cast

import grpc
from google.protobuf.message import Message
from google.rpc import status_pb2

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    mig_pb2,
    mig_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
    sharing_pb2,
    sharing_pb2_grpc,
    telemetry_pb2,
    telemetry_pb2_grpc,
)
from agent.errors import (
    AgentError,
    InvalidSpec,
)
from agent.rpc_errors import BY_CODE, rebuild

__all__ = ["AgentClient", "ClientTls", "Unreachable", "domain_error"]

_DETAILS_KEY = "grpc-status-details-bin"

#: Reconnect back-off of an agent channel. gRPC's default grows to 120 s, so an agent back
#: after a long outage went unseen for minutes; capped at 2 s (plus gRPC's 20 % jitter) a
#: restarted agent is dialled again within 2.4 s, for one connection attempt per agent down.
#: grpc.min_reconnect_backoff_ms is left at its 20 s: in gRPC it is the *connect timeout* of
#: each attempt, and at 0.5 s a loaded coordinator's 1,000 first TLS handshakes timed out.
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
_WATCH_RETRY_S = 1.0


class Unreachable(AgentError):
    """The agent did not answer (down, unreachable, or the TLS handshake failed)."""

    exit_code = 9


# Transport failures: the agent is not there (or the handshake failed).
_BY_CODE: Mapping[grpc.StatusCode, type[AgentError]] = {
    **BY_CODE,
    grpc.StatusCode.UNAVAILABLE: Unreachable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unreachable,
}


def domain_error(exc: grpc.aio.AioRpcError, address: str) -> AgentError:
    """The domain error behind a failed call, prefixed with the agent it came from."""
    code = exc.code()
    status = None
    # grpc-stubs type these as objects; at run time aio metadata yields (key, value) pairs.
    trailers = cast(Iterable[tuple[str, object]], exc.trailing_metadata() or ())
    for key, value in trailers:
        if key == _DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status.FromString(value)
    return rebuild(code, f"{address}: {exc.details() or code.name}", status, _BY_CODE)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """The coordinator's client certificate, key and the agents' CA; None for plaintext.

    ``server_name`` is the name checked in the agents' certificate when dialling pod IPs (the
    agents share one serving certificate naming their gRPC Service).
    """

    cert: Path
    key: Path
    ca: Path
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        # Read on every new channel: cert-manager rotates the files in place.
        files = []
        named = (("--tls-ca", self.ca), ("--tls-key", self.key), ("--tls-cert", self.cert))
        for option, path in named:
            try:
                files.append(path.read_bytes())
            except OSError as exc:
                # A configuration error, not an unreachable fleet: one line naming the option.
                raise InvalidSpec(
                    f"cannot read the client TLS file {path} ({option} or --tls-dir): "
                    f"{exc.strerror}"
                ) from exc
        ca, key, cert = files
        return grpc.ssl_channel_credentials(ca, key, cert)


M = TypeVar("M", bound=Message)


class AgentClient:
    """Calls on one agent. Every method raises the agent's domain error, or `Unreachable`."""

    def __init__(
        self,
        address: str,
        tls: ClientTls | None,
        *,
        timeout_s: float = 10.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        options: list[tuple[str, str | int]] = list(RECONNECT_OPTIONS)
        if tls is None or address.startswith("unix:"):
            self._channel = grpc.aio.insecure_channel(address, options=options)
        else:
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            self._channel = grpc.aio.secure_channel(
                address, credentials or tls.credentials(), options=options
            )

    # Stubs are made on first use: a stub builds a callable per method, and a status sweep of
    # a thousand fresh clients (`fleet status` is always cold) needs only GetNode.
    @cached_property
    def _node(self) -> agent_pb2_grpc.NodeServiceStub:
        return agent_pb2_grpc.NodeServiceStub(self._channel)

    @cached_property
    def _ops(self) -> operations_pb2_grpc.OperationsServiceStub:
        return operations_pb2_grpc.OperationsServiceStub(self._channel)

    @cached_property
    def _mig(self) -> mig_pb2_grpc.MigServiceStub:
        return mig_pb2_grpc.MigServiceStub(self._channel)

    @cached_property
    def _sharing(self) -> sharing_pb2_grpc.SharingServiceStub:
        return sharing_pb2_grpc.SharingServiceStub(self._channel)

    @cached_property
    def _telemetry(self) -> telemetry_pb2_grpc.TelemetryServiceStub:
        return telemetry_pb2_grpc.TelemetryServiceStub(self._channel)

    @cached_property
    def _prewarm(self) -> prewarm_pb2_grpc.PrewarmServiceStub:
        return prewarm_pb2_grpc.PrewarmServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close(None)

    async def _call(
        self, method: Callable[..., Awaitable[M]], request: Message, timeout: float | None = None
    ) -> M:
        try:
            return await method(request, timeout=timeout or self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise domain_error(exc, self.address) from exc

    # -- node ------------------------------------------------------------------------------------

    async def node(self) -> agent_pb2.Node:
        response: agent_pb2.GetNodeResponse = await self._call(
            self._node.GetNode, agent_pb2.GetNodeRequest()
        )
        return response.node

    # -- MIG -------------------------------------------------------------------------------------

    async def plan_mig(self, config_yaml: str, config_name: str) -> mig_pb2.PlanMigResponse:
        request = mig_pb2.PlanMigRequest(config_yaml=config_yaml, config_name=config_name)
        response: mig_pb2.PlanMigResponse = await self._call(self._mig.PlanMig, request)
        return response

    async def apply_mig(
        self, config_yaml: str, config_name: str, request_id: str
    ) -> operations_pb2.Operation:
        request = mig_pb2.ApplyMigRequest(
            config_yaml=config_yaml, config_name=config_name, request_id=request_id
        )
        response: mig_pb2.ApplyMigResponse = await self._call(self._mig.ApplyMig, request)
        return response.operation

    # -- sharing ---------------------------------------------------------------------------------

    async def get_sharing(self) -> sharing_pb2.GetSharingResponse:
        response: sharing_pb2.GetSharingResponse = await self._call(
            self._sharing.GetSharing, sharing_pb2.GetSharingRequest()
        )
        return response

    async def set_sharing(
        self, request: sharing_pb2.SetSharingRequest
    ) -> sharing_pb2.SharingChange:
        response: sharing_pb2.SetSharingResponse = await self._call(
            self._sharing.SetSharing, request
        )
        return response.change

    # -- prewarm ---------------------------------------------------------------------------------

    async def submit_prewarm(
        self, targets: Sequence[prewarm_pb2.PrewarmTarget], request_id: str
    ) -> operations_pb2.Operation:
        request = prewarm_pb2.SubmitPrewarmRequest(targets=targets, request_id=request_id)
        response: prewarm_pb2.SubmitPrewarmResponse = await self._call(
            self._prewarm.SubmitPrewarm, request
        )
        return response.operation

    # -- operations ------------------------------------------------------------------------------

    async def pods_on(self, gpu_indices: Iterable[int]) -> set[tuple[str, str]]:
        """(namespace, pod) of the containers the agent attributes to those GPUs or their MIG
        instances (kubelet's pod-resources, as its telemetry labels them)."""
        wanted = set(gpu_indices)
        response: telemetry_pb2.GetTelemetrySnapshotResponse = await self._call(
            self._telemetry.GetTelemetrySnapshot,
            telemetry_pb2.GetTelemetrySnapshotRequest(),
        )
        return {
            (e.pod.namespace, e.pod.name)
            for e in response.snapshot.entities
            if e.entity.gpu_index in wanted and e.HasField("pod") and e.pod.name
        }

    async def running_operations(self, kind: str) -> list[operations_pb2.Operation]:
        """The agent's operations of ``kind`` not done yet (whoever started them)."""
        request = operations_pb2.ListOperationsRequest(kind=kind, done=False, page_size=100)
        response: operations_pb2.ListOperationsResponse = await self._call(
            self._ops.ListOperations, request
        )
        return list(response.operations)

    async def cancel_operation(self, name: str) -> operations_pb2.Operation:
        response: operations_pb2.CancelOperationResponse = await self._call(
            self._ops.CancelOperation, operations_pb2.CancelOperationRequest(name=name)
        )
        return response.operation

    async def watch(self, name: str) -> AsyncIterator[operations_pb2.Operation]:
        """The operation at every change until it is done.

        A broken stream (the agent restarted) is watched again: operations outlive restarts.
        """
        while True:
            stream = self._ops.WatchOperation(operations_pb2.WatchOperationRequest(name=name))
            try:
                async for item in stream:
                    yield item.operation
                    if item.operation.done:
                        return
            except grpc.aio.AioRpcError as exc:
                error = domain_error(exc, self.address)
                if not isinstance(error, Unreachable):
                    raise error from exc
            finally:
                stream.cancel()
            await asyncio.sleep(_WATCH_RETRY_S)
