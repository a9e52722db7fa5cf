"""The checks of the node-side duties: sharing (the device plugin's config, its reload and MIG
strategy, or DRA), prewarm (the cache volume, containerd, Nydus, Dragonfly, egress, private
images) and the state dir. They read the config, the filesystem and /proc; nothing is written
(the state dir's write probe is the running store's last answer, not a new write)."""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from agent import pidns
from agent.doctor import kube_checks
from agent.doctor.facts import NEEDS_NVML, Facts, degraded, failed, ok
from agent.dra.mode import AllocationMode
from agent.errors import AgentError
from agent.prewarm import inuse
from agent.prewarm.policy import redact_url
from agent.prewarm.private_images import (
    ALWAYS_VERIFY,
    POLICY_FIELD,
    SETTING,
    USABLE_BY_EVERY_POD,
    read_kubelet_policy,
)
from agent.sharing import strategy
from agent.sharing.reload import NO_HOSTPID
from agent.sharing.store import ConfigStore
from agent.statedir import FIX as STATE_FIX
from agent.wire.doctor import Check

__all__ = [
    "prewarm_cache_volume",
    "prewarm_containerd",
    "prewarm_dragonfly",
    "prewarm_egress",
    "prewarm_nydus",
    "prewarm_private_images",
    "sharing_mig_strategy",
    "sharing_plugin_config",
    "sharing_reload",
    "state_dir",
]

S, P = "sharing", "prewarm"
#: A cache volume this full is degraded, and this full failed (a fetch then fails for space).
NEARLY_FULL = 0.90
FULL = 0.98
_GIB = 1024**3
#: Filesystems that are not a local disk: the container's layer or memory.
NOT_LOCAL = {"overlay", "tmpfs", "ramfs", "aufs"}


def sharing_plugin_config(facts: Facts) -> Check:
    mode = facts.allocation().mode
    if mode.is_dra:
        if facts.kube is None:
            return failed(
                S,
                "plugin-config",
                f"allocation mode {mode.value} but no Kubernetes API to write DeviceClasses",
                "run the agent in a pod with its service account",
            )
        return ok(S, "plugin-config", f"{mode.value}: sharing renders to DeviceClass config")
    path = facts.config.sharing.config_path
    directory = path.parent
    if not directory.is_dir():
        # With no allocator found (mode none) nothing reads the config yet: degraded.
        make = degraded if mode is AllocationMode.NONE else failed
        return make(
            S,
            "plugin-config",
            f"{mode.value}: the device plugin's config directory {directory} is not mounted",
            f"mount the directory the device plugin reads its config from at {directory} "
            "(hostPath), or set sharing.config_path",
        )
    if not os.access(directory, os.W_OK):
        return failed(
            S,
            "plugin-config",
            f"{directory} is not writable by the agent (uid {os.geteuid()})",
            f"mount {directory} read-write into the agent pod",
        )
    unreadable = _config_problem(path)
    if unreadable:
        return failed(
            S,
            "plugin-config",
            f"{mode.value}: {unreadable}",
            f"fix or remove {path} (gpu-agent share show says the same)",
        )
    there = "present" if path.exists() else "not written yet"
    return ok(S, "plugin-config", f"{mode.value}: config path {path} ({there}), directory writable")


def _config_problem(path: Path) -> str:
    """Why the file at ``path`` is no config the plugin can read, read and parsed by `share`'s
    own reader ("" when it is one, or absent: the plugin then runs with its defaults)."""
    try:
        ConfigStore(path).read_config()
    except AgentError as exc:
        return str(exc)
    return ""


def _plugin_pids(facts: Facts, name: str) -> list[int]:
    found = []
    try:
        entries = list(facts.proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == name[:15]:  # comm keeps 15 bytes
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def sharing_reload(facts: Facts) -> Check:
    sharing = facts.config.sharing
    mode = facts.allocation().mode
    if mode in (AllocationMode.DRA, AllocationMode.DRA_DYNAMIC_MIG):
        return ok(S, "reload", f"{mode.value}: the DRA driver reads DeviceClasses, no reload")
    if sharing.reload == "none":
        return ok(S, "reload", "reload none: something else reloads the device plugin")
    if sharing.reload in ("label", "restart-pod"):
        if facts.kube is None:
            return failed(
                S,
                "reload",
                f"reload {sharing.reload} needs the Kubernetes API, and there is none",
                "run the agent in a pod with its service account, or set sharing.reload sighup",
            )
        if sharing.reload == "restart-pod":
            return _restart_pod_allowed(facts, sharing.plugin_namespace)
        return ok(S, "reload", f"reload {sharing.reload} through the Kubernetes API")
    pids = _plugin_pids(facts, sharing.plugin_process_name)
    if pids:
        # No pid: the answer goes to the read role, which sees no process.
        return ok(S, "reload", f"reload sighup: {sharing.plugin_process_name} runs")
    if pidns.hides(facts.namespace_proc or facts.proc):
        return degraded(
            S,
            "reload",
            f"reload sighup, but {NO_HOSTPID} (/proc/self/ns/pid is not the node's PID "
            "namespace): it can neither signal the plugin nor tell whether the plugin loaded a "
            "config",
            "run the agent with hostPID: true (deploy/kubernetes/base has it), or set "
            "sharing.reload label (GPU Operator) or restart-pod",
        )
    return degraded(
        S,
        "reload",
        f"reload sighup but no process named {sharing.plugin_process_name} is visible "
        "(not running, or the agent does not share the host's PID namespace)",
        "run the agent with hostPID: true, or set sharing.reload label (GPU Operator) or "
        "restart-pod",
    )


def _restart_pod_allowed(facts: Facts, namespace: str) -> Check:
    """reload restart-pod lists and deletes the plugin's pods in ``namespace``: verbs the base
    role does not grant (overlays/sharing-restart-pod does), asked of the API server."""
    try:
        denied = [
            verb
            for verb in ("list", "delete")
            if not kube_checks.allowed(facts, "", "pods", verb, namespace)
        ]
    except AgentError as exc:
        return failed(S, "reload", f"SelfSubjectAccessReview refused: {exc}", kube_checks.RBAC_FIX)
    if denied:
        return failed(
            S,
            "reload",
            f"reload restart-pod, but the agent may not {' or '.join(denied)} pods in namespace "
            f"{namespace}: the first share change would write the file and fail its reload",
            "kubectl apply -k deploy/kubernetes/overlays/sharing-restart-pod (a Role for list "
            "and delete on pods in the plugin's namespace), or set sharing.reload sighup",
        )
    return ok(S, "reload", f"reload restart-pod: may list and delete pods in {namespace}")


def sharing_mig_strategy(facts: Facts) -> Check:
    """Does the device plugin expose the MIG devices this node has? It runs with the strategy of
    its own flag or environment when set, else its config file's, else none (agent/sharing/
    strategy.py); under none a MIG-enabled GPU is advertised whole and its MIG devices not."""
    mode = facts.allocation().mode
    if mode.is_dra:
        return ok(S, "mig-strategy", f"{mode.value}: no device plugin; the DRA driver exposes MIG")
    if not facts.driver.is_attached:
        # Not checked is not "ok": as every check of what NVML alone can read.
        return failed(
            S, "mig-strategy", "no NVML: no MIG layout to hold the strategy against", NEEDS_NVML
        )
    snap = facts.snapshot()
    layouts = snap.layouts if snap is not None and snap.layouts else None
    if layouts is None:
        driver = facts.driver.driver
        layouts = tuple(driver.layout(g.uuid) for g in driver.gpus())
    started, unseen = _plugin_strategy(facts)
    used = strategy.effective(_file_strategy(facts), started)
    source = used.source + unseen
    why = strategy.problem(used.value, layouts)
    if why is None:
        return ok(S, "mig-strategy", f"migStrategy {used.value} exposes the MIG layout ({source})")
    if used.overrides_file:
        fix = (
            "change the plugin's --mig-strategy or MIG_STRATEGY (GPU Operator: the ClusterPolicy's "
            "mig.strategy); the config file's flags.migStrategy does not override it"
        )
    else:
        fix = (
            "gpu-agent share set --mig-strategy mixed (or single, when every GPU has MIG "
            "devices of one profile)"
        )
    return degraded(S, "mig-strategy", f"{why} ({source})", fix)


def _file_strategy(facts: Facts) -> str | None:
    """The config file's flags.migStrategy; None when it sets none, is absent or unreadable
    (sharing/plugin-config says why)."""
    try:
        return ConfigStore(facts.config.sharing.config_path).read_config().flags.mig_strategy
    except AgentError:
        return None


def _plugin_strategy(facts: Facts) -> tuple[strategy.Strategy | None, str]:
    """The strategy the running plugin was started with, and a caveat when it cannot be seen."""
    pids = _plugin_pids(facts, facts.config.sharing.plugin_process_name)
    if not pids:
        unseen = (
            NO_HOSTPID
            if pidns.hides(facts.namespace_proc or facts.proc)
            else "the plugin's process is not visible"
        )
        return None, (
            f"; {unseen}, and a --mig-strategy or MIG_STRATEGY it runs with would override this"
        )
    started, caveat = strategy.read_started_with(facts.proc, pids[0])
    return started, f"; {caveat}" if caveat else ""


def _filesystem(facts: Facts, path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (the longest mount point above it)."""
    best, kind = "", "unknown"
    try:
        lines = (facts.proc / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return kind
    target = str(path)
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, line.split(" - ", 1)[1].split()[0]
    return kind


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def prewarm_cache_volume(facts: Facts) -> Check:
    cache = facts.config.prewarm.cache_dir
    where = _existing(cache)
    vfs = facts.statvfs(where)
    total = vfs.f_blocks * vfs.f_frsize
    free = vfs.f_bavail * vfs.f_frsize
    used = 1 - free / total if total else 1.0
    fs = _filesystem(facts, where)
    evidence = (
        f"{cache}{'' if where == cache else f' (not made yet; volume of {where})'}: {fs}, "
        f"{used:.0%} used, {free / _GIB:.1f} GiB free of {total / _GIB:.1f} GiB"
    )
    if used >= FULL:
        return failed(
            P,
            "cache-volume",
            evidence,
            f"free space on the volume of {cache} (gpu-agent cache evict ITEM), or lower "
            "prewarm.budget_bytes",
        )
    if used >= NEARLY_FULL:
        return degraded(
            P,
            "cache-volume",
            f"nearly full: {evidence}",
            f"free space on the volume of {cache}, or lower prewarm.max_volume_share",
        )
    if fs in NOT_LOCAL:
        return degraded(
            P,
            "cache-volume",
            f"{evidence}: not a local disk, lost with the container",
            f"mount a hostPath on local NVMe at {cache} (deploy/kubernetes does)",
        )
    return ok(P, "cache-volume", evidence)


def _socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def _not_answering(path: Path) -> str | None:
    """Why a connection to the Unix socket ``path`` fails within a second (None: it opens). A
    socket file outlives the daemon that made it (a crash leaves it): only a connect tells."""
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(1.0)
            conn.connect(str(path))
            return None
    except ConnectionRefusedError:
        return f"no one listens on {path} (connection refused)"
    except TimeoutError:
        return f"{path} accepts no connection within 1 s"
    except OSError as exc:
        return f"{path} cannot be reached ({exc.strerror or type(exc).__name__})"


@dataclass(frozen=True, slots=True)
class _Daemon:
    """A daemon prewarm talks to over a Unix socket, as its check names it."""

    name: str  # the check's name
    what: str  # e.g. "CRI socket"
    fails: str  # what does not work without it
    mount: str = ""  # the fix when its socket is absent
    start: str = ""  # the fix when its socket is there but no one listens


def _socket_check(daemon: _Daemon, path: Path) -> Check:
    """Ok when the daemon accepts a connection on its socket; else degraded (prewarm goes on),
    saying whether the socket is absent or left behind by a daemon that is down."""
    if not _socket(path):
        return degraded(P, daemon.name, f"no {daemon.what} at {path}: {daemon.fails}", daemon.mount)
    why = _not_answering(path)
    if why is None:
        return ok(P, daemon.name, f"{daemon.what} {path} accepts connections")
    return degraded(P, daemon.name, f"{daemon.what} {path}: {why}: {daemon.fails}", daemon.start)


def prewarm_in_use(facts: Facts) -> Check:
    """Whether the cache can tell the blobs pods hold from the rest: only where the agent
    sees the node's processes is anything evicted for room (agent/prewarm/inuse.py). The
    /proc its scan reads: telemetry.proc_root."""
    proc = facts.config.telemetry.proc_root
    if pidns.sees_node(proc):
        return ok(
            P, "in-use", "the node's processes are visible: a blob a pod holds is never evicted"
        )
    return degraded(
        P,
        "in-use",
        f"{inuse.unseen_node(proc)}; every cached blob may be held, so none is evicted for "
        "room (a fetch that needs room fails, cache evict is refused)",
        "run the agent with hostPID: true (deploy/kubernetes/base has it)",
    )


def prewarm_containerd(facts: Facts) -> Check:
    path = facts.config.prewarm.containerd_socket
    return _socket_check(
        _Daemon(
            "containerd",
            "CRI socket",
            "image prewarm does not work (file prewarm does)",
            f"mount the host's {path} into the agent pod, or set prewarm.containerd_socket",
            "start containerd on the node (systemctl status containerd says why it stopped)",
        ),
        path,
    )


def _optional_socket_check(
    setting: str, path: Path | None, daemon: _Daemon, *, off: str, start: str
) -> Check:
    """A daemon prewarm uses only when ``prewarm.<setting>`` names its socket: off when unset,
    else `_socket_check`, whose fixes mount the socket's folder, start the daemon or unset the
    setting."""
    if path is None:
        return ok(P, daemon.name, f"off (prewarm.{setting} unset): {off}")
    unset = f"or unset prewarm.{setting}"
    mount = f"mount {path.parent} into the agent pod, {unset}"
    return _socket_check(replace(daemon, mount=mount, start=f"{start}, {unset}"), path)


def prewarm_nydus(facts: Facts) -> Check:
    return _optional_socket_check(
        "nydus_system_socket",
        facts.config.prewarm.nydus_system_socket,
        _Daemon("nydus", "nydus-snapshotter system socket", "Nydus prefetch hints are not sent"),
        off="no prefetch hints",
        start="start nydus-snapshotter",
    )


def prewarm_dragonfly(facts: Facts) -> Check:
    """Where file bytes come from: dfdaemon's socket, else its proxy, else the origins. A
    configured dfdaemon that does not answer fails every file fetch (there is no fallback to
    the origins), so it is degraded saying so."""
    settings = facts.config.prewarm
    fail = "file fetches fail until it answers (they go to dfdaemon, not to the origins)"
    if settings.dragonfly_socket is None and settings.dragonfly_proxy is None:
        off = "off (prewarm.dragonfly_socket and prewarm.dragonfly_proxy unset)"
        return ok(P, "dragonfly", f"{off}: files come from origins")
    if settings.dragonfly_socket is not None:  # used even when a proxy is set too
        return _optional_socket_check(
            "dragonfly_socket",
            settings.dragonfly_socket,
            _Daemon("dragonfly", "dfdaemon socket", fail),
            off="",
            start="start dfdaemon",
        )
    assert settings.dragonfly_proxy is not None
    proxy = redact_url(settings.dragonfly_proxy)
    why = _unreachable(settings.dragonfly_proxy)
    if why is None:
        return ok(P, "dragonfly", f"dfdaemon proxy {proxy} accepts connections")
    return degraded(
        P,
        "dragonfly",
        f"dfdaemon proxy {proxy} unreachable ({why}): {fail}",
        "start dfdaemon's proxy there, or unset prewarm.dragonfly_proxy",
    )


def _unreachable(url: str) -> str | None:
    """Why a TCP connection to ``url``'s host and port fails within a second (None: it opens)."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "", port), timeout=1.0):
            return None
    except ValueError as exc:  # a port out of range
        return str(exc)
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def prewarm_egress(facts: Facts) -> Check:
    allowed = facts.config.prewarm.egress_allow
    if not allowed:
        return ok(
            P,
            "egress",
            "loopback, link-local, private and metadata addresses refused (egress_allow empty)",
        )
    wide = [a for a in allowed if _everything(a)]
    if wide:
        return degraded(
            P,
            "egress",
            f"prewarm.egress_allow {', '.join(wide)} lets a prewarm reach every address, the "
            "cloud metadata service included",
            "narrow prewarm.egress_allow to the registries' and origins' networks",
        )
    return ok(P, "egress", f"private addresses allowed only in {', '.join(allowed)}")


def prewarm_private_images(facts: Facts) -> Check:
    """Whether images pulled with the node's credentials may be prewarmed, and why (the rule
    of agent/prewarm/private_images.py, docs/security.md "Private images")."""
    settings = facts.config.prewarm
    if settings.docker_config is None:
        return ok(P, "private-images", "no registry credentials (prewarm.docker_config unset)")
    if settings.private_images == USABLE_BY_EVERY_POD:
        return ok(
            P,
            "private-images",
            f"{SETTING}: {USABLE_BY_EVERY_POD}: a prewarmed private image is usable by every "
            "pod on this node, by the operator's choice",
        )
    kubelet = read_kubelet_policy(settings.kubelet_config, settings.kubelet_config_dir)
    if kubelet.policy == ALWAYS_VERIFY and not kubelet.gate_off:
        return ok(P, "private-images", f"the kubelet verifies credentials: {kubelet.describe()}")
    return degraded(
        P,
        "private-images",
        f"private images are refused (they would be usable by every pod): kubelet "
        f"{POLICY_FIELD} {kubelet.describe()}",
        f"set {POLICY_FIELD}: {ALWAYS_VERIFY} in the kubelet config and mount it into the agent "
        f"pod ({settings.kubelet_config}), or set {SETTING}: {USABLE_BY_EVERY_POD}",
    )


def _everything(entry: str) -> bool:
    try:
        return ipaddress.ip_network(entry, strict=False).prefixlen == 0
    except ValueError:
        return entry.strip() == "*"


def state_dir(facts: Facts) -> Check:
    directory = facts.config.state_dir
    unwritable = facts.state_read_only()
    if unwritable is not None:
        return failed("state", "dir", str(unwritable), STATE_FIX)
    vfs = facts.statvfs(directory)
    free = vfs.f_bavail * vfs.f_frsize
    evidence = f"{directory} writable, {free / _GIB:.1f} GiB free"
    if free < 256 * 1024**2:
        return degraded(
            "state", "dir", f"{evidence}: under 256 MiB", f"free space on the volume of {directory}"
        )
    return ok("state", "dir", evidence)
