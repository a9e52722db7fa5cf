"""A read-only record of every NVML answer the agent's read paths use, for one GPU.

``scripts/device-check.py`` records a real GPU and the simulator's model of it with the same
code and diffs the two field by field, so the simulator is held to the silicon (issue 39). Only
getters are called, through the same facade and reader the agent uses (`GpuDriver`,
`NodeReader`, `XidEvents`' event-type query): no mode, instance, limit, clock or reset.

A record has two halves. ``facts`` are what must agree between a GPU and its model: identity,
memory, power range, MIG mode and profiles with placements, which readings NVML answers (not
their values: a temperature differs from run to run), which GPM metrics answer, which event
types the GPU reports. ``observed`` are this moment's values (temperatures, clocks, power,
processes), shown for a human and never diffed.
"""

from __future__ import annotations

import contextlib
from typing import Any

from agent.errors import AgentError
from agent.gpu.nvml import GpuDriver
from agent.gpu.reading_calls import Reading
from agent.gpu.readings import NodeReader
from dcgm.fields import FIELDS, Gpm

__all__ = ["differences", "record_gpu"]

#: Readings whose value is a fact of the board (they must match the model, not just answer).
_STATIC = (Reading.FB_TOTAL_BYTES, Reading.DEFAULT_POWER_LIMIT_MW)


def record_gpu(driver: GpuDriver, index: int) -> dict[str, Any]:
    """The record of GPU ``index`` (see the module docstring for its two halves)."""
    reader = NodeReader(driver)
    identity = reader.gpus()[index]
    info = driver.gpus()[index]
    read = reader.read(index, list(Reading))
    facts: dict[str, Any] = {
        "name": info.name,
        "pci_device_id": f"0x{info.pci_device_id:08X}",
        "memory_total_bytes": info.memory_total_bytes,
        "mig_capable": info.mig_capable,
        "board_strings": sorted(k for k, _ in identity.strings),
        "readings": _support(read.values, read.unsupported, read.failed),
        "static": {r.value: read.values.get(r) for r in _STATIC},
        "power_range_mw": _power_range(driver, info.uuid),
        "gpm": _gpm(reader, index),
        "event_types": _event_types(driver, index),
    }
    if info.mig_capable:
        facts["gi_profiles"] = _gi_profiles(driver, info.uuid)
    layout = driver.layout(info.uuid)
    observed: dict[str, Any] = {
        "driver_version": driver.driver_version(),
        "nvml_version": reader.versions()[1],
        "values": {r.value: v for r, v in sorted(read.values.items(), key=lambda i: i[0].value)},
        "mig_mode": {"current": info.mig_mode.current, "pending": info.mig_mode.pending}
        if info.mig_mode is not None
        else None,
        "gpu_instances": [
            {"id": gi.id, "profile": gi.profile_name, "start": gi.placement.start}
            for gi in layout.instances
        ],
        "processes": len(reader.processes(index)),
    }
    return {"facts": facts, "observed": observed}


def _support(
    values: dict[Reading, float], unsupported: dict[Reading, str], failed: dict[Reading, str]
) -> dict[str, str]:
    """Each reading: ``ok``, ``unsupported`` or ``failed``; the reason goes to the report's
    observed values, since its words differ between drivers."""
    out = {}
    for reading in Reading:
        if reading in values:
            out[reading.value] = "ok"
        elif reading in unsupported:
            out[reading.value] = "unsupported"
        else:
            out[reading.value] = "failed" if reading in failed else "not read"
    return out


def _power_range(driver: GpuDriver, uuid: str) -> dict[str, int] | str:
    try:
        limits = driver.power_limits(uuid)
    except AgentError as exc:
        return f"error: {type(exc).__name__}"
    return {"min": limits.min_mw, "max": limits.max_mw, "default": limits.default_mw}


def _gpm_metric_ids() -> tuple[int, ...]:
    """Every GPM metric a DCGM field the agent exports is read from."""
    return tuple(sorted({f.source.metric_id for f in FIELDS if isinstance(f.source, Gpm)}))


def _gpm(reader: NodeReader, index: int) -> dict[str, Any]:
    """Whether GPM answers, and which of the agent's metrics it answers between two samples."""
    if not reader.gpm_supported(index):
        return {"supported": False}
    first = reader.gpm_sample(index)
    second = None
    try:
        second = reader.gpm_sample(index)
        readout = reader.gpm_metrics(first, second, _gpm_metric_ids())
    finally:
        reader.gpm_free(first)
        if second is not None:
            reader.gpm_free(second)
    metrics = {str(m): "ok" for m in readout.values}
    metrics.update({str(m): "unsupported" for m in readout.unsupported})
    return {"supported": True, "metrics": dict(sorted(metrics.items(), key=lambda i: int(i[0])))}


def _event_types(driver: GpuDriver, index: int) -> list[str] | str:
    """The NVML event types the GPU reports, by name (the agent registers XID critical errors)."""
    n = driver.nvml
    try:
        handle = driver.call(n.nvmlDeviceGetHandleByIndex, index)
        mask = int(driver.call(n.nvmlDeviceGetSupportedEventTypes, handle))
    except AgentError as exc:
        return f"error: {type(exc).__name__}"
    names = []
    for name in dir(n.module):
        if name.startswith("nvmlEventType") and name not in ("nvmlEventTypeNone",):
            with contextlib.suppress(TypeError, ValueError):
                bit = int(getattr(n.module, name))
                if bit and bit & (bit - 1) == 0 and mask & bit:
                    names.append(name.removeprefix("nvmlEventType"))
    return sorted(names)


def _gi_profiles(driver: GpuDriver, uuid: str) -> dict[str, Any]:
    return {
        str(p.constant): {
            "id": p.id,
            "name": p.name,
            "slice_count": p.slice_count,
            "memory_slices": p.memory_slices,
            "instance_count": p.instance_count,
            "memory_mb": p.memory_mb,
            "multiprocessor_count": p.multiprocessor_count,
            "engines": [p.copy_engines, p.decoders, p.encoders, p.jpegs, p.ofas],
            "placements": [f"{pl.start}:{pl.size}" for pl in p.placements],
        }
        for p in driver.gi_profiles(uuid)
    }


def differences(real: Any, sim: Any, path: str = "") -> list[str]:
    """Every field where two records differ, as ``path: real X != simulated Y`` lines."""
    if isinstance(real, dict) and isinstance(sim, dict):
        out: list[str] = []
        for key in sorted(set(real) | set(sim)):
            where = f"{path}.{key}" if path else key
            if key not in sim:
                out.append(f"{where}: only on the real GPU ({real[key]!r})")
            elif key not in real:
                out.append(f"{where}: only in the simulator ({sim[key]!r})")
            else:
                out.extend(differences(real[key], sim[key], where))
        return out
    return [] if real == sim else [f"{path}: real {real!r} != simulated {sim!r}"]
