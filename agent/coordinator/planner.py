"""Fleet MIG planner: demand per profile + the fleet's layouts -> per-GPU target counts.

Pure (no I/O). It decides *how many* devices of each profile every GPU should hold; where they
sit on a GPU is the per-GPU planner's job (`agent.mig.plan.plan_gpu`), the same function the
agent runs when it applies the plan, so the fleet plan predicts the agent's layout exactly.

Demand is a floor per profile (and per model where the file says so): devices already there
count toward it and stay, surplus ones included, unless their slices are needed. Instances with
running processes always stay. Missing devices are placed one at a time, largest profile first
(big instances are the hard ones to fit, as in first-fit-decreasing), each on the GPU where it
costs least, in this order:

1. fewest demanded devices displaced (a displaced device is placed again later; only devices of
   smaller profiles may be displaced, so the process ends);
2. fewest existing instances destroyed (a device in the free slices destroys none);
3. no MIG mode switch (a GPU already in MIG mode before an idle whole GPU);
4. fewest free slices left on that GPU (best fit: partly used GPUs fill up first, so whole free
   GPUs and large free regions stay available), then the largest free region kept.

GPUs in the same state cost the same, so costs are computed once per distinct state.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import product

from agent.coordinator.capacity import busy_gi_ids, free_capacity, occupied
from agent.coordinator.catalog import Catalog
from agent.coordinator.demand import Demand, DemandEntry, model_key
from agent.gpu.types import GiProfile, GpuLayout, MigMode, Placement
from agent.mig.plan import Desired, GpuPlan, ci_name, current_counts, plan_gpu
from agent.mig.state import GiState

__all__ = [
    "FleetPlan",
    "GpuChange",
    "NodeLayouts",
    "ProfileTotal",
    "Unmet",
    "plan_fleet",
    "scratch_disruption",
]


@dataclass(frozen=True, slots=True)
class NodeLayouts:
    """One node's GPUs as the planner sees them (lost GPUs already left out)."""

    name: str
    gpus: tuple[GpuLayout, ...]


@dataclass(frozen=True, slots=True)
class GpuChange:
    """One GPU the plan changes: its counts before and after, and what happens to instances."""

    node: str
    index: int
    uuid: str
    model: str
    enable_mig: bool
    before: tuple[tuple[str, int], ...]
    after: tuple[tuple[str, int], ...]
    keep: tuple[str, ...]
    destroy: tuple[str, ...]
    create: tuple[str, ...]
    #: the GPU's layout after the change, as the per-GPU planner places it.
    target: tuple[GiState, ...]


@dataclass(frozen=True, slots=True)
class Unmet:
    profile: str
    model: str | None
    wanted: int
    missing: int
    reason: str


@dataclass(frozen=True, slots=True)
class ProfileTotal:
    profile: str
    model: str | None
    demand: int
    before: int
    after: int


@dataclass(frozen=True, slots=True)
class FleetPlan:
    changes: tuple[GpuChange, ...]
    unmet: tuple[Unmet, ...]
    totals: tuple[ProfileTotal, ...]
    #: MIG-capable GPUs planned over.
    gpus: int
    destroyed: int
    created: int
    #: memory slices in no instance after the plan, on GPUs in MIG mode.
    free_slices: int
    #: per profile name: instances that could still be created in those free slices (each alone).
    free_capacity: tuple[tuple[str, int], ...]

    @property
    def met(self) -> bool:
        return not self.unmet


# -- per-GPU evaluation ------------------------------------------------------------------------

_Counts = tuple[tuple[str, int], ...]


def _freeze(counts: Mapping[str, int]) -> _Counts:
    return tuple(sorted((k, v) for k, v in counts.items() if v > 0))


@dataclass(frozen=True, slots=True)
class _Eval:
    """What the per-GPU planner makes of a GPU state and target counts."""

    ok: bool
    destroyed: int = 0
    free: int = 0
    largest: int = 0
    plan: GpuPlan | None = None


@dataclass(slots=True)
class _Gpu:
    order: int
    node: str
    layout: GpuLayout
    sig: tuple[object, ...]
    by_name: dict[str, GiProfile]
    size: dict[str, int]  # device name -> memory slices of its GI
    entries: dict[str, int]  # device name -> demand entry it counts toward
    busy: Counter[str]
    whole_busy: bool
    mig_on: bool
    base: _Counts
    counts: Counter[str] = field(default_factory=Counter)
    #: ``counts`` frozen, kept in step with it: the half of the class key that changes.
    frozen: _Counts = ()

    @property
    def key(self) -> tuple[tuple[object, ...], _Counts]:
        return (self.sig, self.frozen)


def _signature(layout: GpuLayout) -> tuple[object, ...]:
    """Everything `plan_gpu` reads, minus the ids: GPUs with equal signatures plan alike."""
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


class _Evaluator:
    """`plan_gpu` results per (GPU signature, counts), computed once."""

    def __init__(self) -> None:
        self._cache: dict[tuple[tuple[object, ...], _Counts], _Eval] = {}

    def __call__(self, gpu: _Gpu, counts: _Counts) -> _Eval:
        key = (gpu.sig, counts)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._plan(gpu, counts)
        return found

    @staticmethod
    def _plan(gpu: _Gpu, counts: _Counts) -> _Eval:
        plan = plan_gpu(gpu.layout, Desired(True, counts, "fleet-plan"))
        if plan.infeasible is not None or plan.blockers or plan.target is None or plan.deferred:
            return _Eval(False, plan=plan)
        width = gpu.layout.total_memory_slices
        taken = occupied(gi.placement for gi in plan.target.instances)
        return _Eval(
            True,
            destroyed=len(plan.destroy),
            free=width - bin(taken).count("1"),
            largest=plan.free_region.size if plan.free_region else 0,
            plan=plan,
        )


# -- the fleet ----------------------------------------------------------------------------------


def _gpus(nodes: Sequence[NodeLayouts], demand: Demand, scratch: bool) -> list[_Gpu]:
    catalog = Catalog(g for n in nodes for g in n.gpus)
    out: list[_Gpu] = []

    @cache
    def entries(model: str, names: tuple[str, ...]) -> dict[str, int]:
        """Which demand entry each profile of a model counts toward (same for every GPU)."""
        return {n: i for n in names if (i := demand.entry_for(n, model)) is not None}

    for node in sorted(nodes, key=lambda n: n.name):
        for raw in node.gpus:
            if raw.gpu.mig_mode is None:
                continue
            layout = catalog.complete(raw)
            if not layout.profiles:
                continue
            if scratch:
                gpu = dataclasses.replace(layout.gpu, mig_mode=MigMode(True, True))
                layout = GpuLayout(gpu, layout.profiles, (), ())
            out.append(_gpu(len(out), node.name, layout, entries))
    return out


def _gpu(
    order: int,
    node: str,
    layout: GpuLayout,
    entries: Callable[[str, tuple[str, ...]], dict[str, int]],
) -> _Gpu:
    mode = layout.gpu.mig_mode
    mig_on = bool(mode and mode.current)
    by_name = {p.name: p for p in layout.profiles}
    size = {p.name: p.memory_slices for p in layout.profiles}
    by_id = {p.id: p for p in layout.profiles}
    busy: Counter[str] = Counter()
    busy_ids = busy_gi_ids(layout)
    for gi in layout.instances if mig_on else ():
        profile = by_id.get(gi.profile_id)
        if profile is None:
            continue
        for ci in gi.compute_instances:
            name = ci_name(profile, ci.placement.size)
            size[name] = profile.memory_slices
            if gi.id in busy_ids:
                busy[name] += 1
    base = current_counts(layout) if mig_on else {}
    return _Gpu(
        order=order,
        node=node,
        layout=layout,
        sig=_signature(layout),
        by_name=by_name,
        size=size,
        entries=entries(layout.gpu.name, tuple(by_name)),
        busy=busy,
        whole_busy=any(p.gpu_instance_id is None for p in layout.processes),
        mig_on=mig_on,
        base=_freeze(base),
        counts=Counter(base),
        frozen=_freeze(base),
    )


@dataclass(order=True, frozen=True, slots=True)
class _Cost:
    moves: int
    destroyed: int
    mode_switch: int
    free_after: int
    largest_lost: int


@dataclass(frozen=True, slots=True)
class _Option:
    cost: _Cost
    counts: _Counts
    removed: tuple[str, ...]


#: More devices than any GPU holds (7 on an 8-slice GPU): the most one option can give up.
_MAX_REMOVALS = 8


class _Fleet:
    def __init__(self, gpus: list[_Gpu], demand: Demand) -> None:
        self.gpus = gpus
        self.demand = demand
        self.evaluate = _Evaluator()
        self.supply = [0] * len(demand.entries)
        for g in gpus:
            for name, n in g.counts.items():
                entry = g.entries.get(name)
                if entry is not None:
                    self.supply[entry] += n
        self.before = list(self.supply)
        self.classes: dict[tuple[tuple[object, ...], _Counts], list[int]] = {}
        self._options: dict[tuple[object, ...], _Option | None] = {}
        for g in gpus:
            self.classes.setdefault(g.key, []).append(g.order)  # already in order: a heap

    def deficit(self, entry: int) -> int:
        return self.demand.entries[entry].count - self.supply[entry]

    def _moves(self, gpu: _Gpu, removed: Sequence[str]) -> int:
        """Demanded devices that removing ``removed`` from ``gpu`` displaces."""
        taken: Counter[int] = Counter()
        moves = 0
        for name in removed:
            entry = gpu.entries.get(name)
            if entry is None:
                continue
            taken[entry] += 1
            if self.supply[entry] - taken[entry] < self.demand.entries[entry].count:
                moves += 1
        return moves

    def option(self, gpu: _Gpu, entry: int, name: str) -> _Option | None:
        """The cheapest way to add one ``name`` device to ``gpu``, or None.

        The answer depends on the GPU's class and on how far supply stands from demand for the
        devices it could give up, so it is remembered per both.
        """
        key = (gpu.key, entry, name, self._standing(gpu))
        if key not in self._options:
            self._options[key] = self._option(gpu, name)
        return self._options[key]

    def _standing(self, gpu: _Gpu) -> tuple[tuple[int, int], ...]:
        # A GPU gives up at most _MAX_REMOVALS devices, so surplus beyond that, or any
        # deficit, decides nothing more: clamp, to keep the remembered options reusable.
        out = []
        for name, _ in gpu.frozen:
            entry = gpu.entries.get(name)
            if entry is not None:
                surplus = self.supply[entry] - self.demand.entries[entry].count
                out.append((entry, max(-1, min(surplus, _MAX_REMOVALS))))
        return tuple(out)

    def _option(self, gpu: _Gpu, name: str) -> _Option | None:
        if gpu.whole_busy and not gpu.mig_on:
            return None
        now = self.evaluate(gpu, gpu.frozen)
        if not now.ok:
            return None
        size = gpu.size[name]
        removable = {
            n: gpu.counts[n] - gpu.busy[n]
            for n in sorted(gpu.counts)
            if gpu.counts[n] - gpu.busy[n] > 0
        }
        best: _Option | None = None
        for k in range(sum(removable.values()) + 1):
            for removed in _multisets(removable, k):
                if size > now.free + sum(gpu.size[n] for n in removed):
                    continue
                if not self._may_displace(gpu, removed, size):
                    continue
                counts = Counter(gpu.counts)
                counts.subtract(removed)
                counts[name] += 1
                frozen = _freeze(counts)
                result = self.evaluate(gpu, frozen)
                if not result.ok:
                    continue
                cost = _Cost(
                    self._moves(gpu, removed),
                    result.destroyed - now.destroyed,
                    int(not gpu.mig_on and not any(v > 0 for v in gpu.counts.values())),
                    result.free,
                    now.largest - result.largest,
                )
                if best is None or cost < best.cost:
                    best = _Option(cost, frozen, removed)
            if best is not None:
                return best
        return None

    def _may_displace(self, gpu: _Gpu, removed: Sequence[str], size: int) -> bool:
        # Only smaller demanded devices may be displaced: they are placed again later, after
        # every larger profile, so no device displaces its displacer and the planner ends.
        taken: Counter[int] = Counter()
        for n in removed:
            entry = gpu.entries.get(n)
            if entry is None:
                continue
            taken[entry] += 1
            surplus = self.supply[entry] - taken[entry] >= self.demand.entries[entry].count
            if not surplus and gpu.size[n] >= size:
                return False
        return True

    def take(self, key: tuple[tuple[object, ...], _Counts]) -> _Gpu:
        return self.gpus[heapq.heappop(self.classes[key])]

    def move(self, gpu: _Gpu, option: _Option, entry: int) -> None:
        for n in option.removed:
            removed_entry = gpu.entries.get(n)
            if removed_entry is not None:
                self.supply[removed_entry] -= 1
        gpu.counts = Counter(dict(option.counts))
        gpu.frozen = option.counts
        self.supply[entry] += 1
        heapq.heappush(self.classes.setdefault(gpu.key, []), gpu.order)

    def candidates(self, entry: int, name: str) -> Iterator[tuple[tuple[object, ...], _Counts]]:
        for key, members in self.classes.items():
            if members and self.gpus[members[0]].entries.get(name) == entry:
                yield key


def _multisets(available: Mapping[str, int], k: int) -> Iterator[tuple[str, ...]]:
    """Every multiset of ``k`` names drawing at most ``available[name]`` of each."""
    names = list(available)
    for picks in product(*(range(min(available[n], k) + 1) for n in names)):
        if sum(picks) == k:
            yield tuple(n for n, c in zip(names, picks, strict=True) for _ in range(c))


def _entry_order(fleet: _Fleet) -> list[tuple[int, str]]:
    """Entries largest profile first, each with its device name."""
    sizes: dict[int, tuple[int, int]] = {}
    for g in fleet.gpus:
        for name, entry in g.entries.items():
            p = g.by_name[name]
            sizes[entry] = max(sizes.get(entry, (0, 0)), (p.memory_slices, p.slice_count))
    order = sorted(
        range(len(fleet.demand.entries)),
        key=lambda i: (
            tuple(-x for x in sizes.get(i, (0, 0))),
            fleet.demand.entries[i].profile,
            fleet.demand.entries[i].model or "",
        ),
    )
    return [(i, fleet.demand.entries[i].profile) for i in order]


def _place(fleet: _Fleet, entry: int, name: str) -> None:
    heap: list[tuple[_Cost, int, tuple[tuple[object, ...], _Counts]]] = []

    def push(key: tuple[tuple[object, ...], _Counts]) -> None:
        members = fleet.classes.get(key)
        if not members:
            return
        gpu = fleet.gpus[members[0]]
        option = fleet.option(gpu, entry, name)
        if option is not None:
            heapq.heappush(heap, (option.cost, gpu.order, key))

    for key in list(fleet.candidates(entry, name)):
        push(key)
    while fleet.deficit(entry) > 0 and heap:
        cost, order, key = heapq.heappop(heap)
        members = fleet.classes.get(key)
        if not members:
            continue
        gpu = fleet.gpus[members[0]]
        option = fleet.option(gpu, entry, name)
        if option is None:
            continue
        if (option.cost, gpu.order) != (cost, order):  # supply moved since: re-rank
            heapq.heappush(heap, (option.cost, gpu.order, key))
            continue
        taken = fleet.take(key)
        fleet.move(taken, option, entry)
        push(key)
        push(taken.key)


# -- explanations ------------------------------------------------------------------------------


def _why(fleet: _Fleet, entry: int, missing: int, all_gpus: Sequence[_Gpu]) -> str:
    e = fleet.demand.entries[entry]
    eligible = [g for g in fleet.gpus if g.entries.get(e.profile) == entry]
    if not eligible:
        return _no_gpu(e, all_gpus)
    why: Counter[str] = Counter()
    for g in eligible:
        why[_why_gpu(fleet, g, e.profile)] += 1
    parts = "; ".join(f"{n} {reason}" for reason, n in sorted(why.items(), key=lambda i: -i[1]))
    return (
        f"{missing} of {e.count} cannot be placed on the {len(eligible)} GPUs offering it: {parts}"
    )


def _why_gpu(fleet: _Fleet, g: _Gpu, name: str) -> str:
    profile = g.by_name[name]
    if g.whole_busy and not g.mig_on:
        return "run processes as whole GPUs (MIG off)"
    if g.counts[name] >= profile.instance_count or (
        "+me" in name and any("+me" in n and v for n, v in g.counts.items())
    ):
        return f"already hold the most {name} instances their model allows"
    # Would one more fit if every other idle device gave way? If not, busy ones are in the way.
    emptied = Counter({n: g.busy[n] for n in g.counts})
    emptied[name] = g.counts[name] + 1
    if not fleet.evaluate(g, _freeze(emptied)).ok:
        return "have busy instances on the slices it needs"
    return "would have to give up demanded devices of the same or larger profiles"


def _no_gpu(e: DemandEntry, gpus: Sequence[_Gpu]) -> str:
    if e.model is not None:
        same = [g for g in gpus if model_key(g.layout.gpu.name) == model_key(e.model)]
        if not same:
            models = sorted({g.layout.gpu.name for g in gpus}) or ["none"]
            return (
                f"no MIG-capable GPU of model {e.model} in the fleet (models: {', '.join(models)})"
            )
        offered = ", ".join(sorted(same[0].by_name))
        return f"{e.model} has no profile {e.profile}; it offers: {offered}"
    offered = ", ".join(sorted({n for g in gpus for n in g.by_name})) or "none"
    return f"no GPU in the fleet offers {e.profile}; profiles offered: {offered}"


# -- the plan ----------------------------------------------------------------------------------


def _change(fleet: _Fleet, g: _Gpu) -> GpuChange | None:
    after = _freeze(g.counts)
    enable = not g.mig_on and bool(after)
    if after == g.base and not enable:
        return None
    plan = fleet.evaluate(g, after).plan
    assert plan is not None and plan.target is not None  # only feasible counts are chosen
    return GpuChange(
        node=g.node,
        index=g.layout.gpu.index,
        uuid=g.layout.gpu.uuid,
        model=g.layout.gpu.name,
        enable_mig=enable,
        before=g.base,
        after=after,
        keep=tuple(f"{gi.profile_name}@{gi.placement}" for gi in plan.keep),
        destroy=tuple(f"{gi.profile_name}@{gi.placement}" for gi in plan.destroy),
        create=tuple(gi.label for gi in plan.create),
        target=plan.target.instances,
    )


def _placed(fleet: _Fleet, g: _Gpu) -> list[tuple[int, Placement]] | None:
    """(profile id, placement) of the GPU after the plan; None when it stays out of MIG mode."""
    counts = _freeze(g.counts)
    if counts == g.base:
        if not g.mig_on:
            return None
        return [(gi.profile_id, gi.placement) for gi in g.layout.instances]
    plan = fleet.evaluate(g, counts).plan
    assert plan is not None and plan.target is not None
    return [(gi.profile_id, gi.placement) for gi in plan.target.instances]


def plan_fleet(
    nodes: Sequence[NodeLayouts], demand: Demand, *, from_scratch: bool = False
) -> FleetPlan:
    """Plan per-GPU layouts meeting ``demand`` with the least change (see the module doc).

    ``from_scratch`` plans as if every GPU were empty and in MIG mode: the baseline a planner
    without memory of the current layouts would give, to compare disruption against.
    """
    gpus = _gpus(nodes, demand, from_scratch)
    fleet = _Fleet(gpus, demand)
    for entry, name in _entry_order(fleet):
        if fleet.deficit(entry) > 0:
            _place(fleet, entry, name)
    changes = tuple(c for g in gpus if (c := _change(fleet, g)) is not None)
    unmet = tuple(
        Unmet(e.profile, e.model, e.count, missing, _why(fleet, i, missing, gpus))
        for i, e in enumerate(demand.entries)
        if (missing := fleet.deficit(i)) > 0
    )
    totals = tuple(
        ProfileTotal(e.profile, e.model, e.count, fleet.before[i], fleet.supply[i])
        for i, e in enumerate(demand.entries)
    )
    free_slices = 0
    capacity: Counter[str] = Counter()
    for g in gpus:
        placed = _placed(fleet, g)
        if placed is None:
            continue
        taken = occupied(p for _, p in placed)
        free_slices += g.layout.total_memory_slices - bin(taken).count("1")
        capacity.update(free_capacity(g.layout.profiles, placed))
    return FleetPlan(
        changes=changes,
        unmet=unmet,
        totals=totals,
        gpus=len(gpus),
        destroyed=sum(len(c.destroy) for c in changes),
        created=sum(len(c.create) for c in changes),
        free_slices=free_slices,
        free_capacity=tuple(sorted(capacity.items())),
    )


def scratch_disruption(nodes: Sequence[NodeLayouts], scratch: FleetPlan) -> int:
    """Instances a from-scratch plan would destroy: those not at the same place in its layout."""
    targets = {
        (c.node, c.uuid): {(gi.profile_id, gi.placement) for gi in c.target}
        for c in scratch.changes
    }
    destroyed = 0
    for node in nodes:
        for layout in node.gpus:
            mode = layout.gpu.mig_mode
            if not (mode and mode.current):
                continue
            kept = targets.get((node.name, layout.gpu.uuid), set())
            destroyed += sum((gi.profile_id, gi.placement) not in kept for gi in layout.instances)
    return destroyed
