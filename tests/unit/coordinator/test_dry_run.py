"""A rollout's dry run lists every selected node: one that does not answer is `unknown` with
its error, in the table and in `-o json`, never left out (docs/coordinator.md, Rollouts)."""

from __future__ import annotations

import json

from tests.unit.coordinator.agents import invoke_process
from tests.unit.coordinator.fakeagents import fake_agents, mark, node


def test_a_dry_run_shows_a_node_that_does_not_answer_as_unknown() -> None:
    with fake_agents() as agents:
        agents.add(node("a", mark("healthy")))
        gone = f"unix:{agents.root / 'gone.sock'}"
        args = ["--agents", f"{agents.agents['a'].address},{gone}", "--insecure"]
        share = ["fleet", "apply", "share", "--strategy", "time-slicing", "--replicas", "2"]
        as_json = invoke_process([*share, "--dry-run", *args, "-o", "json"], 60)
        table = invoke_process([*share, "--dry-run", *args], 60)
    assert as_json.exit_code == 0, as_json.output
    previews = {p["node"]: p for p in json.loads(as_json.output)["previews"]}
    assert sorted(previews) == sorted(["a", gone])
    assert previews["a"]["would"] == "change"
    assert previews[gone]["would"] == "unknown"
    assert "did not answer" in previews[gone]["detail"], previews[gone]
    row = next(line for line in table.output.splitlines() if line.startswith(gone))
    assert row.split()[1] == "unknown", table.output
