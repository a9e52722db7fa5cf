"""The gRPC server: the agent's one front door, with three listeners and one interceptor.

* TCP ``grpc_listen`` (default :9401) with mTLS: client certificates must chain to
  ``tls.ca_file``. Certificate, key and CA files are re-read when they change (cert-manager
  rotates them in place), checked on every new handshake; connections already open keep the
  certificate they started with. A connection must finish its handshake within
  ``handshake_timeout_s``.
* The Unix socket ``socket_path`` (mode 0600, root only) for the local CLI: the local admin. Its
  directory is checked first (agent/api/socket_dir.py).
* ``grpc_insecure_listen``, only when configured and only on loopback: read-only (agent/config
  refuses any other address).

Every caller has its share of calls and streams (agent/api/share.py), enforced by the
interceptor. Health (grpc.health.v1) and reflection (grpc.reflection.v1 and v1alpha) are served
on all of them, so grpcurl and grpc_health_probe work.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    events_pb2,
    events_pb2_grpc,
    mig_pb2,
    mig_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
    power_pb2,
    power_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
    sharing_pb2,
    sharing_pb2_grpc,
    telemetry_pb2,
    telemetry_pb2_grpc,
)
from agent.api.auth import Policy, Role
from agent.api.events import EventBus, EventsServicer
from agent.api.interceptor import ApiInterceptor
from agent.api.inventory import NodeInventory
from agent.api.mig import MigServicer
from agent.api.node import NodeServicer
from agent.api.operations import OperationRunner, OperationsServicer
from agent.api.power import PowerServicer
from agent.api.prewarm import PrewarmServicer
from agent.api.reflection import enable_reflection
from agent.api.share import FairShare
from agent.api.sharing import SharingServicer
from agent.api.socket_dir import prepare_socket
from agent.api.telemetry import Exposition, SnapshotSource, TelemetryServicer
from agent.config import AgentConfig, RoleSettings, TlsSettings
from agent.errors import Conflict, FieldViolation, InvalidSpec
from agent.filestamp import stamp_files
from agent.mig.service import MigService
from agent.power.service import PowerService
from agent.prewarm.service import PrewarmService
from agent.sharing.service import SharingService
from agent.wire.doctor import DoctorReport

log = logging.getLogger(__name__)

__all__ = [
    "ApiServices",
    "Ports",
    "ReloadingCertificates",
    "create_server",
    "policy_of",
    "set_serving",
]

MAX_RECEIVE_BYTES = 4 * 1024 * 1024  # the largest request: a mig-parted file or manifest
MAX_SEND_BYTES = 16 * 1024 * 1024
MAX_STREAMS_PER_CONNECTION = 128
# No server-wide cap on calls (grpc's maximum_concurrent_rpcs): one cap for every door would let
# one caller's calls refuse everyone's. Each caller and door has its share (agent/api/share.py).

_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ("grpc.max_send_message_length", MAX_SEND_BYTES),
    ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
    # A second agent must fail to bind, not share the port and split the calls.
    ("grpc.so_reuseport", 0),
    # Find dead peers of long watches; let clients keep idle channels alive cheaply.
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 5),
)

_MODULES = (
    agent_pb2,
    operations_pb2,
    mig_pb2,
    sharing_pb2,
    prewarm_pb2,
    telemetry_pb2,
    events_pb2,
    power_pb2,
)
SERVICE_NAMES: tuple[str, ...] = tuple(
    service.full_name
    for module in _MODULES
    for service in module.DESCRIPTOR.services_by_name.values()
)


@dataclass
class ApiServices:
    """What the servicers call; built by the composition root (agent/node.py)."""

    inventory: NodeInventory
    runner: OperationRunner
    bus: EventBus
    sharing: SharingService
    prewarm: PrewarmService
    telemetry: SnapshotSource
    mig: MigService
    power: PowerService
    #: The guard of GPU features (agent.gpu.attach.DriverLink.require): DriverNotReady while
    #: the driver is not attached.
    gpu_guard: Callable[[str], None]
    metrics: Exposition | None = None
    #: The doctor's run (agent/doctor): every read-only check, blocking, bounded.
    doctor: Callable[[], DoctorReport] | None = None


@dataclass(frozen=True, slots=True)
class Ports:
    """Where the server listens; TCP ports are the bound ones (useful with port 0)."""

    tcp: int | None
    insecure: int | None
    socket: Path


class ReloadingCertificates:
    """The server's certificate, key and client CA, re-read when the files change.

    grpc calls `fetch` before every new TLS handshake; it costs three ``stat`` calls when
    nothing changed. A half-written or unreadable set is not used: the previous one stays
    until the files are whole again. Key material is never logged.
    """

    def __init__(self, tls: TlsSettings) -> None:
        if tls.cert_file is None or tls.key_file is None:
            raise InvalidSpec("mTLS needs tls.cert_file and tls.key_file")
        if tls.ca_file is None:
            raise InvalidSpec(
                "tls.cert_file is set, so tls.ca_file must be set too: the gRPC API accepts only "
                "client certificates from that CA (mTLS)",
                [FieldViolation("tls.ca_file", "a PEM CA bundle for client certificates")],
            )
        self._files = (tls.cert_file, tls.key_file, tls.ca_file)
        stamp = stamp_files(self._files)
        self.initial = self._load()
        self._current = stamp

    def _load(self) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = (path.read_bytes() for path in self._files)
        problems = [
            f"{path} has no {marker.decode()}"
            for path, data, marker in (
                (self._files[0], cert, b"-----BEGIN CERTIFICATE-----"),
                (self._files[1], key, b"PRIVATE KEY-----"),
                (self._files[2], ca, b"-----BEGIN CERTIFICATE-----"),
            )
            if marker not in data
        ]
        if problems:
            raise InvalidSpec("TLS files are not PEM: " + "; ".join(problems))
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            stamp = stamp_files(self._files)
            if stamp == self._current:
                return None
            config = self._load()
        except (OSError, InvalidSpec) as exc:
            log.warning(
                "keeping the current TLS certificate: the new files are not usable: %s", exc
            )
            return None
        self._current = stamp
        log.info("TLS certificate files changed; new connections use the new certificate")
        return config

    def credentials(self) -> grpc.ServerCredentials:
        # grpc documents None as "no change"; its type stubs do not say so.
        fetch = cast(Callable[[], grpc.ServerCertificateConfiguration], self.fetch)
        return grpc.dynamic_ssl_server_credentials(
            self.initial, fetch, require_client_authentication=True
        )


_Add = Callable[[Any, grpc.aio.Server], None]


def _servicers(api: ApiServices) -> list[tuple[_Add, object]]:
    changed = api.inventory.poke
    servicers: list[tuple[_Add, object]] = [
        (agent_pb2_grpc.add_NodeServiceServicer_to_server, NodeServicer(api.inventory, api.doctor)),
        (
            operations_pb2_grpc.add_OperationsServiceServicer_to_server,
            OperationsServicer(api.runner),
        ),
        (
            sharing_pb2_grpc.add_SharingServiceServicer_to_server,
            SharingServicer(api.sharing, api.runner, changed),
        ),
        (
            prewarm_pb2_grpc.add_PrewarmServiceServicer_to_server,
            PrewarmServicer(api.prewarm, api.runner, changed),
        ),
        (
            telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server,
            TelemetryServicer(api.telemetry, api.gpu_guard, api.metrics),
        ),
        (events_pb2_grpc.add_EventsServiceServicer_to_server, EventsServicer(api.bus)),
        (
            mig_pb2_grpc.add_MigServiceServicer_to_server,
            MigServicer(api.mig, api.runner, changed, api.inventory.settle, api.gpu_guard),
        ),
        (
            power_pb2_grpc.add_PowerServiceServicer_to_server,
            PowerServicer(api.power, api.runner, api.gpu_guard),
        ),
    ]
    return servicers


def policy_of(config: AgentConfig) -> Policy:
    roles: RoleSettings = config.roles
    members = {role: getattr(roles, role.value) for role in Role}
    # The old allow-list meant "may call every mutating RPC": admin.
    members[Role.ADMIN] = (*members[Role.ADMIN], *config.tls.mutating_identities)
    return Policy.of(members)


def _options(config: AgentConfig) -> Sequence[tuple[str, int]]:
    # A connection that never finishes its TLS handshake is closed after this (grpc's own
    # default is 120 s).
    handshake_ms = round(config.handshake_timeout_s * 1000)
    return (*_OPTIONS, ("grpc.server_handshake_timeout_ms", handshake_ms))


def create_server(
    api: ApiServices, config: AgentConfig
) -> tuple[grpc.aio.Server, Ports, health_aio.HealthServicer]:
    """Build the server and bind its listeners (call ``await server.start()`` next).

    Returns the health servicer too: the agent marks itself NOT_SERVING while it shuts down.
    """
    server = grpc.aio.server(
        interceptors=[ApiInterceptor(policy_of(config), FairShare(config.api))],
        options=_options(config),
    )
    for add, servicer in _servicers(api):
        add(servicer, server)

    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection(
        (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name), server
    )

    tcp = None
    if config.tls.cert_file is not None:
        credentials = ReloadingCertificates(config.tls).credentials()
        tcp = _bind(server, config.grpc_listen, credentials)
        log.info("gRPC API on %s (mTLS)", config.grpc_listen)
    else:
        log.info("gRPC TCP listener off: no tls.cert_file (the Unix socket still serves)")
    insecure = None
    if config.grpc_insecure_listen is not None:
        insecure = _bind(server, config.grpc_insecure_listen, None)
        log.warning(
            "plaintext gRPC on %s (bound %d), loopback and read-only: for demos and tests",
            config.grpc_insecure_listen,
            insecure,
        )
    prepare_socket(config.socket_path)
    _bind(server, f"unix:{config.socket_path}", None)
    # Only root may connect: the socket grants the local admin everything.
    os.chmod(config.socket_path, 0o600)
    return server, Ports(tcp, insecure, config.socket_path), health_servicer


def _bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        port = (
            server.add_insecure_port(address)
            if credentials is None
            else server.add_secure_port(address, credentials)
        )
    except RuntimeError as exc:  # grpc raises RuntimeError when it cannot bind
        raise Conflict(f"cannot listen on {address}: {exc}") from exc
    if port == 0 and not address.startswith("unix:"):
        raise Conflict(f"cannot listen on {address} (in use?)")
    return port


async def set_serving(health_servicer: health_aio.HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, status)
