"""Replay a demand trace against the fleet planner: a capacity model before buying GPUs.

Each step plans the trace's demand against the layouts the previous step left, applies the plan
on paper, and counts what it cost. Demand is taken as devices in use: after each step that many
devices of each entry run a process (those already running first, higher priorities first), so
the next step may not destroy them, exactly as the planner treats busy instances on a real
fleet. A step lasts until the next one (the last until ``end``, when given): GPU-hours idle are
the memory slices in no device in use, as a fraction of their GPU, over that time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.coordinator.fleet.capacity import busy_gi_ids
from agent.coordinator.planning.catalog import Catalog
from agent.coordinator.planning.demand import Demand, TraceStep
from agent.coordinator.planning.planner import GpuChange, NodeLayouts, plan_fleet
from agent.gpu.types import ComputeInstance, GpuInstance, GpuLayout, MigMode, Placement, Process
from agent.mig.desired import ci_name

__all__ = ["PriorityResult", "StepResult", "replay"]

_PID_BASE = 100_000  # simulated workload processes; far from the node's own pids


@dataclass(frozen=True, slots=True)
class PriorityResult:
    priority: int
    demand: int
    met: int

    @property
    def unmet(self) -> int:
        return self.demand - self.met


@dataclass(frozen=True, slots=True)
class StepResult:
    time: float
    label: str
    demand: int
    met: int
    #: devices short, per profile label ("3g.40gb", "3g.40gb on NVIDIA H100 80GB HBM3").
    unmet: tuple[tuple[str, int], ...]
    #: instances destroyed to reach this step's layout (none of them in use).
    disrupted: int
    created: int
    #: GPUs reconfigured in this step.
    gpus_changed: int
    #: memory slices on MIG GPUs not in a device in use: free slices plus idle instances.
    idle_slices: int
    total_slices: int
    #: demand and met per priority, highest first.
    by_priority: tuple[PriorityResult, ...] = ()
    #: devices of the demanded profiles the fleet holds after the step (in use or not).
    capacity: int = 0
    #: seconds until the next step (the last: until ``end``, else 0).
    duration_s: float = 0.0
    #: GPU-hours idle over the step: idle slices as a fraction of their GPU, times duration.
    gpu_hours_idle: float = 0.0

    @property
    def unmet_total(self) -> int:
        return sum(n for _, n in self.unmet)


def replay(
    nodes: Sequence[NodeLayouts],
    steps: Sequence[TraceStep],
    *,
    pools: Mapping[str, frozenset[str]] | None = None,
    end: float | None = None,
) -> tuple[StepResult, ...]:
    catalog = Catalog(g for n in nodes for g in n.gpus)
    fleet = [NodeLayouts(n.name, tuple(catalog.complete(g) for g in n.gpus)) for n in nodes]
    chosen = pools or {}
    out: list[StepResult] = []
    for k, step in enumerate(steps):
        # Work that ended frees its devices before the plan; new work takes them after it.
        fleet = _occupy(fleet, step.demand, chosen)
        plan = plan_fleet(fleet, step.demand, pools=chosen)
        by_gpu = {(c.node, c.uuid): c for c in plan.changes}
        fleet = [
            NodeLayouts(n.name, tuple(_apply(g, by_gpu.get((n.name, g.gpu.uuid))) for g in n.gpus))
            for n in fleet
        ]
        fleet = _occupy(fleet, step.demand, chosen)
        idle, total, idle_gpus = _slices(fleet)
        unmet = tuple((u.label, u.missing) for u in plan.unmet)
        missing: dict[int, int] = {}
        for u in plan.unmet:
            missing[u.priority] = missing.get(u.priority, 0) + u.missing
        levels = sorted({e.priority for e in step.demand.entries}, reverse=True)
        by_priority = tuple(
            PriorityResult(
                level,
                want := sum(e.count for e in step.demand.entries if e.priority == level),
                want - missing.get(level, 0),
            )
            for level in levels
        )
        following = steps[k + 1].time if k + 1 < len(steps) else end
        duration = max(0.0, following - step.time) if following is not None else 0.0
        out.append(
            StepResult(
                time=step.time,
                label=step.label,
                demand=step.demand.total,
                met=step.demand.total - sum(n for _, n in unmet),
                unmet=unmet,
                disrupted=plan.destroyed,
                created=plan.created,
                gpus_changed=len(plan.changes),
                idle_slices=idle,
                total_slices=total,
                by_priority=by_priority,
                capacity=sum(t.after for t in plan.totals),
                duration_s=duration,
                gpu_hours_idle=idle_gpus * duration / 3600.0,
            )
        )
    return tuple(out)


def _apply(layout: GpuLayout, change: GpuChange | None) -> GpuLayout:
    """The layout an agent would leave after ``change`` (kept instances keep their ids)."""
    if change is None:
        return layout
    old = {(gi.profile_id, gi.placement): gi for gi in layout.instances}
    next_id = max((gi.id for gi in layout.instances), default=0) + 1
    instances: list[GpuInstance] = []
    for want in change.target:
        kept = old.get((want.profile_id, want.placement))
        if kept is not None and sorted(c.placement.size for c in kept.compute_instances) == sorted(
            c.slices for c in want.cis
        ):
            instances.append(kept)
            continue
        cis, start = [], 0
        for ci_id, ci in enumerate(sorted(want.cis, key=lambda c: -c.slices)):
            at = ci.start if ci.start is not None else start
            cis.append(
                ComputeInstance(ci_id, ci.profile_id or ci.slices, Placement(at, ci.slices), None)
            )
            start = at + ci.slices
        instances.append(
            GpuInstance(next_id, want.profile_id, want.profile_name, want.placement, tuple(cis))
        )
        next_id += 1
    kept_ids = {gi.id for gi in instances}
    gpu = dataclasses.replace(layout.gpu, mig_mode=MigMode(True, True))
    processes = tuple(p for p in layout.processes if p.gpu_instance_id in kept_ids)
    return GpuLayout(gpu, layout.profiles, tuple(instances), processes)


def _occupy(
    fleet: Sequence[NodeLayouts], demand: Demand, pools: Mapping[str, frozenset[str]]
) -> list[NodeLayouts]:
    """Make the demanded devices busy, those already busy first, higher priorities first.

    Processes on whole GPUs (MIG off) are left as they are: the trace does not model them.
    """
    # (node, GPU, GI id) -> (device name, model, node name, busy now)
    devices: list[tuple[bool, int, int, int, str, str, str]] = []
    for n_i, node in enumerate(fleet):
        for g_i, layout in enumerate(node.gpus):
            busy = busy_gi_ids(layout)
            by_id = {p.id: p for p in layout.profiles}
            for gi in layout.instances:
                profile = by_id.get(gi.profile_id)
                if profile is None or len(gi.compute_instances) != 1:
                    continue
                name = ci_name(profile, gi.compute_instances[0].placement.size)
                devices.append(
                    (gi.id not in busy, n_i, g_i, gi.id, name, layout.gpu.name, node.name)
                )
    devices.sort()  # busy ones first: they stay busy
    chosen: set[tuple[int, int, int]] = set()
    for e in sorted(demand.entries, key=lambda e: -e.priority):
        left = e.count
        for _, n_i, g_i, gi_id, name, model, node_name in devices:
            if left <= 0:
                break
            key = (n_i, g_i, gi_id)
            if key in chosen or not e.accepts(name, model):
                continue
            if e.pool is not None and node_name not in pools.get(e.pool, frozenset()):
                continue
            chosen.add(key)
            left -= 1
    out: list[NodeLayouts] = []
    for n_i, node in enumerate(fleet):
        gpus = []
        for g_i, layout in enumerate(node.gpus):
            whole = tuple(p for p in layout.processes if p.gpu_instance_id is None)
            processes = whole + tuple(
                Process(_PID_BASE + gi.id, None, gi.id, gi.compute_instances[0].id)
                for gi in layout.instances
                if (n_i, g_i, gi.id) in chosen
            )
            gpus.append(dataclasses.replace(layout, processes=processes))
        out.append(NodeLayouts(node.name, tuple(gpus)))
    return out


def _slices(fleet: Sequence[NodeLayouts]) -> tuple[int, int, float]:
    """Idle and total memory slices of MIG GPUs; idle GPUs (MIG GPUs by idle fraction, whole
    GPUs with no process as 1)."""
    idle = total = 0
    gpus = 0.0
    for node in fleet:
        for layout in node.gpus:
            if not (layout.gpu.mig_mode and layout.gpu.mig_mode.current):
                if layout.gpu.mig_mode is not None and not layout.processes:
                    gpus += 1.0
                continue
            width = layout.total_memory_slices
            busy = busy_gi_ids(layout)
            used = sum(gi.placement.size for gi in layout.instances if gi.id in busy)
            total += width
            idle += width - used
            gpus += (width - used) / width if width else 0.0
    return idle, total, gpus
