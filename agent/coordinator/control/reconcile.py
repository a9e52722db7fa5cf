"""`coordinator serve`: keep the fleet at the desired state, with /metrics and /healthz.

Each pass re-reads the desired file (a ConfigMap update lands without a restart), sweeps the
fleet once, finds the nodes that differ per kind (MIG, then sharing, then prewarm: sharing may
name MIG devices the MIG pass creates) and rolls the change over them with the desired limits.
A node whose change failed is held back from the next passes with an exponential back-off
(`agent.backoff`). The loop keeps nothing between passes but counters for
/metrics and the back-off: the agents and the desired file are the state, so a restarted
coordinator carries on where the fleet is (and retries failed nodes at once).

With an elector (`agent.coordinator.control.lease`) a pass runs only while this replica holds the
Lease, and is cancelled the moment it stops holding it (its renew deadline passed): the
agents' operations it started run on, and the next leader counts those nodes as changing.

Health is progress, not finished passes (a rollout may take hours): the loop is live while it
keeps stepping (a node started, a watch event, a node finished, a pass or wait ended, a Lease
attempt) within ``max(3 x interval, 60 s)``, or while a node it started is still inside its
node timeout. Ready: leading, or a standby whose last Lease read was answered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from agent import safeyaml
from agent.backoff import Backoff, BackoffPolicy
from agent.coordinator.control.cluster import ClusterReport, CoalescedStatus
from agent.coordinator.control.desired import (
    Desired,
    MigRule,
    PowerRule,
    PrewarmRule,
    SharingRule,
    load_desired,
)
from agent.coordinator.control.lease import LeaderElector
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.health import STATES
from agent.coordinator.fleet.inventory import NodeView
from agent.coordinator.fleet.selector import Selector
from agent.coordinator.flows import LEFT_OUT, RolloutResult, Selection, rollout, select
from agent.coordinator.rollout.actions import preview
from agent.coordinator.rollout.record import RolloutRecord
from agent.coordinator.rollout.schedule import NodeState
from agent.errors import AgentError
from agent.http import Request, Response

log = logging.getLogger(__name__)

__all__ = ["Reconciler", "Stats"]

KINDS = ("mig", "power", "share", "prewarm")
#: the pass sweeps as `fleet status` does by default, so its sweep can answer GET /fleet/status
SWEEP_IDLE_AFTER_S = 3600.0
_Rule = MigRule | PowerRule | SharingRule | PrewarmRule


@dataclass
class Stats:
    """What /metrics shows: the last pass, and counts since the coordinator started."""

    started: float = field(default_factory=time.time)
    passes: Counter[str] = field(default_factory=Counter)
    last_pass: float | None = None
    last_duration_s: float = 0.0
    nodes: Counter[str] = field(default_factory=Counter)
    #: GPUs of the answering nodes per health verdict, in the last sweep
    gpu_health: Counter[str] = field(default_factory=Counter)
    drift: Counter[str] = field(default_factory=Counter)
    changes: Counter[tuple[str, str]] = field(default_factory=Counter)
    halted: Counter[str] = field(default_factory=Counter)
    #: nodes held (no change) because the labels their rule depends on could not be read
    labels_unknown: Counter[str] = field(default_factory=Counter)
    #: (kind, why) -> nodes that differ but the last pass's rollout left unchanged
    left_out: Counter[tuple[str, str]] = field(default_factory=Counter)
    desired_valid: bool = False
    #: the loop runs passes (without an elector: always while it runs)
    acting: bool = False


# eq=False: the registry keys its collectors by identity.
@dataclass(frozen=True, slots=True, eq=False)
class _Collector:
    """Fresh metric families from `Stats` at every scrape (nothing to go stale)."""

    stats: Stats
    backoff: Backoff
    clock: Callable[[], float]
    leading: Callable[[], bool]

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        p = "gpu_agent_coordinator_"
        yield _family(
            CounterMetricFamily,
            p + "reconcile_passes",
            "Reconcile passes.",
            ["result"],
            {(r,): s.passes[r] for r in ("ok", "error")},
        )
        if s.last_pass is not None:
            yield GaugeMetricFamily(
                p + "last_pass_timestamp_seconds", "When the last pass ended.", value=s.last_pass
            )
        yield GaugeMetricFamily(
            p + "last_pass_duration_seconds", "How long it took.", value=s.last_duration_s
        )
        by_state = {(st,): s.nodes[st] for st in ("answering", "unreachable")}
        yield _family(
            GaugeMetricFamily, p + "nodes", "Agents found, by answer.", ["state"], by_state
        )
        yield _family(
            GaugeMetricFamily,
            p + "gpus",
            "GPUs of the answering agents in the last sweep, by the agent's health verdict "
            "(unknown: no verdict).",
            ["health"],
            {(st,): s.gpu_health[st] for st in STATES},
        )
        for name, text, counts in (
            ("drift_nodes", "Nodes that differed from the desired state.", s.drift),
            ("rollout_halted", "1 when the last pass's rollout halted.", s.halted),
            (
                "labels_unknown_nodes",
                "Nodes held (no change) in the last pass: their labels could not be read.",
                s.labels_unknown,
            ),
        ):
            per_kind = {(k,): counts[k] for k in KINDS}
            yield _family(GaugeMetricFamily, p + name, text, ["kind"], per_kind)
        yield _family(
            CounterMetricFamily,
            p + "node_changes",
            "Node changes rolled out, by end.",
            ["kind", "result"],
            {
                (k, r): s.changes[(k, r)]
                for k in KINDS
                for r in ("succeeded", "unchanged", "failed")
            },
        )
        yield _family(
            GaugeMetricFamily,
            p + "left_out_nodes",
            "Nodes that differ but the last pass left unchanged: a failed GPU (unhealthy), an "
            "allocation mode that allows no such change (not-allowed), no answer from a node the "
            "kind's rules may select (unreachable).",
            ["kind", "why"],
            {(k, w): s.left_out[(k, w)] for k in KINDS for w in LEFT_OUT},
        )
        yield GaugeMetricFamily(
            p + "leader",
            "1 while this replica holds the Lease (or runs alone).",
            value=float(self.leading()),
        )
        yield from self._backoff_metrics(p)
        yield GaugeMetricFamily(
            p + "desired_state_valid",
            "1 when the desired file last read was valid.",
            value=float(s.desired_valid),
        )

    def _backoff_metrics(self, p: str) -> Iterator[Metric]:
        now = self.clock()
        waits: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for (kind, _node), held in self.backoff.held().items():
            if held.retry_at > now and kind in waits:
                waits[kind].append(held.retry_at - now)
        yield _family(
            GaugeMetricFamily,
            p + "backoff_nodes",
            "Nodes held back from reconciling after failed changes, waiting for their retry.",
            ["kind"],
            {(kind,): len(left) for kind, left in waits.items()},
        )
        yield _family(
            GaugeMetricFamily,
            p + "backoff_next_retry_seconds",
            "Seconds until the first held-back node is retried; 0 when none is held back.",
            ["kind"],
            {(kind,): min(left, default=0.0) for kind, left in waits.items()},
        )


def _family(
    make: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    text: str,
    labels: list[str],
    values: Mapping[Any, float],  # label values (a tuple) -> the sample
) -> Metric:
    """A family with one sample per label values; every combination is exported, 0 included."""
    family = make(name, text, labels=labels)
    for label_values, value in values.items():
        family.add_metric(list(label_values), value)
    return family


class Reconciler:
    def __init__(
        self,
        fleet: Fleet,
        desired_path: Path,
        *,
        interval_s: float = 60.0,
        backoff: BackoffPolicy | None = None,
        draw: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        elector: LeaderElector | None = None,
        cluster: ClusterReport | None = None,
        on_sweep: Callable[[Sequence[NodeView], float, float, Mapping[str, Target]], None]
        | None = None,
        identity: str = "",
        status_every_s: float = 5.0,
    ) -> None:
        """``backoff``: how long failed nodes are held back (default: an interval, doubling
        to 30 intervals); ``draw`` gives the jitter's uniform draws (tests fix it);
        ``elector``: act only while holding its Lease (None: this process acts alone);
        ``cluster``: post Node Events and the status ConfigMap (None: not in a cluster);
        ``on_sweep(views, idle_after_s, at, targets)`` gets each pass's sweep (GET
        /fleet/status, ``at`` on ``clock``); ``clock`` (monotonic) runs the timers, back-off
        and durations, ``wall`` only dates what /metrics shows, so a clock step moves neither
        liveness nor back-off;
        ``identity`` claims each node before a MIG change (agent.coordinator.rollout.claims),
        so replicas that share no Lease still keep max-unavailable (empty: no claims);
        ``status_every_s``: the status ConfigMap is written at most this often mid-rollout."""
        self._identity = identity
        self._fleet = fleet
        self._path = desired_path
        self.interval_s = interval_s
        self._clock = clock  # timers, back-off, durations
        self._wall = wall  # what /metrics dates
        self._elector = elector
        self._cluster = cluster
        self._on_sweep = on_sweep
        # One worker, so the cluster sees the reports in order; never waited on by a pass.
        self._reports = concurrent.futures.ThreadPoolExecutor(1, "cluster-report")
        self._status = (
            None
            if cluster is None
            else CoalescedStatus(cluster, self._tell, every_s=status_every_s, clock=clock)
        )
        self._desired: Desired | None = None
        #: what was last logged per matter (`_log_once`), so a pass repeats nothing
        self._said: dict[str, str] = {}
        self._unreached: dict[str, set[str]] = {}  # kind -> nodes left out unanswering
        self._progress_at = clock()
        #: node -> when it may have been silent too long (its start + node timeout + grace)
        self._running: dict[tuple[str, str], float] = {}
        policy = backoff or BackoffPolicy(base_s=interval_s, max_s=30 * interval_s)
        self.backoff = Backoff(policy) if draw is None else Backoff(policy, draw)
        self.stats = Stats(started=wall())
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self.stats, self.backoff, clock, self.leading))

    # -- HTTP ----------------------------------------------------------------------------------

    async def metrics(self, request: Request) -> Response:
        return Response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

    async def healthz(self, request: Request) -> Response:
        healthy, why = self.healthy()
        return Response(200 if healthy else 503, (why + "\n").encode())

    async def readyz(self, request: Request) -> Response:
        ready, why = self.ready()
        return Response(200 if ready else 503, (why + "\n").encode())

    def leading(self) -> bool:
        """Acting now: holding the Lease (by its renew deadline), or running without one."""
        if self._elector is not None:
            return self._elector.leading
        return self.stats.acting

    def beat(self) -> None:
        """The loop made progress (a step, a watch event, a wait or Lease attempt ended)."""
        self._progress_at = self._clock()

    def healthy(self) -> tuple[bool, str]:
        """Live while the loop keeps stepping: within three intervals (a minute at least), or
        while a node it started is within its node timeout (a long step sends no events)."""
        allowed = max(3 * self.interval_s, 60.0)
        now = self._clock()
        quiet = now - self._progress_at
        if quiet <= allowed or any(now <= until for until in self._running.values()):
            return True, "ok"
        return False, f"the reconcile loop made no progress for {quiet:.0f} s (allowed {allowed:g})"

    def ready(self) -> tuple[bool, str]:
        """Ready when live and leading, or live and a standby that can read the Lease."""
        live, why = self.healthy()
        if not live:
            return False, why
        e = self._elector
        if e is None:
            return True, "leading (no lease: acting alone)"
        if e.leading:
            return True, f"leading as {e.identity}"
        if e.answered_recently():
            return True, f"standby: the lease is held by {e.holder or 'nobody'}"
        return False, "standby that cannot read the lease"

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Passes every interval until ``stop``; with an elector, only while leading."""
        keep_stop = asyncio.Event()
        keeper = None
        if self._elector is not None:
            keeper = asyncio.create_task(self._elector.keep(keep_stop, self.beat))
        try:
            while not stop.is_set():
                if self._elector is not None:
                    self.stats.acting = False
                    if not await self._elector.won(stop):
                        break
                self.stats.acting = True
                await self._guarded_pass(stop)
                self.beat()
                with contextlib.suppress(TimeoutError):  # the interval passed: next pass
                    await asyncio.wait_for(stop.wait(), self.interval_s)
                self.beat()
        finally:
            keep_stop.set()
            if keeper is not None:
                await keeper  # releases the Lease
            self.stats.acting = False
            await asyncio.to_thread(self._reports.shutdown, True, cancel_futures=True)

    def _tell(self, call: Callable[..., None], *args: Any) -> None:
        """A report to the cluster, in order, off the loop; a failure is only logged."""
        if self._cluster is not None:
            self._reports.submit(call, *args)

    async def flush_reports(self) -> None:
        """Wait until every report so far has been sent (tests, and the end of --once)."""
        await asyncio.wrap_future(self._reports.submit(lambda: None))

    async def _guarded_pass(self, stop: asyncio.Event) -> None:
        """One pass, cancelled when ``stop`` comes or the Lease is lost, whichever first."""
        work = asyncio.create_task(self.pass_once())
        guards: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait())]
        if self._elector is not None:
            guards.append(asyncio.create_task(self._elector.lost()))
        try:
            await asyncio.wait([work, *guards], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for guard in guards:
                guard.cancel()
            if not work.done():
                why = "stopping" if stop.is_set() else "lost the lease"
                log.warning("%s: the reconcile pass stops here; operations started run on", why)
                work.cancel()
            await asyncio.gather(work, *guards, return_exceptions=True)
            self._running.clear()

    async def pass_once(self) -> None:
        began = self._clock()
        try:
            desired = self._load()
            selection = await select(self._fleet, Selector(), idle_after_s=SWEEP_IDLE_AFTER_S)
            if self._on_sweep is not None:
                self._on_sweep(selection.views, SWEEP_IDLE_AFTER_S, began, selection.targets)
            self.stats.nodes = Counter(
                "answering" if v.reachable else "unreachable" for v in selection.views
            )
            self.stats.gpu_health = Counter(
                m.state for v in selection.views if v.reachable for m in v.marks
            )
            if desired is not None:
                await self._converge(desired, selection)
            self.stats.passes["ok"] += 1
        except AgentError as exc:
            log.error("reconcile pass failed: %s", exc)
            self.stats.passes["error"] += 1
        except Exception:  # a bug: said and counted, and the next pass runs (`_guarded_pass`)
            log.exception("reconcile pass failed on an unexpected error")
            self.stats.passes["error"] += 1
        finally:
            self.stats.last_pass = self._wall()
            self.stats.last_duration_s = self._clock() - began
            self.beat()

    def _load(self) -> Desired | None:
        """The desired state; a bad file keeps the last good one (and says so in metrics). A
        problem is logged when it first appears or changes, not every pass."""
        if not self._path.exists():
            kept = "watching the fleet only" if self._desired is None else "keeping the last one"
            self._log_once("desired", logging.WARNING, f"no desired state at {self._path}: {kept}")
            self.stats.desired_valid = False
            return self._desired
        try:
            self._desired = load_desired(self._path)
        except AgentError as exc:
            kept = (
                "nothing is converged until it is fixed"
                if self._desired is None
                else "keeping the last good one"
            )
            self._log_once(
                "desired",
                logging.ERROR,
                f"desired state {self._path} is invalid, {kept}: {_problems(exc)}",
            )
            self.stats.desired_valid = False
            return self._desired
        if not self.stats.desired_valid and self._said.get("desired"):
            self._log_once("desired", logging.INFO, f"desired state {self._path} is valid again")
        self._said["desired"] = ""
        self.stats.desired_valid = True
        return self._desired

    def _log_once(self, key: str, level: int, text: str) -> None:
        """Log ``text`` when it differs from what was last said under ``key``: a bad desired
        file, or a node that stays drifted or skipped (a failed GPU), is said once, not every
        pass; "" says the matter is over."""
        if text and self._said.get(key) != text:
            log.log(level, "%s", text)
        self._said[key] = text

    async def _converge(self, desired: Desired, selection: Selection) -> None:
        rules: Sequence[tuple[str, Sequence[_Rule]]] = (
            ("mig", desired.mig),
            ("power", desired.power),
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
            for why in LEFT_OUT:
                self.stats.left_out[(kind, why)] = 0
            chosen: dict[str, _Rule | None] = {}
            unknown = []
            for v in selection.reachable:
                labels_known = selection.targets[v.name].labels_known
                rule = _rule_for(kind_rules, v, labels_known)
                if rule is _UNKNOWN:
                    unknown.append(v.name)
                else:
                    chosen[v.name] = rule
            self.stats.labels_unknown[kind] = len(unknown)
            self._note_unreached(kind, kind_rules, selection)
            if unknown:
                log.warning(
                    "%s: holding %d node(s) unchanged: their labels could not be read and a "
                    "rule depends on them: %s",
                    kind,
                    len(unknown),
                    ", ".join(unknown),
                )
            for rule in kind_rules:
                # First matching rule wins, so a node is only ever driven by one rule per kind.
                nodes = [n for n, r in chosen.items() if r is rule]
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
            self._log_once(kind, logging.INFO, "")
            self._log_once(f"{kind}/drift", logging.INFO, "")
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
        self._log_once(
            f"{kind}/drift",
            logging.INFO,
            f"{kind}: {len(due)} node(s) differ from the desired state: {due}",
        )
        record = self._record(kind, rule, due, desired)
        if self._status is not None:
            self._status.update(record, "running", now=True)
        result = await rollout(
            self._fleet,
            _rule_scope(selection, rule, nodes),
            record,
            report=self._report(kind, record),
            holder=self._identity,
        )
        if self._status is not None:
            self._status.update(record, "halted" if record.halted else "done", now=True)
        if result.busy:
            log.info(
                "%s: %d node(s) mid-change by an operation started elsewhere, counted as "
                "unavailable: %s",
                kind,
                len(result.busy),
                ", ".join(result.busy),
            )
        self._note_outcomes(kind, record, change)
        self._note_left_out(kind, result)
        if record.halted:
            self.stats.halted[kind] = 1
            log.error("%s rollout %s", kind, record.halted)

    def _note_unreached(self, kind: str, rules: Sequence[_Rule], selection: Selection) -> None:
        """Nodes without a (full) answer a rule may select: left out (unreachable), drift or not."""
        unreached = {
            v.name: v.why_not_plannable
            for v in selection.unreachable
            if rules and any(_may_pick(r, v, selection) for r in rules)
        }
        self._unreached[kind] = set(unreached)
        self.stats.left_out[(kind, "unreachable")] = len(unreached)
        said = "; ".join(f"{n} ({why})" for n, why in sorted(unreached.items()))
        head = f"{kind}: {len(unreached)} node(s) the desired state may select did not answer: "
        self._log_once(f"{kind}/unreached", logging.WARNING, head + said if said else "")

    def _note_left_out(self, kind: str, result: RolloutResult) -> None:
        left = result.left_out()
        for why, nodes in left.items():
            if why == "unreachable":  # those in the selection are counted already
                seen = self._unreached.get(kind, set())
                nodes = {n: d for n, d in nodes.items() if n not in seen}
            self.stats.left_out[(kind, why)] += len(nodes)
        said = "; ".join(
            f"{node} ({why}: {detail})"
            for why, nodes in left.items()
            for node, detail in sorted(nodes.items())
        )
        if said:
            said = f"{kind}: left unchanged until a later pass finds them able: {said}"
        self._log_once(kind, logging.WARNING, said)

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
        elif isinstance(rule, PowerRule):
            spec = {"spec_yaml": rule.spec_yaml}
        elif isinstance(rule, SharingRule):
            spec = {"request": rule.request}
        else:
            spec = {"targets": list(rule.targets)}
            # Prewarm fans out at the rule's concurrency and never halts: one bad node
            # should not keep the item from the rest.
            limits |= {"max_unavailable": str(rule.concurrency), "max_failures": 0}
        return RolloutRecord.start(kind, spec, sorted(nodes), **limits)

    def _report(self, kind: str, record: RolloutRecord) -> Callable[[str, Any, str], None]:
        """Log each node's end; every report is progress; a running node is live to its
        timeout (plus 30 s for the cancel)."""
        log_end = _log_report(kind)

        def report(node: str, state: Any, detail: str) -> None:
            self.beat()
            if state is NodeState.RUNNING and detail == "started":
                self._running[(kind, node)] = self._clock() + record.node_timeout_s + 30.0
            elif state.finished:
                self._running.pop((kind, node), None)
            if self._cluster is not None and (state.finished or detail == "started"):
                self._tell(self._cluster.node_step, kind, node, state.value, detail)
                if state.finished and self._status is not None:
                    self._status.update(record, "running")
            log_end(node, state, detail)

        return report


#: A node whose rule cannot be told without its (unread) labels.
_UNKNOWN: Any = object()


def _rule_for(rules: Sequence[_Rule], view: Any, labels_known: bool) -> Any:
    """The first rule picking ``view``; `_UNKNOWN` when an earlier-or-matching rule's
    selector needs labels that could not be read (a guess could re-bind the node). A node
    whose GPUs were not read (driver not ready) may be of a rule's model: picked, so the pass
    says why it cannot be changed instead of forgetting it."""
    for rule in rules:
        if not labels_known and rule.selector.needs_labels:
            return _UNKNOWN
        if rule.selector.matches(view) or (view.gpus_unread and rule.selector.may_match(view)):
            return rule
    return None


def _may_pick(rule: _Rule, view: NodeView, selection: Selection) -> bool:
    """Whether ``rule`` may pick ``view``, a node without a (full) answer (labels unknown?)."""
    known = selection.targets[view.name].labels_known
    return rule.selector.needs_inventory or not known or rule.selector.matches(view)


def _rule_scope(selection: Selection, rule: _Rule, nodes: Sequence[str]) -> Selection:
    """The rollout's selection: the rule's nodes, in sync or not, and the unanswering nodes
    it may pick. Max-unavailable protects the capacity of the pool a rule selects, so what
    counts against it is every node of that pool that is down or changing, whoever changes
    it (this rollout, another replica, a hand-run apply): its claims and running applies are
    read, here and only here. A node of another pool takes nothing from this one, and asking
    the whole fleet made a one-node rollout at 5,000 nodes cost 10,000 calls per node."""
    picked = set(nodes)

    def counts(v: NodeView) -> bool:
        if v.name in picked:
            return True
        if v.plannable:
            return False
        # No answer: count it in when the rule could pick it (as a rollout counts its own
        # unanswering nodes).
        return _may_pick(rule, v, selection)

    views = tuple(v for v in selection.views if counts(v))
    return Selection(views, {v.name: selection.targets[v.name] for v in views})


def _fingerprint(record: RolloutRecord) -> str:
    """What a record applies, whatever its nodes: a different change is not held back."""
    text = json.dumps([record.kind, record.spec], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _log_report(kind: str) -> Callable[[str, Any, str], None]:
    def report(node: str, state: Any, detail: str) -> None:
        if state.finished:
            log.info("%s %s: %s %s", kind, node, state.value, detail)

    return report


def _problems(exc: AgentError) -> str:
    """Every refused field of the desired file (up to ten), not just the first."""
    violations = getattr(exc, "violations", ())
    if not violations:
        return str(exc)
    return safeyaml.some([str(v) for v in violations], 10, sep="; ")
