"""The CLI's client of the running agent: its gRPC API over the local Unix socket.

When an agent serves on ``socket_path`` the CLI goes through it, so changes take the agent's
locks, journal and operation records, and reads come from its snapshot. Errors come back as the
domain errors the agent raised (same class, message, field violations and blockers), so the
CLI's one-line messages and exit codes are the same in both modes.

Which commands fall back to direct mode when no agent runs (see docs/api.md):
``status``, ``share …`` and ``prewarm``/``cache …`` work without an agent (they read NVML, the
plugin's config file, the cache database directly); operations, events and the telemetry
snapshot exist only in a running agent.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from grpc_status import rpc_status

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    cache_pb2,
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
    Busy,
    DriverUnavailable,
    FieldViolation,
    InvalidSpec,
    PermissionDenied,
)
from agent.rpc_errors import BY_NAME, rebuild
from agent.sharing import Advertised, ApplyResult, PluginConfig, ReloadReport, SharingView, parse
from agent.sharing.reload import Pickup, StatusRecord
from agent.sharing.schema import render

__all__ = ["AgentClient", "RemoteSharing", "error_from", "status_view"]

_TIMEOUT_S = 60.0


def error_from(exc: grpc.RpcError) -> AgentError:
    """The domain error behind a failed call, rebuilt from its rich status."""
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    message = (exc.details() if isinstance(exc, grpc.Call) else None) or str(code)
    status = rpc_status.from_call(exc) if isinstance(exc, grpc.Call) else None
    if code is grpc.StatusCode.UNAVAILABLE and status is None:
        return DriverUnavailable(f"the agent did not answer: {message}")
    return rebuild(code, message, status)


def operation_failure(error: operations_pb2.OperationError) -> AgentError:
    """The domain error an operation ended with (its reason names the error class)."""
    cls = BY_NAME.get(error.reason, AgentError)
    message = f"{error.reason}: {error.message}" if cls is AgentError else error.message
    if issubclass(cls, InvalidSpec):
        return cls(message, [FieldViolation(v.field, v.description) for v in error.violations])
    if issubclass(cls, Busy):
        return cls(message, list(error.blockers))
    return cls(message)


def follow(
    client: AgentClient, op: operations_pb2.Operation, on_update: Callable[[Any], None]
) -> operations_pb2.Operation:
    """Watch an operation to its end, passing each update on; raise its error if it failed."""
    for update in client.watch(op.name):
        on_update(update)
        op = update
    if op.HasField("error"):
        raise operation_failure(op.error)
    return op


class AgentClient:
    """Calls on the agent; every method raises the agent's domain error when refused."""

    def __init__(self, socket_path: Path, timeout_s: float = _TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self._timeout = timeout_s
        self._channel = grpc.insecure_channel(f"unix:{socket_path}")

    @classmethod
    def connect(cls, socket_path: Path) -> AgentClient | None:
        """A client when an agent serves on ``socket_path``; None when none runs there.

        A socket only root may open raises PermissionDenied: the CLI must not silently fall
        back to direct mode beside a running agent.
        """
        if not socket_path.exists():
            return None
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(socket_path))
        except PermissionError as exc:
            raise PermissionDenied(
                f"an agent serves on {socket_path}, which only root may use: run as root"
            ) from exc
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # left behind by an agent that was killed
        finally:
            probe.close()
        return cls(socket_path)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise error_from(exc) from None

    # -- node -------------------------------------------------------------------------------------

    def node(self) -> agent_pb2.Node:
        stub = agent_pb2_grpc.NodeServiceStub(self._channel)
        response: agent_pb2.GetNodeResponse = self._call(stub.GetNode, agent_pb2.GetNodeRequest())
        return response.node

    def telemetry(self) -> telemetry_pb2.TelemetrySnapshot:
        stub = telemetry_pb2_grpc.TelemetryServiceStub(self._channel)
        request = telemetry_pb2.GetTelemetrySnapshotRequest()
        response: telemetry_pb2.GetTelemetrySnapshotResponse = self._call(
            stub.GetTelemetrySnapshot, request
        )
        return response.snapshot

    # -- operations -------------------------------------------------------------------------------

    def operations(
        self, kind: str = "", done: bool | None = None
    ) -> list[operations_pb2.Operation]:
        stub = operations_pb2_grpc.OperationsServiceStub(self._channel)
        request = operations_pb2.ListOperationsRequest(kind=kind, done=done)
        response: operations_pb2.ListOperationsResponse = self._call(stub.ListOperations, request)
        return list(response.operations)

    def operation(self, name: str) -> operations_pb2.Operation:
        stub = operations_pb2_grpc.OperationsServiceStub(self._channel)
        request = operations_pb2.GetOperationRequest(name=name)
        response: operations_pb2.GetOperationResponse = self._call(stub.GetOperation, request)
        return response.operation

    def cancel(self, name: str) -> operations_pb2.Operation:
        stub = operations_pb2_grpc.OperationsServiceStub(self._channel)
        request = operations_pb2.CancelOperationRequest(name=name)
        response: operations_pb2.CancelOperationResponse = self._call(stub.CancelOperation, request)
        return response.operation

    def watch(self, name: str) -> Iterator[operations_pb2.Operation]:
        """The operation at every change until it is done (no deadline: long work is long)."""
        stub = operations_pb2_grpc.OperationsServiceStub(self._channel)
        try:
            for answer in stub.WatchOperation(operations_pb2.WatchOperationRequest(name=name)):
                yield answer.operation
        except grpc.RpcError as exc:
            raise error_from(exc) from None

    # -- MIG --------------------------------------------------------------------------------------

    def mig_plan(
        self, config_yaml: str, name: str = "", force: bool = False
    ) -> mig_pb2.PlanMigResponse:
        stub = mig_pb2_grpc.MigServiceStub(self._channel)
        request = mig_pb2.PlanMigRequest(config_yaml=config_yaml, config_name=name, force=force)
        response: mig_pb2.PlanMigResponse = self._call(stub.PlanMig, request)
        return response

    def mig_apply(
        self, config_yaml: str, name: str = "", force: bool = False, request_id: str = ""
    ) -> operations_pb2.Operation:
        """Starts the apply; follow it with `watch`."""
        stub = mig_pb2_grpc.MigServiceStub(self._channel)
        request = mig_pb2.ApplyMigRequest(
            config_yaml=config_yaml, config_name=name, force=force, request_id=request_id
        )
        response: mig_pb2.ApplyMigResponse = self._call(stub.ApplyMig, request)
        return response.operation

    def mig_assert(self, config_yaml: str, name: str = "") -> mig_pb2.AssertMigResponse:
        stub = mig_pb2_grpc.MigServiceStub(self._channel)
        request = mig_pb2.AssertMigRequest(config_yaml=config_yaml, config_name=name)
        response: mig_pb2.AssertMigResponse = self._call(stub.AssertMig, request)
        return response

    def mig_export(self, label: str = "current") -> str:
        stub = mig_pb2_grpc.MigServiceStub(self._channel)
        request = mig_pb2.ExportMigRequest(config_name=label)
        response: mig_pb2.ExportMigResponse = self._call(stub.ExportMig, request)
        return response.config_yaml

    # -- prewarm ----------------------------------------------------------------------------------

    def prewarm(
        self, targets: list[prewarm_pb2.PrewarmTarget], request_id: str = ""
    ) -> operations_pb2.Operation:
        """Starts warming; follow it with `watch`."""
        stub = prewarm_pb2_grpc.PrewarmServiceStub(self._channel)
        request = prewarm_pb2.SubmitPrewarmRequest(targets=targets, request_id=request_id)
        response: prewarm_pb2.SubmitPrewarmResponse = self._call(stub.SubmitPrewarm, request)
        return response.operation

    def cache(self) -> cache_pb2.CacheInventory:
        stub = prewarm_pb2_grpc.PrewarmServiceStub(self._channel)
        response: prewarm_pb2.ListCacheResponse = self._call(
            stub.ListCache, prewarm_pb2.ListCacheRequest()
        )
        return response.cache

    # -- sharing ----------------------------------------------------------------------------------

    def sharing(self) -> RemoteSharing:
        return RemoteSharing(self)

    def _sharing_stub(self) -> sharing_pb2_grpc.SharingServiceStub:
        return sharing_pb2_grpc.SharingServiceStub(self._channel)


def _reload(msg: sharing_pb2.PluginReload) -> ReloadReport:
    return ReloadReport(
        msg.method, msg.done, msg.detail, msg.time.ToNanoseconds() / 1e9, tuple(msg.pids)
    )


def _advertised(items: Any) -> tuple[Advertised, ...]:
    return tuple(Advertised(a.resource, a.devices, a.replicas) for a in items)


def _result(change: sharing_pb2.SharingChange) -> ApplyResult:
    return ApplyResult(
        action=change.action,
        changed=change.changed,
        config_path=Path(change.config_path),
        config=parse(change.config.config_yaml),
        advertised=_advertised(change.advertised),
        reload=_reload(change.reload) if change.HasField("reload") else None,
    )


class RemoteSharing:
    """`agent.sharing.SharingService` through the agent: the same methods and records, so
    ``gpu-agent share`` renders them the same way in both modes."""

    def __init__(self, client: AgentClient) -> None:
        self._client = client

    def show(self) -> SharingView:
        stub = self._client._sharing_stub()
        view: sharing_pb2.GetSharingResponse = self._client._call(
            stub.GetSharing, sharing_pb2.GetSharingRequest()
        )
        last = None
        if view.HasField("last_write"):
            w = view.last_write
            last = StatusRecord(
                w.action,
                "",
                w.write_time.ToNanoseconds() / 1e9,
                _reload(w.reload) if w.HasField("reload") else None,
            )
        return SharingView(
            config_path=Path(view.config_path),
            exists=view.exists,
            config=parse(view.config.config_yaml),
            advertised=_advertised(view.advertised),
            problems=tuple(FieldViolation(p.field, p.description) for p in view.problems),
            pickup=Pickup(view.plugin_state, view.plugin_detail),  # type: ignore[arg-type]
            last_write=last,
        )

    def set(self, requested: PluginConfig) -> ApplyResult:
        stub = self._client._sharing_stub()
        request = sharing_pb2.SetSharingRequest(config_yaml=render(requested))
        response: sharing_pb2.SetSharingResponse = self._client._call(stub.SetSharing, request)
        return _result(response.change)

    def clear(self) -> ApplyResult:
        stub = self._client._sharing_stub()
        response: sharing_pb2.ClearSharingResponse = self._client._call(
            stub.ClearSharing, sharing_pb2.ClearSharingRequest()
        )
        return _result(response.change)

    def rollback(self) -> ApplyResult:
        stub = self._client._sharing_stub()
        response: sharing_pb2.RollbackSharingResponse = self._client._call(
            stub.RollbackSharing, sharing_pb2.RollbackSharingRequest()
        )
        return _result(response.change)


def status_view(node: agent_pb2.Node) -> dict[str, Any]:
    """The node as ``gpu-agent status`` shows it (`agent.cli.status.node_status`'s shape)."""

    def placement(p: agent_pb2.Placement) -> dict[str, int]:
        return {"start": p.start, "size": p.size}

    return {
        "driver_version": node.driver_version,
        "gpus": [
            {
                "index": g.index,
                "health": "lost" if g.health == agent_pb2.GPU_HEALTH_LOST else "ok",
                "detail": g.health_detail,
                # A GPU lost before the agent saw it answer has only its index.
                "uuid": g.uuid or None,
                "name": g.name or None,
                "pci_bus_id": g.pci_bus_id or None,
                "pci_device_id": f"0x{g.pci_device_id:08X}" if g.uuid else None,
                "memory_total_bytes": g.memory_total_bytes if g.uuid else None,
                "mig": None
                if not g.HasField("mig_mode")
                else {
                    "current": "enabled" if g.mig_mode.current else "disabled",
                    "pending": "enabled" if g.mig_mode.pending else "disabled",
                },
                "instances": [
                    {
                        "gpu_instance_id": gi.id,
                        "profile": gi.profile_name,
                        "profile_id": gi.profile_id,
                        "placement": placement(gi.placement),
                        "compute_instances": [
                            {
                                "id": ci.id,
                                "profile_id": ci.profile_id,
                                "placement": placement(ci.placement),
                                "uuid": ci.uuid or None,
                            }
                            for ci in gi.compute_instances
                        ],
                    }
                    for gi in g.instances
                ],
                "processes": [
                    {
                        "pid": p.pid,
                        "used_memory_bytes": p.used_memory_bytes
                        if p.HasField("used_memory_bytes")
                        else None,
                        "gpu_instance_id": p.gpu_instance_id
                        if p.HasField("gpu_instance_id")
                        else None,
                        "compute_instance_id": p.compute_instance_id
                        if p.HasField("compute_instance_id")
                        else None,
                    }
                    for p in g.processes
                ],
            }
            for g in node.gpus
        ],
    }
