"""The checks of the GPU duties: telemetry (NVML, profiling, pod attribution), MIG, power and
health. Each reads the agent's driver link and latest snapshot (agent/doctor/facts.py); the
only NVML calls are the facade's read-only ones (power limits, MIG mode)."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

from agent.doctor.facts import NEEDS_NVML, Facts, degraded, failed, ok
from agent.dra.mode import AllocationMode
from agent.errors import AgentError
from agent.gpu.attach import DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, NO_GPUS, STARTING
from agent.gpu.types import GpuInfo
from agent.health.machine import State, action_rank
from agent.mig.outcomes import UNROLLED_FIX, unrolled_said
from agent.telemetry.snapshot import Snapshot
from agent.wire.doctor import Check
from dcgm.fields import BY_ID

__all__ = [
    "health_xid",
    "mig_allocation_mode",
    "mig_capability",
    "mig_journal",
    "mig_operand_labels",
    "mig_pending",
    "power_limits",
    "telemetry_nvml",
    "telemetry_pod_resources",
    "telemetry_profiling",
]

T, M = "telemetry", "mig"
RUNTIME_FIX = (
    "set runtimeClassName: nvidia on the agent's DaemonSet (deploy/kubernetes sets it), or "
    "deploy overlays/nvidia-default-runtime where nvidia is containerd's default runtime"
)


def _nvml_fix(cause: str, in_pod: bool) -> str:
    if cause == LIBRARY_NOT_FOUND:
        if in_pod:
            return RUNTIME_FIX
        return (
            "install the NVIDIA driver (libnvidia-ml.so.1 on the loader path), or run on a "
            "simulated node: gpu-agent --simulate dgx-h100 ..."
        )
    if cause == DRIVER_NOT_LOADED:
        return "load the kernel module (modprobe nvidia) or wait for the GPU Operator's driver pod"
    if cause == NO_GPUS:
        return "nvidia-smi -L should list the GPUs: check the PCI devices and the driver's dmesg"
    return "look at the agent's log for the NVML error; nvidia-smi shows whether NVML answers"


def _library(facts: Facts) -> str:
    """Which libnvidia-ml the process loaded, from its memory map (no NVML call)."""
    if facts.simulated:
        return f"the simulated driver (preset {facts.config.simulate})"
    try:
        for line in (facts.proc / "self" / "maps").read_text().splitlines():
            path = line.split()[-1] if line.split() else ""
            if "libnvidia-ml" in path:
                return path
    except OSError:
        pass
    return "libnvidia-ml (path not readable from /proc/self/maps)"


def telemetry_nvml(facts: Facts) -> Check:
    state = facts.driver.state
    if not state.attached:
        evidence = f"NVML not ready ({state.cause}): {state.reason}"
        if state.cause == STARTING:
            return degraded(T, "nvml", evidence, "wait for the agent's start to finish")
        in_pod = bool(facts.env.get("KUBERNETES_SERVICE_HOST"))
        return failed(T, "nvml", evidence, _nvml_fix(state.cause, in_pod))
    snap = facts.snapshot()
    if snap is not None:
        versions = f"NVML {snap.nvml_version}, driver {snap.driver_version}"
        up = f"{snap.serving()} of {len(snap.gpus)} GPU(s) answering"
    else:
        versions = f"driver {facts.driver.driver.driver_version()}"
        up = f"{state.gpus} GPU(s) at attach"
    evidence = f"{versions}, {up}, library {_library(facts)}"
    lost = ", ".join(f"GPU {i}: {why}" for i, why in _unanswering(snap).items())
    # A GPU not lost whose reads fail (one needing a reset) is no "ok" either: named, with the call
    unread = ", ".join(
        f"GPU {g.gpu.index}: {g.unread}" for g in (snap.gpus if snap else ()) if g.unread
    )
    said = (f"; lost: {lost}" if lost else "") + (f"; not read: {unread}" if unread else "")
    if said:
        return degraded(T, "nvml", evidence + said, "see health/xid and gpu-agent status")
    return ok(T, "nvml", evidence)


def _profiling_param(facts: Facts) -> bool | None:
    """The driver's RmProfilingAdminOnly (NVreg_RestrictProfilingToAdminUsers); None unknown."""
    try:
        text = (facts.proc / "driver" / "nvidia" / "params").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "RmProfilingAdminOnly":
            return value.strip() == "1"
    return None


def telemetry_profiling(facts: Facts) -> Check:
    if not facts.driver.is_attached:
        return failed(T, "profiling", "no NVML: no profiling field can be read", NEEDS_NVML)
    snap = facts.snapshot()
    support = [s for s in (snap.support if snap else ()) if _is_profiling(s.field_id)]
    if not support:
        return ok(T, "profiling", "no profiling (DCGM_FI_PROF_*) field selected")
    missing = sorted({s.gpu.index for s in support if not s.supported})
    admin_only = None if facts.simulated else _profiling_param(facts)
    restricted = admin_only is True and facts.has_sys_admin() is False
    setting = {True: "1", False: "0", None: "not readable"}[admin_only]
    setting = "n/a (simulated driver)" if facts.simulated else setting
    readable = sum(1 for s in support if s.supported)
    evidence = (
        f"{readable} of {len(support)} profiling field reading(s) supported; "
        f"RmProfilingAdminOnly {setting}"
    ) + (f"; unsupported on GPU(s) {', '.join(map(str, missing))}" if missing else "")
    if restricted:
        return failed(
            T,
            "profiling",
            f"profiling restricted to admins and the agent lacks CAP_SYS_ADMIN; {evidence}",
            "options nvidia NVreg_RestrictProfilingToAdminUsers=0 in /etc/modprobe.d/nvidia.conf "
            "and reload the driver, or add capabilities: [SYS_ADMIN] to the agent's container",
        )
    if missing:
        return degraded(
            T,
            "profiling",
            evidence,
            "profiling needs GPM (Hopper and later) or DCGM's profiling module "
            "(libdcgm with nv-hostengine) on older GPUs; drop the fields from the counters CSV "
            "otherwise",
        )
    return ok(T, "profiling", evidence)


def _is_profiling(field_id: int) -> bool:
    found = BY_ID.get(field_id)
    return found is not None and found.profiling


def telemetry_pod_resources(facts: Facts) -> Check:
    socket = facts.config.telemetry.kubelet_socket
    try:
        is_socket = stat.S_ISSOCK(socket.stat().st_mode)
    except OSError:
        is_socket = False
    if is_socket:
        snap = facts.snapshot()
        pods = next((s for s in snap.sources if s.source == "pods"), None) if snap else None
        if pods is not None and pods.degraded is not None:
            return degraded(
                T,
                "pod-resources",
                f"{pods.degraded} (socket {socket})",
                "check kubelet on the node (systemctl status kubelet; its log); the pod labels "
                "follow again at its next answer",
            )
        return ok(T, "pod-resources", f"kubelet pod-resources socket {socket}")
    if facts.kube is None:
        return ok(T, "pod-resources", f"not in a cluster: no pods to attribute ({socket} absent)")
    return failed(
        T,
        "pod-resources",
        f"no kubelet pod-resources socket at {socket}: GPUs are not attributed to pods",
        f"mount the host's {socket.parent} into the agent pod (hostPath volume) or set "
        "telemetry.kubelet_socket",
    )


def _unanswering(snap: Snapshot | None) -> dict[int, str]:
    """The GPUs the snapshot lists down (lost), by index, with the driver's error: whatever
    was read of them before is no reading of now. The one list of the lost every check reads."""
    return {} if snap is None else {g.gpu.index: g.detail for g in snap.gpus if g.up is False}


def _gpus(facts: Facts) -> tuple[GpuInfo, ...]:
    snap = facts.snapshot()
    if snap is not None and snap.layouts:
        return tuple(layout.gpu for layout in snap.layouts)
    return facts.driver.driver.gpus()


def _never_read(facts: Facts, read: Sequence[GpuInfo]) -> list[int]:
    """The GPUs the snapshot lists down that no layout was ever read of (lost before the
    agent started): a check over the GPUs read would pass them over in silence."""
    known = {gpu.index for gpu in read}
    return [i for i in _unanswering(facts.snapshot()) if i not in known]


def mig_capability(facts: Facts) -> Check:
    if not facts.driver.is_attached:
        return failed(M, "capability", "no NVML: MIG cannot be read or changed", NEEDS_NVML)
    capable = [g.index for g in _gpus(facts) if g.mig_capable]
    if not capable:
        return ok(M, "capability", "no MIG-capable GPU on this node")
    gpus = f"MIG-capable GPU(s) {', '.join(map(str, capable))}"
    if facts.simulated:
        return ok(M, "capability", f"{gpus} (simulated driver: no capability device needed)")
    config = facts.proc / "driver" / "nvidia" / "capabilities" / "mig" / "config"
    if facts.has_sys_admin() is False:
        return failed(
            M,
            "capability",
            f"{gpus}; the agent lacks CAP_SYS_ADMIN, which MIG changes need",
            "run the agent's container privileged: true (deploy/kubernetes does)",
        )
    if not config.exists():
        return failed(
            M,
            "capability",
            f"{gpus}; no MIG config capability at {config}",
            "mount the host's /proc/driver/nvidia and /dev/nvidia-caps into the agent pod",
        )
    if not Path("/dev/nvidia-caps").is_dir():
        return degraded(
            M,
            "capability",
            f"{gpus}; {config} present but no /dev/nvidia-caps",
            "nvidia-modprobe -f /proc/driver/nvidia/capabilities/mig/config, and mount "
            "/dev/nvidia-caps",
        )
    return ok(M, "capability", f"{gpus}; CAP_SYS_ADMIN and {config} present")


def mig_allocation_mode(facts: Facts) -> Check:
    allocation = facts.allocation()
    evidence = allocation.describe()
    if allocation.mode is AllocationMode.UNKNOWN:
        return failed(
            M,
            "allocation-mode",
            f"{evidence}: every MIG change is refused until the mode is known",
            "grant the agent list/watch on resourceslices.resource.k8s.io (deploy/kubernetes "
            "agent-rbac.yaml), or set dra.mode (GPU_AGENT_DRA__MODE=device-plugin)",
        )
    if allocation.mode is AllocationMode.DRA_DYNAMIC_MIG:
        return ok(M, "allocation-mode", f"{evidence}: the DRA driver makes MIG; the agent advises")
    return ok(M, "allocation-mode", evidence)


def mig_pending(facts: Facts) -> Check:
    if not facts.driver.is_attached:
        return failed(M, "pending", "no NVML: the MIG mode cannot be read", NEEDS_NVML)
    down = _unanswering(facts.snapshot())
    gpus = [g for g in _gpus(facts) if g.index not in down]
    pending = [g for g in gpus if g.mig_mode is not None and g.mig_mode.is_pending]
    unread = [f"GPU {i}: {why}" for i, why in sorted(down.items())]
    if not pending:
        if not unread:
            return ok(M, "pending", "no MIG mode change waits for a GPU reset")
        return degraded(
            M,
            "pending",
            "no MIG mode change waits for a GPU reset on the GPUs that answer; the MIG mode "
            f"of these cannot be read: {'; '.join(unread)}",
            "see telemetry/nvml and gpu-agent status",
        )
    reboot = facts.mig_reboot()  # as the apply found: the driver waits for a VM reboot
    vm = [g for g in pending if g.uuid in reboot]
    reset = [g for g in pending if g.uuid not in reboot]
    said = [f"MIG mode change pending until a GPU reset: {_modes(reset)}"] if reset else []
    if vm:
        said.append(
            "MIG mode change pending: the driver needs a reboot of this (passthrough) VM to "
            f"apply it: {_modes(vm)}"
        )
    said += [f"the MIG mode of these cannot be read: {'; '.join(unread)}"] if unread else []
    fixes = ["reboot this VM (no GPU reset applies the mode here)"] if vm else []
    if reset:
        fixes.append(
            "stop what holds the GPU (nvidia-persistenced, DCGM, workloads) and reset it "
            "(nvidia-smi -r -i INDEX), or reboot the node"
        )
    return degraded(M, "pending", "; ".join(said), "; ".join(fixes))


def _modes(gpus: Sequence[GpuInfo]) -> str:
    """``GPU 0 on, GPU 3 off``: each GPU and the MIG mode it waits for."""
    return ", ".join(
        f"GPU {g.index} {'on' if g.mig_mode and g.mig_mode.pending else 'off'}" for g in gpus
    )


def mig_journal(facts: Facts) -> Check:
    """A kept journal of an apply whose rollback failed: every MIG apply (and plan) is refused
    until a rollback succeeds, and the GPUs may be between layouts."""
    said = unrolled_said(facts.mig_unrolled())
    if said:
        return failed(M, "journal", said, UNROLLED_FIX)
    return ok(M, "journal", "no MIG apply is left to roll back")


def mig_operand_labels(facts: Facts) -> Check:
    mig = facts.config.mig
    if not mig.watch_node_label:
        return ok(M, "operand-labels", "off (mig.watch_node_label false): no nvidia.com/mig.config")
    if mig.config_file is None or not mig.config_file.is_file():
        return failed(
            M,
            "operand-labels",
            f"nvidia.com/mig.config is followed but mig.config_file {mig.config_file} is "
            "not a file",
            "mount the mig-parted config (the GPU Operator's default-mig-parted-config "
            "ConfigMap) and set mig.config_file to it",
        )
    if facts.kube is None:
        return failed(
            M,
            "operand-labels",
            "nvidia.com/mig.config is followed but there is no Kubernetes API",
            "run the agent in a pod with its service account, or set mig.watch_node_label false",
        )
    return ok(M, "operand-labels", f"following nvidia.com/mig.config with {mig.config_file}")


def power_limits(facts: Facts) -> Check:
    if not facts.driver.is_attached:
        return failed("power", "limits", "no NVML: power limits cannot be read", NEEDS_NVML)
    driver = facts.driver.driver
    ranges: dict[str, list[int]] = {}  # one line per distinct range: 8 alike GPUs, one line
    gpus = _gpus(facts)
    unread = [f"GPU {i}: lost before it was ever read" for i in _never_read(facts, gpus)]
    for gpu in gpus:
        try:
            limits = driver.power_limits(gpu.uuid)
        except AgentError as exc:  # said by index, as the rest: "GPU 3: GPU is lost"
            unread.append(f"GPU {gpu.index}: {str(exc).removeprefix(f'GPU {gpu.uuid}: ')}")
            continue
        text = (
            f"{limits.min_mw // 1000}-{limits.max_mw // 1000} W (set {limits.current_mw // 1000} W)"
        )
        ranges.setdefault(text, []).append(gpu.index)
    said = [f"GPU {', '.join(map(str, gpus))}: {text}" for text, gpus in ranges.items()]
    evidence = "; ".join(said + unread) or "no GPU"
    if unread:
        return degraded(
            "power",
            "limits",
            evidence,
            "power caps need the limits readable: nvidia-smi -q -d POWER shows what NVML says",
        )
    try:
        apart = facts.power_out_of_force()
    except AgentError as exc:
        apart = [f"the power spec's caps cannot be compared: {exc}"]
    if apart:
        return degraded(
            "power",
            "limits",
            "power spec not in force: " + "; ".join(apart),
            "the agent sets the spec's caps again at every driver check: where NVML refuses "
            "(the reason in brackets) grant it what it names; else another tool sets the limit "
            "(nvidia-smi -pl, a BMC): stop it, or make the spec agree",
        )
    return ok("power", "limits", evidence)


def health_xid(facts: Facts) -> Check:
    if not facts.driver.is_attached:
        return failed("health", "xid", "no NVML: XID events are not watched", NEEDS_NVML)
    counts: dict[int, int] = {}
    for (gpu, _instance, _xid), n in facts.xids().items():
        counts[gpu] = counts.get(gpu, 0) + n
    seen = ", ".join(f"GPU {g}: {n}" for g, n in sorted(counts.items())) or "none"
    # An instance's mark is the instance's only: named as `gpu-agent status` names it.
    marks = sorted(
        (
            (i, -1 if t.gpu_instance is None else t.gpu_instance, m, reason)
            for t, (i, m, reason) in facts.marks().items()
            if m.state.rank > 0
        ),
        key=lambda x: (x[0], x[1]),  # marks do not order: two may share a GPU index
    )
    evidence = f"XID events since the agent started: {seen}"
    unwatched = facts.xid_unwatched()
    if unwatched is not None:
        # No XID reaches the marks meanwhile: "healthy" would claim what nobody watched.
        evidence += f"; XID events are not watched: {unwatched}"
    snapshot = facts.snapshot()
    readings = snapshot.health if snapshot is not None else ()
    unread = sorted((r.gpu.index, r.unread) for r in readings if r.unread)
    if unread:
        # Nothing clears on readings that were not read: the marks hold, "healthy" is unchecked.
        evidence += "; " + "; ".join(f"health readings failing on GPU {i}: {w}" for i, w in unread)
    if not marks:
        if unwatched is not None:
            return degraded("health", "xid", evidence, XID_WATCH_FIX)
        if unread:
            return degraded("health", "xid", evidence, HEALTH_READ_FIX)
        return ok("health", "xid", f"{evidence}; every GPU healthy")
    worst = max(m.state.rank for _i, _gi, m, _r in marks)
    # A mark outlives a restart (health-marks.json): it may come from an XID before this start.
    said = "; ".join(
        f"GPU {i}{'' if gi < 0 else f' GPU instance {gi}'} {m.state.value}: {reason}"
        for i, gi, m, reason in marks
    )
    action = max((m.action for *_, m, _r in marks), key=action_rank)  # the strongest covers all
    make = failed if worst == State.FAILED.rank else degraded
    return make(
        "health",
        "xid",
        f"{evidence}; {said}",
        f"the mark's action: {action} (docs/health.md); gpu-agent status shows the marks",
    )


HEALTH_READ_FIX = (
    "the marks hold while a GPU's ECC, row-remap or clock readings fail (docs/health.md); "
    "a failure that lasts points at the driver (dmesg, nvidia-smi -q -d ECC,ROW_REMAPPER)"
)
XID_WATCH_FIX = (
    "the agent's log says why: a failing NVML event set is reopened on its own, a GPU lost "
    "when the agent started (or when it was registered) is registered once it answers; a "
    "failure that lasts points at the driver (dmesg, nvidia-smi)"
)
