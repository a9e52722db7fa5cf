"""Rollout scheduling on a fake clock: max-unavailable, halting, timeouts, resuming."""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from agent.coordinator.rollout.schedule import Limits, NodeState, Scheduler, parse_max_unavailable
from agent.errors import InvalidSpec


@dataclass
class Simulation:
    """Drives a scheduler: each node takes ``durations[node]`` seconds and ends as ``ends``."""

    scheduler: Scheduler
    durations: Mapping[str, float]
    ends: Mapping[str, NodeState] = field(default_factory=dict)
    now: float = 0.0
    most_running: int = 0
    started: list[tuple[float, str]] = field(default_factory=list)

    def run(self) -> None:
        events: list[tuple[float, str]] = []
        while True:
            for node in self.scheduler.start(self.now):
                self.started.append((self.now, node))
                heapq.heappush(events, (self.now + self.durations[node], node))
            self.most_running = max(self.most_running, len(self.scheduler.running))
            if self.scheduler.done:
                return
            deadline = self.scheduler.next_deadline()
            if events and (deadline is None or events[0][0] < deadline):
                self.now, node = heapq.heappop(events)
                if self.scheduler.states[node] is NodeState.RUNNING:
                    self.scheduler.finish(node, self.ends.get(node, NodeState.SUCCEEDED))
            else:
                assert deadline is not None
                self.now = deadline
                for node in self.scheduler.overdue(self.now):
                    self.scheduler.finish(node, NodeState.FAILED)


NODES = [f"n{i:02}" for i in range(10)]


def test_never_more_nodes_running_than_max_unavailable() -> None:
    sim = Simulation(Scheduler(NODES, Limits(3)), {n: 10.0 + i for i, n in enumerate(NODES)})
    sim.run()
    assert sim.most_running == 3
    assert all(s is NodeState.SUCCEEDED for s in sim.scheduler.states.values())
    # A node starts the moment another finishes, never earlier.
    assert [t for t, _ in sim.started[:4]] == [0.0, 0.0, 0.0, 10.0]


def test_the_rollout_halts_at_max_failures_and_lets_running_nodes_finish() -> None:
    ends = {"n01": NodeState.FAILED, "n03": NodeState.FAILED}
    sim = Simulation(Scheduler(NODES, Limits(2, max_failures=2)), dict.fromkeys(NODES, 5.0), ends)
    sim.run()
    states = sim.scheduler.states
    assert sim.scheduler.halted
    assert [n for n in NODES if states[n] is NodeState.FAILED] == ["n01", "n03"]
    # n04 started when n02 finished, just before n03 failed: it runs to its end.
    assert states["n04"] is NodeState.SUCCEEDED
    assert [n for n in NODES if states[n] is NodeState.PENDING] == NODES[5:]
    assert sim.scheduler.halt_reason() == (
        "halted after 2 failed node(s) (max-failures 2): n01, n03"
    )


def test_max_failures_zero_never_halts() -> None:
    ends = dict.fromkeys(NODES[:5], NodeState.FAILED)
    sim = Simulation(Scheduler(NODES, Limits(4, max_failures=0)), dict.fromkeys(NODES, 1.0), ends)
    sim.run()
    assert not sim.scheduler.halted and not sim.scheduler.pending


def test_a_node_past_its_timeout_is_overdue_and_fails() -> None:
    durations = dict.fromkeys(NODES[:3], 1.0) | {"n01": 1000.0}
    sim = Simulation(
        Scheduler(NODES[:3], Limits(3, max_failures=0, node_timeout_s=60.0)), durations
    )
    sim.run()
    assert sim.scheduler.states["n01"] is NodeState.FAILED
    assert sim.now == 60.0


def test_nodes_already_down_use_up_the_budget() -> None:
    sim = Simulation(Scheduler(NODES, Limits(3), already_unavailable=1), dict.fromkeys(NODES, 1))
    sim.run()
    assert sim.most_running == 2


def test_a_budget_spent_before_the_start_is_reported_not_waited_on() -> None:
    scheduler = Scheduler(NODES, Limits(2), already_unavailable=2)
    assert scheduler.start(0.0) == []
    assert not scheduler.done
    assert "2 selected node(s) are already unavailable" in (scheduler.stuck_reason() or "")


def test_resuming_skips_finished_nodes_and_starts_the_rest() -> None:
    states = {n: NodeState.SUCCEEDED for n in NODES[:6]} | {"n06": NodeState.UNCHANGED}
    scheduler = Scheduler(NODES, Limits(2), states=states)
    sim = Simulation(scheduler, dict.fromkeys(NODES, 1.0))
    sim.run()
    assert [n for _, n in sim.started] == NODES[7:]


@pytest.mark.parametrize(
    ("text", "total", "count"),
    [("1", 50, 1), ("3", 50, 3), ("10%", 1000, 100), ("10%", 5, 1), ("25%", 10, 2), ("100%", 7, 7)],
)
def test_max_unavailable_is_a_count_or_a_percentage_rounded_down(
    text: str, total: int, count: int
) -> None:
    assert parse_max_unavailable(text, total) == count


@pytest.mark.parametrize("text", ["0", "-1", "0%", "150%", "ten", ""])
def test_a_bad_max_unavailable_names_the_flag(text: str) -> None:
    with pytest.raises(InvalidSpec, match="max-unavailable"):
        parse_max_unavailable(text, 10)


def test_a_stop_halts_like_max_failures_whatever_the_failure_count() -> None:
    """A node turned unhealthy stops the rollout (agent.coordinator.rollout.healthgate): nothing new
    starts, the running node finishes, the first reason is kept."""
    scheduler = Scheduler(NODES[:4], Limits(2, max_failures=0))
    assert scheduler.start(0.0) == ["n00", "n01"]
    scheduler.finish("n00", NodeState.FAILED)
    scheduler.stop("n00 turned unhealthy during the rollout (GPU 0 failed)")
    scheduler.stop("a second reason")
    assert scheduler.start(1.0) == [] and scheduler.halted and not scheduler.done
    scheduler.finish("n01", NodeState.SUCCEEDED)
    assert scheduler.done and scheduler.pending == ["n02", "n03"]
    assert scheduler.halt_reason() == (
        "halted: n00 turned unhealthy during the rollout (GPU 0 failed)"
    )
