"""Every layout one GPU can reach, as counts with what reaching them costs (pure).

The fleet planner's first half: per GPU, the reachable device counts, each with the fewest
instances destroyed, then mutations, then fragmentation any placement of those counts allows
(instances with processes stay where they are). The second half, `agent.coordinator.planning.solve`,
picks one option per GPU for the whole fleet.

A reachable layout keeps the busy instances, any subset of the idle ones, and fills the free
slices with new instances of the profiles some demand entry counts (creating a device nobody
asked for only adds a mutation). Enumerated exactly, per placement rule of the model: valid
starts (``GiProfile.placements``), the model's instance limits, one ``+me`` per GPU. Results
are cached by the GPU's state (model, instances, which are busy) and the profiles demanded, so
a fleet of a few distinct states costs a few enumerations.

Costs, per option:

* ``destroyed``: existing instances not kept;
* ``mutations``: instances destroyed plus instances created, plus one for a MIG mode switch;
* ``frag``: ``W² - L²`` for a GPU of ``W`` memory slices whose largest free region any profile
  could still use is ``L`` slices: 0 for a free GPU, ``W²`` for a full or uselessly scattered
  one. Summed over the fleet it is smallest when free slices stay together on few GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from agent.coordinator.fleet.capacity import busy_gi_ids, mask
from agent.gpu.types import GiProfile, GpuLayout
from agent.mig.desired import ci_name, current_counts

__all__ = [
    "Counts",
    "GpuOptions",
    "Option",
    "clear_cache",
    "freeze",
    "gpu_options",
    "signature",
]

Counts = tuple[tuple[str, int], ...]


def freeze(counts: Counter[str] | dict[str, int]) -> Counts:
    return tuple(sorted((k, v) for k, v in counts.items() if v > 0))


@dataclass(frozen=True, slots=True)
class Option:
    """One reachable state of a GPU: its device counts (mig-parted's view) and their cost."""

    counts: Counts
    destroyed: int
    mutations: int
    frag: int
    #: whether the GPU is in MIG mode in this state.
    mig: bool

    @property
    def cost(self) -> tuple[int, int, int]:
        return (self.destroyed, self.mutations, self.frag)


@dataclass(frozen=True, slots=True)
class GpuOptions:
    """A GPU's options; ``stay`` (no change) is always first."""

    options: tuple[Option, ...]

    @property
    def stay(self) -> Option:
        return self.options[0]


def signature(layout: GpuLayout) -> tuple[object, ...]:
    """Everything the options (and `plan_gpu`) read, minus ids: equal signatures plan alike."""
    gpu = layout.gpu
    busy = busy_gi_ids(layout)
    instances = tuple(
        (
            gi.profile_id,
            gi.placement.start,
            gi.placement.size,
            tuple(
                (c.profile_id, c.placement.start, c.placement.size) for c in gi.compute_instances
            ),
            gi.id in busy,
        )
        for gi in layout.instances
    )
    mode = gpu.mig_mode
    return (
        gpu.name,
        gpu.pci_device_id,
        gpu.memory_total_bytes,
        tuple(p.name for p in layout.profiles),
        None if mode is None else (mode.current, mode.pending),
        instances,
        any(p.gpu_instance_id is None for p in layout.processes),
    )


@dataclass(frozen=True, slots=True)
class _Existing:
    names: tuple[str, ...]  # one per compute instance
    profile: GiProfile | None
    bits: int
    busy: bool

    @property
    def keepable(self) -> bool:
        # A GI without a CI is no device: the per-GPU planner never keeps one through a change.
        return self.profile is not None and bool(self.names)


def gpu_options(layout: GpuLayout, demanded: frozenset[str]) -> GpuOptions:
    """The options of ``layout`` (profiles completed), creating only ``demanded`` profiles."""
    return _options_cached(_Key(signature(layout), demanded, layout))


@dataclass(frozen=True, slots=True)
class _Key:
    sig: tuple[object, ...]
    demanded: frozenset[str]
    layout: GpuLayout

    def __hash__(self) -> int:
        return hash((self.sig, self.demanded))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self.sig == other.sig and self.demanded == other.demanded


@lru_cache(maxsize=4096)
def _options_cached(key: _Key) -> GpuOptions:
    return _options(key.layout, key.demanded)


def _options(layout: GpuLayout, demanded: frozenset[str]) -> GpuOptions:
    mode = layout.gpu.mig_mode
    mig_on = bool(mode and mode.current)
    width = layout.total_memory_slices
    profiles = layout.profiles
    all_masks = tuple(sorted({(p.size, mask(p)) for pr in profiles for p in pr.placements}))
    creatable = tuple(
        p for p in profiles if p.name in demanded and p.placements and p.instance_count > 0
    )
    busy_ids = busy_gi_ids(layout)
    by_id = {p.id: p for p in profiles}
    existing: list[_Existing] = []
    for gi in layout.instances if mig_on else ():
        profile = by_id.get(gi.profile_id)
        names = (
            tuple(ci_name(profile, c.placement.size) for c in gi.compute_instances)
            if profile is not None
            else ()
        )
        existing.append(_Existing(names, profile, mask(gi.placement), gi.id in busy_ids))
    taken_now = 0
    for e in existing:
        taken_now |= e.bits
    stay = Option(
        tuple(sorted(current_counts(layout).items())) if mig_on else (),
        0,
        0,
        _frag(taken_now, width, all_masks) if mig_on else 0,
        mig_on,
    )
    whole_busy = any(p.gpu_instance_id is None for p in layout.processes)
    if (not mig_on and whole_busy) or width == 0 or (not creatable and not existing):
        return GpuOptions((stay,))
    best: dict[Counts, Option] = {}
    busy = [e for e in existing if e.busy]
    idle = [e for e in existing if not e.busy]
    if any(not e.keepable for e in busy):
        return GpuOptions((stay,))  # cannot happen on a real driver: a process needs a CI
    switch = 0 if mig_on else 1
    frags: dict[int, int] = {}
    for kept in _subsets(idle):
        members = busy + kept
        bits = 0
        counts: Counter[str] = Counter()
        per_profile: Counter[int] = Counter()
        media = False
        for e in members:
            bits |= e.bits
            counts.update(e.names)
            assert e.profile is not None
            per_profile[e.profile.id] += 1
            media = media or "+me" in e.profile.name
        destroyed = len(existing) - len(members)
        room = tuple(max(0, p.instance_count - per_profile[p.id]) for p in creatable)
        have = dict(counts)
        for added, created, after in _fills(creatable, width, bits, room, media):
            if destroyed == 0 and created == 0:
                continue  # that is staying
            total = dict(have)
            for name, n in added:
                total[name] = total.get(name, 0) + n
            key = tuple(sorted(total.items()))
            frag = frags.get(after)
            if frag is None:
                frag = frags[after] = _frag(after, width, all_masks)
            cost = (destroyed, destroyed + created + switch, frag)
            found = best.get(key)
            if found is None or cost < found.cost:
                best[key] = Option(key, *cost, True)
    best.pop(stay.counts, None)
    return GpuOptions((stay, *sorted(best.values(), key=lambda o: (o.cost, o.counts))))


def _subsets(items: Sequence[_Existing]) -> Iterator[list[_Existing]]:
    keepable = [e for e in items if e.keepable]
    for picks in range(1 << len(keepable)):
        yield [e for i, e in enumerate(keepable) if picks >> i & 1]


def _frag(taken: int, width: int, all_masks: tuple[tuple[int, int], ...]) -> int:
    largest = max((size for size, m in all_masks if not m & taken), default=0)
    return width * width - largest * largest


@lru_cache(maxsize=1 << 16)
def _fills(
    creatable: tuple[GiProfile, ...],
    width: int,
    taken: int,
    room: tuple[int, ...],
    media: bool,
) -> tuple[tuple[Counts, int, int], ...]:
    """Every set of new instances in the free slices: (counts added, how many, slices after)."""
    # Placements by start slot: a set of disjoint placements is enumerated once, by its starts.
    starts: dict[int, list[tuple[int, int]]] = {}
    for i, p in enumerate(creatable):
        for place in p.placements:
            starts.setdefault(place.start, []).append((i, mask(place)))
    out: list[tuple[Counts, int, int]] = []
    left = list(room)
    chosen: list[int] = []

    def visit(slot: int, bits: int, media_used: bool) -> None:
        while slot < width and bits >> slot & 1:
            slot += 1
        if slot >= width:
            names = Counter(creatable[i].name for i in chosen)
            out.append((freeze(names), len(chosen), bits))
            return
        visit(slot + 1, bits, media_used)  # slot stays free
        for i, m in starts.get(slot, ()):
            if m & bits or not left[i]:
                continue
            is_me = "+me" in creatable[i].name
            if is_me and media_used:
                continue
            left[i] -= 1
            chosen.append(i)
            visit(slot + 1, bits | m, media_used or is_me)
            chosen.pop()
            left[i] += 1

    visit(0, taken, media)
    return tuple(out)


def clear_cache() -> None:
    """Forget every GPU state's options (benchmarks measure a cold planner)."""
    _options_cached.cache_clear()
    _fills.cache_clear()
