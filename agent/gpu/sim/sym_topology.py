"""Topology symbols: P2P status and NVLink capabilities between the preset's GPUs, CPU and memory
affinity from the preset's NUMA layout, and the device lookups and getters pynvml's own tests
call (handle by serial, process names, power state, temperature thresholds).

P2P over NVLink follows the preset's NVLink topology (``Preset.nvlink_peers``). Pairs without
NVLink are modelled without PCIe P2P either (NOT_SUPPORTED): the real answer depends on the
board's PCIe switches and the chipset, which the presets do not describe.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml

from agent.gpu.sim.abi import (
    fail,
    index_arg,
    set_handle,
    set_value,
    symbol,
    target,
    to_bytes,
    to_int,
    write_string,
)
from agent.gpu.sim.presets import Preset, get_preset
from agent.gpu.sim.sym_device import device_handle_where

if TYPE_CHECKING:
    from agent.gpu.sim.driver import SimDriver, Target

_P2P_INDEXES = (
    pynvml.NVML_P2P_CAPS_INDEX_READ,
    pynvml.NVML_P2P_CAPS_INDEX_WRITE,
    pynvml.NVML_P2P_CAPS_INDEX_NVLINK,
    pynvml.NVML_P2P_CAPS_INDEX_ATOMICS,
    pynvml.NVML_P2P_CAPS_INDEX_PROP,
)
#: datacenter boards' thresholds (nvidia-smi -q "Temperature" section), by architecture:
#: shutdown, slowdown, memory max operating, GPU max operating
_THRESHOLDS = {
    "ampere": (92, 89, 95, 85),
    "hopper": (92, 89, 95, 87),
    "blackwell": (92, 89, 95, 87),
}


def _preset(t: Target) -> Preset:
    return get_preset(t.node.preset)


@symbol("nvmlDeviceGetP2PStatus")
def p2p_status(drv: SimDriver, device1: Any, device2: Any, index: Any, ref: Any) -> None:
    a, b = drv.physical(device1), drv.physical(device2)
    i = to_int(index)
    if a.gpu.index == b.gpu.index:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if i not in _P2P_INDEXES:
        set_value(ref, pynvml.NVML_P2P_STATUS_UNKNOWN)
        return
    linked = _preset(a).nvlink_peers(a.gpu.index, b.gpu.index)
    set_value(ref, pynvml.NVML_P2P_STATUS_OK if linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)


@symbol("nvmlDeviceGetNvLinkCapability")
def nvlink_capability(drv: SimDriver, handle: Any, link: Any, capability: Any, ref: Any) -> None:
    t = drv.physical(handle)
    n, cap = index_arg(link, pynvml.NVML_NVLINK_MAX_LINKS), to_int(capability)
    if n >= t.model.nvlink_links:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    preset = _preset(t)
    peers = any(preset.nvlink_peers(t.gpu.index, o.index) for o in t.node.gpus)
    answers = {
        pynvml.NVML_NVLINK_CAP_P2P_SUPPORTED: peers,
        pynvml.NVML_NVLINK_CAP_SYSMEM_ACCESS: False,
        pynvml.NVML_NVLINK_CAP_P2P_ATOMICS: peers,
        pynvml.NVML_NVLINK_CAP_SYSMEM_ATOMICS: False,
        pynvml.NVML_NVLINK_CAP_SLI_BRIDGE: False,
        pynvml.NVML_NVLINK_CAP_VALID: peers,
    }
    if cap not in answers:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    set_value(ref, int(answers[cap]))


def _write_mask(size: Any, ref: Any, bits: list[int]) -> None:
    words = to_int(size)
    out = target(ref)
    if words <= 0:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    for w in range(min(words, len(out))):
        out[w] = 0
    for bit in bits:
        if bit // 64 < min(words, len(out)):
            out[bit // 64] |= 1 << (bit % 64)


def _scope(scope: Any) -> int:
    s = to_int(scope)
    if s not in (pynvml.NVML_AFFINITY_SCOPE_NODE, pynvml.NVML_AFFINITY_SCOPE_SOCKET):
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return s


def _numa_nodes(t: Target, scope: int) -> list[int]:
    host = _preset(t).host
    node = host.numa_of(t.gpu.index, len(t.node.gpus))
    return host.socket_numa(node) if scope == pynvml.NVML_AFFINITY_SCOPE_SOCKET else [node]


@symbol("nvmlDeviceGetCpuAffinityWithinScope")
def cpu_affinity_within_scope(drv: SimDriver, handle: Any, size: Any, ref: Any, scope: Any) -> None:
    t = drv.physical(handle)
    host = _preset(t).host
    _write_mask(size, ref, [c for n in _numa_nodes(t, _scope(scope)) for c in host.cpus(n)])


@symbol("nvmlDeviceGetCpuAffinity")
def cpu_affinity(drv: SimDriver, handle: Any, size: Any, ref: Any) -> None:
    t = drv.physical(handle)
    host = _preset(t).host
    nodes = _numa_nodes(t, pynvml.NVML_AFFINITY_SCOPE_NODE)
    _write_mask(size, ref, [c for n in nodes for c in host.cpus(n)])


@symbol("nvmlDeviceGetMemoryAffinity")
def memory_affinity(drv: SimDriver, handle: Any, size: Any, ref: Any, scope: Any) -> None:
    t = drv.physical(handle)
    _write_mask(size, ref, _numa_nodes(t, _scope(scope)))


@symbol("nvmlDeviceGetHandleBySerial")
def handle_by_serial(drv: SimDriver, serial: Any, ref: Any) -> None:
    wanted = to_bytes(serial).decode()
    set_handle(ref, device_handle_where(drv, lambda gpu: gpu.serial == wanted))


@symbol("nvmlSystemGetProcessName")
def process_name(drv: SimDriver, pid: Any, buffer: Any, length: Any) -> None:
    """A simulated process's name; otherwise the host process's, as the driver reads it."""
    p = to_int(pid)
    simulated = next((x for x in drv.node().processes if x.pid == p), None)
    if simulated is not None:
        write_string(buffer, length, simulated.name)
        return
    try:
        argv0 = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        raise fail(pynvml.NVML_ERROR_NOT_FOUND) from None
    write_string(buffer, length, argv0.decode(errors="replace"))


@symbol("nvmlDeviceGetPowerState")
def power_state(drv: SimDriver, handle: Any, ref: Any) -> None:
    """The deprecated name of nvmlDeviceGetPerformanceState: the same answer."""
    drv.physical(handle)
    set_value(ref, pynvml.NVML_PSTATE_0)


@symbol("nvmlDeviceGetTemperatureThreshold")
def temperature_threshold(drv: SimDriver, handle: Any, kind: Any, ref: Any) -> None:
    t = drv.physical(handle)
    k = to_int(kind)
    shutdown, slowdown, mem_max, gpu_max = _THRESHOLDS[t.model.architecture]
    values = {
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: shutdown,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: slowdown,
        pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: mem_max if t.model.hbm else None,
        pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: gpu_max,
    }
    if k not in values and not 0 <= k < pynvml.NVML_TEMPERATURE_THRESHOLD_COUNT:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    value = values.get(k)
    if value is None:  # acoustic and GPS thresholds: not on datacenter boards
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    set_value(ref, value)
