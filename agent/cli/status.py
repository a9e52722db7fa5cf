"""``gpu-agent status``: the node at a glance (GPUs, MIG instances, processes)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from agent.cli.context import CliContext
from agent.cli.render import emit, format_table, human_bytes, output_option

if TYPE_CHECKING:
    from agent.gpu.types import Placement
    from agent.health.machine import Mark
    from agent.wire.node import NodeDriver, NodeGpu, NodeView


def _read(data: dict[str, Any]) -> bool:
    """Whether the GPUs were read: a ready driver, or GPUs listed (an agent from before the
    driver state reports none). Otherwise "0 GPU(s)" or "none" would claim what was not read."""
    driver = data["driver"]
    return bool(driver["ready"] or (driver["cause"] == "starting" and data["gpus"]))


def _head(data: dict[str, Any], lost: int) -> str:
    """The driver line: its version and GPU count, or that no driver is attached."""
    driver = data["driver"]
    if _read(data):
        head = f"Driver {data['driver_version']}, {len(data['gpus'])} GPU(s)"
        return head + (f", {lost} lost" if lost else "")
    if driver["cause"] == "starting":
        return "Driver not read yet (the agent is starting): GPUs not read yet"
    return "Driver not ready: GPUs not read (see degraded: gpu-driver below)"


def _gpu_table(gpus: list[dict[str, Any]]) -> str:
    return format_table(
        # NVML: does the driver answer for the GPU (ok, unread, lost); HEALTH: its mark
        # (docs/health.md)
        ["GPU", "NVML", "HEALTH", "UUID", "MODEL", "BUS ID", "MEMORY", "MIG (current/pending)"],
        [
            [
                g["index"],
                g["health"],
                _mark(g["condition"]),
                g["uuid"] or "?",
                g["name"] or "?",
                g["pci_bus_id"] or "?",
                "?" if g["memory_total_bytes"] is None else human_bytes(g["memory_total_bytes"]),
                _mig_cell(g),
            ]
            for g in gpus
        ],
    )


def _mig_cell(g: dict[str, Any]) -> str:
    if g["mig"] is not None:
        return f"{g['mig']['current']}/{g['mig']['pending']}"
    return "?" if g["instances"] is None else "n/a"  # unknown, or not MIG capable


def _table(data: dict[str, Any]) -> str:
    gpus = data["gpus"]
    lost = [g for g in gpus if g["health"] == "lost"]
    allocation = data["allocation"]
    parts = [
        _head(data, len(lost)),
        f"Allocation: {allocation['mode']} ({allocation['evidence']})",
        "",
    ]
    read = _read(data)
    if read:
        parts.append(_gpu_table(gpus))
    unread = [g for g in gpus if g["unread"]]
    for g in lost:
        parts.append(f"GPU {g['index']} is lost: {g['detail']}")
    for g in unread:
        parts.append(f"GPU {g['index']} not read ({g['unread']}): its processes are unknown")
    for g in gpus:
        if g["instances"] is None:
            parts.append(
                f"GPU {g['index']} was never read: its memory, MIG mode and instances are unknown"
            )
    for where, mark in _marked(gpus):
        pods = f" (pods: {', '.join(mark['pods'])})" if mark["pods"] else ""
        parts.append(f"{where} {mark['state']} since {mark['since']}: {mark['reason']}{pods}")
    for d in data["degraded"]:
        parts.append(f"degraded: {d['component']}: {d['detail']}")
    instances = [
        [
            g["index"],
            i["gpu_instance_id"],
            _mark(i["condition"]),
            i["profile"],
            f"{i['placement']['start']}:{i['placement']['size']}",
            ",".join(str(c["id"]) for c in i["compute_instances"]) or "-",
            " ".join(c["uuid"] or "-" for c in i["compute_instances"]) or "-",
        ]
        for g in gpus
        for i in g["instances"] or ()
    ]
    if instances:
        parts += [
            "",
            "MIG instances",
            format_table(
                ["GPU", "GI", "HEALTH", "PROFILE", "PLACEMENT", "CI ID", "MIG UUID"], instances
            ),
        ]
        parts += [
            f"GPU {g['index']} is lost: its instances are as last read, before it stopped answering"
            for g in lost
            if g["instances"]
        ]
        parts += [
            f"GPU {g['index']} not read: its instances are as last read"
            for g in unread
            if g["instances"]
        ]
    parts += ["", "Processes", _processes(data, read, lost, unread)]
    return "\n".join(parts)


def _processes(
    data: dict[str, Any], read: bool, lost: list[dict[str, Any]], unread: list[dict[str, Any]]
) -> str:
    """The Processes section: withheld, not read (no driver, a lost GPU, a failing list) or
    the processes of the GPUs read."""
    gpus = data["gpus"]
    procs = [
        [
            g["index"],
            p["pid"],
            human_bytes(p["used_memory_bytes"]),
            "-"
            if p["gpu_instance_id"] is None
            else f"{p['gpu_instance_id']}/{p['compute_instance_id']}",
        ]
        for g in gpus
        for p in g["processes"] or ()
    ]
    if data["processes_withheld"]:
        shown = "  withheld (read role): this identity may not see what runs on the GPUs"
    elif not read:
        shown = "  not read: the driver is not ready"
    else:
        none = "  none on the GPUs read" if lost or unread else "  none"
        shown = format_table(["GPU", "PID", "MEMORY", "GI/CI"], procs) if procs else none
        shown += "".join(f"\n  GPU {g['index']}: not read (lost)" for g in lost)
        shown += "".join(f"\n  GPU {g['index']}: not read ({g['unread']})" for g in unread)
    return shown


def _mark(mark: dict[str, Any] | None) -> str:
    if mark is None:
        return "-"  # not judged yet
    action = mark["action"]
    return mark["state"] if action in ("", "none") else f"{mark['state']} ({action})"


def _marked(gpus: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(where, mark) of every GPU and instance whose mark is not healthy."""
    out = []
    for g in gpus:
        for where, mark in [(f"GPU {g['index']}", g["condition"])] + [
            (f"GPU {g['index']} GPU instance {i['gpu_instance_id']}", i["condition"])
            for i in g["instances"] or ()
        ]:
            if mark is not None and mark["state"] != "healthy":
                out.append((where, mark))
    return out


def health_mark_view(mark: Mark | None) -> dict[str, Any] | None:
    """The agent's health mark (docs/health.md); None before its first verdict."""
    if mark is None:
        return None
    return {
        "state": mark.state.value,
        "reason": mark.reason,
        "since": datetime.fromtimestamp(mark.since, UTC).isoformat(timespec="seconds"),
        "action": mark.action,
        "pods": list(mark.pods),
    }


def _placement(p: Placement) -> dict[str, int]:
    return {"start": p.start, "size": p.size}


def _gpu_view(g: NodeGpu, hidden: bool) -> dict[str, Any]:
    info = g.layout.gpu
    mode = info.mig_mode
    # A GPU lost before the agent saw it answer has only its index; one whose layout was never
    # read (its process list failing from the start) only its identity.
    never = g.never_read or not info.uuid
    return {
        "index": info.index,
        # Never "ok" for a GPU not read: "unread" names it, and `unread` the failing call
        "health": "lost" if g.lost else "unread" if g.unread or g.never_read else "ok",
        "condition": health_mark_view(g.condition),
        "detail": g.detail,
        # Why its layout and processes were not read in the latest sample (the failing call)
        "unread": g.unread or None,
        "uuid": info.uuid or None,
        "name": info.name or None,
        "pci_bus_id": info.pci_bus_id or None,
        "pci_device_id": None if never else f"0x{info.pci_device_id:08X}",
        "memory_total_bytes": None if never else info.memory_total_bytes,
        # None: not MIG capable, or (with instances None) unknown
        "mig": None
        if mode is None
        else {
            "current": "enabled" if mode.current else "disabled",
            "pending": "enabled" if mode.pending else "disabled",
        },
        # None: a GPU never read ("[]" would say it has no instance)
        "instances": None
        if never
        else [
            {
                "gpu_instance_id": gi.id,
                "condition": health_mark_view(g.instance_conditions.get(gi.id)),
                "profile": gi.profile_name,
                "profile_id": gi.profile_id,
                "placement": _placement(gi.placement),
                "compute_instances": [
                    {
                        "id": ci.id,
                        "profile_id": ci.profile_id,
                        "placement": _placement(ci.placement),
                        "uuid": ci.uuid,
                    }
                    for ci in gi.compute_instances
                ],
            }
            for gi in g.layout.instances
        ],
        # None: not read, withheld from this identity or the GPU lost ("none" would be a claim)
        "processes": None
        if hidden or g.lost or g.unread or never
        else [
            {
                "pid": p.pid,
                "used_memory_bytes": p.used_memory_bytes,
                "gpu_instance_id": p.gpu_instance_id,
                "compute_instance_id": p.compute_instance_id,
            }
            for p in g.layout.processes
        ],
    }


def _driver_view(driver: NodeDriver) -> dict[str, Any]:
    if driver.attached is True:
        return {"ready": True, "cause": None, "detail": None}
    if driver.attached is None:
        return {"ready": False, "cause": "starting", "detail": "the agent has not read NVML yet"}
    return {"ready": False, "cause": driver.cause or "unknown", "detail": driver.why_not}


def status_view(node: NodeView) -> dict[str, Any]:
    """The node as ``gpu-agent status`` shows it (the shape `_table` renders)."""
    allocation = node.allocation
    return {
        "driver_version": node.driver_version,
        # Whether GPUs are attached at all: without a driver the GPU list is empty because
        # nothing can be read, not because the node has none.
        # Ready only when verified: before the agent's first try it is not ready, cause "starting".
        "driver": _driver_view(node.driver),
        # Who hands the GPUs to pods, and what it was read from; it gates MIG (docs/dra.md).
        "allocation": {
            "mode": allocation.mode.value,
            "evidence": allocation.evidence,
            "driver": allocation.driver or None,
        },
        # The agent's parts that do not work as they should, with why (e.g. the state store).
        "degraded": [{"component": c.name, "detail": c.detail} for c in node.degraded],
        # Withheld from this identity's roles: None per GPU, never an empty list ("none run").
        "processes_withheld": node.processes_hidden,
        "gpus": [_gpu_view(g, node.processes_hidden) for g in node.gpus],
    }


@click.command()
@output_option
@click.pass_obj
def status(obj: CliContext, output: str) -> None:
    """Show the node: GPUs with their health marks, MIG mode and instances with placements,
    processes.

    The node's agent answers (the running one, or one embedded for this command); the CLI
    itself never calls NVML.

    \b
    Example:
      gpu-agent --simulate dgx-h100 --state-dir /tmp/node status -o json
    """
    emit(status_view(obj.agent().node()), output, _table)
