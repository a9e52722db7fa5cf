"""What a GPU should hold: a config entry's counts, resolved to GPU instance shapes on its board.

`Desired` is mig-parted's view of one GPU (its MIG mode and counts per profile name); `resolve`
turns it into the GPU instances this board can make (`Shape`: a profile and the widths of its
compute instances), and an error names the field when a profile is not the board's. Pure
functions over the records of :mod:`agent.gpu.types`: no NVML, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.profiles import parse_profile
from agent.gpu.types import GiProfile, GpuInstance, GpuLayout


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
        parsed = parse_profile(name, any_size=True)  # a config's name, as mig-parted takes it
        profile = by_name.get(parsed.gi_name)
        field = f"{desired.source}.mig-devices.{name}" if desired.source else name
        if profile is None:
            have = ", ".join(_names(layout.profiles)) or "none while MIG is disabled"
            raise InvalidSpec(
                f"MIG profile {name} does not exist on GPU {layout.gpu.index} "
                f"({layout.gpu.name}); its profiles are: {have}",
                [FieldViolation(field, f"not a profile of {layout.gpu.name}; allowed: {have}")],
            )
        width = profile.slice_count if parsed.ci_slices is None else parsed.ci_slices
        if width not in ci_widths(profile.slice_count):
            offered = ", ".join(ci_name(profile, c) for c in ci_widths(profile.slice_count))
            raise InvalidSpec(
                f"MIG profile {name}: a {profile.name} instance has no {width}-slice compute "
                f"instance; it offers: {offered}",
                [FieldViolation(field, f"allowed: {offered}")],
            )
        widths.setdefault(profile, []).extend([width] * count)
    shapes = [Shape(p, cis) for p, ws in widths.items() for cis in _pack_cis(p, ws)]
    return tuple(sorted(shapes, key=shape_order))


def _names(profiles: Sequence[GiProfile]) -> list[str]:
    """Profile names smallest first, as people list them (1g.10gb, 1g.10gb+me, 1g.20gb, ...)."""
    return [p.name for p in sorted(profiles, key=lambda p: (p.slice_count, p.memory_mb, p.name))]


def shape_order(s: Shape) -> tuple[int, int, str, tuple[int, ...]]:
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
