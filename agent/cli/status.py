"""``gpu-agent status``: the node at a glance (GPUs, MIG instances, processes)."""

from __future__ import annotations

from typing import Any

import click

from agent.cli.context import CliContext
from agent.cli.render import emit, format_table, human_bytes, output_option
from agent.gpu import GpuDriver
from agent.gpu.types import GpuLayout, LostGpu


def node_status(gpu: GpuDriver) -> dict[str, Any]:
    """A JSON-able view of the node, the same shape for every output format. A lost GPU is
    listed with ``health: lost`` and what is known of it; the others are read as usual."""
    scan = gpu.scan()
    views = [_gpu_view(gpu.layout(g.uuid)) for g in scan.gpus]
    views += [_lost_view(g) for g in scan.lost]
    return {
        "driver_version": gpu.driver_version(),
        "gpus": sorted(views, key=lambda v: int(v["index"])),
    }


def _lost_view(lost: LostGpu) -> dict[str, Any]:
    g = lost.last_known
    empty = GpuLayout(g, (), (), ()) if g is not None else None
    view = _gpu_view(empty) if empty is not None else _unknown_view(lost.index)
    view.update(health="lost", detail=lost.detail)
    return view


def _unknown_view(index: int) -> dict[str, Any]:
    """A GPU lost before anything could be read of it: NVML gives only its index."""
    return {
        "index": index,
        "uuid": None,
        "name": None,
        "pci_bus_id": None,
        "pci_device_id": None,
        "memory_total_bytes": None,
        "mig": None,
        "instances": [],
        "processes": [],
    }


def _gpu_view(layout: GpuLayout) -> dict[str, Any]:
    g = layout.gpu
    return {
        "index": g.index,
        "health": "ok",
        "detail": "",
        "uuid": g.uuid,
        "name": g.name,
        "pci_bus_id": g.pci_bus_id,
        "pci_device_id": f"0x{g.pci_device_id:08X}",
        "memory_total_bytes": g.memory_total_bytes,
        "mig": None
        if g.mig_mode is None
        else {
            "current": "enabled" if g.mig_mode.current else "disabled",
            "pending": "enabled" if g.mig_mode.pending else "disabled",
        },
        "instances": [
            {
                "gpu_instance_id": gi.id,
                "profile": gi.profile_name,
                "profile_id": gi.profile_id,
                "placement": {"start": gi.placement.start, "size": gi.placement.size},
                "compute_instances": [
                    {
                        "id": ci.id,
                        "profile_id": ci.profile_id,
                        "placement": {"start": ci.placement.start, "size": ci.placement.size},
                        "uuid": ci.uuid,
                    }
                    for ci in gi.compute_instances
                ],
            }
            for gi in layout.instances
        ],
        "processes": [
            {
                "pid": p.pid,
                "used_memory_bytes": p.used_memory_bytes,
                "gpu_instance_id": p.gpu_instance_id,
                "compute_instance_id": p.compute_instance_id,
            }
            for p in layout.processes
        ],
    }


def _table(data: dict[str, Any]) -> str:
    gpus = data["gpus"]
    lost = [g for g in gpus if g["health"] == "lost"]
    head = f"Driver {data['driver_version']}, {len(gpus)} GPU(s)"
    parts = [head + (f", {len(lost)} lost" if lost else ""), ""]
    parts.append(
        format_table(
            ["GPU", "HEALTH", "UUID", "MODEL", "BUS ID", "MEMORY", "MIG (current/pending)"],
            [
                [
                    g["index"],
                    g["health"],
                    g["uuid"] or "?",
                    g["name"] or "?",
                    g["pci_bus_id"] or "?",
                    "?"
                    if g["memory_total_bytes"] is None
                    else human_bytes(g["memory_total_bytes"]),
                    "n/a" if g["mig"] is None else f"{g['mig']['current']}/{g['mig']['pending']}",
                ]
                for g in gpus
            ],
        )
    )
    for g in lost:
        parts.append(f"GPU {g['index']} is lost: {g['detail']}")
    instances = [
        [
            g["index"],
            i["gpu_instance_id"],
            i["profile"],
            f"{i['placement']['start']}:{i['placement']['size']}",
            ",".join(str(c["id"]) for c in i["compute_instances"]) or "-",
            " ".join(c["uuid"] or "-" for c in i["compute_instances"]) or "-",
        ]
        for g in gpus
        for i in g["instances"]
    ]
    if instances:
        parts += [
            "",
            "MIG instances",
            format_table(["GPU", "GI", "PROFILE", "PLACEMENT", "CIs", "MIG UUID"], instances),
        ]
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
        for p in g["processes"]
    ]
    parts += [
        "",
        "Processes",
        format_table(["GPU", "PID", "MEMORY", "GI/CI"], procs) if procs else "  none",
    ]
    return "\n".join(parts)


@click.command()
@output_option
@click.pass_obj
def status(obj: CliContext, output: str) -> None:
    """Show the node: GPUs, MIG mode and instances with placements, processes.

    Asks the running agent over its Unix socket when there is one, else reads NVML directly.

    \b
    Example:
      gpu-agent --simulate dgx-h100 --state-dir /tmp/node status -o json
    """
    client = obj.agent()
    if client is not None:
        from agent.cli.client import status_view

        data = status_view(client.node())  # the running agent's view, no NVML call here
    else:
        data = node_status(obj.gpu())
    emit(data, output, _table)
