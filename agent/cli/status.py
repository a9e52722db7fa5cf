"""``gpu-agent status``: the node at a glance (GPUs, MIG instances, processes)."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import click

from agent._proto.gpuagent.v1 import agent_pb2
from agent.cli.context import CliContext
from agent.cli.render import emit, format_table, human_bytes, output_option
from agent.wire.node import allocation_of


def _table(data: dict[str, Any]) -> str:
    gpus = data["gpus"]
    lost = [g for g in gpus if g["health"] == "lost"]
    head = f"Driver {data['driver_version']}, {len(gpus)} GPU(s)"
    allocation = data["allocation"]
    parts = [
        head + (f", {len(lost)} lost" if lost else ""),
        f"Allocation: {allocation['mode']} ({allocation['evidence']})",
        "",
    ]
    parts.append(
        format_table(
            ["GPU", "HEALTH", "MARK", "UUID", "MODEL", "BUS ID", "MEMORY", "MIG (current/pending)"],
            [
                [
                    g["index"],
                    g["health"],
                    _mark(g["condition"]),
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
        for i in g["instances"]
    ]
    if instances:
        parts += [
            "",
            "MIG instances",
            format_table(
                ["GPU", "GI", "MARK", "PROFILE", "PLACEMENT", "CIs", "MIG UUID"], instances
            ),
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
        for p in g["processes"] or ()
    ]
    if data["processes_withheld"]:
        shown = "  withheld (read role): this identity may not see what runs on the GPUs"
    else:
        shown = format_table(["GPU", "PID", "MEMORY", "GI/CI"], procs) if procs else "  none"
    parts += ["", "Processes", shown]
    return "\n".join(parts)


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
            for i in g["instances"]
        ]:
            if mark is not None and mark["state"] != "healthy":
                out.append((where, mark))
    return out


_STATES = {
    agent_pb2.HEALTH_STATE_HEALTHY: "healthy",
    agent_pb2.HEALTH_STATE_DEGRADED: "degraded",
    agent_pb2.HEALTH_STATE_FAILED: "failed",
}


def health_mark_view(message: agent_pb2.Gpu | agent_pb2.GpuInstance) -> dict[str, Any] | None:
    """The agent's health mark (docs/health.md); None before its first verdict."""
    if not message.HasField("condition"):
        return None
    mark = message.condition
    return {
        "state": _STATES.get(mark.state, "unknown"),
        "reason": mark.reason,
        "since": mark.since.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds"),
        "action": mark.action,
        "pods": list(mark.pods),
    }


def status_view(node: agent_pb2.Node) -> dict[str, Any]:
    """The node as ``gpu-agent status`` shows it (the shape `_table` renders)."""

    def placement(p: agent_pb2.Placement) -> dict[str, int]:
        return {"start": p.start, "size": p.size}

    hidden = node.processes_hidden
    allocation = allocation_of(node)
    return {
        "driver_version": node.driver_version,
        # Who hands the GPUs to pods, and what it was read from; it gates MIG (docs/dra.md).
        "allocation": {
            "mode": allocation.mode.value,
            "evidence": allocation.evidence,
            "driver": allocation.driver or None,
        },
        # The agent's parts that do not work as they should, with why (e.g. the state store).
        "degraded": [
            {"component": c.name, "detail": c.detail}
            for c in node.health.components
            if not c.healthy and c.name != "gpu-driver"  # GPUs: their own health column
        ],
        # Withheld from this identity's roles: None per GPU, never an empty list ("none run").
        "processes_withheld": hidden,
        "gpus": [
            {
                "index": g.index,
                "health": "lost" if g.health == agent_pb2.GPU_HEALTH_LOST else "ok",
                "condition": health_mark_view(g),
                "detail": g.health_detail,
                # A GPU lost before the agent saw it answer has only its index.
                "uuid": g.uuid or None,
                "name": g.name or None,
                "pci_bus_id": g.pci_bus_id or None,
                "pci_device_id": f"0x{g.pci_device_id:08X}" if g.uuid else None,
                "memory_total_bytes": g.memory_total_bytes if g.uuid else None,
                "mig": None
                if not g.HasField("mig_mode")
                else {
                    "current": "enabled" if g.mig_mode.current else "disabled",
                    "pending": "enabled" if g.mig_mode.pending else "disabled",
                },
                "instances": [
                    {
                        "gpu_instance_id": gi.id,
                        "condition": health_mark_view(gi),
                        "profile": gi.profile_name,
                        "profile_id": gi.profile_id,
                        "placement": placement(gi.placement),
                        "compute_instances": [
                            {
                                "id": ci.id,
                                "profile_id": ci.profile_id,
                                "placement": placement(ci.placement),
                                "uuid": ci.uuid or None,
                            }
                            for ci in gi.compute_instances
                        ],
                    }
                    for gi in g.instances
                ],
                "processes": None
                if hidden
                else [
                    {
                        "pid": p.pid,
                        "used_memory_bytes": p.used_memory_bytes
                        if p.HasField("used_memory_bytes")
                        else None,
                        "gpu_instance_id": p.gpu_instance_id
                        if p.HasField("gpu_instance_id")
                        else None,
                        "compute_instance_id": p.compute_instance_id
                        if p.HasField("compute_instance_id")
                        else None,
                    }
                    for p in g.processes
                ],
            }
            for g in node.gpus
        ],
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
