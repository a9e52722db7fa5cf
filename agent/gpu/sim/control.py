"""``SimControl``: what tests and ``gpu-agent sim ...`` do to the simulated node from outside NVML.

It works on the same state file as the driver, so changes show up in every process that has the
node open. Bad input raises agent errors naming the field and changes nothing.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pynvml

from agent.errors import Busy, Conflict, DeviceLost, FieldViolation, InvalidSpec, NotFound
from agent.gpu.models import profile_name
from agent.gpu.sim import activity, faults, generations, layout, lifecycle
from agent.gpu.sim.activity import RATIOS
from agent.gpu.sim.lifecycle import model_of
from agent.gpu.sim.state import Gpu, GpuInstance, NodeState, Process, XidEvent
from agent.gpu.sim.store import StateStore
from agent.pidns import NODE_PID_NAMESPACE

MIB = 1 << 20
XID_GPU_FALLEN_OFF_BUS = 79  # what the driver reports when a GPU drops off the bus
_MAX_QUEUED_EVENTS = 1024
#: NVML's pid field is 32-bit: a larger pid comes back cut. Above the kernel's pid_max is
#: allowed: a simulated-only process no host tool finds (tests/integration/test_nvitop_on_sim.py).
MAX_PID = (1 << 32) - 1
#: the kernel driver's XID is 32-bit (NvU32): no event carries a larger one
MAX_XID = (1 << 32) - 1
#: NVML's ECC error counters are 64-bit, its remapped-row counts 32-bit: past these they wrap
MAX_ECC_COUNT = (1 << 64) - 1
MAX_REMAPPED_ROWS = (1 << 32) - 1
#: the nvmlClocksEventReason* bits a test or `gpu-agent sim clocks` may hold (GPU idle is the
#: simulator's own), by the names dcgm-exporter's clock_event label uses
CLOCK_REASONS = {
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}


def missing_node(state_dir: Path) -> InvalidSpec:
    return InvalidSpec(
        f"no simulated node in {state_dir}; pass --simulate PRESET to create one",
        [FieldViolation("simulate", "required: no simulated node exists in this state dir yet")],
    )


#: the kernel's boot id, below the /proc look-alike (agent/health/boot.py reads it there)
_BOOT_ID = Path("sys/kernel/random/boot_id")
#: the agent's PID namespace, below the /proc look-alike (agent/pidns.py reads it there)
_PID_NAMESPACE = Path("self/ns/pid")


class SimControl:
    def __init__(self, state_dir: Path) -> None:
        self._store = StateStore(state_dir)
        if not self._store.exists():
            raise missing_node(state_dir)
        self._proc_root = self._store.root / "proc"
        if not (self._proc_root / _BOOT_ID).exists():
            self._new_boot_id()

    @property
    def proc_root(self) -> Path:
        """A /proc look-alike holding ``<pid>/cgroup`` and ``<pid>/comm`` of simulated processes,
        and ``self/ns/pid`` naming the node's PID namespace: the agent has hostPID, as the
        DaemonSet runs it, unless a test links it elsewhere (agent/pidns.py)."""
        return self._proc_root

    def describe(self) -> dict[str, Any]:
        node = self._store.read()
        return {
            "preset": node.preset,
            "driver_version": node.driver_version,
            "cuda_driver_version": node.cuda_driver_version,
            "passthrough_vm": node.passthrough_vm,
            "boot_id": node.boot_id,
            "driver_loaded": not node.driver_missing(time.time()),
            "gpus": [_describe_gpu(g) for g in node.gpus],
            "processes": [asdict(p) for p in node.processes],
            "faults": [
                {**asdict(f), "error": pynvml.nvmlExceptionClass(f.code).__name__}
                for f in node.faults
            ],
            "pending_xids": [asdict(e) for e in node.events],
        }

    # --- workloads ---------------------------------------------------------------------------

    def set_workload(
        self,
        gpu: int,
        *,
        gpu_instance: int | None = None,
        sm_active: float = 0.0,
        sm_occupancy: float = 0.0,
        tensor_active: float = 0.0,
        fp64_active: float = 0.0,
        fp32_active: float = 0.0,
        fp16_active: float = 0.0,
        dram_active: float = 0.0,
        pcie_tx_bytes_per_s: float = 0.0,
        pcie_rx_bytes_per_s: float = 0.0,
        nvlink_tx_bytes_per_s: float = 0.0,
        nvlink_rx_bytes_per_s: float = 0.0,
    ) -> None:
        values = activity.validate(
            {
                "sm_active": sm_active,
                "sm_occupancy": sm_occupancy,
                "tensor_active": tensor_active,
                "fp64_active": fp64_active,
                "fp32_active": fp32_active,
                "fp16_active": fp16_active,
                "dram_active": dram_active,
                "pcie_tx_bytes_per_s": pcie_tx_bytes_per_s,
                "pcie_rx_bytes_per_s": pcie_rx_bytes_per_s,
                "nvlink_tx_bytes_per_s": nvlink_tx_bytes_per_s,
                "nvlink_rx_bytes_per_s": nvlink_rx_bytes_per_s,
            }
        )
        self._put_workload(gpu, gpu_instance, values)

    def clear_workload(self, gpu: int, *, gpu_instance: int | None = None) -> None:
        self._put_workload(gpu, gpu_instance, {})

    def _put_workload(self, gpu: int, gpu_instance: int | None, values: dict[str, float]) -> None:
        with self._store.transaction() as node:
            g = _gpu(node, gpu)
            if gpu_instance is None:
                ratios = sorted(n for n in values if n in RATIOS)
                if g.mig_current and ratios:
                    raise InvalidSpec(
                        f"GPU {gpu} has MIG enabled: set {', '.join(ratios)} per gpu_instance; "
                        "a GPU-level workload carries PCIe/NVLink traffic only",
                        [FieldViolation(n, "set per gpu_instance on a MIG GPU") for n in ratios],
                    )
                g.workload = values
            else:
                gi = _mig_instance(g, gpu_instance)
                if values and not gi.compute_instances:
                    raise InvalidSpec(
                        f"GPU {gpu} instance {gpu_instance} has no compute instance to run on",
                        [FieldViolation("gpu_instance", "needs a compute instance")],
                    )
                gi.workload = values
            activity.refresh(g, model_of(g), time.monotonic())

    # --- processes ---------------------------------------------------------------------------

    def start_process(
        self,
        pid: int,
        gpu: int,
        *,
        used_memory_mib: int,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
        cgroup: str | None = None,
        name: str = "python",
    ) -> None:
        if not 0 < pid <= MAX_PID:
            raise InvalidSpec(
                f"pid must be 1..{MAX_PID} (NVML's pid field is 32-bit), got {pid}",
                [FieldViolation("pid", f"1..{MAX_PID}")],
            )
        if used_memory_mib < 0:
            raise InvalidSpec(
                f"used_memory_mib must be >= 0, got {used_memory_mib}",
                [FieldViolation("used_memory_mib", "must be >= 0")],
            )
        with self._store.transaction() as node:
            g = _gpu(node, gpu)
            if g.lost:
                raise DeviceLost(f"GPU {gpu} is lost; nothing can start on it")
            if any(p.pid == pid for p in node.processes):
                raise Conflict(f"pid {pid} is already running on the simulated node")
            gi_id, ci_id = _placement_of_process(g, gpu_instance, compute_instance)
            total, used = lifecycle.memory(node, g, gi_id)
            if used + used_memory_mib * MIB > total:
                free = (total - used) // MIB
                raise InvalidSpec(
                    f"used_memory_mib {used_memory_mib} exceeds the {free} MiB free there",
                    [FieldViolation("used_memory_mib", f"must be <= {free}")],
                )
            node.processes.append(Process(pid, gpu, gi_id, ci_id, used_memory_mib, name, cgroup))
        self._write_proc(pid, name, cgroup)

    def stop_process(self, pid: int) -> None:
        with self._store.transaction() as node:
            if not any(p.pid == pid for p in node.processes):
                raise NotFound(f"no simulated process with pid {pid}")
            node.processes = [p for p in node.processes if p.pid != pid]
        shutil.rmtree(self._proc_root / str(pid), ignore_errors=True)

    def _write_proc(self, pid: int, name: str, cgroup: str | None) -> None:
        directory = self._proc_root / str(pid)
        directory.mkdir(parents=True, exist_ok=True)
        # A process outside any pod sits in the root cgroup.
        for filename, text in (("cgroup", cgroup or "0::/"), ("comm", name)):
            tmp = directory / f".{filename}.tmp"
            tmp.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
            os.replace(tmp, directory / filename)

    # --- GPU holders, VM, faults -------------------------------------------------------------

    def add_holder(self, gpu: int, name: str) -> None:
        if not name:
            raise InvalidSpec("holder name is empty", [FieldViolation("name", "required")])
        with self._store.transaction() as node:
            g = _gpu(node, gpu)
            if name not in g.holders:
                g.holders.append(name)

    def remove_holder(self, gpu: int, name: str) -> None:
        with self._store.transaction() as node:
            g = _gpu(node, gpu)
            if name not in g.holders:
                raise NotFound(f"GPU {gpu} has no holder {name!r} (holders: {g.holders})")
            g.holders.remove(name)

    def set_passthrough_vm(self, enabled: bool) -> None:
        with self._store.transaction() as node:
            node.passthrough_vm = enabled

    def inject_fault(
        self,
        function: str,
        error: str | int,
        *,
        nth: int = 1,
        gpu: int | None = None,
        count: int = 1,
    ) -> None:
        name = faults.check_function(function)
        code = faults.error_code(error)
        with self._store.transaction() as node:
            if gpu is not None:
                _gpu(node, gpu)  # a GPU the node lacks: NotFound (exit 3), as every sim command
            faults.arm(node, name, code, nth=nth, count=count, gpu=gpu)

    def clear_faults(self) -> None:
        with self._store.transaction() as node:
            node.faults.clear()

    def hold(self, function: str) -> None:
        """Every call of pynvml ``function`` blocks, in any process, until `release`: a test
        sees what the agent does while such a call is in progress."""
        name = faults.check_function(function)
        with self._store.transaction() as node:
            node.held = sorted({*node.held, name})

    def release(self, function: str) -> None:
        """The held calls of ``function`` go on (each reads the state then), new ones too."""
        name = faults.check_function(function)
        with self._store.transaction() as node:
            node.held = [n for n in node.held if n != name]

    # --- failures, reset, reboot -------------------------------------------------------------

    def mark_lost(self, gpu: int) -> None:
        with self._store.transaction() as node:
            g = _gpu(node, gpu)
            if not g.lost:
                g.lost = True
                _queue_xid(node, gpu, XID_GPU_FALLEN_OFF_BUS)

    def raise_xid(self, gpu: int, xid: int, *, gpu_instance: int | None = None) -> None:
        """Queue XID ``xid`` on ``gpu``; with ``gpu_instance``, attributed to that MIG GPU
        instance as the driver does for faults inside one (the event's gpuInstanceId)."""
        if not 0 < xid <= MAX_XID:
            raise InvalidSpec(
                f"xid must be 1..{MAX_XID} (the driver's XID is 32-bit), got {xid}",
                [FieldViolation("xid", f"1..{MAX_XID}")],
            )
        with self._store.transaction() as node:
            g = _gpu(node, gpu)
            if gpu_instance is not None:
                _mig_instance(g, gpu_instance)
            _queue_xid(node, gpu, xid, gpu_instance)

    def memory_errors(
        self, gpu: int, *, sbe: int = 0, dbe: int = 0, remap_failure: bool = False
    ) -> None:
        """ECC errors on ``gpu``: ``sbe`` corrected and ``dbe`` uncorrected (volatile and
        aggregate counts). Each uncorrected error records a row remap that
        is pending until the next reset; ``remap_failure``: a remap found no spare row."""
        if sbe < 0 or dbe < 0:
            raise InvalidSpec(
                f"sbe and dbe must be >= 0, got {sbe} and {dbe}",
                [FieldViolation("sbe" if sbe < 0 else "dbe", "a count >= 0")],
            )
        with self._store.transaction() as node:
            g = _gpu(node, gpu)
            _refuse_wrapping_counts(g, sbe, dbe)
            for kind, count in (("sbe", sbe), ("dbe", dbe)):
                for span in ("volatile", "aggregate"):
                    key = f"{kind}_{span}"
                    g.ecc[key] = g.ecc.get(key, 0) + count
            if dbe:  # every simulated model is Ampere or later: row remapping, not page retirement
                g.remap["pending"] = g.remap.get("pending", 0) + dbe
            if remap_failure:
                g.remap["failure"] = 1

    def write_power_limit(self, gpu: int, watts: float | None) -> None:
        """Another writer of ``gpu``'s power limit on the host (a site power manager, a loop
        of `nvidia-smi -pl`): it sets ``watts`` now and again right after every set, so a set
        succeeds and the driver then holds ``watts``. None: the writer stops (the limit
        stays). Like any writer it can only set a limit inside the GPU's range."""
        with self._store.transaction() as node:
            g = _gpu(node, gpu)
            if watts is None:
                g.power_limit_writer_mw = None
                return
            model = model_of(g)
            # The range first: round() of nan or of an overflowing inf raises, and nan compares
            # with nothing.
            if not model.min_power_limit_w <= watts <= model.power_limit_w:
                raise InvalidSpec(
                    f"watts must be {model.min_power_limit_w}..{model.power_limit_w} "
                    f"(GPU {gpu}'s range), got {watts:g}",
                    [FieldViolation("watts", f"{model.min_power_limit_w}..{model.power_limit_w}")],
                )
            milliwatts = round(watts * 1000)
            activity.refresh(g, model, time.monotonic())  # energy so far at the old limit
            g.power_limit_writer_mw = milliwatts
            activity.set_power_limit(g, model, milliwatts)
            activity.refresh(g, model, time.monotonic())

    def hold_clocks(self, gpu: int, reasons: Sequence[str]) -> None:
        """Hold ``gpu``'s clocks down for ``reasons`` (`CLOCK_REASONS` names; none clears
        them), as nvmlDeviceGetCurrentClocksEventReasons then reports; GPU idle is the
        simulator's own and is added when nothing runs."""
        unknown = [r for r in reasons if r not in CLOCK_REASONS]
        if unknown:
            raise InvalidSpec(
                f"unknown clock reason(s) {', '.join(unknown)}; allowed: "
                + ", ".join(CLOCK_REASONS),
                [FieldViolation("reasons", "one of " + ", ".join(CLOCK_REASONS))],
            )
        mask = 0
        for reason in reasons:
            mask |= CLOCK_REASONS[reason]
        with self._store.transaction() as node:
            _gpu(node, gpu).clock_event_reasons = mask

    def reset_gpu(self, gpu: int) -> None:
        with self._store.transaction() as node:
            g = _gpu(node, gpu)
            if g.lost:
                raise DeviceLost(f"GPU {gpu} is lost; a reset cannot reach it (reboot the node)")
            in_the_way = lifecycle.blockers(node, g)
            if in_the_way:
                raise Busy(f"GPU {gpu} is in use: {', '.join(in_the_way)}", in_the_way)
            lifecycle.reset_gpu(node, g, time.monotonic())

    def reboot(self) -> None:
        with self._store.transaction() as node:
            lifecycle.reboot(node, time.monotonic())
        self._new_boot_id()

    def _new_boot_id(self) -> None:
        """A new boot: the /proc look-alike starts empty (no process survives) but for the
        kernel's random boot id, as the host's reads (a driver reload keeps it), and the
        agent's PID namespace, the node's."""
        shutil.rmtree(self._proc_root, ignore_errors=True)
        path = self._proc_root / _BOOT_ID
        path.parent.mkdir(parents=True)
        path.write_text(f"{uuid.uuid4()}\n", encoding="ascii")
        (self._proc_root / _PID_NAMESPACE).parent.mkdir(parents=True)
        (self._proc_root / _PID_NAMESPACE).symlink_to(NODE_PID_NAMESPACE)

    def driver_absent(self, for_s: float | None = None) -> None:
        """Unload the driver: for ``for_s`` seconds, or until :meth:`driver_present`.

        A process that has not loaded the library yet gets LIBRARY_NOT_FOUND from pynvml
        (no libnvidia-ml.so.1, as on a GPU Operator node before its driver container); one that
        has gets DRIVER_NOT_LOADED from every call. Unloading the kernel module ends what it
        held, as a reboot does: GPU and compute instances and processes are gone, the MIG mode
        stays.
        """
        if for_s is not None and not for_s > 0:
            raise InvalidSpec(
                f"for must be > 0 seconds, got {for_s}",
                [FieldViolation("for", "seconds > 0, or omitted: until driver-present")],
            )
        with self._store.transaction() as node:
            node.driver_absent = True
            node.driver_absent_until = None if for_s is None else time.time() + for_s
            lifecycle.reboot(node, time.monotonic())
        for entry in self._proc_root.iterdir():  # the processes end; the boot id stays
            if entry.name.isdigit():
                shutil.rmtree(entry, ignore_errors=True)

    def driver_present(self) -> None:
        """Load the driver again (ends :meth:`driver_absent` before its time)."""
        with self._store.transaction() as node:
            node.driver_absent = False
            node.driver_absent_until = None

    def install_driver(self, version: str) -> None:
        """Install driver ``version`` and reboot, as an administrator would.

        The version decides which NVML symbols exist (``generations.py``). A process that already
        loaded the library keeps the symbols it resolved, so restart NVML clients afterwards.
        """
        with self._store.transaction() as node:
            generations.check_supported(
                version, {g.model: model_of(g).min_driver_version for g in node.gpus}
            )
            node.driver_version = version
            node.cuda_driver_version = generations.cuda_driver_version(version)
            lifecycle.reboot(node, time.monotonic())
        self._new_boot_id()


def _refuse_wrapping_counts(g: Gpu, sbe: int, dbe: int) -> None:
    """ECC errors that would pass NVML's counters (the driver's counts would wrap, and the agent
    read 0) are refused, naming the field; the aggregate count is never below the volatile."""
    bad = [
        FieldViolation(kind, f"at most {room} more: NVML's ECC error counters are 64-bit")
        for kind, count in (("sbe", sbe), ("dbe", dbe))
        if count > (room := max(0, MAX_ECC_COUNT - g.ecc.get(f"{kind}_aggregate", 0)))
    ]
    # Pending rows join the uncorrectable count NVML reports at the next reset.
    rows = g.remap.get("uncorrectable", 0) + g.remap.get("pending", 0)
    room = max(0, MAX_REMAPPED_ROWS - rows)
    if not bad and dbe > room:
        bad.append(
            FieldViolation("dbe", f"at most {room} more: NVML counts remapped rows in 32 bits")
        )
    if bad:
        raise InvalidSpec(
            "ECC errors past NVML's counters: " + "; ".join(map(str, bad)),
            bad,
        )


def _gpu(node: NodeState, index: int) -> Gpu:
    if not 0 <= index < len(node.gpus):
        raise NotFound(f"GPU {index} does not exist; the node has GPUs 0..{len(node.gpus) - 1}")
    return node.gpus[index]


def _mig_instance(g: Gpu, gpu_instance: int) -> GpuInstance:
    if not g.mig_current:
        raise InvalidSpec(
            f"GPU {g.index} has MIG disabled; gpu_instance must be omitted",
            [FieldViolation("gpu_instance", "only on a MIG-enabled GPU")],
        )
    gi = g.gpu_instance(gpu_instance)
    if gi is None:
        ids = sorted(x.id for x in g.gpu_instances)
        raise NotFound(f"GPU {g.index} has no GPU instance {gpu_instance} (has {ids})")
    return gi


def _placement_of_process(
    g: Gpu, gpu_instance: int | None, compute_instance: int | None
) -> tuple[int | None, int | None]:
    if not g.mig_current:
        if gpu_instance is not None or compute_instance is not None:
            raise InvalidSpec(
                f"GPU {g.index} has MIG disabled; gpu_instance/compute_instance must be omitted",
                [FieldViolation("gpu_instance", "only on a MIG-enabled GPU")],
            )
        return None, None
    if gpu_instance is None:
        raise InvalidSpec(
            f"GPU {g.index} has MIG enabled; a process runs on a MIG device: pass gpu_instance",
            [FieldViolation("gpu_instance", "required on a MIG-enabled GPU")],
        )
    gi = _mig_instance(g, gpu_instance)
    if not gi.compute_instances:
        raise InvalidSpec(
            f"GPU {g.index} instance {gpu_instance} has no compute instance, so no MIG device",
            [FieldViolation("gpu_instance", "needs a compute instance")],
        )
    if compute_instance is None:
        return gi.id, min(c.id for c in gi.compute_instances)
    if gi.compute_instance(compute_instance) is None:
        raise NotFound(f"GPU {g.index} instance {gi.id} has no compute instance {compute_instance}")
    return gi.id, compute_instance


def _queue_xid(node: NodeState, gpu: int, xid: int, gpu_instance: int | None = None) -> None:
    node.events.append(XidEvent(node.next_event_seq, gpu, xid, gpu_instance))
    node.next_event_seq += 1
    del node.events[:-_MAX_QUEUED_EVENTS]


def _describe_gpu(g: Gpu) -> dict[str, Any]:
    model = model_of(g)
    instances = []
    for gi in sorted(g.gpu_instances, key=lambda x: x.id):
        spec = layout.gi_spec(model, gi)
        instances.append(
            {
                "id": gi.id,
                "profile_id": gi.profile_id,
                "profile": profile_name(model, spec),
                "placement": {"start": gi.start, "size": gi.size},
                "workload": dict(gi.workload),
                "compute_instances": [
                    {
                        "id": ci.id,
                        "profile_id": ci.profile_id,
                        "profile": profile_name(model, spec, ci.size),
                        "placement": {"start": ci.start, "size": ci.size},
                        "uuid": ci.uuid,
                    }
                    for ci in sorted(gi.compute_instances, key=lambda x: x.id)
                ],
            }
        )
    return {
        "index": g.index,
        "model": g.model,
        "name": model.name,
        "uuid": g.uuid,
        "pci_bus_id": g.pci_bus_id,
        "lost": g.lost,
        "holders": list(g.holders),
        "mig": {"current": g.mig_current, "pending": g.mig_pending},
        "power_limit_w": activity.power_limit_mw(g, model) / 1000,
        "workload": dict(g.workload),
        "gpu_instances": instances,
    }
