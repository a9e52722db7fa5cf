"""`coordinator serve`: keep the fleet at the desired state, with /metrics and /healthz.

Each pass re-reads the desired file (a ConfigMap update lands without a restart), sweeps the
fleet once, finds the nodes that differ per kind (MIG, then sharing, then prewarm: sharing may
name MIG devices the MIG pass creates) and rolls the change over them with the desired limits.
A node whose change failed is held back from the next passes with an exponential back-off
(`agent.coordinator.backoff`). The loop keeps nothing between passes but counters for /metrics
and the back-off: the agents and the desired file are the state, so a restarted coordinator
carries on where the fleet is (and retries failed nodes at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from agent.coordinator.actions import preview
from agent.coordinator.backoff import Backoff, BackoffPolicy
from agent.coordinator.desired import Desired, MigRule, PrewarmRule, SharingRule, load_desired
from agent.coordinator.fleet import Fleet
from agent.coordinator.flows import Selection, rollout, select
from agent.coordinator.record import RolloutRecord
from agent.coordinator.rollout import NodeState
from agent.coordinator.selector import Selector
from agent.errors import AgentError
from agent.http import Request, Response

log = logging.getLogger(__name__)

__all__ = ["Reconciler", "Stats"]

KINDS = ("mig", "share", "prewarm")
_Rule = MigRule | SharingRule | PrewarmRule


@dataclass
class Stats:
    """What /metrics shows: the last pass, and counts since the coordinator started."""

    started: float = field(default_factory=time.time)
    passes: Counter[str] = field(default_factory=Counter)
    last_pass: float | None = None
    last_duration_s: float = 0.0
    nodes: Counter[str] = field(default_factory=Counter)
    drift: Counter[str] = field(default_factory=Counter)
    changes: Counter[tuple[str, str]] = field(default_factory=Counter)
    halted: Counter[str] = field(default_factory=Counter)
    desired_valid: bool = False


class _Collector:
    """Fresh metric families from `Stats` at every scrape (nothing to go stale)."""

    def __init__(self, stats: Stats, backoff: Backoff, clock: Callable[[], float]) -> None:
        self._stats = stats
        self._backoff = backoff
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        p = "gpu_agent_coordinator_"
        passes = CounterMetricFamily(p + "reconcile_passes", "Reconcile passes.", labels=["result"])
        for result in ("ok", "error"):
            passes.add_metric([result], s.passes[result])
        yield passes
        if s.last_pass is not None:
            yield GaugeMetricFamily(
                p + "last_pass_timestamp_seconds", "When the last pass ended.", value=s.last_pass
            )
        yield GaugeMetricFamily(
            p + "last_pass_duration_seconds", "How long it took.", value=s.last_duration_s
        )
        nodes = GaugeMetricFamily(p + "nodes", "Agents found, by answer.", labels=["state"])
        for state in ("answering", "unreachable"):
            nodes.add_metric([state], s.nodes[state])
        yield nodes
        drift = GaugeMetricFamily(
            p + "drift_nodes", "Nodes that differed from the desired state.", labels=["kind"]
        )
        changes = CounterMetricFamily(
            p + "node_changes", "Node changes rolled out, by end.", labels=["kind", "result"]
        )
        halted = GaugeMetricFamily(
            p + "rollout_halted", "1 when the last pass's rollout halted.", labels=["kind"]
        )
        for kind in KINDS:
            drift.add_metric([kind], s.drift[kind])
            halted.add_metric([kind], s.halted[kind])
            for result in ("succeeded", "unchanged", "failed"):
                changes.add_metric([kind, result], s.changes[(kind, result)])
        yield from (drift, changes, halted)
        yield from self._backoff_metrics(p)
        yield GaugeMetricFamily(
            p + "desired_state_valid",
            "1 when the desired file last read was valid.",
            value=float(s.desired_valid),
        )

    def _backoff_metrics(self, p: str) -> Iterator[Metric]:
        now = self._clock()
        waits: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for (kind, _node), held in self._backoff.held().items():
            if held.retry_at > now and kind in waits:
                waits[kind].append(held.retry_at - now)
        nodes = GaugeMetricFamily(
            p + "backoff_nodes",
            "Nodes held back from reconciling after failed changes, waiting for their retry.",
            labels=["kind"],
        )
        soonest = GaugeMetricFamily(
            p + "backoff_next_retry_seconds",
            "Seconds until the first held-back node is retried; 0 when none is held back.",
            labels=["kind"],
        )
        for kind, left in waits.items():
            nodes.add_metric([kind], len(left))
            soonest.add_metric([kind], min(left, default=0.0))
        yield from (nodes, soonest)


class Reconciler:
    def __init__(
        self,
        fleet: Fleet,
        desired_path: Path,
        *,
        interval_s: float = 60.0,
        backoff: BackoffPolicy | None = None,
        draw: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``backoff``: how long failed nodes are held back (default: an interval, doubling
        to 30 intervals); ``draw`` gives the jitter's uniform draws (tests fix it)."""
        self._fleet = fleet
        self._path = desired_path
        self.interval_s = interval_s
        self._clock = clock
        self._desired: Desired | None = None
        policy = backoff or BackoffPolicy(base_s=interval_s, max_s=30 * interval_s)
        self.backoff = Backoff(policy) if draw is None else Backoff(policy, draw)
        self.stats = Stats(started=clock())
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self.stats, self.backoff, clock))

    # -- HTTP ----------------------------------------------------------------------------------

    async def metrics(self, request: Request) -> Response:
        return Response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

    async def healthz(self, request: Request) -> Response:
        healthy, why = self.healthy()
        return Response(200 if healthy else 503, (why + "\n").encode())

    def healthy(self) -> tuple[bool, str]:
        """Alive while passes keep ending: within three intervals (a minute at least)."""
        allowed = max(3 * self.interval_s, 60.0)
        since = self.stats.last_pass or self.stats.started
        late = self._clock() - since
        if late > allowed:
            return False, f"no reconcile pass has ended for {late:.0f} s (allowed {allowed:.0f})"
        return True, "ok"

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.pass_once()
            with contextlib.suppress(TimeoutError):  # the interval passed: next pass
                await asyncio.wait_for(stop.wait(), self.interval_s)

    async def pass_once(self) -> None:
        began = self._clock()
        try:
            desired = self._load()
            selection = await select(self._fleet, Selector())
            self.stats.nodes = Counter(
                "answering" if v.reachable else "unreachable" for v in selection.views
            )
            if desired is not None:
                await self._converge(desired, selection)
            self.stats.passes["ok"] += 1
        except AgentError as exc:
            log.error("reconcile pass failed: %s", exc)
            self.stats.passes["error"] += 1
        finally:
            self.stats.last_pass = self._clock()
            self.stats.last_duration_s = self.stats.last_pass - began

    def _load(self) -> Desired | None:
        """The desired state; a bad file keeps the last good one (and says so in metrics)."""
        if not self._path.exists():
            if self._desired is None:
                log.warning("no desired state at %s: watching the fleet only", self._path)
            self.stats.desired_valid = False
            return self._desired
        try:
            self._desired = load_desired(self._path)
            self.stats.desired_valid = True
        except AgentError as exc:
            log.error("desired state %s is invalid, keeping the last good one: %s", self._path, exc)
            self.stats.desired_valid = False
        return self._desired

    async def _converge(self, desired: Desired, selection: Selection) -> None:
        rules: Sequence[tuple[str, Sequence[_Rule]]] = (
            ("mig", desired.mig),
            ("share", desired.sharing),
            ("prewarm", desired.prewarm),
        )
        # Back-off of nodes gone from the fleet, or of kinds the file no longer asks for, ends.
        present = {v.name for v in selection.views}
        asked = {kind for kind, kind_rules in rules if kind_rules}
        self.backoff.retain(lambda key: key[0] in asked and key[1] in present)
        for kind, kind_rules in rules:
            self.stats.drift[kind] = 0
            self.stats.halted[kind] = 0
            for index, rule in enumerate(kind_rules):
                # First matching rule wins, so a node is only ever driven by one rule per kind.
                nodes = [
                    v.name
                    for v in selection.reachable
                    if desired.rule_for(kind_rules, v) is kind_rules[index]
                ]
                if nodes:
                    await self._rule(kind, rule, nodes, desired, selection)

    async def _rule(
        self, kind: str, rule: _Rule, nodes: list[str], desired: Desired, selection: Selection
    ) -> None:
        check = self._record(kind, rule, nodes, desired)
        change = _fingerprint(check)
        targets = {n: selection.targets[n] for n in nodes}
        previews = await preview(self._fleet, targets, check)
        for p in previews:
            if p.would == "unchanged":
                self.backoff.succeeded((kind, p.node))
        drifted = [p.node for p in previews if p.would != "unchanged"]
        self.stats.drift[kind] += len(drifted)
        if not drifted:
            return
        now = self._clock()
        held = {n: h for n in drifted if (h := self.backoff.waiting((kind, n), now, change))}
        if held:
            log.info(
                "%s: holding back %d node(s) after failures: %s",
                kind,
                len(held),
                ", ".join(
                    f"{n} ({h.failures} failure(s) in a row, retry in {h.retry_at - now:.0f} s)"
                    for n, h in sorted(held.items())
                ),
            )
        due = [n for n in drifted if n not in held]
        if not due:
            return
        log.info("%s: %d node(s) differ from the desired state: %s", kind, len(due), due)
        record = self._record(kind, rule, due, desired)
        await rollout(self._fleet, selection, record, report=_log_report(kind))
        self._note_outcomes(kind, record, change)
        if record.halted:
            self.stats.halted[kind] = 1
            log.error("%s rollout %s", kind, record.halted)

    def _note_outcomes(self, kind: str, record: RolloutRecord, change: str) -> None:
        now = self._clock()
        for node, state in record.states().items():
            self.stats.changes[(kind, state.value)] += 1
            if state in (NodeState.SUCCEEDED, NodeState.UNCHANGED):
                self.backoff.succeeded((kind, node))
            elif state is NodeState.FAILED:
                detail = record.nodes[node].detail
                held = self.backoff.failed((kind, node), now, change, detail)
                log.warning(
                    "%s %s failed %d time(s) in a row (%s); next retry in %.0f s",
                    kind,
                    node,
                    held.failures,
                    detail,
                    held.retry_at - now,
                )

    @staticmethod
    def _record(kind: str, rule: _Rule, nodes: list[str], desired: Desired) -> RolloutRecord:
        limits: dict[str, Any] = {
            "selector": str(rule.selector),
            "max_unavailable": desired.rollout.max_unavailable,
            "max_failures": desired.rollout.max_failures,
            "node_timeout_s": desired.rollout.node_timeout_s,
        }
        if isinstance(rule, MigRule):
            spec: dict[str, Any] = {
                "config_yaml": rule.config_yaml,
                "config_name": rule.config_name,
            }
        elif isinstance(rule, SharingRule):
            spec = {"request": rule.request}
        else:
            spec = {"targets": list(rule.targets)}
            # Prewarm fans out at the rule's concurrency and never halts: one bad node
            # should not keep the item from the rest.
            limits |= {"max_unavailable": str(rule.concurrency), "max_failures": 0}
        return RolloutRecord.start(kind, spec, sorted(nodes), **limits)


def _fingerprint(record: RolloutRecord) -> str:
    """What a record applies, whatever its nodes: a different change is not held back."""
    text = json.dumps([record.kind, record.spec], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _log_report(kind: str) -> Callable[[str, Any, str], None]:
    def report(node: str, state: Any, detail: str) -> None:
        if state.finished:
            log.info("%s %s: %s %s", kind, node, state.value, detail)

    return report
