"""Fleet MIG planner: demand per profile + the fleet's layouts -> per-GPU target counts.

Pure (no I/O). It decides *how many* devices of each profile every GPU should hold; where they
sit on a GPU is the per-GPU planner's job (`agent.mig.plan.plan_gpu`), the same function the
agent runs when it applies the plan, so the fleet plan predicts the agent's layout exactly.

Demand is a floor per entry (a profile, optionally a model and a pool of nodes, with a
priority): devices already there count toward it and stay unless their slices are needed.
Instances with running processes always stay, and a whole GPU running processes is never
switched to MIG. The plan is exact, in this order of objectives:

1. as much demand met as possible, priority by priority, highest first (devices short);
2. fewest existing instances destroyed;
3. fewest mutations (instances destroyed + created + MIG mode switches);
4. least fragmentation (free slices kept in large regions on few GPUs).

Two steps: every GPU's reachable layouts with their costs
(`agent.coordinator.planning.options`), then one integer program over the fleet
(`agent.coordinator.planning.solve`) that picks a layout per GPU.
GPUs in the same state and pools are one class, so a fleet of 8,000 GPUs in a few hundred
distinct states is a program of a few thousand variables.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import ceil

from agent.coordinator.fleet.capacity import busy_gi_ids, creatable, free_capacity, occupied
from agent.coordinator.planning.catalog import Catalog
from agent.coordinator.planning.demand import Demand, DemandEntry
from agent.coordinator.planning.options import Counts, GpuOptions, Option, gpu_options, signature
from agent.coordinator.planning.solve import ClassSpec, Problem, Solution, solve
from agent.gpu.models import model_key
from agent.gpu.types import GiProfile, GpuLayout, MigMode, Placement
from agent.mig.desired import Desired
from agent.mig.plan import GpuPlan, plan_gpu
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
    priority: int = 0
    pool: str | None = None
    #: the entries whose devices hold the slices this one needed ("7g.80gb (priority 10)").
    lost_to: tuple[str, ...] = ()
    #: what would make it fit: more GPUs of a model, or a profile that fits now.
    fixes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        out = self.profile if self.model is None else f"{self.profile} on {self.model}"
        return out if self.pool is None else f"{out} in {self.pool}"


@dataclass(frozen=True, slots=True)
class ProfileTotal:
    profile: str
    model: str | None
    demand: int
    before: int
    after: int
    priority: int = 0
    pool: str | None = None


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
    #: instances destroyed + created + MIG mode switches.
    mutations: int = 0
    #: every objective proven optimal (False only when the solver's time limit cut it short).
    optimal: bool = True

    @property
    def met(self) -> bool:
        return not self.unmet


# -- the fleet's GPUs ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Gpu:
    order: int
    node: str
    layout: GpuLayout
    #: device name -> the entries it may count toward, highest priority first.
    accepts: dict[str, tuple[int, ...]]
    options: GpuOptions
    choice: Option | None = None

    @property
    def mig_on(self) -> bool:
        mode = self.layout.gpu.mig_mode
        return bool(mode and mode.current)

    @property
    def whole_busy(self) -> bool:
        return any(p.gpu_instance_id is None for p in self.layout.processes)

    @property
    def by_name(self) -> dict[str, GiProfile]:
        return {p.name: p for p in self.layout.profiles}

    @property
    def after(self) -> Counts:
        assert self.choice is not None
        return self.choice.counts


def _gpus(
    nodes: Sequence[NodeLayouts],
    demand: Demand,
    pools: Mapping[str, frozenset[str]],
    scratch: bool,
) -> list[_Gpu]:
    catalog = Catalog(g for n in nodes for g in n.gpus)
    order = sorted(range(len(demand.entries)), key=lambda i: -demand.entries[i].priority)
    known: dict[tuple[object, ...], tuple[dict[str, tuple[int, ...]], frozenset[str]]] = {}

    def accepted(layout: GpuLayout, node: str) -> tuple[dict[str, tuple[int, ...]], frozenset[str]]:
        """Which entries each profile counts toward here (same per model and pools), and the
        profiles some entry wants devices of."""
        member = frozenset(p for p, names in pools.items() if node in names)
        key = (layout.gpu.name, tuple(p.name for p in layout.profiles), member)
        found = known.get(key)
        if found is None:
            accepts: dict[str, tuple[int, ...]] = {}
            for p in layout.profiles:
                es = tuple(
                    i
                    for i in order
                    if demand.entries[i].accepts(p.name, layout.gpu.name)
                    and (demand.entries[i].pool is None or demand.entries[i].pool in member)
                )
                if es:
                    accepts[p.name] = es
            wanted = frozenset(
                n for n, es in accepts.items() if any(demand.entries[i].count for i in es)
            )
            found = known[key] = (accepts, wanted)
        return found

    out: list[_Gpu] = []
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
            accepts, demanded = accepted(layout, node.name)
            out.append(_Gpu(len(out), node.name, layout, accepts, gpu_options(layout, demanded)))
    return out


# -- the program ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Class:
    members: list[_Gpu]
    #: option indexes into the members' options that survive dominance.
    kept: list[int]


def _problem(
    gpus: Sequence[_Gpu], demand: Demand
) -> tuple[Problem, list[_Class], list[tuple[int, ...]]]:
    groups: dict[tuple[int, ...], int] = {}
    by_key: dict[tuple[object, ...], _Class] = {}
    for g in gpus:
        key = (signature(g.layout), tuple(sorted(g.accepts.items())))
        found = by_key.get(key)
        if found is None:
            by_key[key] = _Class([g], [])
        else:
            found.members.append(g)
    for accepts in sorted({tuple(es) for g in gpus for es in g.accepts.values()}):
        groups.setdefault(accepts, len(groups))
    group_list = [es for es, _ in sorted(groups.items(), key=lambda kv: kv[1])]
    caps = [sum(demand.entries[e].count for e in es) for es in group_list]
    classes = list(by_key.values())
    specs: list[ClassSpec] = []
    for cls in classes:
        head = cls.members[0]
        supplies: list[tuple[tuple[int, int], ...]] = []
        costs: list[tuple[int, int, int]] = []
        seen: list[tuple[dict[int, int], tuple[int, int, int]]] = []
        for i, option in enumerate(head.options.options):
            supply: Counter[int] = Counter()
            for name, n in option.counts:
                es = head.accepts.get(name)
                if es is not None:
                    supply[groups[es]] += n
            capped = {grp: min(n, caps[grp]) for grp, n in supply.items() if caps[grp]}
            if i and any(_dominates(s, c, capped, option.cost) for s, c in seen):
                continue
            seen.append((capped, option.cost))
            cls.kept.append(i)
            supplies.append(tuple(sorted(capped.items())))
            costs.append(option.cost)
        specs.append(ClassSpec(len(cls.members), tuple(supplies), tuple(costs)))
    problem = Problem(
        tuple(specs),
        tuple(group_list),
        tuple(e.count for e in demand.entries),
        tuple(e.priority for e in demand.entries),
    )
    return problem, classes, group_list


def _dominates(
    supply: Mapping[int, int],
    cost: tuple[int, int, int],
    other_supply: Mapping[int, int],
    other_cost: tuple[int, int, int],
) -> bool:
    """Whether (supply, cost) is at least as good as the other on every count and cost."""
    return all(a <= b for a, b in zip(cost, other_cost, strict=True)) and all(
        supply.get(g, 0) >= n for g, n in other_supply.items()
    )


def _assign(classes: Sequence[_Class], solution: Solution) -> None:
    for cls, picks in zip(classes, solution.choice, strict=True):
        members = iter(cls.members)
        # Non-staying options go to the first GPUs of the class (node-name order): stable.
        ordered = sorted(range(len(picks)), key=lambda k: (cls.kept[k] == 0, k))
        for k in ordered:
            option = cls.members[0].options.options[cls.kept[k]]
            for _ in range(picks[k]):
                next(members).choice = option


# -- results -------------------------------------------------------------------------------------


def _plan_of(g: _Gpu, cache: dict[tuple[object, ...], GpuPlan]) -> GpuPlan:
    key = (signature(g.layout), g.after)
    found = cache.get(key)
    if found is None:
        found = cache[key] = plan_gpu(g.layout, Desired(True, g.after, "fleet-plan"))
    return found


def _change(g: _Gpu, plan: GpuPlan) -> GpuChange:
    assert plan.target is not None, "the fleet planner chose counts its GPU cannot hold"
    return GpuChange(
        node=g.node,
        index=g.layout.gpu.index,
        uuid=g.layout.gpu.uuid,
        model=g.layout.gpu.name,
        enable_mig=not g.mig_on,
        before=g.options.stay.counts,
        after=g.after,
        keep=tuple(f"{gi.profile_name}@{gi.placement}" for gi in plan.keep),
        destroy=tuple(f"{gi.profile_name}@{gi.placement}" for gi in plan.destroy),
        create=tuple(gi.label for gi in plan.create),
        target=plan.target.instances,
    )


def _placed(g: _Gpu, plan: GpuPlan | None) -> list[tuple[int, Placement]] | None:
    """(profile id, placement) of the GPU after the plan; None when it stays out of MIG mode."""
    if plan is None:
        if not g.mig_on:
            return None
        return [(gi.profile_id, gi.placement) for gi in g.layout.instances]
    assert plan.target is not None
    return [(gi.profile_id, gi.placement) for gi in plan.target.instances]


def _supply(
    gpus: Sequence[_Gpu],
    demand: Demand,
    counts_of: str,
    given: Mapping[tuple[tuple[int, ...], int], int] | None = None,
) -> tuple[list[int], list[int]]:
    """Devices counted per entry, and spare ones (beyond demand, on the group's first entry).

    ``given`` is the solver's split of each group among its entries (optimal where entries
    share devices); without it, devices go to entries by priority, single-entry groups first.
    """
    per_group: Counter[tuple[int, ...]] = Counter()
    for g in gpus:
        counts = g.options.stay.counts if counts_of == "before" else g.after
        for name, n in counts:
            es = g.accepts.get(name)
            if es is not None:
                per_group[es] += n
    got = [0] * len(demand.entries)
    spare = [0] * len(demand.entries)
    for es, n in sorted(per_group.items(), key=lambda kv: (len(kv[0]), kv[0])):
        for e in es:
            want = demand.entries[e].count - got[e]
            take = min(n, want if given is None else given.get((es, e), 0), want)
            if take > 0:
                got[e] += take
                n -= take
        if n > 0:
            spare[es[0]] += n
    return got, spare


def plan_fleet(
    nodes: Sequence[NodeLayouts],
    demand: Demand,
    *,
    from_scratch: bool = False,
    pools: Mapping[str, frozenset[str]] | None = None,
    time_limit_s: float = 30.0,
) -> FleetPlan:
    """Plan per-GPU layouts meeting ``demand`` with the least change (see the module doc).

    ``pools`` maps each entry's pool selector to the nodes it selects (a pool missing here
    selects none). ``from_scratch`` plans as if every GPU were empty and in MIG mode: the
    baseline a planner without memory of the current layouts would give.
    """
    pool_nodes = pools or {}
    gpus = _gpus(nodes, demand, pool_nodes, from_scratch)
    problem, classes, groups = _problem(gpus, demand)
    solution = solve(problem, time_limit_s=time_limit_s)
    _assign(classes, solution)
    cache: dict[tuple[object, ...], GpuPlan] = {}
    plans: dict[int, GpuPlan] = {}
    changes: list[GpuChange] = []
    for g in gpus:
        assert g.choice is not None
        if g.choice is g.options.stay:
            continue
        plan = plans[g.order] = _plan_of(g, cache)
        changes.append(_change(g, plan))
    before, spare_before = _supply(gpus, demand, "before")
    given = {(groups[g], e): n for (g, e), n in solution.given.items()}
    after, spare_after = _supply(gpus, demand, "after", given)
    free_slices = 0
    capacity: Counter[str] = Counter()
    for g in gpus:
        placed = _placed(g, plans.get(g.order))
        if placed is None:
            continue
        free_slices += g.layout.total_memory_slices - bin(occupied(p for _, p in placed)).count("1")
        capacity.update(free_capacity(g.layout.profiles, placed))
    unmet = tuple(
        _unmet(i, demand, after[i], gpus, plans, pool_nodes)
        for i, e in enumerate(demand.entries)
        if after[i] < e.count
    )
    totals = tuple(
        ProfileTotal(
            e.profile,
            e.model,
            e.count,
            before[i] + spare_before[i],
            after[i] + spare_after[i],
            e.priority,
            e.pool,
        )
        for i, e in enumerate(demand.entries)
    )
    return FleetPlan(
        changes=tuple(changes),
        unmet=unmet,
        totals=totals,
        gpus=len(gpus),
        destroyed=sum(len(c.destroy) for c in changes),
        created=sum(len(c.create) for c in changes),
        free_slices=free_slices,
        free_capacity=tuple(sorted(capacity.items())),
        mutations=sum(len(c.destroy) + len(c.create) + c.enable_mig for c in changes),
        optimal=solution.optimal,
    )


# -- explanations --------------------------------------------------------------------------------


def _unmet(
    entry: int,
    demand: Demand,
    got: int,
    gpus: Sequence[_Gpu],
    plans: Mapping[int, GpuPlan],
    pools: Mapping[str, frozenset[str]],
) -> Unmet:
    e = demand.entries[entry]
    missing = e.count - got
    eligible = [g for g in gpus if entry in g.accepts.get(e.profile, ())]
    lost: dict[int, int] = {}
    if not eligible:
        reason = _no_gpu(e, gpus, pools)
    else:
        why: Counter[str] = Counter()
        for g in eligible:
            text, holders = _why_gpu(g, e, entry, demand, plans.get(g.order))
            why[text] += 1
            for h, n in holders.items():
                lost[h] = lost.get(h, 0) + n
        parts = "; ".join(f"{n} {r}" for r, n in sorted(why.items(), key=lambda i: (-i[1], i[0])))
        reason = (
            f"{missing} of {e.count} cannot be placed on the {len(eligible)} GPUs offering it: "
            f"{parts}"
        )
    lost_to = tuple(
        f"{demand.entries[h].label} (priority {demand.entries[h].priority}, {n} device(s))"
        for h, n in sorted(lost.items(), key=lambda kv: (-demand.entries[kv[0]].priority, kv[0]))
    )
    fixes = _fixes(e, missing, eligible or gpus, plans)
    text = reason
    if lost_to:
        text += "; lost to " + ", ".join(lost_to)
    if fixes:
        text += "; would fit with " + " or ".join(fixes)
    return Unmet(e.profile, e.model, e.count, missing, text, e.priority, e.pool, lost_to, fixes)


def _why_gpu(
    g: _Gpu, e: DemandEntry, entry: int, demand: Demand, plan: GpuPlan | None
) -> tuple[str, dict[int, int]]:
    """Why this GPU holds no more of the entry's devices, and which entries hold its slices."""
    profile = g.by_name[e.profile]
    if g.whole_busy and not g.mig_on:
        return "run processes as whole GPUs (MIG off)", {}
    after = dict(g.after)
    placed = _placed(g, plan) or []
    by_id = {p.id: p for p in g.layout.profiles}
    same = sum(1 for pid, _ in placed if pid == profile.id)
    media = any("+me" in by_id[pid].name for pid, _ in placed if pid in by_id)
    if same >= profile.instance_count or ("+me" in profile.name and media):
        return f"already hold the most {e.profile} instances their model allows", {}
    # Would one more fit if every idle instance gave way? If not, busy ones are in the way.
    busy_ids = busy_gi_ids(g.layout)
    busy = [gi for gi in g.layout.instances if gi.id in busy_ids] if g.mig_on else []
    busy_mask = occupied(gi.placement for gi in busy)
    busy_same = sum(1 for gi in busy if gi.profile_id == profile.id)
    busy_media = any("+me" in gi.profile_name for gi in busy)
    reachable = busy_same + creatable(profile, busy_mask, busy_same, busy_media)
    if reachable <= after.get(e.profile, 0):
        return "have busy instances on the slices it needs", {}
    holders: dict[int, int] = {}
    for name, n in after.items():
        for other in g.accepts.get(name, ()):
            if other != entry and demand.entries[other].count:
                holders[other] = holders.get(other, 0) + n
                break
    higher = [h for h in holders if demand.entries[h].priority > e.priority]
    if higher:
        return "hold devices of higher-priority demand", holders
    if holders:
        return "hold devices of other demand of the same or lower priority", holders
    return "have no free slices for it", {}


def _no_gpu(e: DemandEntry, gpus: Sequence[_Gpu], pools: Mapping[str, frozenset[str]]) -> str:
    if e.pool is not None:
        nodes = pools.get(e.pool, frozenset())
        if not nodes:
            return f"pool selector {e.pool!r} matched no node"
        gpus = [g for g in gpus if g.node in nodes]
        if not gpus:
            return f"pool {e.pool!r} ({len(nodes)} node(s)) has no MIG-capable GPU"
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


def _fixes(
    e: DemandEntry, missing: int, gpus: Sequence[_Gpu], plans: Mapping[int, GpuPlan]
) -> tuple[str, ...]:
    """More idle GPUs of each model offering the profile, or smaller profiles that fit now."""
    out: list[str] = []
    models: dict[str, GiProfile] = {}
    for g in gpus:
        p = g.by_name.get(e.profile)
        if p is not None:
            models.setdefault(g.layout.gpu.name, p)
    for model, p in sorted(models.items()):
        per_gpu = creatable(p, 0, 0, False)
        if per_gpu:
            n = ceil(missing / per_gpu)
            out.append(f"{n} more idle {model} GPU(s) ({per_gpu} x {e.profile} each)")
    fits: Counter[str] = Counter()
    size: dict[str, tuple[int, int]] = {}
    for g in gpus:
        want = g.by_name.get(e.profile)
        placed = _placed(g, plans.get(g.order))
        if want is None or placed is None:
            continue
        for name, n in free_capacity(g.layout.profiles, placed).items():
            p = g.by_name[name]
            if p.memory_slices < want.memory_slices or p.slice_count < want.slice_count:
                fits[name] += n
                size[name] = (p.memory_slices, p.slice_count)
    if fits:
        # Largest first: the closest to what was asked.
        best = sorted(fits.items(), key=lambda kv: (tuple(-x for x in size[kv[0]]), kv[0]))
        out.append(
            "a smaller profile that fits now: "
            + ", ".join(f"{name} ({n} free)" for name, n in best[:3])
        )
    return tuple(out)


# -- baselines -----------------------------------------------------------------------------------


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
