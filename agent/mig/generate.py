"""``mig generate-config``: every MIG layout this node's GPUs can hold, as a mig-parted v1 file.

Pure: GPU layouts (identity and the profiles the driver reports) in, a config document out.
It holds mig-parted's own generated configs (its ``pkg/mig/builder``): ``all-disabled``,
``all-enabled``, ``all-balanced`` and ``all-<profile>`` at each profile's max count, with ``+`` in
names written as ``.``; and beyond them one ``layout-...`` config per set of GPU instances
that fits on a GPU model (each with its full-width compute instance, as mig-parted's
generator leaves compute-instance profiles out), e.g. ``layout-1x3g.40gb-4x1g.10gb``. Whether a
set fits is decided on the driver's possible placements, the profiles' max counts and the
media-engine rules (one ``+me`` per GPU; ``+me.all`` only beside ``-me``).

On a node with several GPU models each entry carries a ``device-filter``; GPUs that report no
profiles (MIG off on a driver that lists them only when on) or are not MIG-capable are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.gpu.types import GiProfile, GpuLayout, Placement
from agent.mig.spec import ALL, VERSION, DeviceFilter

# NVML_GPU_INSTANCE_PROFILE_{1,2,3}_SLICE: the plain profiles mig-parted's balanced config uses.
_BALANCED = ((0, 2), (1, 1), (2, 1))


@dataclass(frozen=True, slots=True)
class Generated:
    document: dict[str, Any]
    #: GPUs left out, with why
    skipped: tuple[tuple[int, str], ...]


def _media(p: GiProfile) -> bool:
    return "+me" in p.name


def _media_all(p: GiProfile) -> bool:
    return "+me.all" in p.name


def _allowed(chosen: Sequence[GiProfile], new: GiProfile) -> bool:
    """The driver's limits beyond overlap: max counts, one +me, +me.all only beside -me."""
    if sum(p.id == new.id for p in chosen) >= new.instance_count:
        return False
    if _media(new) and any(_media(p) for p in chosen):
        return False
    if _media_all(new) and any(not p.name.endswith("-me") for p in chosen):
        return False
    return not any(_media_all(p) for p in chosen) or new.name.endswith("-me")


def _mask(p: Placement) -> int:
    return ((1 << p.size) - 1) << p.start


def layouts(profiles: Sequence[GiProfile]) -> list[tuple[tuple[str, int], ...]]:
    """Every non-empty set of GPU instances that fits, as sorted (profile name, count) pairs."""
    pairs = sorted(
        ((p, at) for p in profiles for at in p.placements),
        key=lambda x: (-x[0].memory_slices, x[0].constant, x[1].start),
    )
    found: set[tuple[tuple[str, int], ...]] = set()

    def walk(first: int, used: int, chosen: list[GiProfile]) -> None:
        for i in range(first, len(pairs)):
            profile, at = pairs[i]
            if used & _mask(at) or not _allowed(chosen, profile):
                continue
            chosen.append(profile)
            counts: dict[str, int] = {}
            for p in chosen:
                counts[p.name] = counts.get(p.name, 0) + 1
            found.add(tuple(sorted(counts.items())))
            walk(i + 1, used | _mask(at), chosen)
            chosen.pop()

    walk(0, 0, [])
    by_size = {p.name: (p.memory_slices, p.constant) for p in profiles}
    return sorted(
        found, key=lambda c: tuple(sorted(((-by_size[n][0], by_size[n][1], -k) for n, k in c)))
    )


def layout_name(counts: Sequence[tuple[str, int]], profiles: Sequence[GiProfile]) -> str:
    """``layout-1x3g.40gb-4x1g.10gb``: widest profiles first, ``+`` written as ``.``."""
    order = {p.name: (-p.memory_slices, -p.slice_count, p.constant) for p in profiles}
    parts = sorted(counts, key=lambda c: order[c[0]])
    return "layout-" + "-".join(f"{n}x{name.replace('+', '.')}" for name, n in parts)


def _balanced(profiles: Sequence[GiProfile]) -> tuple[tuple[str, int], ...] | None:
    """mig-parted's all-balanced: 2x 1g, 1x 2g, 1x 3g (1g and 2g only on 4-slice GPUs)."""
    by_constant = {p.constant: p for p in profiles}
    picked = [(by_constant[c].name, n) for c, n in _BALANCED if c in by_constant]
    return tuple(picked) if picked else None


def generate(gpus: Sequence[GpuLayout]) -> Generated:
    models: dict[str, tuple[GiProfile, ...]] = {}
    skipped: list[tuple[int, str]] = []
    for layout in gpus:
        gpu = layout.gpu
        if not gpu.mig_capable:
            skipped.append((gpu.index, "not MIG-capable"))
        elif not layout.profiles:
            skipped.append((gpu.index, "the driver reports no MIG profiles (MIG mode off?)"))
        else:
            models.setdefault(str(DeviceFilter.of(gpu)), layout.profiles)
    # config name -> (mig-enabled, counts) -> device filters
    configs: dict[str, dict[tuple[bool, tuple[tuple[str, int], ...]], list[str]]] = {}

    def add(name: str, enabled: bool, counts: tuple[tuple[str, int], ...], model: str) -> None:
        configs.setdefault(name, {}).setdefault((enabled, counts), []).append(model)

    for model, profiles in models.items():
        add("all-disabled", False, (), model)
        add("all-enabled", True, (), model)
        balanced = _balanced(profiles)
        if balanced is not None:
            add("all-balanced", True, balanced, model)
        for p in sorted(profiles, key=lambda p: p.name):
            add(f"all-{p.name.replace('+', '.')}", True, ((p.name, p.instance_count),), model)
        for counts in layouts(profiles):
            add(layout_name(counts, profiles), True, counts, model)
    several = len(models) > 1
    document: dict[str, Any] = {"version": VERSION, "mig-configs": {}}
    for name, entries in configs.items():
        out = []
        for (enabled, counts), filters in entries.items():
            entry: dict[str, Any] = {}
            if several:
                entry["device-filter"] = filters[0] if len(filters) == 1 else sorted(filters)
            entry["devices"] = ALL
            entry["mig-enabled"] = enabled
            if enabled:
                entry["mig-devices"] = dict(counts)
            out.append(entry)
        document["mig-configs"][name] = out
    return Generated(document, tuple(skipped))
