"""Property-based tests of the planner over random current layouts and random desired counts.

For every plan: it is valid (no overlap, valid starts, within max counts and one +me), executing
its steps reaches exactly the desired counts, no instance that could have stayed is destroyed, and
busy instances are destroyed only when forced. A naive oracle (tests/unit/mig/oracle.py) decides
what is possible.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent.gpu.models import MODELS
from agent.gpu.types import GiProfile, GpuLayout, Placement
from agent.mig.desired import Desired, _free_ci_start, ci_name, ci_widths, counts_of, resolve
from agent.mig.plan import (
    CreateCi,
    CreateGi,
    DestroyCi,
    DestroyGi,
    ResetGpu,
    SetMigMode,
    Step,
    plan_gpu,
)
from tests.unit.mig import oracle
from tests.unit.mig.layouts import make_layout, profiles_of


@dataclass
class _Gi:
    profile: GiProfile
    placement: Placement
    cis: dict[int, Placement] = field(default_factory=dict)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[GpuLayout, Desired, bool]:
    model_key = draw(st.sampled_from(sorted(MODELS)))
    profiles = profiles_of(MODELS[model_key])
    mig_on = draw(st.integers(0, 9)) > 0
    specs: list[tuple[str, int, tuple[int, ...]]] = []
    taken: list[tuple[GiProfile, Placement]] = []
    attempts = st.tuples(
        st.sampled_from(profiles),
        st.integers(0, 7),
        st.lists(st.integers(0, 4), min_size=0, max_size=4),
        st.integers(0, 19),  # 0: a GI left without a CI (a half-done create)
    )
    for profile, where, widths, empty in (
        draw(st.lists(attempts, min_size=2, max_size=12)) if mig_on else []
    ):
        free = [p for p in profile.placements if not any(p.overlaps(q) for _, q in taken)]
        if not free or not _within_limits([*taken, (profile, free[0])]):
            continue
        placement = free[where % len(free)]
        options = ci_widths(profile.slice_count)
        cis: list[int] = []
        used = 0
        for w in widths or [len(options) - 1]:
            width = options[w % len(options)]
            start = _free_ci_start(profile.slice_count, width, used)
            if start is not None:
                used |= ((1 << width) - 1) << start
                cis.append(width)
        taken.append((profile, placement))
        specs.append((profile.name, placement.start, tuple(cis) if empty else ()))
    with_cis = [i for i, s in enumerate(specs, start=1) if s[2]]
    busy_ids = draw(st.sets(st.sampled_from(with_cis), max_size=3)) if with_cis else set()
    layout = make_layout(
        model_key,
        specs,
        busy=[(1000 + gi_id, gi_id) for gi_id in sorted(busy_ids)],
        mig=(True, True) if mig_on else (False, False),
    )
    wants = draw(
        st.lists(
            st.tuples(st.sampled_from(profiles), st.integers(0, 4), st.integers(1, 2)),
            max_size=2,
        )
    )
    # Mostly a variation of the current layout (some instances dropped, some added), so that
    # instances can stay; sometimes unrelated counts.
    counts: Counter[str] = Counter()
    if draw(st.integers(0, 3)):
        profiles_by_id = {p.id: p for p in profiles}
        for gi in layout.instances:
            if gi.compute_instances and draw(st.integers(0, 3)):
                profile = profiles_by_id[gi.profile_id]
                counts.update(ci_name(profile, c.placement.size) for c in gi.compute_instances)
    for profile, w, n in wants:
        options = ci_widths(profile.slice_count)
        counts[ci_name(profile, options[w % len(options)])] += n
    enabled = draw(st.integers(0, 9)) > 0
    desired = Desired(enabled, tuple(sorted(counts.items())) if enabled and counts else ())
    return layout, desired, draw(st.booleans())


def _within_limits(instances: list[tuple[GiProfile, Placement]]) -> bool:
    return oracle.within_limits([(p, ()) for p, _ in instances], 8)


def execute(layout: GpuLayout, steps: tuple[Step, ...]) -> tuple[bool, list[_Gi]]:
    """Run the steps on a model of the driver that rejects every invalid mutation."""
    profiles = {p.id: p for p in layout.profiles}
    mode = layout.gpu.mig_mode
    enabled = bool(mode and mode.current)
    gis = {
        gi.id: _Gi(
            profiles[gi.profile_id], gi.placement, {c.id: c.placement for c in gi.compute_instances}
        )
        for gi in (layout.instances if enabled else ())
    }
    next_id = 100
    for step in steps:
        match step:
            case DestroyCi(gi_id=gi_id, ci_id=ci_id):
                del gis[gi_id].cis[ci_id]
            case DestroyGi(gi_id=gi_id):
                assert not gis[gi_id].cis, "a GI is destroyed only after its CIs"
                del gis[gi_id]
            case SetMigMode(enable=on):
                assert not gis, "instances are destroyed before a mode change"
                enabled = on
            case ResetGpu():
                pass
            case CreateGi(profile_id=pid, placement=placement):
                assert enabled
                profile = profiles[pid]
                assert placement in profile.placements
                assert not any(g.placement.overlaps(placement) for g in gis.values())
                gis[next_id] = _Gi(profile, placement)
                next_id += 1
                assert oracle.within_limits(
                    [(g.profile, ()) for g in gis.values()], layout.total_memory_slices
                )
            case CreateCi(gi_placement=at, ci=ci):
                (gi,) = [g for g in gis.values() if g.placement == at]
                assert ci.slices in ci_widths(gi.profile.slice_count)
                used = 0
                for p in gi.cis.values():
                    used |= ((1 << p.size) - 1) << p.start
                start = (
                    _free_ci_start(gi.profile.slice_count, ci.slices, used)
                    if ci.start is None
                    else ci.start
                )
                assert start is not None
                assert not (((1 << ci.slices) - 1) << start) & used
                gi.cis[next_id] = Placement(start, ci.slices)
                next_id += 1
    return enabled, list(gis.values())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_plans_are_valid_reach_the_counts_and_destroy_only_what_must_go(
    scenario: tuple[GpuLayout, Desired, bool],
) -> None:
    layout, desired, force = scenario
    plan = plan_gpu(layout, desired, force=force)
    event(f"{plan.status}{' forced' if force else ''}")
    event(f"existing {len(layout.instances)}: kept {len(plan.keep)}, destroyed {len(plan.destroy)}")
    width = layout.total_memory_slices
    if not desired.mig_enabled:
        enabled, gis = execute(layout, plan.steps)
        assert not enabled and not gis
        return
    wanted = resolve(desired, layout)
    shapes = [(s.profile, s.cis) for s in wanted]
    if not oracle.completes(shapes, [], width):
        assert (
            plan.status == "infeasible" and plan.infeasible is not None and plan.infeasible.reason
        )
        return
    assert plan.status in ("change", "unchanged", "blocked"), plan.infeasible
    # The steps reach exactly the desired counts through valid mutations only.
    enabled, gis = execute(layout, plan.steps)
    assert enabled
    reached = Counter(ci_name(g.profile, p.size) for g in gis for p in g.cis.values())
    assert dict(reached) == counts_of(wanted) == dict(desired.counts)
    assert all(g.cis for g in gis), "every GPU instance gets a compute instance"
    # Minimal disruption: nothing destroyed could have stayed next to what was kept.
    existing = {gi_id: (shape, p) for shape, gi_id, p in oracle.shapes_of_layout(layout)}
    kept = [existing[gi.id] for gi in plan.keep]
    for gi in plan.destroy:
        if gi.id in existing:
            assert not oracle.completes(shapes, [*kept, existing[gi.id]], width), gi
    busy = {p.gpu_instance_id for p in layout.processes} - {None}
    if not force:
        best = oracle.max_keepable(shapes, layout, {b for b in busy if b is not None})
        if plan.status == "blocked":
            assert best is None and plan.blockers
        else:
            assert len(plan.keep) == best
            assert not {gi.id for gi in plan.destroy} & busy
            assert not plan.blockers or plan.mode_change is not None
