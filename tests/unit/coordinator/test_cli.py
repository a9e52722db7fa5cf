"""`gpu-agent fleet` commands that need no agents: offline replay, and refused arguments."""

from __future__ import annotations

import json
from pathlib import Path

from agent.cli.fleet import _plan_table, fleet
from agent.coordinator.demand import Demand, DemandEntry
from agent.coordinator.flows import PlanResult
from agent.coordinator.planner import plan_fleet
from tests.unit.coordinator.agents import invoke
from tests.unit.coordinator.fleets import gpu, node


def test_an_offline_replay_on_nodes_one_might_buy(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time,profile,count\n0,3g.40gb,4\n3600,3g.40gb,6\n")
    result = invoke(
        fleet, ["replay", "--trace", str(trace), "--offline", "--add", "dgx-h100=2", "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    first, second = json.loads(result.output)
    assert (first["met"], first["unmet"], second["met"]) == (4, [], 6)
    assert second["total_slices"] == 8 * 3  # three GPUs in MIG mode by then


def test_the_table_of_a_replay_sums_up_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time,profile,count\n0,7g.80gb,3\n")
    result = invoke(fleet, ["replay", "--trace", str(trace), "--offline", "--add", "dgx-h100=1"])
    assert result.exit_code == 0, result.output
    assert "0 of 1 step(s) leave demand unmet" in result.output


def test_commands_say_what_is_missing(tmp_path: Path) -> None:
    demand = tmp_path / "demand.yaml"
    demand.write_text("version: v1\ndemand: {1g.10gb: 1}\n")
    no_agents = invoke(fleet, ["plan", "--demand", str(demand)])
    assert no_agents.exit_code == 2 and "where are the agents?" in no_agents.output
    both = invoke(
        fleet, ["apply", "mig", "-f", str(demand), "--plan", str(demand), "--agents", "a:1"]
    )
    assert both.exit_code == 2 and "not both" in both.output
    bad_add = invoke(fleet, ["replay", "--trace", str(demand), "--offline", "--add", "x"])
    assert bad_add.exit_code == 2


def test_the_plan_table_shows_changes_totals_and_unmet_demand() -> None:
    fleet_layouts = [node("a", gpu("a", 0, instances=[("1g.10gb", 4)], busy=[(7, 1)]), gpu("a", 1))]
    want = Demand((DemandEntry("3g.40gb", 2), DemandEntry("7g.80gb", 2)))
    result = PlanResult(plan_fleet(fleet_layouts, want), 3, ("node-z",))
    text = _plan_table({"result": result, "out": Path("plan.yaml")})
    assert "a     1    H100 80GB HBM3  -" in text
    assert "UNMET 7g.80gb: 2 of 2 cannot be placed" in text
    assert "lost to 3g.40gb (priority 0, 1 device(s))" in text
    assert "a plan from scratch would destroy 3" in text
    assert "Not planned (no answer): node-z" in text
    assert "gpu-agent fleet apply mig --plan plan.yaml" in text
