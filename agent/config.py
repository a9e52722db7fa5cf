"""Agent configuration: defaults < YAML file < env ``GPU_AGENT_*`` < flags, validated up front.

The frozen dataclasses below are the schema. Each field carries its rules (doc, allowed values,
range, custom check) as data in its metadata; one generic path walks them to parse, coerce and
validate every source, so a new setting is one documented field and nothing else.

Keys are snake_case everywhere. In YAML, sections nest (``telemetry: {interval_s: 0.5}``); in env
they join with a double underscore (``GPU_AGENT_TELEMETRY__INTERVAL_S``); flags use dotted keys
(``telemetry.interval_s``). ``GPU_AGENT_CONFIG`` names the config file when none is passed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import socket
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

from agent import safeyaml
from agent.config_prewarm import PrewarmSettings
from agent.config_rules import RULES_KEY as _RULES
from agent.config_rules import Rules as _Rules
from agent.config_rules import is_listen as _is_listen
from agent.config_rules import is_loopback_listen as _is_loopback_listen
from agent.config_rules import rules as _rules
from agent.errors import FieldViolation, InvalidSpec
from agent.safeyaml import brief

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "AgentConfig",
    "ApiSettings",
    "DraSettings",
    "DriverSettings",
    "HealthSettings",
    "MigSettings",
    "OperationsSettings",
    "PrewarmSettings",
    "RoleSettings",
    "SharingSettings",
    "TelemetrySettings",
    "TlsSettings",
    "config_schema",
    "load_config",
]

ENV_PREFIX = "GPU_AGENT_"
CONFIG_ENV = "GPU_AGENT_CONFIG"
_ENV_SEP = "__"
_GIB = 1024**3


_LISTEN_TEXT = "HOST:PORT or [IPv6]:PORT with PORT 0-65535, e.g. 0.0.0.0:9400"


@dataclass(frozen=True)
class MigSettings:
    """How MIG layouts are applied."""

    reset_command: str = field(
        default="nvidia-smi -r -i {bus_id}",
        metadata=_rules(
            doc="Command run once per GPU whose MIG mode change is left pending, to reset it; "
            "{bus_id} is replaced by the GPU's PCI bus id. NVML's own reset fails while a daemon "
            "holds the GPU; operators swap in their drain-and-reset tooling here.",
        ),
    )
    config_file: Path | None = field(
        default=None,
        metadata=_rules(
            doc="mig-parted config file (a mounted ConfigMap) whose config names the node label "
            "nvidia.com/mig.config selects. Needed for watch_node_label.",
        ),
    )
    watch_node_label: bool = field(
        default=False,
        metadata=_rules(
            doc="Follow the GPU Operator's label protocol on this node: apply the config named by "
            "nvidia.com/mig.config when it changes and publish nvidia.com/mig.config.state. Off "
            "unless the agent replaces mig-manager (two managers must not fight over one GPU).",
        ),
    )
    label_poll_s: float = field(
        default=5.0,
        metadata=_rules(
            doc="Seconds between reads of the node's labels when watch_node_label is on and the "
            "Node is not watched (no Kubernetes API client); in a pod the agent watches its Node "
            "(a label change is seen at once) and re-reads its cache of them every 60 s.",
            ge=1.0,
        ),
    )


@dataclass(frozen=True)
class SharingSettings:
    """Where the NVIDIA k8s-device-plugin reads its sharing (time-slicing / MPS) config."""

    config_path: Path = field(
        default=Path("/etc/nvidia-device-plugin/config.yaml"),
        metadata=_rules(
            doc="File the agent writes the device-plugin config to (mounted into the plugin pod)."
        ),
    )
    reload: str = field(
        default="sighup",
        metadata=_rules(
            choices=("sighup", "label", "restart-pod", "none"),
            doc="How the plugin learns of a new config: SIGHUP its process; set its config label "
            "(the GPU Operator's nvidia.com/device-plugin.config); delete its pod on this node; or "
            "nothing, when something else reloads it.",
        ),
    )
    plugin_process_name: str = field(
        default="nvidia-device-plugin",
        metadata=_rules(doc="Process name signalled when reload is sighup (needs hostPID)."),
    )
    label_config_name: str = field(
        default="gpu-agent",
        metadata=_rules(
            doc="Config name put in the node's nvidia.com/device-plugin.config label when reload "
            "is label; must be a key of the plugin's config map.",
        ),
    )
    plugin_namespace: str = field(
        default="gpu-operator",
        metadata=_rules(doc="Namespace of the device-plugin pods, for reload restart-pod."),
    )
    plugin_label_selector: str = field(
        default="app=nvidia-device-plugin-daemonset",
        metadata=_rules(doc="Label selector of the device-plugin pods, for reload restart-pod."),
    )


@dataclass(frozen=True)
class TelemetrySettings:
    """The GPU sampler and the Prometheus exporter."""

    interval_s: float = field(
        default=1.0,
        metadata=_rules(
            ge=0.1,
            doc="Seconds between samples. Scrapes render the latest sample, so this bounds how "
            "fresh metrics are; under 0.1 s NVML and GPM reads cost more than they tell.",
        ),
    )
    collectors: Path | None = field(
        default=None,
        metadata=_rules(
            doc="A dcgm-exporter counters CSV choosing the exported fields; none means the "
            "built-in default set (dcgm-exporter's default-counters.csv).",
        ),
    )
    metric_names: str = field(
        default="dcgm",
        metadata=_rules(
            choices=("dcgm", "native"),
            doc="Series naming: dcgm exports DCGM_FI_* names and labels, a drop-in for "
            "dcgm-exporter dashboards; native exports gpu_agent_* names.",
        ),
    )
    devices: str = field(
        default="f",
        metadata=_rules(
            choices=("f", "g"),
            doc="Which entities carry the per-instance fields (framebuffer, DCP), named after "
            "dcgm-exporter's --devices: f (flex, its default) exports them per GPU instance on "
            "a GPU with MIG instances and per GPU elsewhere, so sums over a GPU never count "
            "twice; g exports whole-GPU rows only, also on MIG GPUs, and no instance rows.",
        ),
    )
    idle_threshold_percent: float = field(
        default=5.0,
        metadata=_rules(
            ge=0,
            le=100,
            doc="Percent utilisation under which a GPU or MIG instance counts as idle.",
        ),
    )
    idle_reclaim_after_s: float = field(
        default=86400.0,
        metadata=_rules(
            ge=0,
            doc="Seconds a GPU must stay idle with no process before the agent marks it "
            "reclaimable on its Node (annotation gpu-agent.io/reclaimable=<GPU indices>, and an "
            "Event); 0 turns the mark off. Needs the Kubernetes API (in a pod).",
        ),
    )
    reclaim_exclude_selector: str | None = field(
        default=None,
        metadata=_rules(
            check=lambda v: all(
                "=" in t and t.partition("!=" if "!=" in t else "=")[0].strip()
                for t in (x.strip() for x in v.split(","))
                if t
            ),
            allowed="comma-separated key=value or key!=value over node labels",
            doc="Nodes whose labels match this selector are never marked reclaimable (an "
            "inference pool idles by design), e.g. pool=inference; none excludes no node.",
        ),
    )
    kubelet_socket: Path = field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        metadata=_rules(
            doc="Kubelet pod-resources socket, used to attribute GPUs and MIG devices to pods."
        ),
    )
    proc_root: Path = field(
        default=Path("/proc"),
        metadata=_rules(
            doc="Root of the host's /proc, read to map GPU processes to pod cgroups; the "
            "DaemonSet mounts the host's /proc here when it does not run with hostPID.",
        ),
    )
    container_log_dir: Path = field(
        default=Path("/var/log/containers"),
        metadata=_rules(
            doc="kubelet's container log links (<pod>_<namespace>_<container>-<id>.log), read to "
            "name the pod of a GPU process from its cgroup's container id (PodResources names no "
            "pod UID); mount the host directory read-only.",
        ),
    )


@dataclass(frozen=True)
class OperationsSettings:
    """How long finished operations and request-id records are kept in the state database."""

    max_age_s: float = field(
        default=7 * 24 * 3600.0,
        metadata=_rules(
            ge=60,
            doc="Seconds a done operation (and the record that makes a request_id retry return "
            "the first answer) is kept after it last changed; older ones are deleted. Default "
            "7 days. A retry after that runs the request again.",
        ),
    )
    max_count: int = field(
        default=1000,
        metadata=_rules(
            ge=1,
            le=1_000_000,
            doc="Done operations kept per kind (mig.apply, prewarm, and each quick call's "
            "request-id records), newest first; the rest are deleted. Operations still running "
            "are never deleted.",
        ),
    )
    prune_interval_s: float = field(
        default=600.0,
        metadata=_rules(
            ge=1,
            doc="Seconds between prunes while the agent runs; it also prunes once at start.",
        ),
    )


@dataclass(frozen=True)
class ApiSettings:
    """Each caller's share of the gRPC API, so that no caller can starve another door.

    A caller is one mTLS identity (its certificate's URI and DNS SANs), the plaintext loopback
    listener as a whole, or the Unix socket. The Unix socket and identities holding the admin
    role (the coordinator) are the reserved share: they are never counted against a door's
    limit, and their streams are never cut."""

    max_calls_per_caller: int = field(
        default=64,
        metadata=_rules(
            ge=1,
            le=100_000,
            doc="Calls (unary and streams) one caller outside the reserved share may have in "
            "flight; more get RESOURCE_EXHAUSTED at once instead of queueing.",
        ),
    )
    max_streams_per_caller: int = field(
        default=16,
        metadata=_rules(
            ge=1,
            le=100_000,
            doc="Of those, streams (WatchEvents, WatchOperation, health Watch, reflection) one "
            "caller outside the reserved share may hold open.",
        ),
    )
    max_calls_per_door: int = field(
        default=256,
        metadata=_rules(
            ge=1,
            le=100_000,
            doc="Calls in flight of all callers outside the reserved share on one door (the "
            "mTLS port; the loopback listener), so many read identities together still leave "
            "the rest served.",
        ),
    )
    reserved_calls: int = field(
        default=256,
        metadata=_rules(
            ge=1,
            le=100_000,
            doc="Calls each caller of the reserved share (the Unix socket; each admin identity) "
            "may have in flight, whatever other callers hold.",
        ),
    )
    stream_max_s: float = field(
        default=3600.0,
        metadata=_rules(
            ge=1,
            doc="Seconds a stream of a caller outside the reserved share may stay open; then it "
            "ends with UNAVAILABLE and the client watches again (the agent's clients do), so a "
            "stream nobody reads does not hold its slot for ever.",
        ),
    )


@dataclass(frozen=True)
class DriverSettings:
    """How the agent follows the NVIDIA driver: it starts without one (a GPU Operator node
    boots before its driver container), attaches when NVML answers and detaches when the
    driver goes away (docs/operations.md, "The driver arrives late, or goes away")."""

    retry_max_s: float = field(
        default=5.0,
        metadata=_rules(
            gt=0,
            le=300,
            doc="Longest wait between tries to attach to a driver that is not ready; the wait "
            "starts at a quarter second and doubles up to this.",
        ),
    )
    check_s: float = field(
        default=2.0,
        metadata=_rules(
            gt=0,
            le=300,
            doc="Seconds between checks, while attached, that the driver is still loaded (one "
            "nvmlDeviceGetCount); a driver that went away is detached from at the next check. "
            "Power caps lost to a reboot or another tool are set again on the same period.",
        ),
    )


@dataclass(frozen=True)
class HealthSettings:
    """Health marks: when a GPU or MIG instance degrades, fails and clears (docs/health.md).

    Also whether the Node is tainted while a GPU is failed."""

    degrade_events: int = field(
        default=3,
        metadata=_rules(
            ge=1,
            le=1000,
            doc="Degrading signals (an application XID, clocks held down by heat or power, a "
            "pending row remap: one per collection tick while it lasts) within "
            "health.degrade_window_s that mark a GPU or instance degraded; fewer do nothing.",
        ),
    )
    degrade_window_s: float = field(
        default=300.0,
        metadata=_rules(
            gt=0, le=86400, doc="Seconds of the sliding window health.degrade_events counts in."
        ),
    )
    hold_down_s: float = field(
        default=600.0,
        metadata=_rules(
            gt=0,
            le=7 * 86400,
            doc="Seconds without a new signal of its severity before a degraded or failed mark "
            "clears; it survives agent restarts and driver reloads (nothing clears while the "
            "driver is away).",
        ),
    )
    max_changes_per_hour: int = field(
        default=6,
        metadata=_rules(
            ge=2,
            le=100,
            doc="State changes a GPU or instance may make in an hour; beyond it a mark does not "
            "improve (it stays at the worse state and its reason says so) until the hour has "
            "room again. Getting worse is never held back.",
        ),
    )
    taint: bool = field(
        default=False,
        metadata=_rules(
            doc="Taint the Node gpu-agent.io/health=failed:NoSchedule while a GPU on it is "
            "failed (other taints are kept); off, only labels, the GPUHealthy condition and "
            "events say so.",
        ),
    )


@dataclass(frozen=True)
class DraSettings:
    """The node's GPU allocation mode (device plugin, DRA driver, DRA with dynamic MIG) and how
    a MIG layout reaches the DRA driver's ResourceSlices (docs/dra.md)."""

    mode: str = field(
        default="auto",
        metadata=_rules(
            choices=("auto", "device-plugin", "dra", "dra-dynamic-mig", "none"),
            doc="auto: detect from this node's ResourceSlices and the Node's allocatable "
            "resources; a mode: use it (shown as set in config), for nodes where detection "
            "cannot see. dra-dynamic-mig refuses every MIG change.",
        ),
    )
    driver: str = field(
        default="gpu.nvidia.com",
        metadata=_rules(doc="Name of the GPU DRA driver whose ResourceSlices are read."),
    )
    plugin_namespace: str = field(
        default="gpu-operator",
        metadata=_rules(
            doc="Namespace of the DRA driver's kubelet plugin pods (the GPU Operator's "
            "namespace; a standalone Helm install uses its release namespace, e.g. "
            "dra-driver-nvidia-gpu).",
        ),
    )
    plugin_label_selector: str = field(
        default="app=nvidia-dra-driver-kubelet-plugin",
        metadata=_rules(
            doc="Label selector of the kubelet plugin pods, restarted after a MIG apply on a dra "
            "node so the driver republishes (the GPU Operator's label; the driver's own Helm "
            "chart labels them dra-driver-nvidia-gpu-component=kubelet-plugin).",
        ),
    )
    republish_timeout_s: float = field(
        default=180.0,
        metadata=_rules(
            gt=0,
            le=3600,
            doc="Seconds a MIG apply on a dra node waits for the driver's ResourceSlices to list "
            "exactly the new devices before it rolls the layout back.",
        ),
    )


_URI_SAN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s]+")
_DNS_SAN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")


def _are_identities(values: tuple[str, ...]) -> bool:
    return all(
        value == "*"
        or (len(value) <= 2048 and (_URI_SAN.fullmatch(value) or _DNS_SAN.fullmatch(value)))
        for value in values
    )


_IDENTITIES_ALLOWED = "a list of URI SANs (scheme://...), DNS names, or *"

_IDENTITY_TEXT = (
    "Client certificate identities: URI SANs (SPIFFE IDs, e.g. "
    "spiffe://cluster/ns/gpu-system/sa/coordinator) or DNS SANs; * is every verified client "
    "certificate. Email, IP and common names are never identities."
)


@dataclass(frozen=True)
class TlsSettings:
    """mTLS of the gRPC API on grpc_listen."""

    cert_file: Path | None = field(
        default=None,
        metadata=_rules(
            requires="key_file",
            doc="PEM server certificate (chain). Without cert and key the TCP listener stays off.",
        ),
    )
    key_file: Path | None = field(
        default=None,
        metadata=_rules(
            requires="cert_file",
            doc="PEM private key of cert_file.",
        ),
    )
    ca_file: Path | None = field(
        default=None,
        metadata=_rules(doc="PEM CA bundle client certificates must chain to (mTLS)."),
    )
    mutating_identities: tuple[str, ...] = field(
        default=(),
        metadata=_rules(
            check=_are_identities,
            allowed=_IDENTITIES_ALLOWED,
            doc="Deprecated, kept so older configs keep their meaning: identities listed here "
            "hold the admin role, as if listed in roles.admin (they could call every mutating "
            "RPC before roles existed).",
        ),
    )


@dataclass(frozen=True)
class RoleSettings:
    """Who may do what over mTLS: identities per role (the Unix socket is always admin, the
    plaintext loopback listener always read). Any role includes read."""

    read: tuple[str, ...] = field(
        default=("*",),
        metadata=_rules(
            check=_are_identities,
            allowed=_IDENTITIES_ALLOWED,
            doc="Identities that may read: the inventory (without process lists), operations, "
            "MIG assert and export, sharing, cache, telemetry (without pods), events. "
            + _IDENTITY_TEXT,
        ),
    )
    prewarm: tuple[str, ...] = field(
        default=(),
        metadata=_rules(
            check=_are_identities,
            allowed=_IDENTITIES_ALLOWED,
            doc="Identities that may submit and cancel prewarm items and evict cache items, "
            "and cancel prewarm operations; nothing that reconfigures GPUs. " + _IDENTITY_TEXT,
        ),
    )
    sharing: tuple[str, ...] = field(
        default=(),
        metadata=_rules(
            check=_are_identities,
            allowed=_IDENTITIES_ALLOWED,
            doc="Identities that may set, clear and roll back the device plugin's sharing "
            "config. " + _IDENTITY_TEXT,
        ),
    )
    mig: tuple[str, ...] = field(
        default=(),
        metadata=_rules(
            check=_are_identities,
            allowed=_IDENTITIES_ALLOWED,
            doc="Identities that may plan and apply MIG layouts and cancel MIG operations; they "
            "also see process lists (GetNode processes, telemetry pods), which say what a change "
            "would disrupt. " + _IDENTITY_TEXT,
        ),
    )
    power: tuple[str, ...] = field(
        default=(),
        metadata=_rules(
            check=_are_identities,
            allowed=_IDENTITIES_ALLOWED,
            doc="Identities that may apply and restore power caps (docs/power.md); nothing "
            "that reshapes GPUs, and no process lists. " + _IDENTITY_TEXT,
        ),
    )
    admin: tuple[str, ...] = field(
        default=(),
        metadata=_rules(
            check=_are_identities,
            allowed=_IDENTITIES_ALLOWED,
            doc="Identities that may call everything and see process lists (the coordinator). "
            + _IDENTITY_TEXT,
        ),
    )


#: The state dir when nobody names one (a hostPath in the DaemonSet); naming another selects
#: another node for the CLI (agent/cli/context.py).
DEFAULT_STATE_DIR = Path("/var/lib/gpu-agent")


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent reads at start; built by `load_config`."""

    simulate: str | None = field(
        default=None,
        metadata=_rules(
            doc="Simulator preset to run on (e.g. dgx-h100); none means the real NVML, and a node "
            "without a driver is then an error, never a silent fall-back to the simulator.",
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
            allowed=_LISTEN_TEXT,
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
            allowed=_LISTEN_TEXT,
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
            "directory that another user owns or that group or others may write.",
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
    mig: MigSettings = field(
        default_factory=MigSettings, metadata=_rules(doc="MIG layout application.")
    )
    sharing: SharingSettings = field(
        default_factory=SharingSettings, metadata=_rules(doc="GPU sharing via the device plugin.")
    )
    telemetry: TelemetrySettings = field(
        default_factory=TelemetrySettings, metadata=_rules(doc="Sampler and exporter.")
    )
    prewarm: PrewarmSettings = field(
        default_factory=PrewarmSettings, metadata=_rules(doc="Image and file cache prewarming.")
    )
    tls: TlsSettings = field(
        default_factory=TlsSettings, metadata=_rules(doc="mTLS of the gRPC API.")
    )
    roles: RoleSettings = field(
        default_factory=RoleSettings,
        metadata=_rules(doc="Roles of mTLS client identities on the gRPC API."),
    )
    api: ApiSettings = field(
        default_factory=ApiSettings,
        metadata=_rules(doc="Each caller's share of the gRPC API: calls, streams, lifetimes."),
    )
    driver: DriverSettings = field(
        default_factory=DriverSettings,
        metadata=_rules(doc="Following the NVIDIA driver as it arrives and goes away."),
    )
    operations: OperationsSettings = field(
        default_factory=OperationsSettings,
        metadata=_rules(doc="Retention of operations and request-id records."),
    )
    health: HealthSettings = field(
        default_factory=HealthSettings,
        metadata=_rules(doc="Health marks per GPU and MIG instance, and where they are published."),
    )
    dra: DraSettings = field(
        default_factory=DraSettings,
        metadata=_rules(doc="GPU allocation mode and Dynamic Resource Allocation."),
    )


# --- value kinds: how raw text or YAML values become typed values -------------------------------


def _parse_str(raw: object, rules: _Rules) -> str:
    if isinstance(raw, str) and raw:
        return raw
    raise ValueError(raw)


def _parse_path(raw: object, rules: _Rules) -> Path:
    if isinstance(raw, Path):
        return raw
    if isinstance(raw, str) and raw:
        return Path(raw)
    raise ValueError(raw)


def _parse_float(raw: object, rules: _Rules) -> float:
    # bool is an int subclass; `true` for a number is a mistake, not 1.0.
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(raw)
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


_BYTE_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGTP])(i?))?B?", re.IGNORECASE | re.ASCII)
_BYTE_SIZE_TEXT = (
    "a byte count: an integer, optionally suffixed K, M, G, T (powers of 1000) "
    "or Ki, Mi, Gi, Ti (powers of 1024), e.g. 200Gi"
)


def _parse_byte_size(text: str) -> int:
    match = _BYTE_SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(text)
    number, prefix, binary = match.groups()
    power = "KMGTP".index(prefix.upper()) + 1 if prefix else 0
    value = Decimal(number) * (1024 if binary else 1000) ** power
    if value != value.to_integral_value():
        raise ValueError(text)
    return int(value)


def _parse_int(raw: object, rules: _Rules) -> int:
    if isinstance(raw, bool):
        raise ValueError(raw)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        return _parse_byte_size(raw) if rules.byte_size else int(raw.strip(), 10)
    raise ValueError(raw)


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def _parse_bool(raw: object, rules: _Rules) -> bool:
    if isinstance(raw, bool):
        return raw
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(raw)


def _parse_strings(raw: object, rules: _Rules) -> tuple[str, ...]:
    if isinstance(raw, str):  # env and flags: comma-separated
        items: Sequence[object] = [item.strip() for item in raw.split(",") if item.strip()]
    elif isinstance(raw, list | tuple):
        items = raw
    else:
        raise ValueError(raw)
    if not all(isinstance(item, str) and item for item in items):
        raise ValueError(raw)
    return tuple(typing.cast(Sequence[str], items))


@dataclass(frozen=True)
class _Kind:
    name: str  # in config_schema
    expected: str  # in errors and docs
    parse: Callable[[object, _Rules], object]  # raises ValueError on a bad value


_KINDS: dict[object, _Kind] = {
    str: _Kind("string", "a non-empty string", _parse_str),
    Path: _Kind("path", "a path", _parse_path),
    float: _Kind("number", "a finite number", _parse_float),
    int: _Kind("integer", "an integer", _parse_int),
    bool: _Kind("bool", "true or false (in env and flags also 1/0, yes/no, on/off)", _parse_bool),
    tuple: _Kind(
        "list", "a list of non-empty strings (comma-separated in env and flags)", _parse_strings
    ),
}


# --- the schema, walked once from the dataclasses ------------------------------------------------


@dataclass(frozen=True)
class _Leaf:
    path: tuple[str, ...]
    kind: _Kind
    optional: bool
    rules: _Rules
    default: object

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        return ENV_PREFIX + _ENV_SEP.join(self.path).upper()


_Tree = dict[str, "_Leaf | _Tree"]


def _walk(cls: type, prefix: tuple[str, ...]) -> Iterator[_Leaf]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint, path = hints[f.name], (*prefix, f.name)
        if dataclasses.is_dataclass(hint):
            yield from _walk(typing.cast(type, hint), path)
            continue
        args = typing.get_args(hint)
        optional = type(None) in args
        base = next(arg for arg in args if arg is not type(None)) if optional else hint
        rules: _Rules = f.metadata[_RULES]
        default = rules.default_doc if f.default is dataclasses.MISSING else f.default
        kind = _KINDS[typing.get_origin(base) or base]
        yield _Leaf(path, kind, optional, rules, default)


@cache
def _leaves() -> tuple[_Leaf, ...]:
    return tuple(_walk(AgentConfig, ()))


@cache
def _tree() -> _Tree:
    root: _Tree = {}
    for leaf in _leaves():
        node = root
        for part in leaf.path[:-1]:
            child = node.setdefault(part, {})
            assert isinstance(child, dict)
            node = child
        node[leaf.path[-1]] = leaf
    return root


@cache
def _by_env() -> dict[str, _Leaf]:
    return {leaf.env: leaf for leaf in _leaves()}


@cache
def _by_key() -> dict[str, _Leaf]:
    return {leaf.key: leaf for leaf in _leaves()}


def _expected(leaf: _Leaf) -> str:
    """What the setting accepts, in words: every error and the docs say it the same way."""
    rules = leaf.rules
    if rules.choices:
        text = "one of: " + ", ".join(rules.choices)
    elif rules.allowed:
        text = rules.allowed
    elif rules.byte_size:
        text = _BYTE_SIZE_TEXT
    else:
        text = leaf.kind.expected
    limits = ((">=", rules.ge), (">", rules.gt), ("<=", rules.le))
    bounds = [f"{op} {limit:g}" for op, limit in limits if limit is not None]
    if bounds:
        text += ", " + " and ".join(bounds)
    if leaf.optional:
        text += "; or empty (null in YAML) for none"
    return text


def _within(rules: _Rules, value: Any) -> bool:
    return (
        (not rules.choices or value in rules.choices)
        and (rules.ge is None or value >= rules.ge)
        and (rules.gt is None or value > rules.gt)
        and (rules.le is None or value <= rules.le)
        and (rules.check is None or rules.check(value))
    )


def _coerce(leaf: _Leaf, raw: object) -> object:
    """The typed, checked value of ``raw``; raises ValueError. Empty text unsets optionals."""
    if raw is None or (leaf.optional and isinstance(raw, str) and not raw.strip()):
        if leaf.optional:
            return None
        raise ValueError(raw)
    value = leaf.kind.parse(raw, leaf.rules)
    if not _within(leaf.rules, value):
        raise ValueError(raw)
    return value


def _render(path: Sequence[str], *, env: bool, section: bool = False) -> str:
    if env:
        return ENV_PREFIX + _ENV_SEP.join(path).upper() + (_ENV_SEP + "*" if section else "")
    return ".".join(path)


def _unknown(prefix: Sequence[str], node: _Tree, key: str, *, env: bool) -> str:
    """Says the key is unknown and lists the valid keys of its section."""
    if env:  # env names only make sense in full
        names = [
            _render((*prefix, n), env=True, section=isinstance(c, dict)) for n, c in node.items()
        ]
    else:
        names = list(node)
    close = difflib.get_close_matches(key, list(node), n=1)
    hint = f" (did you mean {_render((*prefix, close[0]), env=env)}?)" if close else ""
    where = f" in {'.'.join(prefix)}" if prefix and not env else ""
    return f"unknown key{hint}; valid keys{where}: {', '.join(names)}"


def _lookup(parts: Sequence[str], *, env: bool) -> _Leaf | str:
    """The setting at ``parts``, or why there is none."""
    node = _tree()
    for depth, part in enumerate(parts):
        child = node.get(part)
        if child is None:
            return _unknown(parts[:depth], node, part, env=env)
        if isinstance(child, _Leaf):
            if depth == len(parts) - 1:
                return child
            return f"{_render(parts[: depth + 1], env=env)} is a setting, not a section"
        node = child
    keys = ", ".join(_render((*parts, name), env=env) for name in node)
    return f"is a section, not a setting; set one of: {keys}"


# --- sources --------------------------------------------------------------------------------------


@dataclass
class _Collector:
    """Typed values by key path, later sources overwriting earlier ones, and every violation."""

    values: dict[tuple[str, ...], object] = field(default_factory=dict)
    violations: list[FieldViolation] = field(default_factory=list)

    def set(self, leaf: _Leaf, label: str, raw: object) -> None:
        try:
            self.values[leaf.path] = _coerce(leaf, raw)
        except ValueError:
            self.reject(label, f"expected {_expected(leaf)}; got {brief(raw)}")

    def reject(self, label: str, description: str) -> None:
        self.violations.append(FieldViolation(label, description))


def _read_yaml(file: Path) -> Mapping[object, object]:
    try:
        text = safeyaml.read_text(file, "config")
    except FileNotFoundError as exc:
        raise InvalidSpec(
            f"config file {file} does not exist",
            [FieldViolation("config", f"{file} does not exist")],
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSpec(
            f"cannot read config file {file}: {exc}", [FieldViolation("config", str(exc))]
        ) from exc
    try:
        data = safeyaml.load(text, "config")  # errors then name the line and column
    except InvalidSpec as exc:
        raise InvalidSpec(f"config file {file}: {exc}", exc.violations) from None
    if data is None:  # an empty file: all defaults
        return {}
    if not isinstance(data, Mapping):
        description = f"expected a mapping of settings; got {type(data).__name__}"
        raise InvalidSpec(
            f"config file {file}: {description}", [FieldViolation("config", description)]
        )
    return data


def _apply_mapping(
    data: Mapping[object, object], node: _Tree, prefix: tuple[str, ...], out: _Collector
) -> None:
    for key, raw in data.items():
        label = ".".join((*prefix, str(key)))
        child = node.get(key) if isinstance(key, str) else None
        if child is None:
            out.reject(label, _unknown(prefix, node, str(key), env=False))
        elif isinstance(child, _Leaf):
            out.set(child, label, raw)
        elif isinstance(raw, Mapping):
            _apply_mapping(raw, child, (*prefix, str(key)), out)
        elif raw is not None:  # `telemetry:` with nothing under it is an empty section
            out.reject(label, f"expected a mapping with keys: {', '.join(child)}; got {brief(raw)}")


def _apply_env(env: Mapping[str, str], out: _Collector) -> None:
    for leaf in _leaves():  # aliases first, so the GPU_AGENT_ name wins
        alias = next((name for name in leaf.rules.env_aliases if name in env), None)
        if alias is not None and leaf.env not in env:
            out.set(leaf, f"env {alias}", env[alias])
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        label = f"env {name}"
        known = _by_env().get(name)
        if known is not None:
            out.set(known, label, env[name])
            continue
        found = _lookup(name.removeprefix(ENV_PREFIX).lower().split(_ENV_SEP), env=True)
        out.reject(
            label, f"unknown key; did you mean {found.env}?" if isinstance(found, _Leaf) else found
        )


def _apply_flags(flags: Mapping[str, object], out: _Collector) -> None:
    for key, raw in flags.items():
        if raw is None:  # the flag was not given
            continue
        found = _by_key().get(key) or _lookup(key.split("."), env=False)
        if isinstance(found, _Leaf):
            out.set(found, f"flag {key}", raw)
        else:
            out.reject(f"flag {key}", found)


def _build(cls: type, prefix: tuple[str, ...], values: Mapping[tuple[str, ...], object]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        path = (*prefix, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], path, values)
        elif path in values:
            kwargs[f.name] = values[path]
    return cls(**kwargs)


def _value(config: AgentConfig, path: Sequence[str]) -> object:
    value: object = config
    for part in path:
        value = getattr(value, part)
    return value


def _missing_requirements(config: AgentConfig) -> Iterator[FieldViolation]:
    for leaf in _leaves():
        other = leaf.rules.requires
        if other is None or _value(config, leaf.path) is None:
            continue
        sibling = (*leaf.path[:-1], other)
        if _value(config, sibling) is None:
            yield FieldViolation(leaf.key, f"is set, so {'.'.join(sibling)} must be set too")


def _raise(violations: Sequence[FieldViolation], file: Path | None) -> typing.NoReturn:
    source = f" (config file {file})" if file is not None else ""
    lines = "".join(f"\n  {v.field}: {v.description}" for v in violations)
    raise InvalidSpec(f"invalid agent configuration{source}:{lines}", violations)


def load_config(
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> AgentConfig:
    """Build the config from defaults < ``file`` < ``env`` < ``flags`` and validate all of it.

    ``env`` defaults to ``os.environ``; only its ``GPU_AGENT_*`` keys (and the documented
    aliases) are read, and an unknown ``GPU_AGENT_*`` key is an error. Without ``file``,
    ``GPU_AGENT_CONFIG`` names the config file. ``flags`` holds dotted keys; None values are
    flags not given. Every bad value in every source is reported at once in one `InvalidSpec`.
    """
    env = os.environ if env is None else env
    if file is None and env.get(CONFIG_ENV):
        file = Path(env[CONFIG_ENV])
    out = _Collector()
    if file is not None:
        _apply_mapping(_read_yaml(file), _tree(), (), out)
    _apply_env(env, out)
    _apply_flags(flags or {}, out)
    if out.violations:
        _raise(out.violations, file)
    config: AgentConfig = _build(AgentConfig, (), out.values)
    problems = list(_missing_requirements(config))
    if problems:
        _raise(problems, file)
    return config


def _plain(value: object) -> object:
    """JSON/YAML-friendly form of a default."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def config_schema() -> list[dict[str, object]]:
    """One row per setting, in declaration order: for generated docs and manifest checks.

    Keys: ``key`` (dotted path), ``env``, ``env_aliases``, ``type`` (string, path, number,
    integer, bool, list), ``optional``, ``default``, ``allowed`` (in words) and ``doc``.
    """
    return [
        {
            "key": leaf.key,
            "env": leaf.env,
            "env_aliases": list(leaf.rules.env_aliases),
            "type": leaf.kind.name,
            "optional": leaf.optional,
            "default": _plain(leaf.default),
            "allowed": _expected(leaf),
            "doc": leaf.rules.doc,
        }
        for leaf in _leaves()
    ]
