"""Telemetry getters: memory, processes, utilisation, power, clocks, PCIe, NVLink and the like.

Values derive deterministically from the injected workloads (``activity.py``). GPU-wide getters
answer NOT_SUPPORTED on a MIG device handle; memory and process lists are per MIG device there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pynvml

from agent.gpu.models import GpuModel
from agent.gpu.sim import activity, lifecycle
from agent.gpu.sim.abi import OutArray, fail, index_arg, set_value, symbol, target, to_int
from agent.gpu.sim.state import Process

if TYPE_CHECKING:
    from agent.gpu.sim.driver import SimDriver, Target

MIB = 1 << 20
_NOT_ATTRIBUTABLE = 0xFFFFFFFF  # GI/CI id reported for processes when MIG is off
_ENGINE_SAMPLING_PERIOD_US = 167_000  # illustrative encoder/decoder sampling period
_BAR1_USED = 2 * MIB  # illustrative driver-internal BAR1 mappings


def processes_of(t: Target) -> list[Process]:
    """Processes a handle sees: the whole GPU, or one MIG device (GI and CI)."""
    procs = [p for p in t.node.processes if p.gpu == t.gpu.index]
    if t.gi is not None and t.ci is not None:
        gi_id, ci_id = t.gi.id, t.ci.id
        procs = [p for p in procs if p.gpu_instance == gi_id and p.compute_instance == ci_id]
    return procs


def memory(t: Target) -> tuple[int, int]:
    return lifecycle.memory(t.node, t.gpu, t.gi.id if t.gi is not None else None)


@symbol("nvmlDeviceGetMemoryInfo")
def memory_info(drv: SimDriver, handle: Any, ref: Any) -> None:
    total, used = memory(drv.device(handle))
    info = target(ref)
    info.total, info.used, info.free = total, used, total - used


@symbol("nvmlDeviceGetMemoryInfo_v2")
def memory_info_v2(drv: SimDriver, handle: Any, ref: Any) -> None:
    total, used = memory(drv.device(handle))
    info = target(ref)
    if getattr(info, "version", None) != pynvml.nvmlMemory_v2:
        raise fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    info.total, info.reserved, info.used, info.free = total, 0, used, total - used


def _running_processes(drv: SimDriver, handle: Any, count_ref: Any, infos: Any) -> None:
    t = drv.device(handle)
    procs = processes_of(t)
    count = target(count_ref)
    if infos is None or count.value < len(procs):
        count.value = len(procs)
        if procs:
            raise fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        return
    out = OutArray(infos)
    out.require(len(procs))
    mig = t.gpu.mig_current
    for i, p in enumerate(procs):
        out[i].pid = p.pid
        out[i].usedGpuMemory = p.used_memory_mib * MIB
        gi, ci = p.gpu_instance, p.compute_instance
        out[i].gpuInstanceId = gi if mig and gi is not None else _NOT_ATTRIBUTABLE
        out[i].computeInstanceId = ci if mig and ci is not None else _NOT_ATTRIBUTABLE
    count.value = len(procs)


def _no_processes(drv: SimDriver, handle: Any, count_ref: Any, infos: Any) -> None:
    drv.device(handle)
    target(count_ref).value = 0


symbol("nvmlDeviceGetComputeRunningProcesses_v3")(_running_processes)
symbol("nvmlDeviceGetComputeRunningProcesses_v2")(_running_processes)
# Every simulated process is a compute (CUDA) process.
symbol("nvmlDeviceGetGraphicsRunningProcesses_v3")(_no_processes)
symbol("nvmlDeviceGetGraphicsRunningProcesses_v2")(_no_processes)
symbol("nvmlDeviceGetMPSComputeRunningProcesses_v3")(_no_processes)
symbol("nvmlDeviceGetMPSComputeRunningProcesses_v2")(_no_processes)


@symbol("nvmlDeviceGetUtilizationRates")
def utilization_rates(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.physical(handle)
    if t.gpu.mig_current:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # telemetry.md §4: not on MIG-enabled GPUs
    rates = t.gpu.activity.rates
    util = target(ref)
    # No GR-engine field is injectable: "a kernel was running" is taken as SM activity.
    util.gpu = activity.percent(rates.get("sm_active", 0.0))
    util.memory = activity.percent(rates.get("dram_active", 0.0))


@symbol("nvmlDeviceGetTemperature")
def temperature(drv: SimDriver, handle: Any, sensor: Any, ref: Any) -> None:
    t = drv.physical(handle)
    if to_int(sensor) != pynvml.NVML_TEMPERATURE_GPU:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    set_value(ref, activity.temperature_c(t.gpu.activity.rates))


@symbol("nvmlDeviceGetTemperatureV")
def temperature_v(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.physical(handle)
    info = target(ref)
    if info.version != pynvml.nvmlTemperature_v1:
        raise fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    if info.sensorType != pynvml.NVML_TEMPERATURE_GPU:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    info.temperature = activity.temperature_c(t.gpu.activity.rates)


@symbol("nvmlDeviceGetPowerUsage")
def power_usage(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.physical(handle)
    set_value(ref, round(t.gpu.activity.rates.get(activity.POWER_MW, 0.0)))


@symbol("nvmlDeviceGetTotalEnergyConsumption")
def total_energy(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.physical(handle)
    totals = activity.totals_at(t.gpu.activity, drv.now())
    set_value(ref, int(totals.get(activity.POWER_MW, 0.0)))  # mW x s = mJ


def _clock_mhz(t: Target, clock_type: int, *, maximum: bool) -> int:
    rates = {} if maximum else t.gpu.activity.rates
    sm = t.model.max_sm_clock_mhz if maximum else activity.sm_clock_mhz(t.model, rates)
    if clock_type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
        return sm
    if clock_type == pynvml.NVML_CLOCK_MEM:
        return t.model.max_mem_clock_mhz  # HBM runs at its fixed clock
    if clock_type == pynvml.NVML_CLOCK_VIDEO:
        return activity.round_half_up(sm * 0.9)  # illustrative
    raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)


@symbol("nvmlDeviceGetClockInfo")
def clock_info(drv: SimDriver, handle: Any, clock_type: Any, ref: Any) -> None:
    set_value(ref, _clock_mhz(drv.physical(handle), to_int(clock_type), maximum=False))


@symbol("nvmlDeviceGetMaxClockInfo")
def max_clock_info(drv: SimDriver, handle: Any, clock_type: Any, ref: Any) -> None:
    set_value(ref, _clock_mhz(drv.physical(handle), to_int(clock_type), maximum=True))


def _clocks_event_reasons(drv: SimDriver, handle: Any, ref: Any) -> None:
    rates = drv.physical(handle).gpu.activity.rates
    idle = rates.get("sm_active", 0.0) == 0.0
    injected = drv.physical(handle).gpu.clock_event_reasons
    set_value(ref, (pynvml.nvmlClocksEventReasonGpuIdle if idle else 0) | injected)


symbol("nvmlDeviceGetCurrentClocksEventReasons")(_clocks_event_reasons)  # R535 and later
symbol("nvmlDeviceGetCurrentClocksThrottleReasons")(_clocks_event_reasons)  # the older name


@symbol("nvmlDeviceGetPcieThroughput")
def pcie_throughput(drv: SimDriver, handle: Any, counter: Any, ref: Any) -> None:
    rates = drv.physical(handle).gpu.activity.rates
    field = {
        pynvml.NVML_PCIE_UTIL_TX_BYTES: "pcie_tx_bytes_per_s",
        pynvml.NVML_PCIE_UTIL_RX_BYTES: "pcie_rx_bytes_per_s",
    }.get(to_int(counter))
    if field is None:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    # NVML's "KB/s" counts 1024-byte units (nvitop reads it as KiB/s, telemetry.md §4).
    set_value(ref, int(rates.get(field, 0.0) // 1024))


def _constant(value: int) -> Callable[..., None]:
    def getter(drv: SimDriver, handle: Any, ref: Any) -> None:
        drv.physical(handle)
        set_value(ref, value)

    return getter


symbol("nvmlDeviceGetPcieReplayCounter")(_constant(0))
symbol("nvmlDeviceGetPersistenceMode")(_constant(pynvml.NVML_FEATURE_ENABLED))
symbol("nvmlDeviceGetPerformanceState")(_constant(pynvml.NVML_PSTATE_0))
symbol("nvmlDeviceGetComputeMode")(_constant(pynvml.NVML_COMPUTEMODE_DEFAULT))
symbol("nvmlDeviceGetDisplayActive")(_constant(pynvml.NVML_FEATURE_DISABLED))
symbol("nvmlDeviceGetDisplayMode")(_constant(pynvml.NVML_FEATURE_DISABLED))


def _from_model(read: Callable[[GpuModel], int]) -> Callable[..., None]:
    def getter(drv: SimDriver, handle: Any, ref: Any) -> None:
        set_value(ref, read(drv.physical(handle).model))

    return getter


symbol("nvmlDeviceGetCurrPcieLinkGeneration")(_from_model(lambda m: m.pcie_generation))
symbol("nvmlDeviceGetMaxPcieLinkGeneration")(_from_model(lambda m: m.pcie_generation))
symbol("nvmlDeviceGetCurrPcieLinkWidth")(_from_model(lambda m: m.pcie_width))
symbol("nvmlDeviceGetMaxPcieLinkWidth")(_from_model(lambda m: m.pcie_width))


@symbol("nvmlDeviceGetFanSpeed")
def fan_speed(drv: SimDriver, handle: Any, ref: Any) -> None:
    drv.physical(handle)
    raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # passively cooled SXM / NVL boards


@symbol("nvmlDeviceGetRemappedRows")
def remapped_rows(drv: SimDriver, handle: Any, corr: Any, unc: Any, pend: Any, fail_: Any) -> None:
    t = drv.physical(handle)
    if t.gpu.mig_current and t.gpu.gpu_instances:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # telemetry.md §4
    remap = t.gpu.remap
    set_value(corr, remap.get("correctable", 0))
    set_value(unc, remap.get("uncorrectable", 0))
    set_value(pend, 1 if remap.get("pending", 0) else 0)
    set_value(fail_, remap.get("failure", 0))


def _engine_utilization(drv: SimDriver, handle: Any, util: Any, period: Any) -> None:
    drv.physical(handle)
    set_value(util, 0)  # no media workload is injectable
    set_value(period, _ENGINE_SAMPLING_PERIOD_US)


symbol("nvmlDeviceGetEncoderUtilization")(_engine_utilization)
symbol("nvmlDeviceGetDecoderUtilization")(_engine_utilization)


@symbol("nvmlDeviceGetEccMode")
def ecc_mode(drv: SimDriver, handle: Any, current: Any, pending: Any) -> None:
    drv.physical(handle)
    set_value(current, pynvml.NVML_FEATURE_ENABLED)
    set_value(pending, pynvml.NVML_FEATURE_ENABLED)


@symbol("nvmlDeviceGetTotalEccErrors")
def total_ecc_errors(drv: SimDriver, handle: Any, error_type: Any, counter: Any, ref: Any) -> None:
    t = drv.device(handle)  # nvidia-smi shows ECC counts per MIG device too
    if to_int(error_type) >= pynvml.NVML_MEMORY_ERROR_TYPE_COUNT:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if to_int(counter) >= pynvml.NVML_ECC_COUNTER_TYPE_COUNT:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    kind = "sbe" if to_int(error_type) == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "dbe"
    span = "volatile" if to_int(counter) == pynvml.NVML_VOLATILE_ECC else "aggregate"
    set_value(ref, t.gpu.ecc.get(f"{kind}_{span}", 0))


@symbol("nvmlDeviceGetBAR1MemoryInfo")
def bar1_memory_info(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.device(handle)
    # BAR1 is the power of two at or above the framebuffer (64 GiB on A100-40GB, 128 on 80GB).
    total = 1 << (t.model.memory_total_bytes - 1).bit_length()
    used = _BAR1_USED
    if t.gi is not None:
        # A MIG device gets its GI's memory-slice share less 1 MiB, unused: nvidia-smi shows
        # "0MiB / 8191MiB" for a 1g on A100-40GB and on A30 (mig.md §1.3 sources).
        total = total * t.gi.size // t.model.memory_slices - MIB
        used = 0
    info = target(ref)
    info.bar1Total, info.bar1Used, info.bar1Free = total, used, total - used


@symbol("nvmlDeviceGetNvLinkState")
def nvlink_state(drv: SimDriver, handle: Any, link: Any, ref: Any) -> None:
    t = drv.physical(handle)
    n = index_arg(link, pynvml.NVML_NVLINK_MAX_LINKS)
    if n >= t.model.nvlink_links:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    set_value(ref, pynvml.NVML_FEATURE_ENABLED)


@symbol("nvmlDeviceGetProcessUtilization")
def process_utilization(
    drv: SimDriver, handle: Any, samples: Any, count_ref: Any, since: Any
) -> None:
    t = drv.physical(handle)
    to_int(since)
    if t.gpu.mig_current:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # telemetry.md §4: not on MIG
    procs = processes_of(t)
    if not procs:
        raise fail(pynvml.NVML_ERROR_NOT_FOUND)  # no samples in the window
    count = target(count_ref)
    if samples is None or count.value < len(procs):
        count.value = len(procs)
        raise fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    out = OutArray(samples)
    out.require(len(procs))
    rates = t.gpu.activity.rates
    # The GPU's activity shared evenly among its processes.
    sm = activity.percent(rates.get("sm_active", 0.0) / len(procs))
    mem = activity.percent(rates.get("dram_active", 0.0) / len(procs))
    stamp = int(time.time() * 1_000_000)  # NVML stamps samples in CPU-clock microseconds
    for i, p in enumerate(procs):
        out[i].pid, out[i].timeStamp = p.pid, stamp
        out[i].smUtil, out[i].memUtil, out[i].encUtil, out[i].decUtil = sm, mem, 0, 0
    count.value = len(procs)


def _driver_model(drv: SimDriver, handle: Any, current: Any, pending: Any) -> None:
    drv.physical(handle)
    raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # WDDM/TCC driver models exist on Windows only


symbol("nvmlDeviceGetDriverModel_v2")(_driver_model)
symbol("nvmlDeviceGetDriverModel")(_driver_model)
