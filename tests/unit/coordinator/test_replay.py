"""Replaying a demand trace: unmet demand, disruption and idle slices per step."""

from __future__ import annotations

from agent.coordinator.demand import parse_trace
from agent.coordinator.replay import replay
from tests.unit.coordinator.fleets import A100_80, empty_node

TRACE = """time,profile,count
0,1g.10gb,14
0,3g.40gb,2
60,1g.10gb,21
120,7g.80gb,2
180,1g.10gb,0
180,7g.80gb,3
"""


def test_each_step_reports_unmet_demand_disruption_and_idle_slices() -> None:
    fleet = [empty_node("a", A100_80, 4)]
    steps = replay(fleet, parse_trace(TRACE))
    first, grown, starved, freed = steps
    # 14 x 1g and 2 x 3g on three GPUs: nothing is short, 3 GPUs switch to MIG, one stays free.
    assert (first.unmet, first.created, first.disrupted, first.gpus_changed) == ((), 16, 0, 3)
    assert first.idle_slices == 3 * 8 - 14 - 8
    # 7 more 1g take the fourth GPU.
    assert (grown.unmet, grown.created) == ((), 7)
    # A 7g needs a whole GPU and every GPU has devices in use: both 7g are unmet, nothing moves.
    assert starved.unmet == (("7g.80gb", 2),) and starved.disrupted == 0
    # With no 1g in use, the two GPUs holding only idle 1g (6 + 7) give way to two 7g. Step one
    # put a 3g beside 4 x 1g on two GPUs (as few mutations as 7 + 7 + 3g/3g, and a usable 1g
    # slot more), and those 3g are in use now: the third 7g is short.
    assert freed.unmet == (("7g.80gb", 1),) and freed.disrupted == 13 and freed.created == 2


def test_a_fleet_too_small_for_a_step_says_by_how_much() -> None:
    steps = replay([empty_node("a", A100_80, 1)], parse_trace("time,profile,count\n0,3g.40gb,5\n"))
    assert steps[0].unmet == (("3g.40gb", 3),) and steps[0].met == 2
