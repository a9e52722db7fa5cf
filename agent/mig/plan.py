"""MIG planning: a GPU's current layout + desired counts -> the layout to reach, and the steps.

Pure functions over the records of :mod:`agent.gpu.types` (STYLE.md practice 3): no NVML, no I/O.
Unlike mig-parted, which clears a GPU whose counts differ and retries creation orders on the
hardware (reference/mig.md §3.3), the planner searches over placements here:

* every existing instance that can stay (same profile and compute instances, placement compatible
  with a complete layout) stays; only what must go is destroyed;
* new instances get placements from NVML's possible placements (``GiProfile.placements``) so the
  whole set fits; among valid layouts the one keeping the most instances wins, then the one that
  leaves the largest free contiguous region;
* instances with running processes are never destroyed unless forced: the plan names the process
  that blocks each change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import combinations
from typing import ClassVar

from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.profiles import parse_profile
from agent.gpu.types import GiProfile, GpuInstance, GpuLayout, Placement, Process
from agent.mig.state import CiState, GiState, GpuMigState, gi_state

# -- desired state ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Desired:
    """What one GPU should look like: MIG mode and counts per profile name (mig-parted's view)."""

    mig_enabled: bool
    counts: tuple[tuple[str, int], ...] = ()
    #: where it came from, e.g. ``mig-configs.all-balanced[0]``; used to name fields in errors.
    source: str = ""


@dataclass(frozen=True, slots=True)
class Shape:
    """What one GPU instance must be: its profile and the widths of its CIs, widest first."""

    profile: GiProfile
    cis: tuple[int, ...]

    @property
    def ci_names(self) -> tuple[str, ...]:
        return tuple(ci_name(self.profile, c) for c in self.cis)


def ci_widths(gi_slices: int) -> tuple[int, ...]:
    """CI widths a GI of ``gi_slices`` compute slices offers: C == G, or 2C <= G+1 (go-nvlib)."""
    return tuple(c for c in range(1, gi_slices + 1) if c == gi_slices or 2 * c <= gi_slices + 1)


def ci_name(profile: GiProfile, width: int) -> str:
    """``1c.3g.20gb`` for a narrower CI, the GI's own name for a full-width one (§1.6)."""
    return profile.name if width >= profile.slice_count else f"{width}c.{profile.name}"


def _ci_starts(gi_slices: int, width: int) -> range:
    # CI placements start at multiples of their width inside the GI (go-nvml mock, simulator).
    return range(0, gi_slices - width + 1, width)


def _pack_cis(profile: GiProfile, widths: Sequence[int]) -> list[tuple[int, ...]]:
    """Group CIs of one GI profile into as few GIs as first-fit, widest first, allows.

    mig-parted fills the previous GI until a CI does not fit (``1c.3g.20gb: 3`` is one 3g GI with
    three 1c CIs); first-fit over all open GIs gives the same counts with never more GIs.
    """
    gis: list[tuple[list[int], int]] = []  # (widths, used compute-slice mask)
    for width in sorted(widths, reverse=True):
        for i, (members, used) in enumerate(gis):
            start = _free_ci_start(profile.slice_count, width, used)
            if start is not None:
                gis[i] = ([*members, width], used | (((1 << width) - 1) << start))
                break
        else:
            gis.append(([width], (1 << width) - 1))
    return [tuple(members) for members, _ in gis]


def _free_ci_start(gi_slices: int, width: int, used: int) -> int | None:
    for start in _ci_starts(gi_slices, width):
        if not (((1 << width) - 1) << start) & used:
            return start
    return None


def resolve(desired: Desired, layout: GpuLayout) -> tuple[Shape, ...]:
    """Desired counts as GI shapes on this GPU; profile names resolve per device (§1.7).

    InvalidSpec names the field and the profiles this board has when a name is not valid here.
    """
    by_name = {p.name: p for p in layout.profiles}
    widths: dict[GiProfile, list[int]] = {}
    for name, count in desired.counts:
        parsed = parse_profile(name)
        profile = by_name.get(parsed.gi_name)
        field = f"{desired.source}.mig-devices.{name}" if desired.source else name
        if profile is None:
            have = ", ".join(_names(layout.profiles)) or "none while MIG is disabled"
            raise InvalidSpec(
                f"MIG profile {name} does not exist on GPU {layout.gpu.index} "
                f"({layout.gpu.name}); its profiles are: {have}",
                [FieldViolation(field, f"not a profile of {layout.gpu.name}; allowed: {have}")],
            )
        width = parsed.ci_slices or profile.slice_count
        if width not in ci_widths(profile.slice_count):
            offered = ", ".join(ci_name(profile, c) for c in ci_widths(profile.slice_count))
            raise InvalidSpec(
                f"MIG profile {name}: a {profile.name} instance has no {width}-slice compute "
                f"instance; it offers: {offered}",
                [FieldViolation(field, f"allowed: {offered}")],
            )
        widths.setdefault(profile, []).extend([width] * count)
    shapes = [Shape(p, cis) for p, ws in widths.items() for cis in _pack_cis(p, ws)]
    return tuple(sorted(shapes, key=_shape_order))


def _names(profiles: Sequence[GiProfile]) -> list[str]:
    """Profile names smallest first, as people list them (1g.10gb, 1g.10gb+me, 1g.20gb, ...)."""
    return [p.name for p in sorted(profiles, key=lambda p: (p.slice_count, p.memory_mb, p.name))]


def _shape_order(s: Shape) -> tuple[int, int, str, tuple[int, ...]]:
    return (-s.profile.memory_slices, -s.profile.slice_count, s.profile.name, s.cis)


def shape_of(gi: GpuInstance, profiles: Mapping[int, GiProfile]) -> Shape | None:
    """The shape an existing GI has; None for a GI with no CI (not a usable MIG device)."""
    if not gi.compute_instances or gi.profile_id not in profiles:
        return None
    widths = sorted((c.placement.size for c in gi.compute_instances), reverse=True)
    return Shape(profiles[gi.profile_id], tuple(widths))


def current_counts(layout: GpuLayout) -> dict[str, int]:
    """Counts per profile name as mig-parted reads them: one per CI (GIs without a CI count 0)."""
    profiles = {p.id: p for p in layout.profiles}
    counts: Counter[str] = Counter()
    for gi in layout.instances:
        shape = shape_of(gi, profiles)
        if shape is not None:
            counts.update(shape.ci_names)
    return dict(sorted(counts.items()))


def counts_of(shapes: Sequence[Shape]) -> dict[str, int]:
    return dict(sorted(Counter(n for s in shapes for n in s.ci_names).items()))


# -- plan records ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DestroyCi:
    action: ClassVar[str] = "destroy-ci"

    gi_id: int
    ci_id: int
    gi: str

    def __str__(self) -> str:
        return f"destroy compute instance {self.ci_id} of GPU instance {self.gi_id} ({self.gi})"


@dataclass(frozen=True, slots=True)
class DestroyGi:
    action: ClassVar[str] = "destroy-gi"

    gi_id: int
    gi: str

    def __str__(self) -> str:
        return f"destroy GPU instance {self.gi_id} ({self.gi})"


@dataclass(frozen=True, slots=True)
class SetMigMode:
    action: ClassVar[str] = "set-mode"

    enable: bool

    def __str__(self) -> str:
        return f"set MIG mode {'enabled' if self.enable else 'disabled'}"


@dataclass(frozen=True, slots=True)
class ResetGpu:
    """Run only if the driver leaves the new mode pending (it resets by itself when it can)."""

    action: ClassVar[str] = "reset"

    def __str__(self) -> str:
        return "reset the GPU if the MIG mode is left pending"


@dataclass(frozen=True, slots=True)
class CreateGi:
    action: ClassVar[str] = "create-gi"

    profile_id: int
    profile_name: str
    placement: Placement

    def __str__(self) -> str:
        return f"create GPU instance {self.profile_name} at {self.placement}"


@dataclass(frozen=True, slots=True)
class CreateCi:
    action: ClassVar[str] = "create-ci"

    gi_placement: Placement
    gi: str
    ci: CiState

    def __str__(self) -> str:
        where = "" if self.ci.start is None else f" at {self.ci.start}:{self.ci.slices}"
        return f"create {self.ci.slices}-slice compute instance{where} in {self.gi}"


Step = DestroyCi | DestroyGi | SetMigMode | ResetGpu | CreateGi | CreateCi


@dataclass(frozen=True, slots=True)
class ModeChange:
    enable: bool
    #: the current mode differs, so the change needs an activation (a GPU reset unless the driver
    #: resets by itself); False when only a pending opposite request is cancelled.
    activation: bool


@dataclass(frozen=True, slots=True)
class Blocker:
    """A running process in the way of a change."""

    pid: int
    gpu_instance_id: int | None
    instance: str  # "3g.20gb@4:4", or "whole GPU"
    change: str  # "destroy" or "MIG mode change"

    def __str__(self) -> str:
        return f"process {self.pid} on {self.instance} blocks {self.change}"


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


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """What an apply would do to one GPU. ``target`` is None when infeasible or deferred."""

    layout: GpuLayout
    desired: Desired
    mode_change: ModeChange | None = None
    keep: tuple[GpuInstance, ...] = ()
    destroy: tuple[GpuInstance, ...] = ()
    create: tuple[GiState, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    infeasible: Infeasibility | None = None
    target: GpuMigState | None = None
    steps: tuple[Step, ...] = ()
    #: the driver reports no profiles while MIG is off: the layout is planned after the switch.
    deferred: bool = False
    forced: bool = False
    free_region: Placement | None = None

    @property
    def status(self) -> str:
        if self.infeasible is not None:
            return "infeasible"
        if self.blockers and not self.forced:
            return "blocked"
        return "change" if self.steps else "unchanged"


# -- planning --------------------------------------------------------------------------------------


def plan_gpu(layout: GpuLayout, desired: Desired, *, force: bool = False) -> GpuPlan:
    """Plan one GPU. InvalidSpec for a profile this board lacks; infeasible/blocked are data."""
    gpu = layout.gpu
    mode = gpu.mig_mode
    if mode is None:
        if desired.mig_enabled:
            why = Infeasibility(f"GPU {gpu.index} ({gpu.name}) is not MIG-capable")
            return GpuPlan(layout, desired, infeasible=why, forced=force)
        return GpuPlan(layout, desired, forced=force)
    mode_change = None
    if (mode.current, mode.pending) != (desired.mig_enabled, desired.mig_enabled):
        mode_change = ModeChange(
            desired.mig_enabled, activation=mode.current != desired.mig_enabled
        )
    if not desired.mig_enabled:
        return _finish(layout, desired, mode_change, (), (), force)
    if mode_change is not None and mode_change.activation and not layout.profiles:
        steps = (SetMigMode(True), ResetGpu())
        blockers = _mode_blockers(layout.processes)
        return GpuPlan(
            layout,
            desired,
            mode_change,
            blockers=blockers,
            steps=steps,
            deferred=True,
            forced=force,
        )
    shapes = resolve(desired, layout)
    problem = _capacity_problem(shapes, layout)
    if problem is not None:
        return GpuPlan(layout, desired, mode_change, infeasible=problem, forced=force)
    existing = layout.instances if mode.current else ()
    busy = {p.gpu_instance_id for p in layout.processes if p.gpu_instance_id is not None}
    pinned = () if force else tuple(gi for gi in existing if gi.id in busy)
    room = _room_meter(layout.profiles)
    choice = _search(shapes, existing, pinned, busy, room)
    if choice is None and pinned:
        # Busy instances cannot all stay: plan as --force would, and name the blockers.
        choice = _search(shapes, existing, (), busy, room)
    if choice is None:
        return GpuPlan(
            layout, desired, mode_change, infeasible=_explain(shapes, layout), forced=force
        )
    kept, new = choice
    return _finish(layout, desired, mode_change, kept, new, force)


def _finish(
    layout: GpuLayout,
    desired: Desired,
    mode_change: ModeChange | None,
    kept: Sequence[GpuInstance],
    new: Sequence[tuple[Shape, Placement]],
    force: bool,
) -> GpuPlan:
    enabled = desired.mig_enabled
    current = layout.instances if layout.gpu.mig_mode and layout.gpu.mig_mode.current else ()
    kept_ids = {gi.id for gi in kept}
    destroy = tuple(gi for gi in current if gi.id not in kept_ids)
    create = tuple(
        GiState(s.profile.id, s.profile.name, p, tuple(CiState(c) for c in s.cis)) for s, p in new
    )
    target = GpuMigState(
        layout.gpu.uuid,
        enabled,
        tuple(sorted((*(gi_state(gi) for gi in kept), *create), key=lambda gi: gi.placement)),
    )
    blockers = _destroy_blockers(destroy, layout.processes)
    if mode_change is not None and mode_change.activation:
        blockers += _mode_blockers(layout.processes)
    occupied = 0
    for gi in target.instances:
        occupied |= _mask(gi.placement)
    return GpuPlan(
        layout,
        desired,
        mode_change,
        keep=tuple(kept),
        destroy=destroy,
        create=create,
        blockers=blockers,
        target=target,
        steps=converge_steps(layout, target),
        forced=force,
        free_region=_largest_free(occupied, layout.total_memory_slices) if enabled else None,
    )


def _destroy_blockers(
    destroy: Sequence[GpuInstance], processes: Sequence[Process]
) -> tuple[Blocker, ...]:
    labels = {gi.id: f"{gi.profile_name}@{gi.placement}" for gi in destroy}
    return tuple(
        Blocker(p.pid, p.gpu_instance_id, labels[p.gpu_instance_id], "destroy")
        for p in processes
        if p.gpu_instance_id in labels
    )


def _mode_blockers(processes: Sequence[Process]) -> tuple[Blocker, ...]:
    # Processes on a GI are already named by the destroy of that GI.
    return tuple(
        Blocker(p.pid, None, "whole GPU", "MIG mode change")
        for p in processes
        if p.gpu_instance_id is None
    )


def converge_steps(layout: GpuLayout, target: GpuMigState) -> tuple[Step, ...]:
    """The NVML mutations that turn ``layout`` into ``target``: destroy, mode, create.

    Instances that already satisfy the target stay untouched; the rest is destroyed (CIs first,
    §7.5) and the missing ones are created at their exact placements with their CIs, widest first.
    Used for applies and, with a snapshot as the target, for rollbacks.
    """
    mode = layout.gpu.mig_mode
    current_on = bool(mode and mode.current)
    keep: set[int] = set()
    satisfied: set[Placement] = set()
    if current_on and target.mig_enabled:
        wanted = {gi.placement: gi for gi in target.instances}
        for gi in layout.instances:
            want = wanted.get(gi.placement)
            if want is not None and want.satisfied_by(gi_state(gi)):
                keep.add(gi.id)
                satisfied.add(gi.placement)
    steps: list[Step] = []
    for gi in layout.instances if current_on else ():
        if gi.id not in keep:
            label = f"{gi.profile_name}@{gi.placement}"
            steps += [DestroyCi(gi.id, ci.id, label) for ci in gi.compute_instances]
            steps.append(DestroyGi(gi.id, label))
    on = target.mig_enabled
    if mode is not None and (mode.current, mode.pending) != (on, on):
        steps.append(SetMigMode(target.mig_enabled))
        if mode.current != target.mig_enabled:
            steps.append(ResetGpu())
    for want in target.instances:
        if want.placement not in satisfied:
            steps.append(CreateGi(want.profile_id, want.profile_name, want.placement))
            cis = sorted(want.cis, key=lambda c: (-c.slices, c.start is None, c.start or 0))
            steps += [CreateCi(want.placement, want.label, ci) for ci in cis]
    return tuple(steps)


# -- placement search ------------------------------------------------------------------------------


def _mask(p: Placement) -> int:
    return ((1 << p.size) - 1) << p.start


def _largest_free(occupied: int, width: int) -> Placement | None:
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


def _room_meter(profiles: Sequence[GiProfile]) -> Callable[[int], tuple[int, int]]:
    """Scores the free space a layout leaves: (largest free region an instance can still use,
    how many placements of any profile still fit). Raw free slices can mislead: slice 7 alone
    holds no instance on an 8-slice GPU, so a layout leaving it free leaves nothing usable."""
    masks = [(p.size, _mask(p)) for profile in profiles for p in profile.placements]

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
        m = _mask(p)
        sets += [(mask | m, (*places, p)) for mask, places in sets if not mask & m]
    by_size: dict[int, list[tuple[int, tuple[Placement, ...]]]] = {}
    for item in sorted(sets, key=lambda item: item[1]):
        by_size.setdefault(len(item[1]), []).append(item)
    return {size: tuple(items) for size, items in by_size.items()}


def _groups(shapes: Sequence[Shape]) -> list[tuple[Shape, int]]:
    # Identical shapes are chosen together as combinations: n identical 1g instances are one
    # choice of n starts, not n! orderings of the same layout.
    counted = Counter(shapes)
    return sorted(counted.items(), key=lambda item: _shape_order(item[0]))


_Kept = tuple[GpuInstance, ...]
_New = tuple[tuple[Shape, Placement], ...]


def _search(
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
                    mask |= _mask(gi.placement)
                if mask & occupied:
                    continue
                for places in _choose(shape.profile.placements, n - k, occupied | mask):
                    taken = occupied | mask
                    for p in places:
                        taken |= _mask(p)
                    visit(
                        i + 1, taken, kept + forced + extra, new + tuple((shape, p) for p in places)
                    )

    start = 0
    for gi in pinned:
        start |= _mask(gi.placement)
    visit(0, start, (), ())
    if not best:
        return None
    _, kept, new = best[0]
    return tuple(sorted(kept, key=lambda gi: gi.placement)), new


# -- explanations ----------------------------------------------------------------------------------


def _capacity_problem(shapes: Sequence[Shape], layout: GpuLayout) -> Infeasibility | None:
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


def _explain(shapes: Sequence[Shape], layout: GpuLayout) -> Infeasibility:
    """Which profile does not fit, which slices collide at each of its placements, what fits."""
    placed = _best_partial(shapes)
    left = Counter(shapes) - Counter(s for s, _ in placed)
    missing = min(left, key=_shape_order)
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


# -- assert ----------------------------------------------------------------------------------------


def mismatches(layout: GpuLayout, desired: Desired, *, mode_only: bool = False) -> tuple[str, ...]:
    """Why ``layout`` is not ``desired`` (empty when it is), with mig-parted's assert meaning.

    Equality is counts per profile name, placement ignored; stricter than mig-parted, a pending
    mode change and a GPU instance without a compute instance are mismatches too.
    """
    gpu = layout.gpu
    mode = gpu.mig_mode
    if mode is None:
        return (f"GPU {gpu.index} is not MIG-capable",) if desired.mig_enabled else ()
    want = _on_off(desired.mig_enabled)
    if mode.current != desired.mig_enabled:
        return (f"GPU {gpu.index}: MIG mode is {_on_off(mode.current)}, want {want}",)
    out: list[str] = []
    if mode.pending != desired.mig_enabled:
        out.append(f"GPU {gpu.index}: a MIG mode change is pending (want {want})")
    if mode_only or not desired.mig_enabled:
        return tuple(out)
    have = current_counts(layout)
    try:
        wanted = counts_of(resolve(desired, layout))
    except InvalidSpec as exc:
        return (*out, str(exc))
    if have != wanted:
        out.append(f"GPU {gpu.index}: has {_fmt_counts(have)}, want {_fmt_counts(wanted)}")
    out += [
        f"GPU {gpu.index}: GPU instance {gi.id} ({gi.profile_name}@{gi.placement}) "
        "has no compute instance"
        for gi in layout.instances
        if not gi.compute_instances
    ]
    return tuple(out)


def mig_parted_destroys(layout: GpuLayout, desired: Desired) -> int:
    """Instances mig-parted's apply would destroy for the same request (reference/mig.md §3.3).

    It clears a GPU whose counts per profile differ and every GPU whose mode changes; a GPU whose
    counts already match keeps everything, however its instances are placed.
    """
    mode = layout.gpu.mig_mode
    if mode is None or not mode.current:
        return 0
    if desired.mig_enabled and current_counts(layout) == counts_of(resolve(desired, layout)):
        return 0
    return len(layout.instances)


def _on_off(enabled: bool) -> str:
    return "enabled" if enabled else "disabled"


def _fmt_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "no instances"
