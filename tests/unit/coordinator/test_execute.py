"""The rollout runner with fake node actions: record, limits, timeouts, interruption, resume."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.coordinator.rollout.execute import NodeResult, Notes, run_rollout
from agent.coordinator.rollout.record import RolloutRecord
from agent.coordinator.rollout.schedule import Limits, NodeState, Scheduler
from agent.errors import Busy, InvalidSpec

NODES = [f"n{i}" for i in range(6)]


class FakeAction:
    """Each node finishes when the test releases it; ends as ``outcomes`` say."""

    def __init__(self, outcomes: dict[str, NodeResult | Exception] | None = None) -> None:
        self.outcomes = outcomes or {}
        self.release: dict[str, asyncio.Event] = {}
        self.running: set[str] = set()
        self.most = 0
        self.cancelled: list[tuple[str, bool]] = []

    async def __call__(self, node: str, notes: Notes) -> NodeResult:
        self.running.add(node)
        self.most = max(self.most, len(self.running))
        notes.operation(f"operations/{node}")
        notes.progress("working")
        event = self.release.setdefault(node, asyncio.Event())
        try:
            await event.wait()
        except asyncio.CancelledError:
            self.cancelled.append((node, notes.timed_out))
            raise
        finally:
            self.running.discard(node)
        outcome = self.outcomes.get(node, NodeResult(NodeState.SUCCEEDED, "done"))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def record(tmp_path: Path, nodes: list[str] = NODES) -> RolloutRecord:
    rec = RolloutRecord.start(
        "mig",
        {"config_yaml": "x", "config_name": "y"},
        nodes,
        selector="",
        max_unavailable="2",
        max_failures=1,
        node_timeout_s=60.0,
    )
    rec.path = tmp_path / "rollout.json"
    return rec


async def release_all(action: FakeAction, until: asyncio.Task[None]) -> None:
    while not until.done():
        await asyncio.sleep(0.001)
        for event in list(action.release.values()):
            event.set()


async def _test_every_node_runs_with_at_most_max_unavailable_at_once(tmp_path: Path) -> None:
    rec = record(tmp_path)
    action = FakeAction()
    run = asyncio.create_task(run_rollout(rec, Scheduler(NODES, Limits(2)), action))
    await release_all(action, run)
    await run
    assert action.most == 2
    saved = RolloutRecord.load(rec.path)  # type: ignore[arg-type]
    assert {r.state for r in saved.nodes.values()} == {"succeeded"}
    assert saved.nodes["n3"].operation == "operations/n3"


async def _test_a_failing_node_halts_the_rollout_and_the_record_says_why(tmp_path: Path) -> None:
    rec = record(tmp_path)
    action = FakeAction({"n1": Busy("another reconfiguration is running")})
    run = asyncio.create_task(run_rollout(rec, Scheduler(NODES, Limits(2)), action))
    while len(action.running) < 2:
        await asyncio.sleep(0.001)
    action.release["n1"].set()  # fails: the rollout halts, n0 still runs
    while rec.halted is None:
        await asyncio.sleep(0.001)
    assert action.running == {"n0"}
    action.release["n0"].set()
    await run
    saved = RolloutRecord.load(rec.path)  # type: ignore[arg-type]
    assert saved.nodes["n1"].state == "failed"
    assert saved.nodes["n1"].detail == "another reconfiguration is running"
    assert saved.nodes["n0"].state == "succeeded"
    assert saved.halted == "halted after 1 failed node(s) (max-failures 1): n1"
    assert [n for n, r in saved.nodes.items() if r.state == "pending"] == NODES[2:]


async def _test_a_node_past_its_timeout_is_cancelled_and_fails(tmp_path: Path) -> None:
    rec = record(tmp_path, ["slow"])
    action = FakeAction()
    await run_rollout(rec, Scheduler(["slow"], Limits(1, node_timeout_s=0.05)), action)
    assert action.cancelled == [("slow", True)]  # timed out: the agent's operation is cancelled
    assert rec.nodes["slow"].state == "failed"
    assert rec.nodes["slow"].detail == "timed out after 0.05 s"


async def _test_an_interrupted_rollout_leaves_running_nodes_running_for_a_resume(
    tmp_path: Path,
) -> None:
    rec = record(tmp_path)
    action = FakeAction()
    run = asyncio.create_task(run_rollout(rec, Scheduler(NODES, Limits(2)), action))
    while len(action.running) < 2:
        await asyncio.sleep(0.001)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # Interrupted, not timed out: the agents' operations run on.
    assert sorted(action.cancelled) == [("n0", False), ("n1", False)]
    saved = RolloutRecord.load(rec.path)  # type: ignore[arg-type]
    assert [n for n, r in saved.nodes.items() if r.state == "running"] == ["n0", "n1"]
    order = saved.resume()
    assert order[:2] == ["n0", "n1"]
    assert saved.request_id("n0") == rec.request_id("n0")  # re-attaches to the same operation


def test_a_failed_node_gets_a_new_attempt_on_resume(tmp_path: Path) -> None:
    rec = record(tmp_path)
    rec.nodes["n2"].state = "failed"
    rec.nodes["n0"].state = "succeeded"
    first = rec.request_id("n2")
    rec.resume()
    assert rec.nodes["n2"].state == "pending" and rec.request_id("n2") != first
    assert rec.nodes["n0"].state == "succeeded"


def test_a_file_that_is_not_a_record_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"version": 1, "kind": "nope"}')
    with pytest.raises(InvalidSpec, match="not a rollout record"):
        RolloutRecord.load(bad)


def test_every_node_runs_with_at_most_max_unavailable_at_once(tmp_path: Path) -> None:
    asyncio.run(_test_every_node_runs_with_at_most_max_unavailable_at_once(tmp_path))


def test_a_failing_node_halts_the_rollout_and_the_record_says_why(tmp_path: Path) -> None:
    asyncio.run(_test_a_failing_node_halts_the_rollout_and_the_record_says_why(tmp_path))


def test_a_node_past_its_timeout_is_cancelled_and_fails(tmp_path: Path) -> None:
    asyncio.run(_test_a_node_past_its_timeout_is_cancelled_and_fails(tmp_path))


def test_an_interrupted_rollout_leaves_running_nodes_running_for_a_resume(tmp_path: Path) -> None:
    asyncio.run(_test_an_interrupted_rollout_leaves_running_nodes_running_for_a_resume(tmp_path))
