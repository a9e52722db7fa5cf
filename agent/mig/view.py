"""What ``mig show`` prints: slice maps drawn in the terminal, and their data (``mig plan`` draws
the agent's plan with them: agent/cli/mig_plan.py).

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
class Block:
    """One GPU's part of the output: a title without the index, and the lines under it."""

    index: int
    title: str
    body: tuple[str, ...]
    #: after the title when the GPU stands alone (its UUID)
    alone: str = ""
    #: after that
    tail: str = ""


def grouped(blocks: Sequence[Block]) -> str:
    """GPUs whose title and lines are the same print once, as ``GPU 0-7``."""
    groups: dict[tuple[tuple[str, str], tuple[str, ...]], list[Block]] = {}
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
            Block(gpu.index, gpu.name, tuple(body), alone=gpu.uuid, tail=f"  {mode_text(gpu)}")
        )
    return grouped(blocks)


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


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"
