"""The coordinator's client certificate is rotated in place (cert-manager renews it 30 days
before it expires, and `coordinator serve` keeps one fleet for its whole life): new and
existing channels to the agents move to the new certificate, a call in flight on the old
connection finishes, and a half-written rotation leaves working channels alone. Real gRPC over
TCP with mTLS; the agent answers GetNode with the common name of the client certificate its
handshake saw."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
)
from agent.client import ClientTls, aio
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import StaticDiscovery, Target
from agent.wire.operations import OperationView
from tests.unit.api.support import COORDINATOR, Identity, Pki


class PeerNamer(agent_pb2_grpc.NodeServiceServicer):
    """GetNode answers the node named after the caller's certificate (its CN); with ``hold``
    set a call waits for it, after setting ``entered``."""

    def __init__(self) -> None:
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def GetNode(
        self, request: agent_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.GetNodeResponse:
        (name,) = context.auth_context()["x509_common_name"]
        hold = self.hold
        if hold is not None:
            self.entered.set()
            await hold.wait()
        return agent_pb2.GetNodeResponse(node=agent_pb2.Node(name=name.decode()))


class Operation(operations_pb2_grpc.OperationsServiceServicer):
    """WatchOperation: one running update, then to the first certificate's caller nothing more
    (a long apply), to any other the operation done. Records the callers' names."""

    def __init__(self) -> None:
        self.callers: list[str] = []

    async def WatchOperation(
        self, request: operations_pb2.WatchOperationRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[operations_pb2.WatchOperationResponse]:
        (name,) = context.auth_context()["x509_common_name"]
        self.callers.append(name.decode())
        running = operations_pb2.OPERATION_STATE_RUNNING
        yield operations_pb2.WatchOperationResponse(
            operation=operations_pb2.Operation(name=request.name, state=running)
        )
        if name == b"coordinator-1":
            await asyncio.Event().wait()  # until the stream is cut
        done = operations_pb2.OPERATION_STATE_SUCCEEDED
        yield operations_pb2.WatchOperationResponse(
            operation=operations_pb2.Operation(name=request.name, state=done, done=True)
        )


async def serve(
    pki: Pki, operation: Operation | None = None
) -> tuple[grpc.aio.Server, PeerNamer, str]:
    server = grpc.aio.server()
    namer = PeerNamer()
    agent_pb2_grpc.add_NodeServiceServicer_to_server(namer, server)
    if operation is not None:
        operations_pb2_grpc.add_OperationsServiceServicer_to_server(operation, server)
    credentials = grpc.ssl_server_credentials(
        [(pki.server.key.read_bytes(), pki.server.cert.read_bytes())],
        root_certificates=pki.ca.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, namer, f"127.0.0.1:{port}"


class SecretVolume:
    """A directory laid out as the kubelet writes a Secret or cert-manager CSI volume:
    ``tls.crt`` -> ``..data/tls.crt``, ``..data`` -> a timestamped directory, swapped in one
    rename on each update."""

    def __init__(self, root: Path, pki: Pki) -> None:
        self.root = root
        self.pki = pki
        root.mkdir()
        self._version = 0
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (root / name).symlink_to(Path("..data") / name)

    def publish(self, identity: Identity) -> None:
        self._version += 1
        version = self.root / f"..2026_12_08_{self._version}"
        version.mkdir()
        shutil.copy(identity.cert, version / "tls.crt")
        shutil.copy(identity.key, version / "tls.key")
        shutil.copy(self.pki.ca, version / "ca.crt")
        (self.root / "..data_tmp").symlink_to(version.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")

    def tls(self) -> ClientTls:
        return ClientTls(self.root / "tls.crt", self.root / "tls.key", self.root / "ca.crt")


def coordinator(pki: Pki, name: str) -> Identity:
    return pki.issue(name, f"URI:{COORDINATOR}")


async def names_seen(fleet: Fleet, *addresses: str) -> list[str]:
    views = await fleet.views(tuple(Target(a) for a in addresses))
    assert all(v.reachable for v in views), [v.error for v in views]
    return [v.name for v in views]


async def _rotation(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    volume = SecretVolume(tmp_path / "tls", pki)
    volume.publish(coordinator(pki, "coordinator-1"))
    (a, namer_a, at_a), (b, _, at_b) = await serve(pki), await serve(pki)
    fleet = Fleet(StaticDiscovery([at_a, at_b]), volume.tls(), timeout_s=10.0)
    try:
        assert await names_seen(fleet, at_a) == ["coordinator-1"]
        # A call in flight on the connection made with the first certificate...
        gate = namer_a.hold = asyncio.Event()
        in_flight = asyncio.create_task(fleet.client(Target(at_a)).node())
        await namer_a.entered.wait()
        namer_a.hold = None  # later calls answer at once

        volume.publish(coordinator(pki, "coordinator-2"))  # cert-manager renews

        # The agent already dialled and one dialled for the first time both see the new one.
        assert await names_seen(fleet, at_a, at_b) == ["coordinator-2", "coordinator-2"]
        # ...is not dropped: it finishes on its own connection, with its own certificate.
        assert not in_flight.done()
        gate.set()
        assert (await in_flight).name == "coordinator-1"
        assert await names_seen(fleet, at_a) == ["coordinator-2"]
    finally:
        await fleet.close()
        await a.stop(None)
        await b.stop(None)


def test_a_rotated_client_certificate_reaches_new_and_existing_channels(tmp_path: Path) -> None:
    asyncio.run(_rotation(tmp_path))


async def _half_written(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pki = Pki(tmp_path / "pki")
    first, second = coordinator(pki, "coordinator-1"), coordinator(pki, "coordinator-2")
    live = tmp_path / "tls"  # plain files, written one at a time (no ..data swap)
    live.mkdir()
    shutil.copy(first.cert, live / "tls.crt")
    shutil.copy(first.key, live / "tls.key")
    shutil.copy(pki.ca, live / "ca.crt")
    (a, _, at_a), (b, _, at_b) = await serve(pki), await serve(pki)
    tls = ClientTls(live / "tls.crt", live / "tls.key", live / "ca.crt")
    fleet = Fleet(StaticDiscovery([at_a, at_b]), tls, timeout_s=10.0)
    try:
        assert await names_seen(fleet, at_a) == ["coordinator-1"]
        shutil.copy(second.cert, live / "tls.crt")  # the new certificate, the old key
        with caplog.at_level(logging.WARNING):
            # Working channels keep working, and a new one uses the set that still matches.
            assert await names_seen(fleet, at_a, at_b) == ["coordinator-1", "coordinator-1"]
            assert await names_seen(fleet, at_a, at_b) == ["coordinator-1", "coordinator-1"]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings  # said once, not on every call
        assert "keeping the current client certificate" in warnings[0]
        assert "PRIVATE KEY" not in warnings[0]
        shutil.copy(second.key, live / "tls.key")  # the rotation completes
        assert await names_seen(fleet, at_a, at_b) == ["coordinator-2", "coordinator-2"]
    finally:
        await fleet.close()
        await a.stop(None)
        await b.stop(None)


def test_a_half_written_rotation_keeps_the_working_certificate_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    asyncio.run(_half_written(tmp_path, caplog))


async def rest_of(watch: AsyncIterator[OperationView]) -> list[str]:
    return [op.state async for op in watch]


async def _watch(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    volume = SecretVolume(tmp_path / "tls", pki)
    volume.publish(coordinator(pki, "coordinator-1"))
    operation = Operation()
    server, _, at = await serve(pki, operation)
    fleet = Fleet(StaticDiscovery([at]), volume.tls(), timeout_s=5.0)
    try:
        client = fleet.client(Target(at))
        watch = client.watch_operation("operations/apply-1")
        assert (await anext(watch)).state == "running"
        volume.publish(coordinator(pki, "coordinator-2"))
        assert (await client.node()).name == "coordinator-2"  # the client moved
        # After the grace the old channel closes; the watch opens again on the new one (which
        # starts with the operation as it is) and sees it end.
        states = await asyncio.wait_for(rest_of(watch), 30)
        assert states == ["running", "succeeded"]
        assert operation.callers == ["coordinator-1", "coordinator-2"]
    finally:
        await fleet.close()
        await server.stop(None)


def test_a_watch_on_the_old_channel_opens_again_on_the_new_one_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1 s at the 5 s timeout (not raising: the test must fail on a client without it)
    monkeypatch.setattr(aio, "RETIRE_AFTER_TIMEOUTS", 0.2, raising=False)
    asyncio.run(_watch(tmp_path))
