"""The reconcile loop's per-node back-off: a node whose change failed is held back from the next
passes, twice as long after every failure in a row, capped; it shows on /metrics and in the log;
success, being in sync again, or a different desired change end it.

The fleet is faked at the flows the loop calls (select, preview, rollout): what is tested is the
loop's own bookkeeping, with an injected clock."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import generate_latest

from agent.backoff import Backoff, BackoffPolicy
from agent.coordinator.control import reconcile
from agent.coordinator.control.lease import ElectionTiming, LeaderElector
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.inventory import NodeView
from agent.coordinator.flows import RolloutResult, Selection
from agent.coordinator.rollout.actions import NodePreview
from agent.coordinator.rollout.record import RolloutRecord
from agent.coordinator.rollout.schedule import NodeState
from agent.errors import AgentError, Conflict, NotFound

DESIRED = """\
version: v1
sharing:
  - strategy: time-slicing
    replicas: {replicas}
"""


def test_the_hold_doubles_with_each_failure_up_to_the_cap() -> None:
    policy = BackoffPolicy(base_s=60.0, max_s=600.0)
    assert [policy.delay(n, 0.0) for n in (1, 2, 3, 4, 5, 6, 1000)] == [
        60.0,
        120.0,
        240.0,
        480.0,
        600.0,
        600.0,
        600.0,
    ]


def test_jitter_shortens_a_hold_by_up_to_its_fraction() -> None:
    policy = BackoffPolicy(base_s=100.0, max_s=1000.0, jitter=0.2)
    assert policy.delay(2, 0.0) == 200.0
    assert policy.delay(2, 0.5) == pytest.approx(180.0)
    assert policy.delay(2, 0.999) > 160.0


def test_a_different_change_is_not_held_back_and_starts_counting_again() -> None:
    backoff = Backoff(BackoffPolicy(base_s=10.0, max_s=100.0))
    backoff.failed(("mig", "a"), 0.0, change="v1")
    assert backoff.failed(("mig", "a"), 10.0, change="v1").failures == 2
    assert backoff.waiting(("mig", "a"), 15.0, change="v1") is not None
    assert backoff.waiting(("mig", "a"), 15.0, change="v2") is None
    assert backoff.failed(("mig", "a"), 15.0, change="v2").failures == 1
    assert backoff.waiting(("share", "a"), 15.0, change="v2") is None  # per kind


class FakeFleet:
    """The flows `Reconciler` calls, over two nodes: ``broken`` ones fail every change."""

    def __init__(self, broken: set[str]) -> None:
        self.broken = broken
        self.in_sync: set[str] = set()
        self.rolled: list[list[str]] = []
        #: every node's agent reports this failed GPU: rollouts skip them all
        self.failed_gpu = ""
        self.views = tuple(NodeView(n, f"10.0.0.{i}:9401") for i, n in enumerate(("a", "b")))

    async def select(self, fleet: object, selector: object, **kw: object) -> Selection:
        return Selection(self.views, {v.name: Target(v.address, v.name) for v in self.views})

    async def preview(
        self, fleet: object, targets: dict[str, Target], record: RolloutRecord
    ) -> list[NodePreview]:
        return [
            NodePreview(n, "unchanged" if n in self.in_sync else "change", "") for n in record.nodes
        ]

    async def rollout(
        self, fleet: object, selection: Selection, record: RolloutRecord, **kw: Any
    ) -> RolloutResult:
        self.rolled.append(sorted(record.nodes))
        if self.failed_gpu:  # as `flows.rollout` does: left pending, named with the verdict
            left = {n: self.failed_gpu for n in record.nodes}
            for entry in record.nodes.values():
                entry.detail = f"skipped: {self.failed_gpu}"
            return RolloutResult(record, unhealthy=left)
        for node, entry in record.nodes.items():
            if node in self.broken:
                entry.state, entry.detail = NodeState.FAILED.value, "plugin did not reload"
            else:
                entry.state = NodeState.SUCCEEDED.value
                self.in_sync.add(node)
        return RolloutResult(record)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeFleet:
    fleet = FakeFleet(broken={"b"})
    monkeypatch.setattr(reconcile, "select", fleet.select)
    monkeypatch.setattr(reconcile, "preview", fleet.preview)
    monkeypatch.setattr(reconcile, "rollout", fleet.rollout)
    return fleet


def _metric(reconciler: reconcile.Reconciler, name: str, kind: str = "share") -> float:
    text = generate_latest(reconciler.registry).decode()
    prefix = f'gpu_agent_coordinator_{name}{{kind="{kind}"}} '
    line = next(x for x in text.splitlines() if x.startswith(prefix))
    return float(line.removeprefix(prefix))


def _passes(reconciler: reconcile.Reconciler, clock: Clock, times: list[float]) -> None:
    for t in times:
        clock.now = t
        asyncio.run(reconciler.pass_once())


def test_a_failing_node_is_held_back_exponentially_and_shows_on_metrics(
    fake: FakeFleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    clock = Clock(1000.0)
    reconciler = reconcile.Reconciler(
        cast(Fleet, object()), desired, interval_s=60.0, clock=clock, draw=lambda: 0.0
    )
    caplog.set_level(logging.INFO, logger="agent.coordinator.control.reconcile")

    _passes(reconciler, clock, [clock.now])
    assert fake.rolled == [["a", "b"]]
    assert "share b failed 1 time(s) in a row (plugin did not reload); next retry in 60 s" in (
        caplog.text
    )
    assert _metric(reconciler, "backoff_nodes") == 1
    assert _metric(reconciler, "backoff_next_retry_seconds") == 60.0
    assert _metric(reconciler, "backoff_nodes", kind="mig") == 0

    # Held back until 1060, then failed again: held 120 s, then 240 s.
    _passes(reconciler, clock, [1030.0, 1060.0, 1120.0, 1179.0, 1180.0, 1300.0])
    assert fake.rolled == [["a", "b"], ["b"], ["b"]]
    assert "holding back 1 node(s) after failures: b (2 failure(s) in a row, retry in 1 s)" in (
        caplog.text
    )
    assert _metric(reconciler, "backoff_next_retry_seconds") == 120.0  # 1420 - 1300
    held = reconciler.backoff.held()[("share", "b")]
    assert (held.failures, held.retry_at) == (3, 1420.0)
    # Held nodes still count as drift: the fleet is not at the desired state.
    assert reconciler.stats.drift["share"] == 1
    assert reconciler.stats.changes[("share", "failed")] == 3

    # A fixed desired file is a different change: tried at once, counted afresh.
    desired.write_text(DESIRED.format(replicas=4))
    fake.in_sync.clear()
    _passes(reconciler, clock, [1310.0])
    assert fake.rolled[-1] == ["a", "b"]
    assert reconciler.backoff.held()[("share", "b")].failures == 1

    # The node is repaired: its next retry succeeds and the hold is gone.
    fake.broken.clear()
    _passes(reconciler, clock, [1340.0, 1370.0])
    assert fake.rolled[-1] == ["b"]
    assert reconciler.backoff.held() == {}
    assert _metric(reconciler, "backoff_nodes") == 0
    assert _metric(reconciler, "backoff_next_retry_seconds") == 0


def test_holds_end_for_nodes_gone_or_no_longer_asked_for(fake: FakeFleet, tmp_path: Path) -> None:
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    clock = Clock(0.0)
    reconciler = reconcile.Reconciler(cast(Fleet, object()), desired, interval_s=60.0, clock=clock)
    _passes(reconciler, clock, [clock.now])
    assert ("share", "b") in reconciler.backoff.held()
    desired.write_text("version: v1\n")  # sharing no longer managed
    _passes(reconciler, clock, [10.0])
    assert reconciler.backoff.held() == {}


LABELLED = """\
version: v1
sharing:
  - selector: pool=inference
    strategy: mps
    replicas: 2
  - selector: ""
    strategy: time-slicing
    replicas: 4
"""


def test_nodes_whose_rule_depends_on_unread_labels_are_held_and_reported(
    fake: FakeFleet,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node list failed: labels are unknown, not empty. A rule on labels could re-bind an
    inference node to the catch-all rule, so every node is held unchanged and the pass says
    so; once the labels read again the node gets its own rule."""
    desired = tmp_path / "desired.yaml"
    desired.write_text(LABELLED)
    fake.broken.clear()
    unknown = Selection(
        fake.views,
        {v.name: Target(v.address, v.name, {}, None, labels_known=False) for v in fake.views},
    )
    reconciler = reconcile.Reconciler(cast(Fleet, object()), desired, clock=Clock(0.0))

    async def outage(fleet: object, selector: object, **kw: object) -> Selection:
        return unknown

    monkeypatch.setattr(reconcile, "select", outage)
    asyncio.run(reconciler.pass_once())
    assert fake.rolled == []
    assert _metric(reconciler, "labels_unknown_nodes") == 2
    assert "holding 2 node(s) unchanged: their labels could not be read" in caplog.text

    labelled = (NodeView("a", "10.0.0.0:9401", {"pool": "inference"}), fake.views[1])
    known = Selection(labelled, {v.name: Target(v.address, v.name, v.labels) for v in labelled})

    async def back(fleet: object, selector: object, **kw: object) -> Selection:
        return known

    monkeypatch.setattr(reconcile, "select", back)
    asyncio.run(reconciler.pass_once())
    assert fake.rolled == [["a"], ["b"]]  # a by the inference rule, b by the catch-all
    assert _metric(reconciler, "labels_unknown_nodes") == 0


def test_a_rule_needing_no_labels_still_applies_during_a_label_outage(
    fake: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    fake.broken.clear()
    unknown = Selection(
        fake.views,
        {v.name: Target(v.address, v.name, {}, None, labels_known=False) for v in fake.views},
    )

    async def outage(fleet: object, selector: object, **kw: object) -> Selection:
        return unknown

    monkeypatch.setattr(reconcile, "select", outage)
    asyncio.run(reconcile.Reconciler(cast(Fleet, object()), desired).pass_once())
    assert fake.rolled == [["a", "b"]]


def test_liveness_is_progress_a_long_node_step_stays_live_to_its_timeout(
    fake: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass may last hours: the loop is live while it steps, and while a node it started is
    inside its node timeout (a MIG step can be silent for minutes); past that it is not."""
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    fake.broken.clear()
    clock = Clock(0.0)
    reconciler = reconcile.Reconciler(cast(Fleet, object()), desired, interval_s=5.0, clock=clock)
    seen: list[tuple[float, bool]] = []
    why: list[str] = []

    async def slow(fleet: object, selection: Selection, record: RolloutRecord, **kw: Any) -> Any:
        report = kw["report"]
        report("a", NodeState.RUNNING, "started")  # node timeout 900 s: live to 930 s
        for t in (59.0, 61.0, 600.0, 929.0):
            clock.now = t
            seen.append((t, reconciler.healthy()[0]))
        report("a", NodeState.RUNNING, "2 of 7 instances created")  # a watch event
        clock.now = 989.0
        seen.append((989.0, reconciler.healthy()[0]))
        clock.now = 1100.0
        seen.append((1100.0, reconciler.healthy()[0]))
        why.append(reconciler.healthy()[1])
        return await fake.rollout(fleet, selection, record)

    monkeypatch.setattr(reconcile, "rollout", slow)
    asyncio.run(reconciler.pass_once())
    assert seen == [
        (59.0, True),
        (61.0, True),
        (600.0, True),
        (929.0, True),
        (989.0, True),
        (1100.0, False),
    ]
    assert why == ["the reconcile loop made no progress for 171 s (allowed 60)"]
    assert reconciler.healthy() == (True, "ok")  # the pass ended: progress


class MemoryLeases:
    """A Lease store with the API server's resourceVersion rule; ``down`` fails every call."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = 0
        self.down = False
        #: when each write landed (monotonic)
        self.writes: list[float] = []

    def _check(self) -> None:
        if self.down:
            raise AgentError("Kubernetes API unreachable")

    def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        self._check()
        if self.obj is None:
            raise NotFound("no lease")
        return self.obj

    def create_lease(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        self._check()
        return self._store(obj)

    def update_lease(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        self._check()
        assert self.obj is not None
        if obj["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise Conflict("stale")
        return self._store(obj)

    def _store(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.written_at = time.monotonic()
        self.writes.append(self.written_at)
        self.version += 1
        self.obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        return self.obj


def test_a_leader_that_cannot_renew_stops_its_pass_by_the_renew_deadline(
    fake: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server goes away mid-rollout: the leader's pass is cancelled once its last
    renewal is renew-deadline old, before the Lease could expire for anyone else."""
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    leases = MemoryLeases()
    timing = ElectionTiming(lease_duration_s=3.0, renew_deadline_s=1.0, retry_period_s=0.2)
    elector = LeaderElector(leases, "ns", "coord", "me", timing)
    reconciler = reconcile.Reconciler(
        cast(Fleet, object()), desired, interval_s=60.0, elector=elector
    )
    ended: list[float] = []

    async def main() -> None:
        cancelled = asyncio.Event()

        async def forever(fleet: object, selection: Selection, record: Any, **kw: Any) -> Any:
            leases.down = True  # no renewal succeeds from here on
            try:
                await asyncio.Event().wait()
            finally:
                ended.append(time.monotonic())
                cancelled.set()

        monkeypatch.setattr(reconcile, "rollout", forever)
        stop = asyncio.Event()
        run = asyncio.create_task(reconciler.run(stop))
        await asyncio.wait_for(cancelled.wait(), 30)
        assert not elector.leading and not reconciler.leading()
        stop.set()
        await run

    asyncio.run(main())
    # Stopped after the last write by less than the lease duration: nobody could take over yet.
    assert timing.renew_deadline_s - 0.3 <= ended[0] - leases.written_at < timing.lease_duration_s
    assert leases.obj is not None and leases.obj["spec"]["holderIdentity"] == "me"
    assert reconciler.stats.acting is False


def test_a_leader_whose_loop_is_blocked_past_the_renew_deadline_keeps_the_lease(
    fake: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass holds the event loop (a blocking step) for 2.5 renew deadlines: the Lease is
    renewed meanwhile on the elector's own thread, so the leader never stops leading, the
    pass runs to its end and nobody else could have taken the Lease."""
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    leases = MemoryLeases()
    timing = ElectionTiming(lease_duration_s=3.0, renew_deadline_s=1.0, retry_period_s=0.2)
    elector = LeaderElector(leases, "ns", "coord", "me", timing)
    reconciler = reconcile.Reconciler(
        cast(Fleet, object()), desired, interval_s=60.0, elector=elector
    )
    blocked: list[float] = []

    async def main() -> None:
        async def busy(fleet: object, selection: Selection, record: Any, **kw: Any) -> Any:
            blocked.append(time.monotonic())
            time.sleep(2.5 * timing.renew_deadline_s)  # the loop runs nothing else meanwhile
            blocked.append(time.monotonic())
            await asyncio.sleep(0.3)  # back on the loop: a lost lead would cancel us here
            return await fake.rollout(fleet, selection, record)

        monkeypatch.setattr(reconcile, "rollout", busy)
        stop = asyncio.Event()
        run = asyncio.create_task(reconciler.run(stop))

        async def first_pass() -> None:
            while reconciler.stats.passes["ok"] == 0:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(first_pass(), 20)
        assert elector.leading
        stop.set()
        await run

    asyncio.run(main())
    assert fake.rolled == [["a", "b"]]  # the pass was not cancelled
    start, end = blocked
    during = [t for t in leases.writes if start < t < end]
    assert len(during) >= 5  # renewed every retry period while the loop was blocked
    gaps = [b - a for a, b in zip([start, *during], [*during, end], strict=False)]
    assert max(gaps) < timing.renew_deadline_s
    assert leases.obj is not None and leases.obj["spec"]["leaseTransitions"] == 0


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_clock_step_moves_neither_liveness_nor_back_off(
    fake: FakeFleet, tmp_path: Path, step_s: float
) -> None:
    """Liveness and back-off run on the monotonic clock: the wall clock stepped an hour, the
    loop stays live (a liveness probe does not restart it) and a failed node waits out its own
    back-off; /metrics dates the last pass by the wall clock."""
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    mono, wall = Clock(0.0), Clock(1_000_000.0)
    reconciler = reconcile.Reconciler(
        cast(Fleet, object()), desired, interval_s=60.0, clock=mono, wall=wall, draw=lambda: 0.0
    )
    asyncio.run(reconciler.pass_once())  # b fails: held back 60 s
    assert fake.rolled == [["a", "b"]]
    wall.now += step_s
    mono.now += 30
    assert reconciler.healthy()[0]
    asyncio.run(reconciler.pass_once())
    assert fake.rolled == [["a", "b"]]  # b still held, a in sync
    assert _metric_plain(reconciler, "last_pass_timestamp_seconds") == wall.now
    mono.now += 30
    asyncio.run(reconciler.pass_once())
    assert fake.rolled == [["a", "b"], ["b"]]


def _metric_plain(reconciler: reconcile.Reconciler, name: str) -> float:
    text = generate_latest(reconciler.registry).decode()
    prefix = f"gpu_agent_coordinator_{name} "
    return float(next(x for x in text.splitlines() if x.startswith(prefix)).removeprefix(prefix))


def test_a_bad_desired_file_is_said_once_with_every_field_and_its_fix_is_said_too(
    fake: FakeFleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The coordinator logged the same error every pass (every 2 s with --interval 2), said it
    kept "the last good one" when it had none, and named one field of several."""
    desired = tmp_path / "desired.yaml"
    desired.write_text("version: v1\nprewarm:\n  - {url: x, name: y}\n")
    clock = Clock(1000.0)
    reconciler = reconcile.Reconciler(
        cast(Fleet, object()), desired, interval_s=60.0, clock=clock, draw=lambda: 0.0
    )
    caplog.set_level(logging.INFO, logger="agent.coordinator.control.reconcile")
    _passes(reconciler, clock, [1000.0, 1060.0, 1120.0])
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == reconcile.__name__
    ]
    assert len(errors) == 1
    assert "is invalid, nothing is converged until it is fixed: " in errors[0]
    assert "prewarm[0].url" in errors[0] and "prewarm[0].name" in errors[0]
    assert reconciler.stats.desired_valid is False and fake.rolled == []

    desired.write_text(DESIRED.format(replicas=2))
    _passes(reconciler, clock, [1180.0])
    assert "is valid again" in caplog.text and reconciler.stats.desired_valid is True
    desired.write_text("version: v1\nbogus: 1\n")
    _passes(reconciler, clock, [1240.0, 1300.0])
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == reconcile.__name__
    ]
    assert len(errors) == 2 and "keeping the last good one: " in errors[1]
    # the last good file still converges: b, which failed, is tried again
    assert fake.rolled[-1] == ["b"] and reconciler.stats.desired_valid is False


def test_nodes_left_out_for_a_failed_gpu_are_counted_and_said_once_not_every_pass(
    fake: FakeFleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node with a failed GPU was skipped silently: the log said "1 node(s) differ" every pass
    and no series said why nothing happened."""
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    fake.failed_gpu = "GPU 2 failed: XID 79 (GPU has fallen off the bus)"
    clock = Clock(1000.0)
    reconciler = reconcile.Reconciler(
        cast(Fleet, object()), desired, interval_s=60.0, clock=clock, draw=lambda: 0.0
    )
    caplog.set_level(logging.INFO, logger="agent.coordinator.control.reconcile")
    _passes(reconciler, clock, [1000.0, 1060.0, 1120.0])
    assert len(fake.rolled) == 3  # every pass tries again: a healed node is picked up
    said = [r.getMessage() for r in caplog.records]
    left = [m for m in said if "left unchanged" in m]
    assert left == [
        "share: left unchanged until a later pass finds them able: "
        "a (unhealthy: GPU 2 failed: XID 79 (GPU has fallen off the bus)); "
        "b (unhealthy: GPU 2 failed: XID 79 (GPU has fallen off the bus))"
    ]
    assert len([m for m in said if "differ from the desired state" in m]) == 1
    text = generate_latest(reconciler.registry).decode()
    assert 'gpu_agent_coordinator_left_out_nodes{kind="share",why="unhealthy"} 2.0' in text
    assert 'gpu_agent_coordinator_left_out_nodes{kind="share",why="unreachable"} 0.0' in text

    fake.failed_gpu = ""  # healed: changed, and the series falls back to 0
    _passes(reconciler, clock, [1180.0])
    text = generate_latest(reconciler.registry).decode()
    assert 'gpu_agent_coordinator_left_out_nodes{kind="share",why="unhealthy"} 0.0' in text


def test_a_node_that_does_not_answer_is_left_out_unreachable_and_once_exits_10(
    fake: FakeFleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve --once` exited 0 with `left_out_nodes{why="unreachable"} 0` beside
    `nodes{state="unreachable"} 1`: whether that node holds the desired state is not known."""
    from agent.coordinator.control.app import _once_exit_code

    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    fake.views = (*fake.views, NodeView("c", "10.0.0.9:9401", error="connection refused"))
    fake.in_sync |= {"a", "b"}
    clock = Clock(1000.0)
    reconciler = reconcile.Reconciler(
        cast(Fleet, object()), desired, interval_s=60.0, clock=clock, draw=lambda: 0.0
    )
    caplog.set_level(logging.INFO, logger="agent.coordinator.control.reconcile")
    _passes(reconciler, clock, [1000.0, 1060.0])
    text = generate_latest(reconciler.registry).decode()
    assert 'gpu_agent_coordinator_left_out_nodes{kind="share",why="unreachable"} 1.0' in text
    assert 'gpu_agent_coordinator_left_out_nodes{kind="mig",why="unreachable"} 0.0' in text
    said = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert said == [
        "share: 1 node(s) the desired state may select did not answer: c (connection refused)"
    ]
    assert _once_exit_code(reconciler.stats) == 10
    fake.in_sync.add("c")  # it answers again, in sync
    fake.views = (*fake.views[:2], NodeView("c", "10.0.0.9:9401"))
    _passes(reconciler, clock, [1120.0])
    assert reconciler.stats.left_out[("share", "unreachable")] == 0
    assert _once_exit_code(reconciler.stats) == 0


def test_a_pass_that_meets_a_bug_is_said_and_counted_and_the_next_pass_runs(
    fake: FakeFleet,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error no code meant (here a KeyError in the rollout) vanished: `_guarded_pass`
    gathers the pass with return_exceptions, so nothing was logged and no pass was counted
    failed. It is logged with its traceback and counted now, and the next pass goes on."""
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(replicas=2))
    clock = Clock(1000.0)
    reconciler = reconcile.Reconciler(
        cast(Fleet, object()), desired, interval_s=60.0, clock=clock, draw=lambda: 0.0
    )
    caplog.set_level(logging.ERROR, logger="agent.coordinator.control.reconcile")

    async def buggy(*args: Any, **kw: Any) -> RolloutResult:
        raise KeyError("spec_yaml")

    monkeypatch.setattr(reconcile, "rollout", buggy)
    _passes(reconciler, clock, [clock.now])
    assert reconciler.stats.passes["error"] == 1 and reconciler.stats.passes["ok"] == 0
    [said] = [r for r in caplog.records if "unexpected error" in r.getMessage()]
    assert said.exc_info is not None and "spec_yaml" in str(said.exc_info[1])
    monkeypatch.setattr(reconcile, "rollout", fake.rollout)
    _passes(reconciler, clock, [1060.0])
    assert reconciler.stats.passes["ok"] == 1
