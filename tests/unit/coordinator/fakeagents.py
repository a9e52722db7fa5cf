"""Fake agents over real gRPC (Unix sockets, gRPC's threaded server), for
the coordinator's health tests: each answers GetNode with a Node the test sets (HealthMarks
included), records the calls it gets, and either answers the rest itself (SetSharing,
GetSharing, ResetGpu, GetTelemetrySnapshot) or forwards them untouched to a real agent's
socket (``upstream``), rewriting only GetNode's answer through ``rewrite``.

The real agent fills no HealthMark yet on this branch (the health state machine is built
alongside); these stand in for its GetNode until it does.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    mig_pb2,
    operations_pb2,
    sharing_pb2,
    telemetry_pb2,
)

_P = "/gpuagent.v1."


def mark(state: str, reason: str = "", action: str = "", pods: tuple[str, ...] = ()) -> Any:
    """A HealthMark: ``state`` healthy, degraded or failed."""
    value = agent_pb2.HealthState.Value(f"HEALTH_STATE_{state.upper()}")
    return agent_pb2.HealthMark(state=value, reason=reason, action=action, pods=list(pods))


def driverless_node(name: str) -> Any:
    """A Node whose agent waits for the NVIDIA driver: no GPU read, none to say."""
    answer = agent_pb2.Node(name=name)
    answer.driver.CopyFrom(
        agent_pb2.Driver(
            state=agent_pb2.DRIVER_STATE_NOT_READY, cause="driver_not_loaded", reason="no module"
        )
    )
    return answer


def node(name: str, *marks: Any, processes: dict[int, list[int]] | None = None) -> Any:
    """A Node of ``len(marks)`` GPUs, GPU i marked ``marks[i]`` (None: no verdict), handed out
    by a device plugin (a test that wants another mode sets ``allocation``)."""
    answer = agent_pb2.Node(name=name)
    answer.allocation.CopyFrom(
        agent_pb2.Allocation(mode=agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN, evidence="test")
    )
    for i, m in enumerate(marks):
        gpu = answer.gpus.add(index=i, uuid=f"GPU-{name}-{i}", name="NVIDIA H100 80GB HBM3")
        gpu.health = agent_pb2.GPU_HEALTH_OK
        if m is not None:
            gpu.condition.CopyFrom(m)
        for pid in (processes or {}).get(i, []):
            gpu.processes.add(pid=pid)
    return answer


@dataclass
class FakeAgent:
    name: str
    socket: Path
    node: Any
    #: (namespace, pod) per GPU index, as the agent's telemetry attributes them
    pods: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    #: GPU indices reset (ResetGpu, not validate_only)
    resets: list[int] = field(default_factory=list)
    #: called with each method name before it is answered (the test changes ``node`` there)
    on_call: Callable[[FakeAgent, str], None] = lambda agent, method: None
    #: a real agent's socket to forward every call but GetNode's answer to
    upstream: str | None = None
    #: GetNode's answer from the upstream agent's, when forwarding
    rewrite: Callable[[Any], None] = lambda answer: None
    #: ResetGpu refused with this status and message
    reset_error: tuple[grpc.StatusCode, str] | None = None
    #: other methods refused with a status and message, as the real agent refuses them
    errors: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)
    #: SetSharing's and GetSharing's answers (None: changed, nothing reloaded; an empty one)
    sharing_change: Any = None
    sharing_view: Any = None

    @property
    def address(self) -> str:
        return f"unix:{self.socket}"


def _reply(agent: FakeAgent, method: str, request: bytes) -> bytes | None:
    """The fake's own answer, or None for a method it does not serve."""
    if method == "NodeService/GetNode":
        return agent_pb2.GetNodeResponse(node=agent.node).SerializeToString()
    if method == "SharingService/SetSharing":
        change = agent.sharing_change
        if change is None:
            change = sharing_pb2.SharingChange(changed=True)
        return sharing_pb2.SetSharingResponse(change=change).SerializeToString()
    if method == "SharingService/GetSharing":
        view = agent.sharing_view
        if view is None:
            view = sharing_pb2.GetSharingResponse()
        return view.SerializeToString()
    if method == "OperationsService/ListOperations":
        return operations_pb2.ListOperationsResponse().SerializeToString()
    if method == "TelemetryService/GetTelemetrySnapshot":
        snapshot = telemetry_pb2.TelemetrySnapshot()
        for index, pods in agent.pods.items():
            for namespace, name in pods:
                entry = snapshot.entities.add()
                entry.entity.gpu_index = index
                entry.pod.namespace, entry.pod.name = namespace, name
        return telemetry_pb2.GetTelemetrySnapshotResponse(snapshot=snapshot).SerializeToString()
    if method == "MigService/ResetGpu":
        asked = mig_pb2.ResetGpuRequest.FromString(request)
        if not asked.validate_only:
            agent.resets.append(asked.gpu_index)
        uuid = f"GPU-{agent.name}-{asked.gpu_index}"
        return mig_pb2.ResetGpuResponse(
            gpu_uuid=uuid, reset=not asked.validate_only
        ).SerializeToString()
    return None


def _fail(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> bytes:
    """The call ends with ``code`` (set, not raised: the answer is sent as any other)."""
    context.set_code(code)
    context.set_details(details)
    return b""


#: the agent's server-streaming methods (the rest are unary)
_STREAMS = {"OperationsService/WatchOperation", "EventsService/WatchEvents"}


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, agent: FakeAgent, upstream: grpc.Channel | None) -> None:
        self._agent = agent
        self._upstream = upstream

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = str(details.method).removeprefix(_P)

        def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
            agent = self._agent
            agent.calls.append(method)
            agent.on_call(agent, method)
            if method == "MigService/ResetGpu" and agent.reset_error is not None:
                return _fail(context, *agent.reset_error)
            if method in agent.errors:
                return _fail(context, *agent.errors[method])
            if self._upstream is not None:
                call = self._upstream.unary_unary(_P + method)
                try:
                    raw: bytes = call(request, timeout=60)
                except grpc.RpcError as exc:
                    context.set_trailing_metadata(exc.trailing_metadata())
                    return _fail(context, exc.code(), exc.details() or "")
                if method == "MigService/ResetGpu":
                    asked = mig_pb2.ResetGpuRequest.FromString(request)
                    if not asked.validate_only:  # the real agent reset it
                        agent.resets.append(asked.gpu_index)
                if method == "NodeService/GetNode":
                    got = agent_pb2.GetNodeResponse.FromString(raw)
                    agent.rewrite(got.node)
                    agent.node = got.node
                    raw = got.SerializeToString()
                return raw
            found = _reply(agent, method, request)
            if found is None:
                return _fail(context, grpc.StatusCode.UNIMPLEMENTED, f"{method} is not faked")
            return found

        def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            self._agent.calls.append(method)
            if self._upstream is None:
                context.set_code(grpc.StatusCode.UNIMPLEMENTED)
                context.set_details(f"{method} is not faked")
                return
            upstream = self._upstream.unary_stream(_P + method)(request)
            context.add_callback(upstream.cancel)  # the client went: stop forwarding
            try:
                yield from upstream
            except grpc.RpcError as exc:
                context.set_code(exc.code())
                context.set_details(exc.details() or "")

        if method in _STREAMS:  # server-streaming: forwarded message by message
            return grpc.unary_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(answer)


class FakeAgents:
    """Fake agents on gRPC's threaded (not asyncio) server, beside the CLI's asyncio.run.

    Not grpc.aio on a loop of its own: with two asyncio loops in one process grpc.aio now
    and then never delivers a call's completion to the CLI's loop (its deadline included), and
    the test hangs until pytest's timeout (seen about one run in five of test_remediate)."""

    def __init__(self) -> None:
        # Short: a Unix socket path has at most 107 bytes, and tmp_path names the test.
        self.root = Path(tempfile.mkdtemp(prefix="fa-", dir="/tmp"))
        self.agents: dict[str, FakeAgent] = {}
        self._servers: list[grpc.Server] = []
        self._channels: list[grpc.Channel] = []

    def add(self, agent_node: Any, **kw: Any) -> FakeAgent:
        name = agent_node.name
        agent = FakeAgent(name, self.root / f"{name}.sock", agent_node, **kw)
        upstream = None
        if agent.upstream is not None:
            upstream = grpc.insecure_channel(agent.upstream)
            self._channels.append(upstream)
        server = grpc.server(ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers([_Handler(agent, upstream)])
        server.add_insecure_port(agent.address)
        server.start()
        self._servers.append(server)
        self.agents[name] = agent
        return agent

    def args(self) -> list[str]:
        return ["--agents", ",".join(a.address for a in self.agents.values()), "--insecure"]

    def stop(self) -> None:
        for server in self._servers:
            server.stop(None).wait(10)
        for channel in self._channels:
            channel.close()
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def fake_agents() -> Iterator[FakeAgents]:
    agents = FakeAgents()
    try:
        yield agents
    finally:
        agents.stop()
