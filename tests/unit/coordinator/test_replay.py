"""Replaying a demand trace: unmet demand, disruption and idle slices per step."""

from __future__ import annotations

import csv
import io
import json
from xml.etree import ElementTree

import pytest

from agent.coordinator.planning.demand import parse_trace
from agent.coordinator.planning.replay import replay
from agent.coordinator.planning.replayreport import report_csv, report_json, report_svg
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


PRIORITY_TRACE = """time,profile,count,priority
0,7g.80gb,2,10
0,1g.10gb,7,0
3600,1g.10gb,21,0
7200,7g.80gb,0,10
"""


def test_steps_report_met_per_priority_reconfigurations_and_gpu_hours_idle() -> None:
    fleet = [empty_node("a", A100_80, 3)]
    first, more, freed = replay(fleet, parse_trace(PRIORITY_TRACE), end=10_800)
    # Two whole GPUs for the 7g (priority 10), the third into 7 x 1g.
    assert [(p.priority, p.demand, p.met) for p in first.by_priority] == [(10, 2, 2), (0, 7, 7)]
    assert first.gpus_changed == 3 and first.gpu_hours_idle == pytest.approx(1 / 8)
    # 21 x 1g cannot fit beside two 7g in use: the 1g entry is short, the 7g keep their GPUs.
    assert [(p.priority, p.met) for p in more.by_priority] == [(10, 2), (0, 7)]
    assert more.unmet == (("1g.10gb", 14),) and more.disrupted == 0
    # The 7g end: their two GPUs are rebuilt as 1g; every 1g is in use, a slice idle per GPU.
    assert freed.unmet == () and freed.disrupted == 2 and freed.gpus_changed == 2
    assert freed.duration_s == 3600 and freed.gpu_hours_idle == pytest.approx(3 / 8)


def test_the_report_has_a_row_per_step_and_priority_and_the_picture_its_lines() -> None:
    steps = replay([empty_node("a", A100_80, 3)], parse_trace(PRIORITY_TRACE), end=10_800)
    rows = list(csv.DictReader(io.StringIO(report_csv(steps))))
    assert [(r["time_s"], r["priority"], r["met"], r["unmet"]) for r in rows] == [
        ("0.0", "10", "2", "0"),
        ("0.0", "0", "7", "0"),
        ("3600.0", "10", "2", "0"),
        ("3600.0", "0", "7", "14"),
        ("7200.0", "10", "0", "0"),
        ("7200.0", "0", "21", "0"),
    ]
    assert json.loads(report_json(steps))[3]["unmet"] == 14
    svg = ElementTree.fromstring(report_svg(steps))
    lines = {
        p.get("class"): [tuple(map(float, xy.split(","))) for xy in (p.get("points") or "").split()]
        for p in svg.iter("{http://www.w3.org/2000/svg}polyline")
    }
    assert sorted(lines) == ["capacity", "demand", "met"]
    # Two points per step; demand steps up from 9 to 23 then down to 21: its y falls, then rises.
    demand_y = [y for _, y in lines["demand"][::2]]
    assert len(lines["demand"]) == 6 and demand_y[0] > demand_y[1] < demand_y[2]
    met_y = [y for _, y in lines["met"][::2]]
    assert met_y[1] > demand_y[1]  # met below demand while the 1g are short


@pytest.mark.parametrize("when", ["nan", "inf", "-inf", ".nan"])
def test_a_trace_time_that_is_not_a_finite_number_is_refused_naming_its_line(when: str) -> None:
    """A row at time `nan` or `inf` was replayed ('0.0 GPU-hour(s) idle', steps ordered by a
    time that compares with nothing): refused as `x` is, naming the line's time."""
    from agent.errors import InvalidSpec

    with pytest.raises(InvalidSpec) as refused:
        parse_trace(f"time,profile,count\n0,1g.10gb,1\n{when},1g.10gb,2\n", "t.csv")
    assert "line 3.time" in str(refused.value), refused.value
