"""The agent config's sections (agent/config/schema.py nests them): each a frozen dataclass
whose fields carry their rules as data (agent/config/rules.py); the prewarm section is
agent/config/prewarm.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from agent.config.rules import rules as _rules
from agent.kube_names import is_dns_label, is_label_name

#: What a listen address may be, in the error that refuses one.
LISTEN_TEXT = "HOST:PORT or [IPv6]:PORT with PORT 0-65535, e.g. 0.0.0.0:9400"

#: What a namespace may be (the API server refuses others), in the error that refuses one.
NAMESPACE_TEXT = (
    "a namespace: a DNS label (lowercase letters, digits and '-', at most 63, starting and "
    "ending with a letter or digit)"
)


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
            check=is_label_name,
            allowed="a label value: at most 63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit",
            doc="Config name put in the node's nvidia.com/device-plugin.config label when reload "
            "is label; must be a key of the plugin's config map.",
        ),
    )
    plugin_namespace: str = field(
        default="gpu-operator",
        metadata=_rules(
            check=is_dns_label,
            allowed=NAMESPACE_TEXT,
            doc="Namespace of the device-plugin pods, for reload restart-pod.",
        ),
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
            le=30,
            doc="Seconds between samples. Scrapes render the latest sample, so this bounds how "
            "fresh metrics are; under 0.1 s NVML and GPM reads cost more than they tell. At "
            "most 30 s (dcgm-exporter's default): the GpuAgentTelemetryStale alert calls a "
            "sample older than 60 s a stuck sampler.",
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
            "Event); a GPU with a failed health mark is never marked. 0 turns the mark off. "
            "Needs the Kubernetes API (in a pod).",
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
            check=is_dns_label,
            allowed=NAMESPACE_TEXT,
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
