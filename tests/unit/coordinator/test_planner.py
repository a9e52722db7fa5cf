"""The fleet MIG planner on small fleets whose right answer is known."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from agent.coordinator.planning.demand import Demand, DemandEntry, parse_demand
from agent.coordinator.planning.planfile import PLAN_CONFIG, load_plan, plan_document
from agent.coordinator.planning.planner import FleetPlan, plan_fleet, scratch_disruption
from agent.mig.spec import parse_spec
from tests.unit.coordinator.fleets import A30, A100_80, H100, empty_node, gpu, node


def demand(**counts: int) -> Demand:
    return Demand(tuple(DemandEntry(k.replace("_", "."), v) for k, v in counts.items()))


def totals(plan: FleetPlan) -> dict[str, int]:
    return {
        t.profile if t.model is None else f"{t.profile}/{t.model}": t.after for t in plan.totals
    }


def test_demand_is_met_exactly_on_a_fleet_of_idle_whole_gpus() -> None:
    """Nothing exists yet: the plan creates exactly the demanded devices, no more."""
    fleet = [empty_node("a"), empty_node("b")]
    want = {"1g.10gb": 10, "2g.20gb": 3, "3g.40gb": 4, "7g.80gb": 2}
    plan = plan_fleet(fleet, parse_demand(f"version: v1\ndemand: {want}"))
    assert plan.met
    assert totals(plan) == want
    made = Counter(c.split("@")[0] for change in plan.changes for c in change.create)
    assert dict(made) == want
    assert plan.destroyed == 0
    assert all(c.enable_mig for c in plan.changes)


def test_devices_already_there_count_toward_demand_and_stay() -> None:
    fleet = [
        node(
            "a",
            gpu("a", 0, instances=[("3g.40gb", 0), ("3g.40gb", 4)]),
            gpu("a", 1, instances=[("1g.10gb", 0), ("1g.10gb", 1)]),
        )
    ]
    plan = plan_fleet(fleet, demand(**{"3g_40gb": 2, "1g_10gb": 5}))
    assert plan.met and plan.destroyed == 0
    (change,) = plan.changes
    assert (change.index, change.keep) == (1, ("1g.10gb@0:1", "1g.10gb@1:1"))
    assert [c.split("@")[0] for c in change.create] == ["1g.10gb"] * 3


def test_a_busy_instance_is_never_planned_away_and_the_reason_says_so() -> None:
    """A 7g needs the whole GPU; a process on 1g@4 holds it, so the demand stays unmet."""
    fleet = [node("a", gpu("a", 0, instances=[("1g.10gb", 4)], busy=[(4242, 1)]))]
    plan = plan_fleet(fleet, demand(**{"7g_80gb": 1}))
    (unmet,) = plan.unmet
    assert (unmet.profile, unmet.missing) == ("7g.80gb", 1)
    assert "1 have busy instances on the slices it needs" in unmet.reason
    assert plan.changes == ()


def test_idle_surplus_instances_make_room() -> None:
    fleet = [node("a", gpu("a", 0, instances=[("1g.10gb", i) for i in range(7)]))]
    plan = plan_fleet(fleet, demand(**{"7g_80gb": 1, "1g_10gb": 0}))
    assert plan.met
    (change,) = plan.changes
    assert len(change.destroy) == 7 and change.create == ("7g.80gb@0:8",)


def test_a_smaller_demanded_device_is_displaced_and_placed_again_elsewhere() -> None:
    """GPU 1 is held by busy 1g devices; the 7g can only go to GPU 0, whose idle 1g moves."""
    fleet = [
        node(
            "a",
            gpu("a", 0, instances=[("1g.10gb", 4)]),
            gpu(
                "a",
                1,
                instances=[("1g.10gb", i) for i in range(4)],
                busy=[(100 + i, i + 1) for i in range(4)],
            ),
        )
    ]
    plan = plan_fleet(fleet, demand(**{"7g_80gb": 1, "1g_10gb": 5}))
    assert plan.met
    by_gpu = {c.index: c for c in plan.changes}
    assert by_gpu[0].destroy == ("1g.10gb@4:1",) and by_gpu[0].create == ("7g.80gb@0:8",)
    assert by_gpu[1].create[0].startswith("1g.10gb@") and len(by_gpu[1].keep) == 4
    assert plan.destroyed == 1


def test_gpus_already_in_mig_mode_are_used_before_whole_gpus() -> None:
    fleet = [node("a", gpu("a", 0, mig=(False, False)), gpu("a", 1))]
    plan = plan_fleet(fleet, demand(**{"3g_40gb": 2}))
    (change,) = plan.changes
    assert change.index == 1 and not change.enable_mig


def test_partly_used_gpus_fill_first_so_a_whole_gpu_stays_free() -> None:
    fleet = [node("a", gpu("a", 0, instances=[("3g.40gb", 0)]), gpu("a", 1))]
    plan = plan_fleet(fleet, demand(**{"3g_40gb": 2}))
    (change,) = plan.changes
    assert change.index == 0 and change.create == ("3g.40gb@4:4",)
    assert dict(plan.free_capacity)["7g.80gb"] == 1
    assert plan.free_slices == 8


def test_demand_per_model_lands_on_that_model_only() -> None:
    fleet = [empty_node("a100", A100_80, 2), empty_node("h100", H100, 2)]
    text = """
version: v1
demand:
  3g.40gb:
    NVIDIA H100 80GB HBM3: 3
  1g.10gb: 4
"""
    plan = plan_fleet(fleet, parse_demand(text))
    assert plan.met
    for change in plan.changes:
        if any(c.startswith("3g") for c in change.create):
            assert change.model == "NVIDIA H100 80GB HBM3"


def test_a_profile_the_fleet_lacks_is_reported_with_what_it_offers() -> None:
    plan = plan_fleet([empty_node("a", A30, 4)], demand(**{"3g_40gb": 1}))
    (unmet,) = plan.unmet
    assert "no GPU in the fleet offers 3g.40gb" in unmet.reason
    assert "1g.6gb" in unmet.reason


def test_a_model_the_fleet_lacks_is_reported() -> None:
    plan = plan_fleet(
        [empty_node("a", A30, 1)],
        Demand((DemandEntry("1g.6gb", 1, "NVIDIA H200"),)),
    )
    (unmet,) = plan.unmet
    assert "no MIG-capable GPU of model NVIDIA H200" in unmet.reason


def test_a_whole_gpu_running_processes_is_not_switched_to_mig() -> None:
    fleet = [node("a", gpu("a", 0, mig=(False, False), gpu_processes=[77]))]
    plan = plan_fleet(fleet, demand(**{"1g_10gb": 1}))
    assert "run processes as whole GPUs (MIG off)" in plan.unmet[0].reason


def test_demand_beyond_the_model_limit_is_explained() -> None:
    fleet = [node("a", gpu("a", 0, instances=[("4g.40gb", 0)]))]
    plan = plan_fleet(fleet, demand(**{"4g_40gb": 2}))
    assert "already hold the most 4g.40gb instances their model allows" in plan.unmet[0].reason


def test_changing_few_instances_versus_a_plan_from_scratch() -> None:
    """A fleet in a mixed layout asked for a bit more of one profile: the planner creates in free
    slices and keeps every instance; planning from scratch destroys over half of them."""
    balanced = [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]
    halves = [("3g.40gb", 0)]
    fleet = [
        node(
            f"n{i}",
            *(gpu(f"n{i}", j, instances=balanced if j % 2 else halves) for j in range(8)),
        )
        for i in range(4)
    ]
    want = demand(**{"1g_10gb": 40, "2g_20gb": 16, "3g_40gb": 40})
    plan = plan_fleet(fleet, want)
    scratch = plan_fleet(fleet, want, from_scratch=True)
    assert plan.met and scratch.met
    assert plan.destroyed == 0
    existing = sum(len(g.instances) for n in fleet for g in n.gpus)
    assert existing == 80
    assert scratch_disruption(fleet, scratch) > existing // 2


def test_a_plan_file_gives_each_node_a_mig_parted_config_of_its_changed_gpus(
    tmp_path: Path,
) -> None:
    """The handoff to `fleet apply mig --plan`: each config selects the changed GPUs by UUID
    with the planned counts, and the agent's parser accepts it."""
    fleet = [
        node("a", gpu("a", 0, instances=[("3g.40gb", 0)]), gpu("a", 1)),
        empty_node("b", count=2),
    ]
    plan = plan_fleet(fleet, demand(**{"3g_40gb": 3, "7g_80gb": 1}))
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan_document(plan, "demand.yaml")))
    configs = load_plan(path)
    assert sorted(configs) == sorted({c.node for c in plan.changes})
    for change in plan.changes:
        _, entries = parse_spec(configs[change.node]).select(PLAN_CONFIG)
        (entry,) = [e for e in entries if e.devices == (change.uuid,)]
        assert entry.mig_enabled and dict(entry.mig_devices) == dict(change.after)
