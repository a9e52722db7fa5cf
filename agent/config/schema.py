"""The agent config's schema: `AgentConfig`, its top-level settings and its sections
(agent/config/sections.py, agent/config/prewarm.py), read by agent/config/loader.py."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from agent.config.prewarm import PrewarmSettings
from agent.config.rules import is_listen as _is_listen
from agent.config.rules import is_loopback_listen as _is_loopback_listen
from agent.config.rules import rules as _rules
from agent.config.sections import (
    LISTEN_TEXT,
    ApiSettings,
    DraSettings,
    DriverSettings,
    HealthSettings,
    MigSettings,
    OperationsSettings,
    RoleSettings,
    SharingSettings,
    TelemetrySettings,
    TlsSettings,
)

#: The state dir when nobody names one (a hostPath in the DaemonSet); naming another selects
#: another node for the CLI (agent/cli/context.py).
DEFAULT_STATE_DIR = Path("/var/lib/gpu-agent")

#: Keys the agent no longer reads, with why. A config file or env that still carries one (a
#: DaemonSet's ConfigMap may outlive the version that read it) loads with a warning naming the
#: key, instead of being refused as unknown.
RETIRED = {
    "mig.label_poll_s": "the agent watches its Node, so a MIG config label change is seen at once",
}

_S = TypeVar("_S")


def _section(cls: type[_S], doc: str) -> _S:
    """A nested section: its defaults, and the line the docs give it."""
    return field(default_factory=cls, metadata=_rules(doc=doc))


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent reads at start; built by `load_config`."""

    simulate: str | None = field(
        default=None,
        metadata=_rules(
            doc="Simulator preset to run on (e.g. dgx-h100); none means the real NVML, and a node "
            "without a driver is then an error, never a silent fall-back to the simulator. An "
            'empty value (`--simulate "$PRESET"` with PRESET unset) is refused, never taken '
            "as the real NVML.",
            empty_unsets=False,
        ),
    )
    state_dir: Path = field(
        default=DEFAULT_STATE_DIR,
        metadata=_rules(
            doc="Directory of the agent's SQLite state (operations, MIG journal, prewarm jobs) "
            "and of the simulator's driver state; must outlive the pod (a hostPath).",
        ),
    )
    node_name: str = field(
        default_factory=socket.gethostname,
        metadata=_rules(
            env_aliases=("NODE_NAME",),
            default_doc="the machine's host name",
            doc="Kubernetes node name used for labels, events and pod attribution. Env NODE_NAME "
            "(the downward API's spec.nodeName) is read when GPU_AGENT_NODE_NAME is not set.",
        ),
    )
    simulate_latency: bool = field(
        default=True,
        metadata=_rules(
            doc="With simulate: each simulated NVML call takes about as long as the real one "
            "(a MIG mode change about a second), so timings are honest; off, calls run at "
            "memory speed (the test suite turns it off where a test is not about timing).",
        ),
    )
    log_level: str = field(
        default="info",
        metadata=_rules(
            choices=("debug", "info", "warning", "error"),
            doc="Least severe log level written.",
        ),
    )
    metrics_listen: str = field(
        default="0.0.0.0:9400",
        metadata=_rules(
            check=_is_listen,
            allowed=LISTEN_TEXT,
            doc="Address of the /metrics and /healthz HTTP server; dcgm-exporter's port.",
        ),
    )
    metrics_web_config: Path | None = field(
        default=None,
        metadata=_rules(
            doc="A Prometheus exporter-toolkit web config file (the --web.config.file format: "
            "tls_server_config, basic_auth_users with bcrypt hashes) protecting /metrics with "
            "TLS and basic auth or client certificates; none serves plain HTTP to anyone. "
            "/healthz and /readyz stay unauthenticated (over TLS when it is on). See "
            "docs/metrics.md.",
        ),
    )
    grpc_listen: str = field(
        default="0.0.0.0:9401",
        metadata=_rules(
            check=_is_listen,
            allowed=LISTEN_TEXT,
            doc="Address of the mTLS gRPC API (served only when tls.cert_file is set).",
        ),
    )
    grpc_insecure_listen: str | None = field(
        default=None,
        metadata=_rules(
            check=_is_loopback_listen,
            allowed="a loopback HOST:PORT: 127.0.0.1:PORT, [::1]:PORT or localhost:PORT",
            doc="Plaintext gRPC listener for local tools and tests; loopback only, because it has "
            "no authentication.",
        ),
    )
    socket_path: Path = field(
        default=Path("/run/gpu-agent/agent.sock"),
        metadata=_rules(
            doc="Unix socket of the gRPC API for the local CLI (mode 0600: root on the node). "
            "Its directory is created 0700 when missing; the agent refuses to serve from a "
            "directory that another user owns or that group or others may write, and from "
            "a path over 107 bytes (what a Unix socket address holds).",
        ),
    )
    handshake_timeout_s: float = field(
        default=10.0,
        metadata=_rules(
            gt=0,
            le=120,
            doc="Seconds a new connection to the mTLS gRPC port or the TLS metrics port may take "
            "to finish its TLS handshake; then it is closed, so connections that never finish "
            "one cannot pile up.",
        ),
    )
    mig: MigSettings = _section(MigSettings, "MIG layout application.")
    sharing: SharingSettings = _section(SharingSettings, "GPU sharing via the device plugin.")
    telemetry: TelemetrySettings = _section(TelemetrySettings, "Sampler and exporter.")
    prewarm: PrewarmSettings = _section(PrewarmSettings, "Image and file cache prewarming.")
    tls: TlsSettings = _section(TlsSettings, "mTLS of the gRPC API.")
    roles: RoleSettings = _section(RoleSettings, "Roles of mTLS client identities on the gRPC API.")
    api: ApiSettings = _section(
        ApiSettings, "Each caller's share of the gRPC API: calls, streams, lifetimes."
    )
    driver: DriverSettings = _section(
        DriverSettings, "Following the NVIDIA driver as it arrives and goes away."
    )
    operations: OperationsSettings = _section(
        OperationsSettings, "Retention of operations and request-id records."
    )
    health: HealthSettings = _section(
        HealthSettings, "Health marks per GPU and MIG instance, and where they are published."
    )
    dra: DraSettings = _section(DraSettings, "GPU allocation mode and Dynamic Resource Allocation.")
