"""What ``mig show`` and ``mig plan`` print: slice maps drawn in the terminal, and their data.

Pure: records in, text or JSON-able dicts out. A slice map draws a GPU's memory slices (8, or 4
on A30) left to right, one box per instance spanning the slices it holds, free slices marked,
and a ``*`` on instances with running processes:

    slice     0          1          2          3          4          5          6          7
        ┌──────────┬──────────┬─────────────────────┬───────────────────────────────────────────┐
        │  1g.5gb  │  1g.5gb  │       2g.10gb       │                 3g.20gb *                 │
        │   GI 7   │   GI 8   │        GI 4         │                   GI 2                    │
        └──────────┴──────────┴─────────────────────┴───────────────────────────────────────────┘
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.gpu.types import GpuInfo, GpuLayout, Placement
from agent.mig.desired import current_counts
from agent.mig.plan import GpuPlan
from agent.mig.state import GpuMigState

_CELL = 10  # characters per memory slice: fits "1g.18gb+me"


@dataclass(frozen=True, slots=True)
class Box:
    """One box of a slice map: an instance, or a free slice."""

    placement: Placement
    title: str
    detail: str = ""


def mode_text(gpu: GpuInfo) -> str:
    mode = gpu.mig_mode
    if mode is None:
        return "not MIG-capable"
    text = f"MIG {'enabled' if mode.current else 'disabled'}"
    if mode.is_pending:
        text += f", {'enable' if mode.pending else 'disable'} pending (needs a GPU reset)"
    return text


def layout_boxes(layout: GpuLayout) -> list[Box]:
    busy = {p.gpu_instance_id for p in layout.processes}
    boxes = []
    for gi in layout.instances:
        cis = len(gi.compute_instances)
        detail = f"GI {gi.id}" + ("" if cis == 1 else f" · {cis} CIs")
        boxes.append(Box(gi.placement, gi.profile_name + (" *" if gi.id in busy else ""), detail))
    return boxes


def state_boxes(state: GpuMigState, existing: Sequence[Placement]) -> list[Box]:
    """Boxes of a planned layout: kept instances say so, the others are new."""
    boxes = []
    for gi in state.instances:
        cis = len(gi.cis)
        detail = ("kept" if gi.placement in existing else "new") + (
            "" if cis == 1 else f" · {cis} CIs"
        )
        boxes.append(Box(gi.placement, gi.profile_name, detail))
    return boxes


def slice_map(boxes: Sequence[Box], width: int, indent: str = "  ") -> str:
    """Draw ``boxes`` over ``width`` memory slices; slices no box covers are drawn free."""
    taken = {i for b in boxes for i in b.placement.slices}
    cells = sorted(
        [*boxes, *(Box(Placement(i, 1), "free") for i in range(width) if i not in taken)],
        key=lambda b: b.placement.start,
    )
    spans = [b.placement.size * _CELL + b.placement.size - 1 for b in cells]
    header = (" " + "".join(f"{i:^{_CELL}} " for i in range(width))).rstrip()
    lines = [
        f"{indent}slice{header}",
        f"{indent}     ┌" + "┬".join("─" * s for s in spans) + "┐",
        f"{indent}     │"
        + "│".join(f"{b.title:^{s}}" for b, s in zip(cells, spans, strict=True))
        + "│",
        f"{indent}     │"
        + "│".join(f"{b.detail:^{s}}" for b, s in zip(cells, spans, strict=True))
        + "│",
        f"{indent}     └" + "┴".join("─" * s for s in spans) + "┘",
    ]
    return "\n".join(lines)


def gpu_ranges(indexes: Sequence[int]) -> str:
    """``0-3,5,7``: GPU indexes as the shortest list of ranges."""
    out: list[str] = []
    ordered = sorted(indexes)
    start = prev = ordered[0]
    for i in [*ordered[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)


@dataclass(frozen=True, slots=True)
class _Block:
    """One GPU's part of the output: a title without the index, and the lines under it."""

    index: int
    title: str
    body: tuple[str, ...]
    #: after the title when the GPU stands alone (its UUID)
    alone: str = ""
    #: after that
    tail: str = ""


def _grouped(blocks: Sequence[_Block]) -> str:
    """GPUs whose title and lines are the same print once, as ``GPU 0-7``."""
    groups: dict[tuple[tuple[str, str], tuple[str, ...]], list[_Block]] = {}
    for block in blocks:
        groups.setdefault(((block.title, block.tail), block.body), []).append(block)
    parts = []
    for (_, body), members in groups.items():
        first = members[0]
        alone = f"  {first.alone}" if len(members) == 1 and first.alone else ""
        which = gpu_ranges([b.index for b in members])
        parts.append(f"GPU {which}  {first.title}{alone}{first.tail}".rstrip())
        parts += body
        parts.append("")
    return "\n".join(parts).rstrip()


def show_text(layouts: Sequence[GpuLayout]) -> str:
    """Every GPU's slice map; GPUs with the same model and layout share one."""
    blocks = []
    for layout in layouts:
        gpu = layout.gpu
        body: list[str] = []
        mode = gpu.mig_mode
        if mode is not None and mode.current:
            body.append(slice_map(layout_boxes(layout), layout.total_memory_slices))
            body += [
                f"  * pid {p.pid} on GI {p.gpu_instance_id}"
                + (f" ({_mib(p.used_memory_bytes)})" if p.used_memory_bytes is not None else "")
                for p in layout.processes
                if p.gpu_instance_id is not None
            ]
        elif mode is not None and layout.total_memory_slices:
            whole = Box(Placement(0, layout.total_memory_slices), "whole GPU (MIG disabled)")
            body.append(slice_map([whole], layout.total_memory_slices))
        blocks.append(
            _Block(gpu.index, gpu.name, tuple(body), alone=gpu.uuid, tail=f"  {mode_text(gpu)}")
        )
    return _grouped(blocks)


def show_data(layouts: Sequence[GpuLayout]) -> list[dict[str, Any]]:
    out = []
    for layout in layouts:
        gpu = layout.gpu
        owner = {i: gi.id for gi in layout.instances for i in gi.placement.slices}
        busy = {p.gpu_instance_id for p in layout.processes}
        out.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "mig": None
                if gpu.mig_mode is None
                else {"current": gpu.mig_mode.current, "pending": gpu.mig_mode.pending},
                "slices": [owner.get(i) for i in range(layout.total_memory_slices)],
                "counts": current_counts(layout),
                "instances": [
                    {
                        "gpu_instance_id": gi.id,
                        "profile": gi.profile_name,
                        "placement": str(gi.placement),
                        "compute_instances": [
                            {"id": ci.id, "slices": ci.placement.size, "uuid": ci.uuid}
                            for ci in gi.compute_instances
                        ],
                        "busy": gi.id in busy,
                    }
                    for gi in layout.instances
                ],
                "processes": [
                    {
                        "pid": p.pid,
                        "gpu_instance_id": p.gpu_instance_id,
                        "used_memory_bytes": p.used_memory_bytes,
                    }
                    for p in layout.processes
                ],
            }
        )
    return out


def plan_text(plans: Sequence[GpuPlan]) -> str:
    """Every GPU's plan; GPUs planned the same way (same model, entry and steps) share one."""
    blocks = []
    for plan in plans:
        gpu = plan.layout.gpu
        source = f" ({plan.desired.source})" if plan.desired.source else ""
        title = f"{gpu.name}{source}: {plan.status.upper()}"
        blocks.append(_Block(gpu.index, title, tuple(_gpu_plan_lines(plan))))
    return _grouped(blocks)


def _gpu_plan_lines(plan: GpuPlan) -> list[str]:
    lines: list[str] = []
    if plan.mode_change is not None:
        change = "enabled" if plan.mode_change.enable else "disabled"
        if plan.mode_change.activation:
            lines.append(
                f"  MIG mode -> {change}: needs a GPU reset unless the driver switches at once "
                "(nothing may hold the GPU)"
            )
        else:
            lines.append(f"  MIG mode: cancel the pending change, stay {change}")
    if plan.infeasible is not None:
        why = plan.infeasible
        lines.append(f"  cannot fit: {why.reason}")
        if why.fits_instead:
            lines.append("  fits instead: " + ", ".join(f"{n}: {c}" for n, c in why.fits_instead))
        return lines
    if plan.deferred:
        lines.append(
            "  the driver lists no profiles while MIG is off: instances are planned once it is on"
        )
    for label, items in (
        ("keep", [f"{gi.profile_name}@{gi.placement} (GI {gi.id})" for gi in plan.keep]),
        ("destroy", [f"{gi.profile_name}@{gi.placement} (GI {gi.id})" for gi in plan.destroy]),
        ("create", [gi.label for gi in plan.create]),
    ):
        if items:
            lines.append(f"  {label:<8} " + ", ".join(items))
    lines += [f"  BLOCKED  {b}" for b in plan.blockers]
    if plan.target is not None and plan.target.mig_enabled and plan.steps:
        existing = [gi.placement for gi in plan.keep]
        lines.append("  after:")
        lines.append(
            slice_map(state_boxes(plan.target, existing), plan.layout.total_memory_slices, "    ")
        )
    if plan.steps:
        lines.append("  steps:")
        lines += [f"    {i}. {step}" for i, step in enumerate(plan.steps, start=1)]
    return lines


def plan_data(plan: GpuPlan) -> dict[str, Any]:
    gpu = plan.layout.gpu
    why = plan.infeasible
    return {
        "gpu": gpu.index,
        "uuid": gpu.uuid,
        "entry": plan.desired.source,
        "status": plan.status,
        "mode_change": None
        if plan.mode_change is None
        else {"enable": plan.mode_change.enable, "reset_needed": plan.mode_change.activation},
        "keep": [f"{gi.profile_name}@{gi.placement}" for gi in plan.keep],
        "destroy": [f"{gi.profile_name}@{gi.placement}" for gi in plan.destroy],
        "create": [gi.label for gi in plan.create],
        "blockers": [
            {"pid": b.pid, "instance": b.instance, "change": b.change} for b in plan.blockers
        ],
        "infeasible": None
        if why is None
        else {
            "reason": why.reason,
            "profile": why.profile,
            "collisions": [
                {
                    "placement": str(c.placement),
                    "blocked_by": list(c.blocked_by),
                    "slices": list(c.slices),
                }
                for c in why.collisions
            ],
            "fits_instead": dict(why.fits_instead),
        },
        "deferred": plan.deferred,
        "free_region": None if plan.free_region is None else str(plan.free_region),
        "steps": [str(s) for s in plan.steps],
    }


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"
