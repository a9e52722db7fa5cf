"""The sync client of the node's agent (the CLI): its gRPC API over the local Unix socket.

The same method names and requests as the asyncio client (agent/client/aio.py); errors are the
agent's domain errors (same class, message, field violations and blockers: agent/wire/errors.py),
so the CLI's one-line messages and exit codes are the agent's own.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    mig_pb2,
    operations_pb2,
    power_pb2,
    prewarm_pb2,
    sharing_pb2,
    telemetry_pb2,
)
from agent.client.base import Stubs, channel_options
from agent.client.errors import Unreachable, domain_error
from agent.errors import PermissionDenied
from agent.power import Change, PowerView
from agent.prewarm.model import CacheItem
from agent.prewarm.source import SourceRequest
from agent.sharing import ApplyResult, PluginConfig, SharingView
from agent.wire.doctor import DoctorReport, report_from
from agent.wire.mig import AdvisedGpu, MigPlanView, advice_from, plan_from
from agent.wire.node import NodeView, node_from
from agent.wire.operations import OperationView, operation_from
from agent.wire.power import power_changes_from, power_view_from
from agent.wire.prewarm import (
    CacheContents,
    cache_contents_from,
    cache_item_from,
    prewarm_targets_pb,
)
from agent.wire.sharing import set_sharing_request, sharing_change_from, sharing_view_from
from agent.wire.telemetry import Scrape, TelemetryView, scrape_from, telemetry_from

__all__ = ["PROBE_AFTER_S", "PROBE_TIMEOUT_S", "AgentClient"]

_TIMEOUT_S = 60.0
PROBE_AFTER_S = 2.0
"""A call the agent has not answered in this long makes the client check the agent is alive."""
PROBE_TIMEOUT_S = 3.0
"""How long that check (a health Check on a new connection) may take; then the call ends with
a message naming the agent, so a stopped or wedged agent is reported in under 10 s."""
_PROBE_EVERY_S = 5.0
_CONNECT_TIMEOUT_S = 5.0
M = TypeVar("M", bound=Message)


class AgentClient(Stubs):
    """Calls on the agent; every method raises the agent's domain error when refused."""

    def __init__(
        self, socket_path: Path, timeout_s: float = _TIMEOUT_S, peer_pid: int | None = None
    ) -> None:
        """``peer_pid``: the agent process behind the socket, when known (`connect`)."""
        self.socket_path = socket_path
        self.peer_pid = peer_pid
        self._timeout = timeout_s
        self._channel = grpc.insecure_channel(f"unix:{socket_path}", options=channel_options())

    @classmethod
    def connect(cls, socket_path: Path) -> AgentClient | None:
        """A client when an agent serves on ``socket_path``; None when none runs there.

        A socket only root may open raises PermissionDenied: the CLI must never act beside a
        running agent it cannot reach.
        """
        if not socket_path.exists():
            return None
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(_CONNECT_TIMEOUT_S)  # a full backlog: the agent accepts nothing
        try:
            probe.connect(str(socket_path))
            # The listening process, as the kernel knows it (SO_PEERCRED: pid, uid, gid).
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", creds)[0] or None
        except PermissionError as exc:
            raise PermissionDenied(
                f"an agent serves on {socket_path}, which only root may use: run as root"
            ) from exc
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # left behind by an agent that was killed
        except TimeoutError:
            raise Unreachable(
                f"the agent on {socket_path} accepts no connection in {_CONNECT_TIMEOUT_S:.0f}s "
                "(stopped, wedged or out of file descriptors): look at its log and restart it"
            ) from None
        finally:
            probe.close()
        return cls(socket_path, peer_pid=pid)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., M], request: Message) -> M:
        # The future form, so the watchdog can cancel a call the agent will never answer.
        call = cast(Any, method).future(request, timeout=self._timeout)
        with self._watchdog(call.cancel) as verdict:
            try:
                return cast(M, call.result())
            except (grpc.RpcError, grpc.FutureCancelledError) as exc:
                if verdict:
                    raise Unreachable(verdict[0]) from None
                assert isinstance(exc, grpc.RpcError)
                raise domain_error(exc) from None

    @contextmanager
    def _watchdog(self, cancel: Callable[[], object]) -> Iterator[list[str]]:
        """While the block waits for the agent: from PROBE_AFTER_S on, check now and then that
        the agent answers at all; when it does not, put why in the list and ``cancel`` the call
        (the block then raises `Unreachable` with it). A slow answer from a live agent is
        waited for as long as the call's deadline allows."""
        verdict: list[str] = []
        done = threading.Event()

        def watch() -> None:
            wait = PROBE_AFTER_S
            while not done.wait(wait):
                why = self._unanswered()
                if why is not None and not done.is_set():
                    verdict.append(why)
                    cancel()
                    return
                wait = _PROBE_EVERY_S

        watcher = threading.Thread(target=watch, name="agent-watchdog", daemon=True)
        watcher.start()
        try:
            yield verdict
        finally:
            done.set()

    def _unanswered(self) -> str | None:
        """None when the agent answers a health check on a new connection in PROBE_TIMEOUT_S;
        else a message naming it (pid, socket) and what to do."""
        channel = grpc.insecure_channel(f"unix:{self.socket_path}", options=channel_options())
        try:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S
            )
            return None
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                return None  # it answered, if only to refuse
        finally:
            channel.close()
        pid = self.peer_pid
        who = f"the agent on {self.socket_path}" + (f" (pid {pid})" if pid else "")
        if pid is not None and _process_state(pid) == "T":
            return (
                f"{who} is stopped (SIGSTOP or a debugger) and answers nothing: "
                f"resume it with kill -CONT {pid}"
            )
        how = f"restart it (kill -TERM {pid})" if pid else "restart it"
        return (
            f"{who} did not answer a health check in {PROBE_TIMEOUT_S:.0f}s: it is wedged or "
            f"overloaded; look at its log, or {how}"
        )

    # -- node -------------------------------------------------------------------------------------

    def node(self) -> NodeView:
        return node_from(self._call(self._node.GetNode, agent_pb2.GetNodeRequest()).node)

    def doctor(self) -> DoctorReport:
        """Every read-only check of the agent's duties, run now (under 10 s)."""
        return report_from(self._call(self._node.Doctor, agent_pb2.DoctorRequest()))

    def telemetry(self, field_ids: Sequence[int] = ()) -> TelemetryView:
        """The agent's latest telemetry snapshot (only ``field_ids``, when given)."""
        request = telemetry_pb2.GetTelemetrySnapshotRequest(field_ids=list(field_ids))
        return telemetry_from(self._call(self._telemetry.GetTelemetrySnapshot, request).snapshot)

    def metrics(self, *, openmetrics: bool = False) -> Scrape:
        """What the agent's /metrics returns now, with the time of the sample rendered."""
        request = telemetry_pb2.GetMetricsRequest(openmetrics=openmetrics)
        return scrape_from(self._call(self._telemetry.GetMetrics, request))

    # -- operations -------------------------------------------------------------------------------

    def list_operations(self, kind: str = "", done: bool | None = None) -> list[OperationView]:
        request = operations_pb2.ListOperationsRequest(kind=kind, done=done)
        answer = self._call(self._ops.ListOperations, request)
        return [operation_from(op) for op in answer.operations]

    def get_operation(self, name: str) -> OperationView:
        request = operations_pb2.GetOperationRequest(name=name)
        return operation_from(self._call(self._ops.GetOperation, request).operation)

    def cancel_operation(self, name: str) -> OperationView:
        request = operations_pb2.CancelOperationRequest(name=name)
        return operation_from(self._call(self._ops.CancelOperation, request).operation)

    def watch_operation(self, name: str) -> Iterator[OperationView]:
        """The operation at every change until it is done (no deadline: long work is long)."""
        call = self._ops.WatchOperation(operations_pb2.WatchOperationRequest(name=name))
        with self._watchdog(call.cancel) as verdict:
            try:
                for answer in call:
                    yield operation_from(answer.operation)
            except grpc.RpcError as exc:
                if verdict:
                    raise Unreachable(verdict[0]) from None
                raise domain_error(exc) from None

    def follow(
        self, op: OperationView, on_update: Callable[[OperationView], None]
    ) -> OperationView:
        """Watch an operation to its end, passing each update on; raise its error if it failed."""
        for update in self.watch_operation(op.name):
            on_update(update)
            op = update
        if op.error is not None:
            raise op.error
        return op

    # -- MIG --------------------------------------------------------------------------------------

    def plan_mig(self, config_yaml: str, config_name: str = "", force: bool = False) -> MigPlanView:
        """What an apply of ``config_yaml`` would do, GPU by GPU; changes nothing."""
        request = mig_pb2.PlanMigRequest(
            config_yaml=config_yaml, config_name=config_name, force=force
        )
        return plan_from(self._call(self._mig.PlanMig, request))

    def apply_mig(
        self,
        config_yaml: str,
        config_name: str = "",
        request_id: str = "",
        force: bool = False,
        mode_only: bool = False,
        skip_reset: bool = False,
    ) -> OperationView:
        """Starts the apply; follow it with `watch_operation` or `follow`."""
        request = mig_pb2.ApplyMigRequest(
            config_yaml=config_yaml,
            config_name=config_name,
            request_id=request_id,
            force=force,
            mode_only=mode_only,
            skip_reset=skip_reset,
        )
        return operation_from(self._call(self._mig.ApplyMig, request).operation)

    def export_mig(self, config_name: str = "current") -> str:
        request = mig_pb2.ExportMigRequest(config_name=config_name)
        return self._call(self._mig.ExportMig, request).config_yaml

    def advise_mig(self, gpu_index: int | None = None, profile: str = "") -> tuple[AdvisedGpu, ...]:
        request = mig_pb2.AdviseMigRequest(gpu_index=gpu_index, profile=profile)
        return advice_from(self._call(self._mig.AdviseMig, request))

    def restore_mig(
        self, checkpoint: bytes, *, mode_only: bool = False, request_id: str = ""
    ) -> OperationView:
        """Starts restoring a mig-parted checkpoint; follow it with `follow`."""
        request = mig_pb2.RestoreMigRequest(
            checkpoint=checkpoint, mode_only=mode_only, request_id=request_id
        )
        return operation_from(self._call(self._mig.RestoreMig, request).operation)

    # -- prewarm ----------------------------------------------------------------------------------

    def submit_prewarm(
        self, requests: Sequence[SourceRequest], request_id: str = ""
    ) -> OperationView:
        """Starts warming what ``requests`` ask for (any registered kind, sent as the targets
        the agent reads back into the same requests); follow it with `watch_operation` or
        `follow`."""
        request = prewarm_pb2.SubmitPrewarmRequest(
            targets=prewarm_targets_pb(requests), request_id=request_id
        )
        return operation_from(self._call(self._prewarm.SubmitPrewarm, request).operation)

    def list_prewarm_items(self) -> list[CacheItem]:
        request = prewarm_pb2.ListPrewarmItemsRequest()
        return [
            cache_item_from(i) for i in self._call(self._prewarm.ListPrewarmItems, request).items
        ]

    def cancel_prewarm_item(self, item: str) -> CacheItem:
        request = prewarm_pb2.CancelPrewarmItemRequest(item=item)
        return cache_item_from(self._call(self._prewarm.CancelPrewarmItem, request).item)

    def delete_prewarm_item(self, item: str) -> CacheItem:
        request = prewarm_pb2.DeletePrewarmItemRequest(item=item)
        return cache_item_from(self._call(self._prewarm.DeletePrewarmItem, request).item)

    def list_cache(self) -> CacheContents:
        cache = self._call(self._prewarm.ListCache, prewarm_pb2.ListCacheRequest()).cache
        return cache_contents_from(cache)

    def evict_cache_item(self, item: str) -> CacheItem:
        request = prewarm_pb2.EvictCacheItemRequest(item=item)
        return cache_item_from(self._call(self._prewarm.EvictCacheItem, request).item)

    def pin_cache_item(self, item: str, pinned: bool = True) -> CacheItem:
        request = prewarm_pb2.PinCacheItemRequest(item=item, pinned=pinned)
        return cache_item_from(self._call(self._prewarm.PinCacheItem, request).item)

    # -- sharing ----------------------------------------------------------------------------------

    def get_sharing(self) -> SharingView:
        return sharing_view_from(
            self._call(self._sharing.GetSharing, sharing_pb2.GetSharingRequest())
        )

    def set_sharing(self, config: PluginConfig) -> ApplyResult:
        """Make ``config`` the node's sharing (sent as the plugin's own file)."""
        change = self._call(self._sharing.SetSharing, set_sharing_request(config)).change
        return sharing_change_from(change)

    def clear_sharing(self) -> ApplyResult:
        request = sharing_pb2.ClearSharingRequest()
        return sharing_change_from(self._call(self._sharing.ClearSharing, request).change)

    def rollback_sharing(self) -> ApplyResult:
        request = sharing_pb2.RollbackSharingRequest()
        return sharing_change_from(self._call(self._sharing.RollbackSharing, request).change)

    # -- power ------------------------------------------------------------------------------------

    def get_power(self) -> PowerView:
        return power_view_from(self._call(self._power.GetPower, power_pb2.GetPowerRequest()))

    def apply_power(self, spec_yaml: str) -> list[Change]:
        request = power_pb2.ApplyPowerRequest(spec_yaml=spec_yaml)
        return power_changes_from(self._call(self._power.ApplyPower, request).changes)

    def restore_power(self) -> list[Change]:
        request = power_pb2.RestorePowerRequest()
        return power_changes_from(self._call(self._power.RestorePower, request).changes)


def _process_state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (R, S, D, T for stopped, ...); None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0] if ")" in stat else None
