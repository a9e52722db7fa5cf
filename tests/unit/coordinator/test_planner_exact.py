"""The fleet planner is exact: checked against a brute-force reference on small fleets.

The reference shares no code with the planner: per GPU it enumerates every valid layout of its
model (every profile, every valid start, the model's instance limits, one +me) that keeps the
busy instances, and tries every combination over the fleet. The planner must reach the same
optimum in this order: devices short per priority (highest first), instances destroyed,
mutations (destroyed + created + MIG mode switches).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import product

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.coordinator.planning.catalog import Catalog
from agent.coordinator.planning.demand import Demand, DemandEntry, parse_trace
from agent.coordinator.planning.planner import NodeLayouts, plan_fleet
from agent.coordinator.planning.replay import replay
from agent.gpu.types import GiProfile, GpuLayout
from agent.mig.desired import Desired
from agent.mig.plan import plan_gpu
from tests.unit.coordinator.fleets import A30, A100_40, H100, empty_node, gpu, node
from tests.unit.mig.layouts import make_layout


def test_one_h100_keeps_its_3g_when_a_4g_is_asked_for() -> None:
    """2g@0 1g@2 1g@3 3g@4, demand 4g.40gb: 1. The 4g needs slices 0-3 only: the three
    instances there go, the 3g at 4 stays (a greedy planner destroyed all four)."""
    fleet = [
        node(
            "a",
            gpu("a", 0, instances=[("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]),
        )
    ]
    plan = plan_fleet(fleet, Demand((DemandEntry("4g.40gb", 1),)))
    assert plan.met and plan.optimal
    (change,) = plan.changes
    assert change.keep == ("3g.40gb@4:4",)
    assert sorted(change.destroy) == ["1g.10gb@2:1", "1g.10gb@3:1", "2g.20gb@0:2"]
    assert change.create == ("4g.40gb@0:4",)
    assert plan.destroyed == 3 and plan.mutations == 4


TRACE_7G_1G = "time,profile,count{extra}\n0,7g.80gb,8{p7}\n0,1g.10gb,56{p1}\n"


def test_replaying_8_7g_and_56_1g_on_one_dgx_h100_meets_the_most_devices() -> None:
    """Same priority: 56 x 1g fill the 8 GPUs (56 devices met beats 8); before, the largest
    profile always won and all 56 x 1g stayed unmet."""
    trace = parse_trace(TRACE_7G_1G.format(extra="", p7="", p1=""))
    (step,) = replay([empty_node("dgx", H100, 8)], trace)
    assert step.unmet == (("7g.80gb", 8),) and step.met == 56


def test_replaying_8_7g_over_56_1g_by_priority() -> None:
    """The 7g entry at a higher priority is met first: 8 whole GPUs, and the 1g wait."""
    trace = parse_trace(TRACE_7G_1G.format(extra=",priority", p7=",10", p1=",0"))
    (step,) = replay([empty_node("dgx", H100, 8)], trace)
    assert step.unmet == (("1g.10gb", 56),) and step.met == 8


# -- the brute-force reference --------------------------------------------------------------------


def _layouts(profiles: Sequence[GiProfile], width: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every valid layout as (profile id, start) pairs, free slices allowed."""
    places = sorted(
        ((pl.start, p) for p in profiles for pl in p.placements), key=lambda sp: (sp[0], sp[1].id)
    )

    def visit(
        i: int, taken: int, chosen: tuple[tuple[int, int], ...], per: Counter[int], me: bool
    ) -> Iterator[tuple[tuple[int, int], ...]]:
        if i == len(places):
            yield chosen
            return
        yield from visit(i + 1, taken, chosen, per, me)
        start, p = places[i]
        bits = ((1 << p.memory_slices) - 1) << start
        is_me = "+me" in p.name
        if bits & taken or per[p.id] >= p.instance_count or (is_me and me):
            return
        per[p.id] += 1
        yield from visit(i + 1, taken | bits, (*chosen, (p.id, start)), per, me or is_me)
        per[p.id] -= 1

    yield from visit(0, 0, (), Counter(), False)


def _gpu_choices(layout: GpuLayout, demand: Demand) -> dict[tuple[int, ...], tuple[int, int]]:
    """Supply per entry (capped at demand) -> the least (destroyed, mutations) reaching it."""
    mode = layout.gpu.mig_mode
    assert mode is not None
    on = mode.current
    by_id = {p.id: p for p in layout.profiles}
    existing = {(gi.profile_id, gi.placement.start) for gi in layout.instances} if on else set()
    busy_ids = {p.gpu_instance_id for p in layout.processes}
    busy = {(gi.profile_id, gi.placement.start) for gi in layout.instances if gi.id in busy_ids}
    stay_supply = _supply(Counter(by_id[p].name for p, _ in existing), layout, demand)
    out = {stay_supply: (0, 0)}
    if not on and None in busy_ids:
        return out
    for chosen in _layouts(layout.profiles, layout.total_memory_slices):
        placed = set(chosen)
        if not busy <= placed:
            continue
        kept = len(existing & placed)
        destroyed = len(existing) - kept
        mutations = destroyed + (len(placed) - kept) + (0 if on else 1)
        if destroyed == 0 and mutations == (0 if on else 1) and not placed - existing:
            continue  # staying, or switching to MIG for nothing
        supply = _supply(Counter(by_id[p].name for p, _ in chosen), layout, demand)
        cost = (destroyed, mutations)
        if supply not in out or cost < out[supply]:
            out[supply] = cost
    return out


def _supply(names: Counter[str], layout: GpuLayout, demand: Demand) -> tuple[int, ...]:
    return tuple(
        min(e.count, sum(n for name, n in names.items() if e.accepts(name, layout.gpu.name)))
        for e in demand.entries
    )


def reference(fleet: Sequence[NodeLayouts], demand: Demand) -> tuple[tuple[int, ...], int, int]:
    catalog = Catalog(g for n in fleet for g in n.gpus)
    per_gpu = [
        list(_gpu_choices(catalog.complete(g), demand).items())
        for n in fleet
        for g in n.gpus
        if g.gpu.mig_mode is not None
    ]
    levels = sorted({e.priority for e in demand.entries}, reverse=True)
    best: tuple[tuple[int, ...], int, int] | None = None
    for combo in product(*per_gpu):
        got = [min(e.count, sum(s[i] for s, _ in combo)) for i, e in enumerate(demand.entries)]
        short = tuple(
            sum(e.count - got[i] for i, e in enumerate(demand.entries) if e.priority == level)
            for level in levels
        )
        key = (short, sum(c[0] for _, c in combo), sum(c[1] for _, c in combo))
        if best is None or key < best:
            best = key
    assert best is not None
    return best


MODELS = (A100_40, A30, H100)


@st.composite
def small_gpus(draw: st.DrawFn, name: str, index: int) -> GpuLayout:
    model = draw(st.sampled_from(MODELS))
    kind = draw(st.sampled_from(("off", "off-busy", "on", "on", "on")))
    if kind != "on":
        return gpu(name, index, model, mig=(False, False), gpu_processes=[7] * (kind == "off-busy"))
    empty = make_layout(model)
    names = [p.name for p in empty.profiles]
    counts = draw(st.dictionaries(st.sampled_from(names), st.integers(1, 3), max_size=3))
    planned = plan_gpu(empty, Desired(True, tuple(sorted(counts.items()))))
    instances = (
        []
        if planned.target is None
        else [(gi.profile_name, gi.placement.start) for gi in planned.target.instances]
    )
    busy = draw(st.sets(st.integers(1, max(1, len(instances))), max_size=2))
    return gpu(
        name, index, model, instances, busy=[(900 + i, i) for i in busy if i <= len(instances)]
    )


@st.composite
def small_fleets(draw: st.DrawFn) -> list[NodeLayouts]:
    sizes = draw(st.lists(st.integers(1, 2), min_size=1, max_size=2))
    if sum(sizes) > 3:
        sizes = [3]
    return [
        NodeLayouts(f"n{i}", tuple(draw(small_gpus(f"n{i}", j)) for j in range(k)))
        for i, k in enumerate(sizes)
    ]


@st.composite
def small_demands(draw: st.DrawFn) -> Demand:
    names = sorted({p.name for key in MODELS for p in make_layout(key).profiles})
    chosen = draw(st.dictionaries(st.sampled_from(names), st.integers(0, 6), max_size=3))
    return Demand(
        tuple(
            DemandEntry(n, c, priority=draw(st.integers(0, 2))) for n, c in sorted(chosen.items())
        )
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_fleets(), small_demands())
def test_the_plan_reaches_the_brute_force_optimum(fleet: list[NodeLayouts], demand: Demand) -> None:
    short, destroyed, mutations = reference(fleet, demand)
    plan = plan_fleet(fleet, demand)
    assert plan.optimal
    levels = sorted({e.priority for e in demand.entries}, reverse=True)
    missing = {(u.profile, u.priority): u.missing for u in plan.unmet}
    got = tuple(
        sum(missing.get((e.profile, e.priority), 0) for e in demand.entries if e.priority == level)
        for level in levels
    )
    assert (got, plan.destroyed, plan.mutations) == (short, destroyed, mutations)
