"""The fleet plan as a file `fleet apply mig --plan` takes: one mig-parted config per node.

Each node's config selects only the GPUs the plan changes, by UUID (an index can move after a
reboot; a UUID cannot), with the counts the plan chose. The agent's per-GPU planner turns those
counts into the same placements the fleet planner predicted (it is the same function).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agent import safeyaml
from agent.coordinator.planning.planner import FleetPlan, GpuChange
from agent.errors import FieldViolation, InvalidSpec
from agent.mig.spec import VERSION as MIG_VERSION
from agent.mig.spec import parse_spec

__all__ = ["PLAN_CONFIG", "load_plan", "node_config", "plan_document"]

KIND = "FleetMigPlan"
PLAN_CONFIG = "fleet-plan"


def node_config(changes: list[GpuChange]) -> str:
    """A mig-parted v1 file with one entry per changed GPU of one node."""
    entries = [
        {"devices": [c.uuid], "mig-enabled": True, "mig-devices": dict(c.after)}
        for c in sorted(changes, key=lambda c: c.index)
    ]
    doc = {"version": MIG_VERSION, "mig-configs": {PLAN_CONFIG: entries}}
    return yaml.safe_dump(doc, sort_keys=False)


def plan_document(plan: FleetPlan, demand_file: str) -> dict[str, Any]:
    by_node: dict[str, list[GpuChange]] = {}
    for change in plan.changes:
        by_node.setdefault(change.node, []).append(change)
    return {
        "kind": KIND,
        "version": "v1",
        "demand": demand_file,
        "config_name": PLAN_CONFIG,
        "nodes": {
            node: {
                "config": node_config(changes),
                "gpus": [
                    {
                        "index": c.index,
                        "uuid": c.uuid,
                        "model": c.model,
                        "before": dict(c.before),
                        "after": dict(c.after),
                        "create": list(c.create),
                        "destroy": list(c.destroy),
                    }
                    for c in changes
                ],
            }
            for node, changes in sorted(by_node.items())
        },
        "unmet": [
            {
                "profile": u.profile,
                "model": u.model,
                "pool": u.pool,
                "priority": u.priority,
                "missing": u.missing,
                "reason": u.reason,
                "lost_to": list(u.lost_to),
                "fixes": list(u.fixes),
            }
            for u in plan.unmet
        ],
    }


#: A plan holds one MIG config per node of the fleet.
LIMITS = safeyaml.Limits(max_bytes=64 * 1024 * 1024, max_nodes=2_000_000, max_scalar=1024 * 1024)


def load_plan(path: Path) -> Mapping[str, str]:
    """Node name -> its mig-parted config, from a plan file; every config is checked."""
    raw = safeyaml.read_text(path, "plan", LIMITS.max_bytes)
    doc = safeyaml.load(raw, "plan", LIMITS)
    if (
        not isinstance(doc, dict)
        or doc.get("kind") != KIND
        or not isinstance(doc.get("nodes"), dict)
    ):
        raise InvalidSpec(
            f"{path} is not a fleet plan (kind {KIND}, from `gpu-agent fleet plan --out`)",
            [FieldViolation("kind", f"must be {KIND}")],
        )
    configs: dict[str, str] = {}
    for node, entry in doc["nodes"].items():
        text = entry.get("config") if isinstance(entry, dict) else None
        if not isinstance(text, str):
            raise InvalidSpec(
                f"{path}: node {node} has no config", [FieldViolation(f"nodes.{node}.config", "")]
            )
        parse_spec(text, f"{path}: nodes.{node}.config")
        configs[str(node)] = text
    return configs
