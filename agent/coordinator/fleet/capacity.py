"""What a GPU's MIG slices hold and could still hold: masks, idle devices, the slice map.

Pure functions over `GpuLayout` and placements, shared by the fleet view and the planner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import cache

from agent.gpu.types import GiProfile, GpuLayout, Placement
from agent.mig.desired import ci_name

__all__ = [
    "busy_gi_ids",
    "counts_text",
    "creatable",
    "free_capacity",
    "idle_devices",
    "mask",
    "occupied",
    "slice_map",
]


def mask(p: Placement) -> int:
    return ((1 << p.size) - 1) << p.start


def occupied(placements: Iterable[Placement]) -> int:
    out = 0
    for p in placements:
        out |= mask(p)
    return out


def busy_gi_ids(layout: GpuLayout) -> frozenset[int]:
    return frozenset(p.gpu_instance_id for p in layout.processes if p.gpu_instance_id is not None)


def idle_devices(layout: GpuLayout) -> Counter[str]:
    """MIG devices (one per compute instance) with no process on their GPU instance, by name."""
    if not (layout.gpu.mig_mode and layout.gpu.mig_mode.current):
        return Counter()
    busy = busy_gi_ids(layout)
    by_id = {p.id: p for p in layout.profiles}
    out: Counter[str] = Counter()
    for gi in layout.instances:
        profile = by_id.get(gi.profile_id)
        if gi.id in busy or profile is None:
            continue
        out.update(ci_name(profile, ci.placement.size) for ci in gi.compute_instances)
    return out


@cache
def _max_disjoint(placements: tuple[Placement, ...], taken: int) -> int:
    # Placements of one profile all have one size, so earliest-ending-first is optimal.
    count, used = 0, taken
    for p in sorted(placements, key=lambda q: q.start + q.size):
        if not mask(p) & used:
            used |= mask(p)
            count += 1
    return count


def creatable(profile: GiProfile, taken: int, existing: int, media_used: bool) -> int:
    """How many more ``profile`` instances fit in the slices outside ``taken``, this one alone."""
    if "+me" in profile.name:
        return 0 if media_used else min(1, _max_disjoint(profile.placements, taken))
    return max(0, min(profile.instance_count - existing, _max_disjoint(profile.placements, taken)))


def free_capacity(
    profiles: Sequence[GiProfile], placed: Sequence[tuple[int, Placement]]
) -> dict[str, int]:
    """Per profile name: instances creatable in the free slices, given ``(profile id, where)``."""
    taken = occupied(p for _, p in placed)
    per_id = Counter(pid for pid, _ in placed)
    by_id = {p.id: p for p in profiles}
    media = any("+me" in by_id[pid].name for pid in per_id if pid in by_id)
    return {p.name: n for p in profiles if (n := creatable(p, taken, per_id[p.id], media))}


def slice_map(layout: GpuLayout, width: int | None = None) -> str:
    """One character per memory slice: the GI's compute-slice count, ``.`` free, ``*`` busy.

    ``7777777`` is one 7g, ``1122.333`` ... reads left to right in slice order; a GPU with MIG
    off is ``-`` (a whole GPU), a GPU without MIG ``n/a``.
    """
    mode = layout.gpu.mig_mode
    if mode is None:
        return "n/a"
    if not mode.current:
        return "-"
    width = width or layout.total_memory_slices or 8
    cells = ["."] * width
    busy = busy_gi_ids(layout)
    slices = {p.id: p.slice_count for p in layout.profiles}
    for gi in layout.instances:
        mark = "*" if gi.id in busy else str(slices.get(gi.profile_id, "?"))
        for i in gi.placement.slices:
            if i < width:
                cells[i] = mark
    return "".join(cells)


def counts_text(counts: Mapping[str, int]) -> str:
    """``1g.10gb:3 3g.40gb:1``: compact counts for tables."""
    return " ".join(f"{name}:{n}" for name, n in sorted(counts.items()) if n) or "-"
