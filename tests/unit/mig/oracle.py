"""A deliberately naive reference for the planner: plain backtracking over placements.

It shares no code with agent/mig/placement.py's search, so agreement between the two means
something.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import combinations

from agent.gpu.types import GiProfile, GpuLayout, Placement

#: An instance as the oracle sees it: its GI profile and the widths of its CIs (widest first).
Shape = tuple[GiProfile, tuple[int, ...]]


def within_limits(shapes: Sequence[Shape], width: int) -> bool:
    per_profile = Counter(p for p, _ in shapes)
    if any(n > p.instance_count for p, n in per_profile.items()):
        return False
    if sum(n for p, n in per_profile.items() if "+me" in p.name) > 1:
        return False
    # nvml.h: an _ALL_ME instance blocks every profile but the _NO_ME ones.
    names = [p.name for p, _ in shapes]
    if any(n.endswith("+me.all") for n in names) and not all(
        n.endswith(("+me.all", "-me")) for n in names
    ):
        return False
    return sum(p.memory_slices for p, _ in shapes) <= width


def completes(
    shapes: Sequence[Shape], fixed: Sequence[tuple[Shape, Placement]], width: int
) -> bool:
    """Can ``shapes`` all exist at once, with the ``fixed`` ones at their given placements?"""
    if not within_limits(shapes, width):
        return False
    remaining = Counter(shapes)
    for shape, _ in fixed:
        if remaining[shape] == 0:
            return False
        remaining[shape] -= 1
    placed = [p for _, p in fixed]
    if any(a.overlaps(b) for a, b in combinations(placed, 2)):
        return False
    todo = sorted(remaining.elements(), key=lambda s: (-s[0].memory_slices, s[0].id, s[1]))
    return _place(todo, placed, None, 0)


def _place(todo: list[Shape], placed: list[Placement], previous: Shape | None, first: int) -> bool:
    """Backtracking; identical shapes take placements in increasing order (no n! re-tries)."""
    if not todo:
        return True
    shape, rest = todo[0], todo[1:]
    placements = shape[0].placements
    for i in range(first if shape == previous else 0, len(placements)):
        p = placements[i]
        if not any(p.overlaps(q) for q in placed):
            placed.append(p)
            if _place(rest, placed, shape, i + 1):
                return True
            placed.pop()
    return False


def shapes_of_layout(layout: GpuLayout) -> list[tuple[Shape, int, Placement]]:
    """(shape, GI id, placement) of every existing instance with at least one CI."""
    profiles = {p.id: p for p in layout.profiles}
    return [
        (
            (
                profiles[gi.profile_id],
                tuple(sorted((c.placement.size for c in gi.compute_instances), reverse=True)),
            ),
            gi.id,
            gi.placement,
        )
        for gi in layout.instances
        if gi.compute_instances
    ]


def max_keepable(
    shapes: Sequence[Shape],
    layout: GpuLayout,
    must_keep: set[int] = frozenset(),  # type: ignore[assignment]
) -> int | None:
    """The most existing instances a complete layout can keep (None if ``must_keep`` can't stay)."""
    existing = shapes_of_layout(layout)
    width = layout.total_memory_slices
    for size in range(len(existing), -1, -1):
        for subset in combinations(existing, size):
            ids = {gi_id for _, gi_id, _ in subset}
            if must_keep <= ids and completes(shapes, [(s, p) for s, _, p in subset], width):
                return size
    return None
