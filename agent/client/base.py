"""What both clients share: the channel's settings and the service stubs.

The sync client (`agent.client.sync.AgentClient`, the CLI) and the asyncio one
(`agent.client.aio.AsyncAgentClient`, the coordinator) send the same requests, built once
(agent/client/requests.py); only the calling convention differs. gRPC stubs are the same
classes over a sync or an asyncio channel, so they live here, made on first use: a stub builds
a callable per method, and a status sweep of a thousand fresh clients needs only GetNode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import grpc

from agent._proto.gpuagent.v1 import (
    agent_pb2_grpc,
    mig_pb2_grpc,
    operations_pb2_grpc,
    power_pb2_grpc,
    prewarm_pb2_grpc,
    sharing_pb2_grpc,
    telemetry_pb2_grpc,
)
from agent.errors import FieldViolation, InvalidSpec

#: Reconnect back-off of an agent channel. gRPC's default grows to 120 s, so an agent back
#: after a long outage went unseen for minutes; capped at 2 s (plus gRPC's 20 % jitter) a
#: restarted agent is dialled again within 2.4 s, for one connection attempt per agent down.
#: grpc.min_reconnect_backoff_ms is left at its 20 s: in gRPC it is the *connect timeout* of
#: each attempt, and at 0.5 s a loaded coordinator's 1,000 first TLS handshakes timed out.
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class Dialled(Protocol):
    """What is known of the agent dialled (a discovery target)."""

    @property
    def address(self) -> str: ...
    @property
    def pod(self) -> str | None: ...
    @property
    def node(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ClientTls:
    """A client certificate, key and the agents' CA (mTLS); None for plaintext or a socket.

    ``server_name`` is the name the agent's serving certificate must carry (a DNS SAN), checked
    by the TLS handshake instead of the dialled pod IP. It may name the agent dialled:
    ``{pod}`` and ``{node}`` are replaced by the target's pod and node, so each agent must
    present its own certificate (one key per agent; see docs/api.md, "Trust model"). A target
    that lacks what the template needs is not dialled.
    """

    cert: Path
    key: Path
    ca: Path
    server_name: str | None = None

    def name_for(self, target: Dialled) -> str | None:
        """The name ``target``'s certificate must carry; raises InvalidSpec when unknown."""
        if self.server_name is None:
            return None
        values = {"pod": target.pod, "node": target.node}
        needed = [key for key in values if "{" + key + "}" in self.server_name]
        missing = [key for key in needed if not values[key]]
        if missing:
            raise InvalidSpec(
                f"{target.address}: its {' and '.join(missing)} is unknown, so the name its "
                f"certificate must carry ({self.server_name}) cannot be checked",
                [FieldViolation("server_name", "use Kubernetes discovery, or a fixed name")],
            )
        name = self.server_name
        for key in needed:
            name = name.replace("{" + key + "}", str(values[key]))
        return name

    def read(self) -> tuple[bytes, bytes, bytes]:
        """The CA, key and certificate as they are now; InvalidSpec naming the option of a file
        that cannot be read."""
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
        return ca, key, cert

    def credentials(self) -> grpc.ChannelCredentials:
        """The files read now. The CLI reads them once per command; the coordinator's fleet, which
        lives for weeks, re-reads them when they change (agent/client/rotation.py)."""
        ca, key, cert = self.read()
        return grpc.ssl_channel_credentials(ca, key, cert)


def channel_options(server_name: str | None = None) -> list[tuple[str, Any]]:
    """``server_name``: verify this name (a DNS SAN) in the agent's certificate, not the
    dialled host (`ClientTls.name_for`)."""
    options = list(CHANNEL_OPTIONS)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


#: Each service's stub class, by the name a `Call` gives it (agent/client/requests.py).
STUB_TYPES: Mapping[str, Callable[[Any], Any]] = {
    "_node": agent_pb2_grpc.NodeServiceStub,
    "_telemetry": telemetry_pb2_grpc.TelemetryServiceStub,
    "_ops": operations_pb2_grpc.OperationsServiceStub,
    "_mig": mig_pb2_grpc.MigServiceStub,
    "_sharing": sharing_pb2_grpc.SharingServiceStub,
    "_power": power_pb2_grpc.PowerServiceStub,
    "_prewarm": prewarm_pb2_grpc.PrewarmServiceStub,
}


class Stubs:
    """The service stubs over ``self._channel`` (sync or asyncio: the same stub classes), each
    made on first use."""

    _channel: Any

    @cached_property
    def _stubs(self) -> dict[str, Any]:
        return {}

    def stub(self, name: str) -> Any:
        """The stub `STUB_TYPES` names ``name``."""
        made = self._stubs.get(name)
        if made is None:
            made = self._stubs[name] = STUB_TYPES[name](self._channel)
        return made
