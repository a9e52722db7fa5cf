"""Fragmentation-aware placement advice for one GPU: where a new MIG instance should go.

Pure functions over :class:`agent.gpu.types.GpuLayout` (no NVML, no I/O). They never change a
GPU: on a node whose DRA driver creates MIG instances itself (dra-dynamic-mig) the agent only
advises, and on any other node the advice says where `mig apply` or a person should put the
next instance.

For each GPU-instance profile the advice lists the placements free now (valid per NVML's
possible placements, not overlapping an existing instance, within the profile's instance limit
and the media-engine rules), and for each of them what would still fit afterwards: per profile,
how many instances could still be created (each profile on its own, as NVML's remaining
capacity counts them), and the largest profile still placeable.

**The recommended placement** keeps the largest profiles possible: among the free placements,
the one whose "still fits" counts are greatest lexicographically, profiles taken largest first
(memory slices, then compute slices, then name); ties go to the lowest start. So it first keeps
the largest profile placeable, then the most instances of it, then of the next largest, ...

When no placement is free, the advice says why: the profile's instance limit, the media
engines, too few free slices, or fragmentation (enough free memory and compute slices, no free
placement). For a fragmented profile :func:`moves_to_fit` finds the fewest relocations of
existing instances (at most two) after which it would fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations, product

from agent.gpu.types import GiProfile, GpuLayout, Placement

__all__ = [
    "GpuAdvice",
    "Move",
    "PlacementAdvice",
    "ProfileAdvice",
    "advise_gpu",
    "can_create",
    "moves_to_fit",
    "profile_order",
    "still_fits",
]

#: Instances :func:`moves_to_fit` relocates at most; more is a re-layout, not a nudge.
MAX_MOVES = 2

_MEDIA = ("+me", "+me.all")

#: (profile, placement) of one instance, existing or planned.
Placed = tuple[GiProfile, Placement]
#: how moves_to_fit ranks candidates: busy moved, still-fits (negated), positions
_Key = tuple[int, tuple[int, ...], tuple[int, ...]]


def _attrs(profile: GiProfile) -> str:
    """The name's attribute suffix: ``+me``, ``+me.all``, ``-me``, ``+gfx`` or ``""``."""
    for suffix in ("+me.all", "+me", "-me", "+gfx"):
        if profile.name.endswith(suffix):
            return suffix
    return ""


def _media_conflict(profile: GiProfile, placed: Sequence[Placed]) -> bool:
    """One +me or +me.all instance per GPU; a +me.all instance takes every media engine, so it
    lives only beside -me instances, either way round (nvml.h ``_ALL_ME``)."""
    mine = _attrs(profile)
    theirs = [_attrs(p) for p, _ in placed]
    if mine in _MEDIA and any(a in _MEDIA for a in theirs):
        return True
    if mine == "+me.all" and any(a != "-me" for a in theirs):
        return True
    return mine != "-me" and "+me.all" in theirs


def can_create(profile: GiProfile, at: Placement, placed: Sequence[Placed]) -> bool:
    """Whether NVML would create a ``profile`` instance at ``at`` beside ``placed``."""
    if at not in profile.placements:
        return False
    if sum(1 for p, _ in placed if p.id == profile.id) >= profile.instance_count:
        return False
    if _media_conflict(profile, placed):
        return False
    return not any(at.overlaps(q) for _, q in placed)


def still_fits(profile: GiProfile, placed: Sequence[Placed]) -> int:
    """How many more ``profile`` instances could be created beside ``placed`` (this profile
    alone). Its placements all have one size, so taking them earliest-ending first is optimal;
    a media instance (+me, +me.all) rules out a second one."""
    count = 0
    now = list(placed)
    for at in sorted(profile.placements, key=lambda p: (p.start + p.size, p.start)):
        if can_create(profile, at, now):
            now.append((profile, at))
            count += 1
    return count


def profile_order(profile: GiProfile) -> tuple[int, int, str]:
    """Largest first: memory slices, then compute slices, then the name."""
    return (-profile.memory_slices, -profile.slice_count, profile.name)


@dataclass(frozen=True, slots=True)
class PlacementAdvice:
    placement: Placement
    #: (profile name, instances still creatable) after this placement, largest profile first.
    fits_after: tuple[tuple[str, int], ...]
    #: the largest profile still placeable afterwards; None when nothing more fits.
    largest_after: str | None


@dataclass(frozen=True, slots=True)
class ProfileAdvice:
    profile: str
    #: free placements now, in start order.
    placements: tuple[PlacementAdvice, ...]
    #: the placement that keeps the largest profiles possible (see the module doc).
    recommended: Placement | None
    #: why no placement is free; "" when one is.
    reason: str = ""
    #: enough free memory and compute slices, but no free placement.
    fragmented: bool = False


@dataclass(frozen=True, slots=True)
class GpuAdvice:
    index: int
    uuid: str
    model: str
    #: memory slices in no instance, and the GPU's width.
    free_slices: tuple[int, ...]
    width: int
    #: (profile name, instances creatable now), largest profile first.
    fits_now: tuple[tuple[str, int], ...]
    profiles: tuple[ProfileAdvice, ...]
    #: why there is no advice (MIG off, not MIG-capable); "" when there is.
    note: str = ""


def _placed(layout: GpuLayout) -> list[Placed]:
    by_id = {p.id: p for p in layout.profiles}
    return [
        (by_id[gi.profile_id], gi.placement) for gi in layout.instances if gi.profile_id in by_id
    ]


def _fits(profiles: Sequence[GiProfile], placed: Sequence[Placed]) -> tuple[tuple[str, int], ...]:
    return tuple((p.name, still_fits(p, placed)) for p in profiles)


def _free_slices(width: int, placed: Sequence[Placed]) -> tuple[int, ...]:
    used = {i for _, q in placed for i in q.slices}
    return tuple(i for i in range(width) if i not in used)


def _why_none(
    profile: GiProfile, placed: Sequence[Placed], width: int, compute: int
) -> tuple[str, bool]:
    same = sum(1 for p, _ in placed if p.id == profile.id)
    if same >= profile.instance_count:
        return f"{same} of at most {profile.instance_count} {profile.name} instances exist", False
    if _media_conflict(profile, placed):
        return (
            "the media engines are taken: one +me or +me.all instance per GPU, and a +me.all "
            "instance only beside -me ones",
            False,
        )
    free = len(_free_slices(width, placed))
    free_compute = compute - sum(p.slice_count for p, _ in placed)
    starts = ",".join(str(p.start) for p in profile.placements)
    if free >= profile.memory_slices and free_compute >= profile.slice_count:
        return (
            f"fragmented: {free} free memory slice(s) and {free_compute} free compute slice(s) "
            f"are enough, but no placement is free (it starts at slice {starts}, "
            f"{profile.memory_slices} wide)",
            True,
        )
    return (
        f"too few free slices: {free} memory and {max(free_compute, 0)} compute free, "
        f"{profile.memory_slices} and {profile.slice_count} needed",
        False,
    )


def _rank(option: PlacementAdvice) -> tuple[tuple[int, ...], int]:
    """The recommendation's order: still-fits counts largest profile first, then lowest start."""
    return tuple(n for _, n in option.fits_after), -option.placement.start


def advise_gpu(layout: GpuLayout, only: str | None = None) -> GpuAdvice:
    """Placement advice for every profile of this GPU (or for the profile named ``only``)."""
    gpu = layout.gpu
    width = layout.total_memory_slices
    if gpu.mig_mode is None:
        return GpuAdvice(gpu.index, gpu.uuid, gpu.name, (), 0, (), (), "not MIG-capable")
    if not gpu.mig_mode.current or not layout.profiles:
        return GpuAdvice(gpu.index, gpu.uuid, gpu.name, (), 0, (), (), "MIG is off")
    profiles = sorted(layout.profiles, key=profile_order)
    compute = max(p.slice_count for p in profiles)
    placed = _placed(layout)
    out: list[ProfileAdvice] = []
    for profile in profiles:
        if only is not None and profile.name != only:
            continue
        options = []
        for at in sorted(profile.placements):
            if not can_create(profile, at, placed):
                continue
            after = _fits(profiles, [*placed, (profile, at)])
            largest = next((name for name, n in after if n), None)
            options.append(PlacementAdvice(at, after, largest))
        if options:
            best = max(options, key=_rank)
            out.append(ProfileAdvice(profile.name, tuple(options), best.placement))
        else:
            reason, fragmented = _why_none(profile, placed, width, compute)
            out.append(ProfileAdvice(profile.name, (), None, reason, fragmented))
    return GpuAdvice(
        gpu.index,
        gpu.uuid,
        gpu.name,
        _free_slices(width, placed),
        width,
        _fits(profiles, placed),
        tuple(out),
    )


@dataclass(frozen=True, slots=True)
class Move:
    """Relocate one existing instance: its profile, GI id and where it is and would be."""

    profile: str
    gpu_instance: int
    source: Placement
    target: Placement
    #: processes run on it: moving it restarts them.
    busy: bool

    def __str__(self) -> str:
        used = " (in use)" if self.busy else ""
        return (
            f"the {self.profile} at slice {self.source.start}{used} were at slice "
            f"{self.target.start}"
        )


def moves_to_fit(layout: GpuLayout, profile_name: str) -> tuple[tuple[Move, ...], Placement] | None:
    """The fewest relocations of existing instances (at most :data:`MAX_MOVES`) after which
    a ``profile_name`` instance fits, and where it would go; None when none do (or it fits
    already: then no move is needed and the advice's placement says where).

    Among equally few moves: fewest busy instances moved, then the recommended placement's
    rule for the new instance, then the lowest (instance, target) positions.
    """
    by_name = {p.name: p for p in layout.profiles}
    profile = by_name.get(profile_name)
    mode = layout.gpu.mig_mode
    if profile is None or not (mode and mode.current):
        return None
    by_id = {p.id: p for p in layout.profiles}
    gis = [gi for gi in layout.instances if gi.profile_id in by_id]
    placed = [(by_id[gi.profile_id], gi.placement) for gi in gis]
    if any(can_create(profile, at, placed) for at in profile.placements):
        return None
    in_use = {p.gpu_instance_id for p in layout.processes if p.gpu_instance_id is not None}
    ordered = sorted(layout.profiles, key=profile_order)
    for count in range(1, MAX_MOVES + 1):
        found: list[tuple[_Key, tuple[Move, ...], Placement]] = []
        for chosen in combinations(range(len(gis)), count):
            targets = [
                [t for t in by_id[gis[i].profile_id].placements if t != gis[i].placement]
                for i in chosen
            ]
            for where in product(*targets):
                moved = dict(zip(chosen, where, strict=True))
                after = [(p, moved.get(i, q)) for i, (p, q) in enumerate(placed)]
                if any(a[1].overlaps(b[1]) for a, b in combinations(after, 2)):
                    continue
                spots = [at for at in sorted(profile.placements) if can_create(profile, at, after)]
                if not spots:
                    continue
                best = max(
                    spots,
                    key=lambda at: (
                        tuple(still_fits(p, [*after, (profile, at)]) for p in ordered),
                        -at.start,
                    ),
                )
                moves = tuple(
                    Move(
                        by_id[gis[i].profile_id].name,
                        gis[i].id,
                        gis[i].placement,
                        moved[i],
                        gis[i].id in in_use,
                    )
                    for i in chosen
                )
                score = tuple(still_fits(p, [*after, (profile, best)]) for p in ordered)
                key = (
                    sum(m.busy for m in moves),
                    tuple(-n for n in score),
                    tuple(x for m in moves for x in (m.source.start, m.target.start)),
                )
                found.append((key, moves, best))
        if found:
            _, moves, best = min(found, key=lambda f: f[0])
            return moves, best
    return None
