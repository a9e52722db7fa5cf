"""What holds a GPU, and what a GPU reset, a MIG mode change and a node reboot do to it.

The rule (ARCHITECTURE.md, "The simulated driver"): ``nvmlDeviceSetMigMode`` records the
requested mode as pending and makes the driver try a GPU reset itself. The reset, and with it the
mode change, happens at once unless something is in the way:

* a process on the GPU, a daemon holding it (nvidia-persistenced, DCGM), or GPU instances when
  disabling MIG -> activation status IN_USE; the mode stays pending until a reset succeeds;
* a passthrough VM, on Ampere -> RESET_REQUIRED; the mode stays pending until the VM reboots.
  Hopper and later switch inside a passthrough VM like on bare metal.

A reset (``nvidia-smi -r``) destroys every GPU and compute instance; a reboot also ends every
process, brings lost GPUs back, releases holders and puts power limits back to their default.
Only the MIG mode survives both.
"""

from __future__ import annotations

import pynvml

from agent.gpu.models import MODELS, GpuModel
from agent.gpu.sim import activity
from agent.gpu.sim.state import Activity, Gpu, NodeState

MIB = 1 << 20


def model_of(gpu: Gpu) -> GpuModel:
    return MODELS[gpu.model]


def blockers(node: NodeState, gpu: Gpu) -> list[str]:
    """What keeps the GPU from being reset: its processes and holder daemons."""
    pids = [f"pid {p.pid}" for p in node.processes if p.gpu == gpu.index]
    return pids + [f"holder {h}" for h in gpu.holders]


def memory(node: NodeState, gpu: Gpu, gi_id: int | None) -> tuple[int, int]:
    """(total, used) bytes of the GPU, or of one GI (its CIs share its memory); used is the sum
    of the processes' memory."""
    procs = [p for p in node.processes if p.gpu == gpu.index]
    model = model_of(gpu)
    if gi_id is None:
        return model.memory_total_bytes, sum(p.used_memory_mib for p in procs) * MIB
    gi = gpu.gpu_instance(gi_id)
    spec = model.gi_profile_by_id(gi.profile_id) if gi is not None else None
    used = sum(p.used_memory_mib for p in procs if p.gpu_instance == gi_id) * MIB
    return (spec.memory_mb * MIB if spec else 0), used


def set_mig_mode(node: NodeState, gpu: Gpu, enabled: bool, now: float) -> int:
    """Request a MIG mode; return the activation status NVML reports."""
    gpu.mig_pending = enabled
    if gpu.mig_current == enabled:
        return pynvml.NVML_SUCCESS
    if blockers(node, gpu) or (not enabled and gpu.gpu_instances):
        return pynvml.NVML_ERROR_IN_USE
    if _reboot_needed(node, gpu):
        return pynvml.NVML_ERROR_RESET_REQUIRED
    _reset(gpu, now)
    return pynvml.NVML_SUCCESS


def reset_gpu(node: NodeState, gpu: Gpu, now: float) -> None:
    """``nvidia-smi -r``: the caller has checked ``blockers``. Applies a pending mode unless
    only a VM reboot can."""
    _reset(gpu, now, apply_pending=not _reboot_needed(node, gpu))


def boot(node: NodeState, now: float) -> None:
    """The driver loads: counters start from zero and idle power is drawn from ``now``."""
    for gpu in node.gpus:
        gpu.activity = Activity(since=now)
        activity.refresh(gpu, model_of(gpu), now)


def reboot(node: NodeState, now: float) -> None:
    node.boot_id += 1
    node.processes.clear()
    node.events.clear()
    for gpu in node.gpus:
        gpu.lost = False
        gpu.holders.clear()
        gpu.power_limit_mw = None  # power limits do not survive the driver
        gpu.power_limit_writer_mw = None  # nor does a process that wrote them
        _reset(gpu, now)
    boot(node, now)


def _reboot_needed(node: NodeState, gpu: Gpu) -> bool:
    return node.passthrough_vm and model_of(gpu).architecture == "ampere"


def _reset(gpu: Gpu, now: float, *, apply_pending: bool = True) -> None:
    model = model_of(gpu)
    activity.refresh(gpu, model, now)  # fold counters under the old workloads first
    gpu.gpu_instances.clear()
    gpu.workload.clear()
    # Volatile ECC counts start again; pending row remaps take effect (NVIDIA's row-remapping
    # rules: a remap recorded after an uncorrectable error is applied at the next reset).
    for kind in ("sbe_volatile", "dbe_volatile"):
        gpu.ecc.pop(kind, None)
    pending = gpu.remap.pop("pending", 0)
    if pending:
        gpu.remap["uncorrectable"] = gpu.remap.get("uncorrectable", 0) + pending
    if apply_pending:
        gpu.mig_current = gpu.mig_pending
    activity.refresh(gpu, model, now)
