"""Where GPU instances go on one GPU: the placement search, and why a set of them does not fit.

Unlike mig-parted, which clears a GPU whose counts differ and retries creation orders on the
hardware (reference/mig.md §3.3), the planner (agent/mig/plan.py) searches over placements here:

* every existing instance that can stay (same profile and compute instances, placement compatible
  with a complete layout) stays; only what must go is destroyed;
* new instances get placements from NVML's possible placements (``GiProfile.placements``) so the
  whole set fits; among valid layouts the one keeping the most instances wins, then the one that
  leaves the largest free contiguous region.

When no layout fits, `capacity_problem` and `explain` say why and what would fit instead. Pure:
slices are bits of a mask, no NVML, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import combinations

from agent.gpu.types import GiProfile, GpuInstance, GpuLayout, Placement
from agent.mig.desired import Shape, counts_of, shape_of, shape_order

# -- why a layout does not fit ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Collision:
    """Where an instance could go, and the planned instances that already hold those slices."""

    placement: Placement
    blocked_by: tuple[str, ...]
    slices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Infeasibility:
    """Why the desired layout cannot exist on this GPU model, and what would fit instead."""

    reason: str
    profile: str | None = None
    collisions: tuple[Collision, ...] = ()
    fits_instead: tuple[tuple[str, int], ...] = ()


# -- placement search ------------------------------------------------------------------------------


def slice_mask(p: Placement) -> int:
    return ((1 << p.size) - 1) << p.start


def largest_free(occupied: int, width: int) -> Placement | None:
    best: Placement | None = None
    start = None
    for i in range(width + 1):
        free = i < width and not (occupied >> i) & 1
        if free and start is None:
            start = i
        elif not free and start is not None:
            if best is None or i - start > best.size:
                best = Placement(start, i - start)
            start = None
    return best


def room_meter(profiles: Sequence[GiProfile]) -> Callable[[int], tuple[int, int]]:
    """Scores the free space a layout leaves: (largest free region an instance can still use,
    how many placements of any profile still fit). Raw free slices can mislead: slice 7 alone
    holds no instance on an 8-slice GPU, so a layout leaving it free leaves nothing usable."""
    masks = [(p.size, slice_mask(p)) for profile in profiles for p in profile.placements]

    def room(occupied: int) -> tuple[int, int]:
        fitting = [size for size, mask in masks if not mask & occupied]
        return max(fitting, default=0), len(fitting)

    return room


def _choose(
    placements: tuple[Placement, ...], count: int, occupied: int
) -> Iterator[tuple[Placement, ...]]:
    """Every set of ``count`` mutually disjoint placements avoiding ``occupied``, lowest first."""
    for mask, places in _disjoint_sets(placements).get(count, ()):
        if not mask & occupied:
            yield places


@cache
def _disjoint_sets(
    placements: tuple[Placement, ...],
) -> dict[int, tuple[tuple[int, tuple[Placement, ...]], ...]]:
    """Size -> all sets of that many mutually disjoint placements of a profile, (mask, places).

    At most 2**7 sets on an 8-slice GPU, computed once per profile: the searches only test masks.
    """
    sets: list[tuple[int, tuple[Placement, ...]]] = [(0, ())]
    for p in sorted(placements):
        m = slice_mask(p)
        sets += [(mask | m, (*places, p)) for mask, places in sets if not mask & m]
    by_size: dict[int, list[tuple[int, tuple[Placement, ...]]]] = {}
    for item in sorted(sets, key=lambda item: item[1]):
        by_size.setdefault(len(item[1]), []).append(item)
    return {size: tuple(items) for size, items in by_size.items()}


def _groups(shapes: Sequence[Shape]) -> list[tuple[Shape, int]]:
    # Identical shapes are chosen together as combinations: n identical 1g instances are one
    # choice of n starts, not n! orderings of the same layout.
    counted = Counter(shapes)
    return sorted(counted.items(), key=lambda item: shape_order(item[0]))


_Kept = tuple[GpuInstance, ...]
_New = tuple[tuple[Shape, Placement], ...]


def search(
    shapes: Sequence[Shape],
    existing: Sequence[GpuInstance],
    pinned: Sequence[GpuInstance],
    busy: set[int],
    room: Callable[[int], tuple[int, int]],
) -> tuple[_Kept, _New] | None:
    """The best complete layout: ``pinned`` stay, then most busy kept, most kept, most room."""
    profiles = {s.profile.id: s.profile for s in shapes}
    candidates: dict[Shape, list[GpuInstance]] = {}
    for gi in existing:
        shape = shape_of(gi, profiles)
        if shape is not None:
            candidates.setdefault(shape, []).append(gi)
    pinned_ids = {gi.id for gi in pinned}
    if any(shape_of(gi, profiles) not in candidates for gi in pinned):
        return None
    groups = _groups(shapes)
    # Upper bounds of the busy and total instances later groups can still keep, for pruning.
    later = [(0, 0)] * (len(groups) + 1)
    for i in range(len(groups) - 1, -1, -1):
        shape, n = groups[i]
        cands = candidates.get(shape, [])
        busy_later, kept_later = later[i + 1]
        later[i] = (
            busy_later + min(n, sum(gi.id in busy for gi in cands)),
            kept_later + min(n, len(cands)),
        )
    best: list[tuple[tuple[int, ...], _Kept, _New]] = []

    def visit(i: int, occupied: int, kept: _Kept, new: _New) -> None:
        if best:
            bound = (sum(gi.id in busy for gi in kept) + later[i][0], len(kept) + later[i][1])
            if bound < best[0][0][:2]:
                return
        if i == len(groups):
            score = (sum(gi.id in busy for gi in kept), len(kept), *room(occupied))
            if not best or score > best[0][0]:
                best[:] = [(score, kept, new)]
            return
        shape, n = groups[i]
        cands = candidates.get(shape, [])
        forced = tuple(gi for gi in cands if gi.id in pinned_ids)
        optional = [gi for gi in cands if gi.id not in pinned_ids]
        if len(forced) > n:
            return
        for k in range(min(n, len(cands)), len(forced) - 1, -1):
            for extra in combinations(optional, k - len(forced)):
                mask = 0
                for gi in extra:
                    mask |= slice_mask(gi.placement)
                if mask & occupied:
                    continue
                for places in _choose(shape.profile.placements, n - k, occupied | mask):
                    taken = occupied | mask
                    for p in places:
                        taken |= slice_mask(p)
                    visit(
                        i + 1, taken, kept + forced + extra, new + tuple((shape, p) for p in places)
                    )

    start = 0
    for gi in pinned:
        start |= slice_mask(gi.placement)
    visit(0, start, (), ())
    if not best:
        return None
    _, kept, new = best[0]
    return tuple(sorted(kept, key=lambda gi: gi.placement)), new


# -- explanations ----------------------------------------------------------------------------------


def capacity_problem(shapes: Sequence[Shape], layout: GpuLayout) -> Infeasibility | None:
    """Count, +me and size limits, checked before any placement search."""
    model = layout.gpu.name
    per_profile = Counter(s.profile for s in shapes)
    for profile, n in per_profile.items():
        if n > profile.instance_count:
            return Infeasibility(
                f"needs {n} {profile.name} instances; {model} allows at most "
                f"{profile.instance_count}",
                profile.name,
                fits_instead=_fitting_counts(shapes),
            )
    media = [s.profile.name for s in shapes if _is_media(s.profile)]
    if len(media) > 1:
        return Infeasibility(
            f"only one +me instance per GPU; requested {len(media)} ({', '.join(media)})",
            media[1],
            fits_instead=_fitting_counts(shapes),
        )
    # At most one +me.all by now (it is a +me profile too); everything beside it must be -me.
    every_engine = [s.profile.name for s in shapes if _takes_every_engine(s.profile)]
    beside = sorted(
        {
            s.profile.name
            for s in shapes
            if not _takes_every_engine(s.profile) and not _has_no_engine(s.profile)
        }
    )
    if every_engine and beside:
        return Infeasibility(
            f"a {every_engine[0]} instance takes every media engine, so only -me instances may "
            f"share its GPU; requested beside it: {', '.join(beside)}",
            every_engine[0],
            fits_instead=_fitting_counts(shapes),
        )
    used = sum(s.profile.memory_slices for s in shapes)
    width = layout.total_memory_slices
    if used > width:
        parts = ", ".join(f"{n} x {p.name} = {p.memory_slices * n}" for p, n in per_profile.items())
        return Infeasibility(
            f"needs {used} memory slices ({parts}); {model} has {width}",
            fits_instead=_fitting_counts(shapes),
        )
    return None


def _is_media(profile: GiProfile) -> bool:
    return "+me" in profile.name


def _takes_every_engine(profile: GiProfile) -> bool:
    """``+me.all``: nvml.h's _ALL_ME profiles, which block every profile but the -me ones."""
    return profile.name.endswith("+me.all")


def _has_no_engine(profile: GiProfile) -> bool:
    return profile.name.endswith("-me")


def _within_limits(shapes: Sequence[Shape]) -> list[Shape]:
    """``shapes`` cut to each profile's max count, to one +me instance and to a +me.all instance
    only beside -me ones (§1.2, §1.4)."""
    out: list[Shape] = []
    for s in shapes:
        same = sum(o.profile == s.profile for o in out)
        media = sum(_is_media(o.profile) for o in out)
        if same >= s.profile.instance_count or (_is_media(s.profile) and media):
            continue
        if _takes_every_engine(s.profile) and any(not _has_no_engine(o.profile) for o in out):
            continue
        if any(_takes_every_engine(o.profile) for o in out) and not _has_no_engine(s.profile):
            continue
        out.append(s)
    return out


def _fitting_counts(shapes: Sequence[Shape]) -> tuple[tuple[str, int], ...]:
    placed = _best_partial(shapes)
    return tuple(counts_of([s for s, _ in placed]).items())


def _best_partial(shapes: Sequence[Shape]) -> _New:
    """The most instances of ``shapes`` that fit an empty GPU together (then the most memory)."""
    groups = _groups(_within_limits(shapes))
    _, choices = _most_placed(tuple((s.profile.placements, n) for s, n in groups), 0)
    return tuple(
        (shape, p) for (shape, _), places in zip(groups, choices, strict=True) for p in places
    )


@lru_cache(maxsize=1 << 16)
def _most_placed(
    groups: tuple[tuple[tuple[Placement, ...], int], ...], occupied: int
) -> tuple[tuple[int, int], tuple[tuple[Placement, ...], ...]]:
    """Best (count, memory) for up to n placements per group in the free slices, and the choice.

    Dynamic programming over (groups left, occupied slices): what later groups can add depends
    only on the slices left. Cached across calls, as layouts share their tails.
    """
    if not groups:
        return (0, 0), ()
    (placements, n), rest = groups[0], groups[1:]
    top: tuple[tuple[int, int], tuple[tuple[Placement, ...], ...]] = ((-1, -1), ())
    sets = _disjoint_sets(placements)
    for k in range(n, -1, -1):
        for mask, places in sets.get(k, ()):
            if not mask & occupied:
                (count, memory), later = _most_placed(rest, occupied | mask)
                score = (count + k, memory + mask.bit_count())
                if score > top[0]:
                    top = (score, (places, *later))
    return top


def explain(shapes: Sequence[Shape], layout: GpuLayout) -> Infeasibility:
    """Which profile does not fit, which slices collide at each of its placements, what fits."""
    placed = _best_partial(shapes)
    left = Counter(shapes) - Counter(s for s, _ in placed)
    missing = min(left, key=shape_order)
    collisions = tuple(
        Collision(
            p,
            tuple(f"{s.profile.name}@{q}" for s, q in placed if q.overlaps(p)),
            tuple(i for i in p.slices if any(i in q.slices for _, q in placed)),
        )
        for p in missing.profile.placements
    )
    holders = "; ".join(
        f"at {c.placement} it overlaps {', '.join(c.blocked_by)} on slices {_slices(c.slices)}"
        for c in collisions
    )
    return Infeasibility(
        f"{missing.profile.name} does not fit next to "
        f"{', '.join(f'{s.profile.name}@{p}' for s, p in placed)}: {holders}",
        missing.profile.name,
        collisions,
        tuple(counts_of([s for s, _ in placed]).items()),
    )


def _slices(slices: Sequence[int]) -> str:
    return f"{slices[0]}-{slices[-1]}" if len(slices) > 1 else str(slices[0])
