"""Priorities and pools: who gets the slices when not everything fits, and what the rest lacks."""

from __future__ import annotations

from agent.coordinator.planning.demand import Demand, DemandEntry
from agent.coordinator.planning.planner import plan_fleet
from tests.unit.coordinator.fleets import A30, H100, empty_node, gpu, node


def test_the_higher_priority_entry_is_met_and_the_other_says_what_it_lost_to() -> None:
    """Two idle H100s: 7g at priority 10 takes both; the 1g at 0 lost to it, and more GPUs of
    the model (7 x 1g each) or a smaller profile would make it fit."""
    fleet = [empty_node("a", H100, 2, mig_on=True)]
    want = Demand((DemandEntry("1g.10gb", 14, priority=0), DemandEntry("7g.80gb", 2, priority=10)))
    plan = plan_fleet(fleet, want)
    (unmet,) = plan.unmet
    assert (unmet.profile, unmet.missing, unmet.priority) == ("1g.10gb", 14, 0)
    assert "hold devices of higher-priority demand" in unmet.reason
    assert unmet.lost_to == ("7g.80gb (priority 10, 2 device(s))",)
    assert unmet.fixes == ("2 more idle NVIDIA H100 80GB HBM3 GPU(s) (7 x 1g.10gb each)",)
    # Flip the priorities: now the 1g fill both GPUs and the 7g wait.
    flipped = Demand((DemandEntry("1g.10gb", 14, priority=10), DemandEntry("7g.80gb", 2)))
    (unmet,) = plan_fleet(fleet, flipped).unmet
    assert (unmet.profile, unmet.missing) == ("7g.80gb", 2)
    assert unmet.lost_to == ("1g.10gb (priority 10, 14 device(s))",)


def test_the_same_profile_at_two_priorities_fills_the_higher_first() -> None:
    fleet = [empty_node("a", H100, 1, mig_on=True)]
    want = Demand(
        (
            DemandEntry("3g.40gb", 2, priority=0, pool="name=a"),
            DemandEntry("3g.40gb", 1, priority=5),
        )
    )
    plan = plan_fleet(fleet, want, pools={"name=a": frozenset({"a"})})
    (unmet,) = plan.unmet
    assert (unmet.priority, unmet.missing, unmet.pool) == (0, 1, "name=a")
    assert {(t.priority, t.after) for t in plan.totals} == {(5, 1), (0, 1)}


def test_a_pool_puts_devices_on_its_nodes_only() -> None:
    fleet = [empty_node("a", H100, 1, mig_on=True), empty_node("b", H100, 1, mig_on=True)]
    want = Demand((DemandEntry("3g.40gb", 2, pool="team=b"),))
    plan = plan_fleet(fleet, want, pools={"team=b": frozenset({"b"})})
    assert plan.met
    assert {c.node for c in plan.changes} == {"b"}


def test_a_pool_that_matches_no_node_is_said_as_such() -> None:
    fleet = [empty_node("a", H100, 1)]
    want = Demand((DemandEntry("3g.40gb", 1, pool="team=x"),))
    (unmet,) = plan_fleet(fleet, want, pools={"team=x": frozenset()}).unmet
    assert unmet.reason.startswith("pool selector 'team=x' matched no node")


def test_a_profile_too_big_for_what_is_free_suggests_one_that_fits() -> None:
    """A busy 3g on the only GPU: a 4g cannot go anywhere, a 3g (or smaller) would."""
    fleet = [node("a", gpu("a", 0, instances=[("3g.40gb", 4)], busy=[(5, 1)]))]
    (unmet,) = plan_fleet(fleet, Demand((DemandEntry("4g.40gb", 2),))).unmet
    assert unmet.missing == 1  # one 4g fits at 0
    assert "already hold the most 4g.40gb instances" in unmet.reason
    assert unmet.fixes[0] == "1 more idle NVIDIA H100 80GB HBM3 GPU(s) (1 x 4g.40gb each)"


def test_a_model_with_room_elsewhere_is_named_in_the_fix() -> None:
    fleet = [empty_node("a", A30, 1, mig_on=True)]
    (unmet,) = plan_fleet(fleet, Demand((DemandEntry("1g.6gb", 6),))).unmet
    assert unmet.missing == 2
    assert unmet.fixes == ("1 more idle NVIDIA A30 GPU(s) (4 x 1g.6gb each)",)
