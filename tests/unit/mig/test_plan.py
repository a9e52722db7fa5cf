"""The MIG planner on layouts built from the simulator's GPU models (pure: no driver)."""

from __future__ import annotations

import itertools

import pynvml
import pytest

from agent.errors import InvalidSpec
from agent.gpu.models import MODELS
from agent.gpu.types import GpuLayout, Placement
from agent.mig.desired import Desired, Shape, counts_of, current_counts, resolve
from agent.mig.placement import Infeasibility
from agent.mig.plan import (
    CreateCi,
    CreateGi,
    DestroyCi,
    DestroyGi,
    ResetGpu,
    SetMigMode,
    converge_steps,
    mismatches,
    plan_gpu,
)
from agent.mig.state import fetch
from tests.unit.mig import oracle
from tests.unit.mig.layouts import make_layout, profiles_of

EIGHT_SLICE = [k for k, m in MODELS.items() if m.memory_slices == 8]
A100 = "A100-SXM4-40GB"

# reference/mig.md §1.5 notation -> NVML profile constant.
KINDS = {
    "1g": pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    "1g2": pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    "1g+me": pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    "2g": pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    "2g+me": pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
    "3g": pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    "4g": pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    "7g": pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
}

# §1.5: the maximal geometries that use all 7 compute slices, with the guide's example placement.
GEOMETRIES = {
    "7g": "7g@0",
    "4g + 3g": "4g@0 3g@4",
    "3g + 2g + 2g": "2g@0 2g@2 3g@4",
    "3g + 2g + 1g + 1g (all-balanced)": "1g@0 1g@1 2g@2 3g@4",
    "3g + 4x1g": "1g@0 1g@1 1g@2 1g@3 3g@4",
    "4g + 2g + 1g2": "4g@0 2g@4 1g2@6",
    "4g + 1g2 + 2x1g": "4g@0 1g@4 1g@5 1g2@6",
    "3x2g + 1g2": "2g@0 2g@2 2g@4 1g2@6",
    "2x2g + 1g2 + 2x1g": "2g@0 1g@2 1g@3 2g@4 1g2@6",
    "2g + 1g2 + 4x1g": "1g@0 1g@1 1g@2 1g@3 2g@4 1g2@6",
    "1g2 + 6x1g": "1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g2@6",
    "7x1g": "1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g@6",
    "2g + 5x1g": "1g@0 1g@1 2g@2 1g@4 1g@5 1g@6",
    "2x2g + 3x1g": "2g@0 2g@2 1g@4 1g@5 1g@6",
    "3x2g + 1g": "2g@0 2g@2 2g@4 1g@6",
    "4g + 2g + 1g": "4g@0 2g@4 1g@6",
    "4g + 3x1g": "4g@0 1g@4 1g@5 1g@6",
}
A30_GEOMETRIES = {
    "4x1g": "1g@0 1g@1 1g@2 1g@3",
    "2g + 2x1g": "2g@0 1g@2 1g@3",
    "2x2g": "2g@0 2g@2",
    "4g": "4g@0",
}


def names(model_key: str) -> dict[str, str]:
    """§1.5 notation -> this model's profile name (e.g. 1g2 -> 1g.10gb on A100-40GB)."""
    by_constant = {p.constant: p.name for p in profiles_of(MODELS[model_key])}
    return {kind: by_constant[c] for kind, c in KINDS.items() if c in by_constant}


def instances(model_key: str, geometry: str) -> list[tuple[str, int]]:
    n = names(model_key)
    return [(n[kind], int(start)) for kind, start in (item.split("@") for item in geometry.split())]


def desired_of(insts: list[tuple[str, int]], source: str = "") -> Desired:
    counts = itertools.groupby(sorted(name for name, _ in insts))
    return Desired(True, tuple((name, len(list(group))) for name, group in counts), source)


def labels(gis: object) -> list[str]:
    return sorted(f"{gi.profile_name}@{gi.placement}" for gi in gis)  # type: ignore[attr-defined]


# -- the reference's geometries --------------------------------------------------------------------


@pytest.mark.parametrize("model_key", EIGHT_SLICE)
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_every_maximal_geometry_fits_and_its_example_layout_is_kept(
    model_key: str, geometry: str
) -> None:
    """§1.5: each geometry is accepted on an empty GPU, and its example layout needs no change."""
    wanted = instances(model_key, GEOMETRIES[geometry])
    fresh = plan_gpu(make_layout(model_key), desired_of(wanted))
    assert fresh.status == "change", fresh.infeasible
    assert fresh.target is not None
    assert counts_of_target(fresh) == dict(desired_of(wanted).counts)
    as_example = plan_gpu(make_layout(model_key, wanted), desired_of(wanted))
    assert as_example.status == "unchanged"
    assert len(as_example.keep) == len(wanted) and not as_example.steps


@pytest.mark.parametrize("geometry", A30_GEOMETRIES)
def test_every_a30_geometry_fits(geometry: str) -> None:
    wanted = instances("A30", A30_GEOMETRIES[geometry])
    assert plan_gpu(make_layout("A30"), desired_of(wanted)).status == "change"
    assert plan_gpu(make_layout("A30", wanted), desired_of(wanted)).status == "unchanged"


def counts_of_target(plan: object) -> dict[str, int]:
    target = plan.target  # type: ignore[attr-defined]
    layout = plan.layout  # type: ignore[attr-defined]
    profiles = {p.id: p for p in layout.profiles}
    return counts_of(
        [Shape(profiles[gi.profile_id], tuple(c.slices for c in gi.cis)) for gi in target.instances]
    )


@pytest.mark.parametrize("model_key", list(MODELS))
def test_every_count_combination_is_accepted_exactly_when_it_fits(model_key: str) -> None:
    """Over counts 0..max of every profile: the planner agrees with a naive search, refuses the
    rest with a reason, and what it offers instead really fits.

    Exhaustive up to one memory slice past the GPU's width, where fitting is decided by
    placement; past that, the refusal follows from the sum alone, so every 16th such
    combination is checked (the RTX PRO 6000's 108,000 combinations took 125 s exhaustively)."""
    layout = make_layout(model_key)
    profiles = layout.profiles
    by_name = {p.name: p for p in profiles}
    refused = 0
    width = layout.total_memory_slices
    combos = [
        counts
        for i, counts in enumerate(
            itertools.product(*(range(p.instance_count + 1) for p in profiles))
        )
        if sum(p.memory_slices * n for p, n in zip(profiles, counts, strict=True)) <= width + 1
        or i % 16 == 0
    ]
    for counts in combos:
        desired = Desired(
            True, tuple((p.name, n) for p, n in zip(profiles, counts, strict=True) if n)
        )
        shapes = [
            (by_name[name], (by_name[name].slice_count,))
            for name, n in desired.counts
            for _ in range(n)
        ]
        plan = plan_gpu(layout, desired)
        if oracle.completes(shapes, [], layout.total_memory_slices):
            assert plan.status in ("change", "unchanged"), (desired, plan.infeasible)
            continue
        refused += 1
        assert plan.status == "infeasible", desired
        assert_explained(plan.infeasible, desired, layout)
    assert 0 < refused < len(combos)


@pytest.mark.parametrize("model_key", list(MODELS))
def test_more_instances_than_a_profile_allows_are_refused(model_key: str) -> None:
    layout = make_layout(model_key)
    for profile in layout.profiles:
        desired = Desired(True, ((profile.name, profile.instance_count + 1),))
        plan = plan_gpu(layout, desired)
        assert plan.infeasible is not None and plan.infeasible.profile == profile.name
        assert f"allows at most {profile.instance_count}" in plan.infeasible.reason
        assert_explained(plan.infeasible, desired, layout)


def assert_explained(why: Infeasibility | None, desired: Desired, layout: GpuLayout) -> None:
    """A refusal has a reason, and its "fits instead" is part of the request and really fits."""
    assert why is not None and why.reason
    by_name = {p.name: p for p in layout.profiles}
    instead = [
        (by_name[n], (by_name[n].slice_count,)) for n, c in why.fits_instead for _ in range(c)
    ]
    assert instead and oracle.completes(instead, [], layout.total_memory_slices), why
    assert all(c <= dict(desired.counts).get(n, 0) for n, c in why.fits_instead)


# -- what a plan keeps, destroys and creates -------------------------------------------------------


def test_balanced_to_3g_plus_four_1g_disrupts_one_instance() -> None:
    """all-balanced -> 3g + 4x1g keeps both 1g and the 3g; only the 2g goes (mig-parted: all 4)."""
    layout = make_layout(A100, instances(A100, GEOMETRIES["3g + 2g + 1g + 1g (all-balanced)"]))
    plan = plan_gpu(layout, Desired(True, (("3g.20gb", 1), ("1g.5gb", 4))))
    assert labels(plan.keep) == ["1g.5gb@0:1", "1g.5gb@1:1", "3g.20gb@4:4"]
    assert labels(plan.destroy) == ["2g.10gb@2:2"]
    assert sorted(gi.label for gi in plan.create) == ["1g.5gb@2:1", "1g.5gb@3:1"]
    assert [type(s) for s in plan.steps] == [
        DestroyCi,
        DestroyGi,
        CreateGi,
        CreateCi,
        CreateGi,
        CreateCi,
    ]


def test_seven_g_to_four_plus_three_replaces_the_whole_gpu() -> None:
    layout = make_layout(A100, [("7g.40gb", 0)])
    plan = plan_gpu(layout, Desired(True, (("4g.20gb", 1), ("3g.20gb", 1))))
    assert labels(plan.destroy) == ["7g.40gb@0:8"]
    assert sorted(gi.label for gi in plan.create) == ["3g.20gb@4:4", "4g.20gb@0:4"]


def test_an_instance_in_the_way_is_moved_not_kept() -> None:
    """2g@0 cannot stay next to a 4g (which only starts at 0): it is recreated at 4."""
    layout = make_layout(A100, [("2g.10gb", 0)])
    plan = plan_gpu(layout, Desired(True, (("4g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 1))))
    assert labels(plan.destroy) == ["2g.10gb@0:2"]
    assert sorted(gi.label for gi in plan.create) == ["1g.5gb@6:1", "2g.10gb@4:2", "4g.20gb@0:4"]


def test_among_equal_keeps_the_layout_leaving_the_most_room_wins() -> None:
    """Two 1g on an empty GPU go where a 4g and a 1g.10gb can still follow them (4 and 5)."""
    plan = plan_gpu(make_layout(A100), Desired(True, (("1g.5gb", 2),)))
    assert sorted(gi.label for gi in plan.create) == ["1g.5gb@4:1", "1g.5gb@5:1"]
    assert plan.free_region == Placement(0, 4)


def test_a_free_slice_no_instance_can_use_counts_for_nothing() -> None:
    """3g + 2g + 1g leaves one slice free: slice 3 (a 1g fits there), never slice 7."""
    plan = plan_gpu(
        make_layout(A100), Desired(True, (("3g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 1)))
    )
    assert plan.free_region == Placement(3, 1)
    grown = make_layout(A100, [(gi.profile_name, gi.placement.start) for gi in plan.create])
    added = plan_gpu(grown, Desired(True, (("3g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 2))))
    assert not added.destroy and [gi.label for gi in added.create] == ["1g.5gb@3:1"]


def test_busy_instances_block_their_destruction_and_name_the_process() -> None:
    layout = make_layout(A100, [("1g.5gb", i) for i in range(7)], busy=[(4242, 6), (4343, 7)])
    desired = Desired(True, (("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)))
    plan = plan_gpu(layout, desired)
    assert plan.status == "blocked"
    assert {(b.pid, b.instance, b.change) for b in plan.blockers} == {
        (4242, "1g.5gb@5:1", "destroy"),
        (4343, "1g.5gb@6:1", "destroy"),
    }
    assert "process 4242 on 1g.5gb@5:1 blocks destroy" in [str(b) for b in plan.blockers]
    forced = plan_gpu(layout, desired, force=True)
    assert forced.status == "change" and forced.blockers


def test_busy_instances_are_worked_around_when_possible() -> None:
    """all-1g -> all-balanced with the 1g at 0 and 1 busy: both stay, the other five go."""
    layout = make_layout(A100, [("1g.5gb", i) for i in range(7)], busy=[(10, 1), (11, 2)])
    plan = plan_gpu(layout, Desired(True, (("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1))))
    assert plan.status == "change" and not plan.blockers
    assert labels(plan.keep) == ["1g.5gb@0:1", "1g.5gb@1:1"]
    assert len(plan.destroy) == 5


def test_multi_ci_profiles_share_a_gpu_instance_like_mig_parted() -> None:
    """``1c.3g.20gb: 3`` is one 3g GI with three 1c CIs; a fourth needs a second GI (§3.3)."""
    layout = make_layout(A100)
    (one,) = resolve(Desired(True, (("1c.3g.20gb", 3),)), layout)
    assert (one.profile.name, one.cis) == ("3g.20gb", (1, 1, 1))
    two = resolve(Desired(True, (("1c.3g.20gb", 4),)), layout)
    assert sorted(s.cis for s in two) == [(1,), (1, 1, 1)]
    mixed = resolve(Desired(True, (("2c.3g.20gb", 1), ("1c.3g.20gb", 1))), layout)
    assert [s.cis for s in mixed] == [(2, 1)]
    plan = plan_gpu(layout, Desired(True, (("1c.3g.20gb", 3),)))
    assert [str(s) for s in plan.steps[1:]] == [
        "create 1-slice compute instance in 3g.20gb@4:4"
    ] * 3


def test_a_profile_from_another_board_is_an_error_naming_this_boards_profiles() -> None:
    with pytest.raises(InvalidSpec) as info:
        plan_gpu(make_layout("H100-SXM5-80GB"), Desired(True, (("1g.5gb", 7),), "mig-configs.x[0]"))
    assert "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb" in str(info.value)
    assert info.value.violations[0].field == "mig-configs.x[0].mig-devices.1g.5gb"


def test_a_compute_profile_the_gpu_instance_lacks_is_an_error() -> None:
    with pytest.raises(InvalidSpec, match=r"offers: 1c.4g.20gb, 2c.4g.20gb, 4g.20gb"):
        plan_gpu(make_layout(A100), Desired(True, (("3c.4g.20gb", 1),)))


def test_only_one_media_extension_instance_per_gpu() -> None:
    plan = plan_gpu(make_layout("A30"), Desired(True, (("1g.6gb+me", 1), ("2g.12gb+me", 1))))
    assert plan.status == "infeasible" and "only one +me" in plan.infeasible.reason  # type: ignore[union-attr]


def test_an_all_media_engine_instance_shares_its_gpu_only_with_no_engine_ones() -> None:
    """nvml.h: a +me.all instance blocks every profile but the -me ones. The planner refused
    nothing and the driver (the simulator, as nvml.h says) refused the apply midway."""
    gpu = "RTX-PRO-6000-96GB"
    plan = plan_gpu(make_layout(gpu), Desired(True, (("1g.24gb+me.all", 1), ("1g.24gb", 2))))
    why = plan.infeasible
    assert plan.status == "infeasible" and why is not None and why.profile == "1g.24gb+me.all"
    assert "only -me instances may share its GPU; requested beside it: 1g.24gb" in why.reason
    assert dict(why.fits_instead) == {"1g.24gb": 2}
    fine = plan_gpu(make_layout(gpu), Desired(True, (("1g.24gb+me.all", 1), ("1g.24gb-me", 3))))
    assert fine.status == "change", fine.infeasible


def test_a_collision_says_which_slices_collide_and_what_fits() -> None:
    plan = plan_gpu(make_layout(A100), Desired(True, (("4g.20gb", 1), ("2g.10gb", 2))))
    why = plan.infeasible
    assert why is not None and why.profile == "2g.10gb"
    assert [(str(c.placement), c.blocked_by, c.slices) for c in why.collisions] == [
        ("0:2", ("4g.20gb@0:4",), (0, 1)),
        ("2:2", ("4g.20gb@0:4",), (2, 3)),
        ("4:2", ("2g.10gb@4:2",), (4, 5)),
    ]
    assert dict(why.fits_instead) == {"4g.20gb": 1, "2g.10gb": 1}
    assert "at 0:2 it overlaps 4g.20gb@0:4 on slices 0-1" in why.reason


# -- MIG mode --------------------------------------------------------------------------------------


def test_enabling_mig_plans_mode_change_reset_and_instances() -> None:
    layout = make_layout(A100, mig=(False, False), gpu_processes=[77])
    plan = plan_gpu(layout, Desired(True, (("7g.40gb", 1),)))
    assert plan.mode_change is not None and plan.mode_change.enable and plan.mode_change.activation
    assert [type(s) for s in plan.steps] == [SetMigMode, ResetGpu, CreateGi, CreateCi]
    assert [(b.pid, b.change) for b in plan.blockers] == [(77, "MIG mode change")]


def test_disabling_mig_destroys_every_instance_first() -> None:
    layout = make_layout(A100, [("3g.20gb", 0), ("3g.20gb", 4)])
    plan = plan_gpu(layout, Desired(False))
    assert [type(s) for s in plan.steps] == [
        DestroyCi,
        DestroyGi,
        DestroyCi,
        DestroyGi,
        SetMigMode,
        ResetGpu,
    ]
    assert len(plan.destroy) == 2


def test_a_pending_opposite_request_is_cancelled_without_a_reset() -> None:
    layout = make_layout(A100, [("7g.40gb", 0)], mig=(True, False))
    plan = plan_gpu(layout, Desired(True, (("7g.40gb", 1),)))
    assert plan.mode_change is not None and not plan.mode_change.activation
    assert plan.steps == (SetMigMode(True),)


def test_profiles_unknown_while_mig_is_off_defer_the_layout() -> None:
    layout = make_layout(A100, mig=(False, False))
    blank = type(layout)(layout.gpu, (), (), ())
    plan = plan_gpu(blank, Desired(True, (("1g.5gb", 7),)))
    assert plan.deferred and plan.target is None and plan.steps == (SetMigMode(True), ResetGpu())


def test_gpus_without_mig_are_left_alone_or_refused() -> None:
    layout = make_layout(A100, mig=None)
    assert plan_gpu(layout, Desired(False)).status == "unchanged"
    assert plan_gpu(layout, Desired(True, (("1g.5gb", 1),))).status == "infeasible"


# -- converge (used by rollback) and assert --------------------------------------------------------


def test_converge_to_a_snapshot_restores_exact_placements() -> None:
    before = make_layout(A100, [("1g.5gb", 0), ("2g.10gb", 2), ("3g.20gb", 4, (2, 1))])
    after = make_layout(A100, [("7g.40gb", 0)])
    steps = converge_steps(after, fetch(before))
    creates = [s for s in steps if isinstance(s, CreateGi)]
    assert sorted(str(s.placement) for s in creates) == ["0:1", "2:2", "4:4"]
    cis = [s.ci for s in steps if isinstance(s, CreateCi) and s.gi_placement.start == 4]
    assert [(c.slices, c.start) for c in cis] == [(2, 0), (1, 2)]
    assert converge_steps(before, fetch(before)) == ()


def test_mismatches_follow_mig_parted_counts_and_flag_empty_instances() -> None:
    layout = make_layout(A100, [("3g.20gb", 0, (1, 1, 1)), ("3g.20gb", 4)])
    assert current_counts(layout) == {"1c.3g.20gb": 3, "3g.20gb": 1}
    assert mismatches(layout, Desired(True, (("3g.20gb", 1), ("1c.3g.20gb", 3)))) == ()
    assert mismatches(layout, Desired(True, (("3g.20gb", 2),)))
    assert mismatches(layout, Desired(False)) == ("GPU 0: MIG mode is enabled, want disabled",)
    empty = make_layout(A100, [("3g.20gb", 0, ())])
    assert "has no compute instance" in mismatches(empty, Desired(True, (("3g.20gb", 1),)))[-1]
    pending = make_layout(A100, mig=(False, True))
    assert mismatches(pending, Desired(False)) == (
        "GPU 0: a MIG mode change is pending (want disabled)",
    )
