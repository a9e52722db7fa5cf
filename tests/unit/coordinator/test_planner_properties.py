"""Properties of the fleet planner over random fleets, layouts, busy instances and demand."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.coordinator.planning.catalog import Catalog
from agent.coordinator.planning.demand import Demand, DemandEntry
from agent.coordinator.planning.planner import NodeLayouts, plan_fleet, scratch_disruption
from agent.gpu.models import MODELS
from agent.gpu.types import GpuLayout
from agent.mig.desired import Desired
from agent.mig.plan import plan_gpu
from tests.unit.coordinator.fleets import A30, A100_40, A100_80, H100, H200, gpu
from tests.unit.mig.layouts import make_layout

MODEL_KEYS = (A100_40, A100_80, A30, H100, H200)


@st.composite
def gpu_layouts(draw: st.DrawFn, node: str, index: int) -> GpuLayout:
    model = draw(st.sampled_from(MODEL_KEYS))
    kind = draw(st.sampled_from(("off", "off-busy", "on")))
    if kind != "on":
        return gpu(node, index, model, mig=(False, False), gpu_processes=[7] * (kind == "off-busy"))
    empty = make_layout(model)
    names = [p.name for p in empty.profiles]
    counts = draw(st.dictionaries(st.sampled_from(names), st.integers(1, 4), max_size=3))
    plan = plan_gpu(empty, Desired(True, tuple(sorted(counts.items()))))
    instances = (
        []
        if plan.target is None
        else [(gi.profile_name, gi.placement.start) for gi in plan.target.instances]
    )
    busy_ids = draw(st.sets(st.integers(1, max(1, len(instances))), max_size=len(instances)))
    busy = [(1000 + i, i) for i in sorted(busy_ids) if i <= len(instances)]
    return gpu(node, index, model, instances, busy=busy)


@st.composite
def fleets(draw: st.DrawFn) -> list[NodeLayouts]:
    count = draw(st.integers(1, 3))
    return [
        NodeLayouts(
            f"n{i}",
            tuple(draw(gpu_layouts(f"n{i}", j)) for j in range(draw(st.integers(1, 4)))),
        )
        for i in range(count)
    ]


@st.composite
def demands(draw: st.DrawFn) -> Demand:
    names = sorted(
        {
            p.name
            for key in MODEL_KEYS
            for p in make_layout(key).profiles  # every profile of every model
        }
    )
    chosen = draw(st.dictionaries(st.sampled_from(names), st.integers(0, 8), max_size=4))
    return Demand(tuple(DemandEntry(n, c) for n, c in sorted(chosen.items())))


def _completed(fleet: list[NodeLayouts]) -> dict[tuple[str, str], GpuLayout]:
    catalog = Catalog(g for n in fleet for g in n.gpus)
    return {(n.name, g.gpu.uuid): catalog.complete(g) for n in fleet for g in n.gpus}


def _valid_for_model(layout: GpuLayout, instances: tuple[tuple[int, int, int], ...]) -> None:
    """(profile id, start, size) triples form a layout the GPU model allows (reference §1.4)."""
    model = next(m for m in MODELS.values() if m.name == layout.gpu.name)
    by_id = {p.id: p for p in model.gi_profiles}
    taken = 0
    for pid, start, size in instances:
        profile = by_id[pid]
        assert start in profile.starts and size == profile.memory_slices
        bits = ((1 << size) - 1) << start
        assert not bits & taken, f"overlap at {start}:{size}"
        taken |= bits
    per = Counter(pid for pid, _, _ in instances)
    assert all(n <= by_id[pid].instance_count for pid, n in per.items())
    assert sum(n for pid, n in per.items() if by_id[pid].attrs == "+me") <= 1


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(fleets(), demands())
def test_every_planned_layout_is_valid_for_its_gpu_model(
    fleet: list[NodeLayouts], demand: Demand
) -> None:
    plan = plan_fleet(fleet, demand)
    layouts = _completed(fleet)
    for change in plan.changes:
        layout = layouts[(change.node, change.uuid)]
        _valid_for_model(
            layout,
            tuple((gi.profile_id, gi.placement.start, gi.placement.size) for gi in change.target),
        )
        # The agent plans the same counts to the same layout, with nothing in the way.
        again = plan_gpu(layout, Desired(True, change.after))
        assert again.target is not None and not again.blockers
        assert again.target.instances == change.target


@SETTINGS
@given(fleets(), demands())
def test_busy_instances_are_never_planned_away(fleet: list[NodeLayouts], demand: Demand) -> None:
    plan = plan_fleet(fleet, demand)
    by_gpu = {(c.node, c.uuid): c for c in plan.changes}
    for node in fleet:
        for layout in node.gpus:
            change = by_gpu.get((node.name, layout.gpu.uuid))
            busy = {p.gpu_instance_id for p in layout.processes}
            if change is None:
                continue
            assert not (change.enable_mig and None in busy), "a whole GPU in use switched to MIG"
            kept = {(gi.profile_id, gi.placement) for gi in change.target}
            for gi in layout.instances:
                if gi.id in busy:
                    assert (gi.profile_id, gi.placement) in kept


@SETTINGS
@given(fleets(), demands())
def test_totals_add_up_and_met_entries_reach_their_demand(
    fleet: list[NodeLayouts], demand: Demand
) -> None:
    plan = plan_fleet(fleet, demand)
    unmet = {(u.profile, u.model): u.missing for u in plan.unmet}
    for total in plan.totals:
        missing = unmet.get((total.profile, total.model), 0)
        assert total.after + missing >= total.demand
        if missing:
            assert total.after == total.demand - missing
    created = Counter(c.split("@")[0] for ch in plan.changes for c in ch.create)
    destroyed = Counter(c.split("@")[0] for ch in plan.changes for c in ch.destroy)
    for total in plan.totals:
        if total.model is None:
            grown = created[total.profile] - destroyed[total.profile]
            assert total.after - total.before == grown


@SETTINGS
@given(fleets(), demands())
def test_never_more_disruptive_than_planning_from_scratch(
    fleet: list[NodeLayouts], demand: Demand
) -> None:
    plan = plan_fleet(fleet, demand)
    scratch = plan_fleet(fleet, demand, from_scratch=True)
    assert plan.destroyed <= scratch_disruption(fleet, scratch)
