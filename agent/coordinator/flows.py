"""The user-facing flows over the fleet: read it, plan for it, roll a change across it.

Each flow asks the agents afresh (discovery, then one sweep) and returns records; the CLI and
the reconcile loop render or act on them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.inventory import NodeView
from agent.coordinator.fleet.selector import Selector, parse_selector
from agent.coordinator.planning.claimdemand import PendingRequest
from agent.coordinator.planning.demand import Demand, TraceStep
from agent.coordinator.planning.fragmentation import Fragmented, fragmented_requests
from agent.coordinator.planning.planner import (
    FleetPlan,
    NodeLayouts,
    plan_fleet,
    scratch_disruption,
)
from agent.coordinator.planning.replay import StepResult, replay
from agent.coordinator.planning.rightsize import ACTIVITY, FB_TOTAL, FB_USED, Window
from agent.coordinator.rollout.actions import NodePreview, action_for, preview
from agent.coordinator.rollout.execute import NodeAction, Report, run_rollout
from agent.coordinator.rollout.healthgate import (
    HealthGate,
    degraded_detail,
    unhealthy_nodes,
    unread_detail,
    unread_nodes,
)
from agent.coordinator.rollout.record import RolloutRecord
from agent.coordinator.rollout.schedule import Limits, NodeState, Scheduler, parse_max_unavailable
from agent.dra.mode import AllocationMode
from agent.errors import AgentError, FieldViolation, InvalidSpec

__all__ = [
    "LEFT_OUT",
    "PlanResult",
    "RolloutResult",
    "Selection",
    "observe",
    "plan",
    "pool_nodes",
    "replay_trace",
    "rollout",
    "rollout_nodes",
    "select",
]


@dataclass(frozen=True, slots=True)
class Selection:
    """The nodes a selector picks: those that can be acted on, and the others it may pick
    (no answer, or an answer with the process lists withheld)."""

    views: tuple[NodeView, ...]
    targets: dict[str, Target]
    #: every node the sweep found, picked or not
    seen: frozenset[str] = frozenset()

    @property
    def reachable(self) -> tuple[NodeView, ...]:
        """Answered with everything planning and rollouts need."""
        return tuple(v for v in self.views if v.plannable)

    @property
    def unreachable(self) -> tuple[NodeView, ...]:
        return tuple(v for v in self.views if not v.plannable)


async def select(
    fleet: Fleet, selector: Selector, *, idle_after_s: float | None = None
) -> Selection:
    """The nodes ``selector`` picks; ``idle_after_s`` also counts idle GPUs (`Fleet.views`)."""
    targets = await fleet.targets()
    check_labels(targets, selector)
    views = await fleet.views(targets, idle_after_s=idle_after_s)
    _check_one_agent_per_node(views)
    by_address = {t.address: t for t in targets}
    chosen = tuple(
        v
        for v in views
        # An unreachable node cannot say its model, nor one whose GPUs were not read (driver
        # not ready): it stays in view, so it is not forgotten.
        if selector.may_match(v)
    )
    found = frozenset(v.name for v in views)
    return Selection(chosen, {v.name: by_address[v.address] for v in chosen}, found)


def may_pick(selector: Selector, name: str) -> bool:
    """Whether ``selector`` could pick a node named ``name`` that no agent answers as: by its
    name, or on facts nobody can read for it (its model, preset, labels)."""
    absent = NodeView(name, "", error="no agent answers as this node")
    return selector.matches(absent) or selector.needs_inventory or selector.needs_labels


def _check_one_agent_per_node(views: Sequence[NodeView]) -> None:
    """Two agents answering as one node (one agent by two addresses, or two agents given one
    node name) would count its GPUs twice and change it twice: refused, naming both."""
    seen: dict[str, str] = {}
    for v in views:
        if v.reachable and v.name in seen:
            raise InvalidSpec(
                f"agents {seen[v.name]} and {v.address} both answer as node {v.name}: give each "
                "agent once (one address each), and each agent its own node name",
                [FieldViolation("agents", "one address per agent, one agent per node")],
            )
        seen.setdefault(v.name, v.address)


def check_labels(targets: Iterable[Target], selector: Selector) -> None:
    """A selector on labels picks nothing on labels nobody read (`pool!=training` would pick
    every node): agents named by --agents or --dns (no pod, no node) come with none
    (InvalidSpec), and while the API fails they are unknown (AgentError)."""
    if not selector.needs_labels:
        return
    targets = tuple(targets)
    if any(t.pod is None and t.node is None for t in targets):
        raise InvalidSpec(
            f"selector {selector} names a node label, and agents given by --agents or --dns "
            "come with none: select by name, address, model, preset or allocation, or find "
            "the agents with --kubernetes",
            [FieldViolation("selector", "name, address, model, preset or allocation keys")],
        )
    unknown = sorted(t.node or t.address for t in targets if not t.labels_known)
    if unknown:
        raise AgentError(
            f"selector {selector} needs node labels, which could not be read for "
            f"{len(unknown)} node(s) ({', '.join(unknown[:5])}): nothing selected on a guess"
        )


def layouts_of(views: Sequence[NodeView]) -> list[NodeLayouts]:
    return [NodeLayouts(v.name, v.usable_layouts) for v in views if v.plannable]


DYNAMIC_MIG = (
    "dynamic MIG: advice only (its DRA driver creates and destroys MIG instances per claim; "
    "the coordinator never changes them)"
)


def not_mig_plannable(view: NodeView) -> str | None:
    """Why the MIG planner leaves this node out because of its allocation mode, or None.

    dra-dynamic-mig: its driver owns the layout. Unknown: the agent cannot say who hands out
    its GPUs yet (or, being older, does not report it), so no layout is planned on a guess.
    """
    mode = None if view.allocation is None else view.allocation.mode
    if mode is AllocationMode.DRA_DYNAMIC_MIG:
        return DYNAMIC_MIG
    if mode is AllocationMode.UNKNOWN and view.allocation is not None:
        why = view.allocation.evidence or "not detected yet"
        return f"allocation mode unknown ({why}): not planned until the agent knows it"
    return None


def _not_plannable(view: NodeView) -> str | None:
    """`not_mig_plannable`, and a node whose GPUs were not read (its driver not ready): GPUs
    nobody knows, not none."""
    return unread_detail(view) or not_mig_plannable(view)


@dataclass(frozen=True, slots=True)
class NotPlanned:
    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class PlanResult:
    plan: FleetPlan
    #: instances a plan made from scratch (ignoring the current layouts) would destroy.
    scratch_destroyed: int
    unreachable: tuple[str, ...]
    #: answering nodes the MIG planner leaves out: their allocation mode, or GPUs not read.
    not_planned: tuple[NotPlanned, ...] = ()
    #: waiting demand only fragmentation keeps from fitting on dra-dynamic-mig nodes: advice.
    fragmented: tuple[Fragmented, ...] = ()
    #: GPUs of planned nodes left out ("node GPU i"): lost (no layout) or failed themselves.
    left_out_gpus: tuple[NotPlanned, ...] = ()
    #: planned nodes with a failed GPU -> what failed: a rollout skips them until healthy.
    unhealthy: Mapping[str, str] = dataclasses.field(default_factory=dict)


def pool_nodes(views: Sequence[NodeView], pools: Sequence[str]) -> dict[str, frozenset[str]]:
    """Each demand pool's selector -> the reachable nodes it selects (none is a valid answer)."""
    out: dict[str, frozenset[str]] = {}
    for text in pools:
        try:
            chosen = parse_selector(text)
        except InvalidSpec as exc:
            raise InvalidSpec(
                f"demand pool {text!r}: {exc}", [FieldViolation("pool", str(exc))]
            ) from exc
        out[text] = frozenset(v.name for v in views if v.plannable and chosen.matches(v))
    return out


def plan(
    selection: Selection,
    demand: Demand,
    *,
    time_limit_s: float = 30.0,
    waiting: Sequence[PendingRequest] = (),
) -> PlanResult:
    """The fleet plan over the nodes whose mode allows MIG changes; ``waiting`` (who waits for
    which devices) is checked for fragmentation on the dra-dynamic-mig nodes."""
    skipped = tuple(
        NotPlanned(v.name, why)
        for v in selection.reachable
        if (why := _not_plannable(v)) is not None
    )
    left_out = {s.node for s in skipped}
    views = [v for v in selection.views if v.name not in left_out]
    nodes = layouts_of(views)
    pools = pool_nodes(views, demand.pools)
    result = plan_fleet(nodes, demand, pools=pools, time_limit_s=time_limit_s)
    blank = plan_fleet(nodes, demand, from_scratch=True, pools=pools, time_limit_s=time_limit_s)
    scratch = scratch_disruption(nodes, blank)
    wait_pools = sorted({w.pool for w in waiting if w.pool is not None})
    fragmented = fragmented_requests(
        selection.reachable, waiting, pool_nodes(selection.views, wait_pools)
    )
    unreachable = tuple(v.name for v in selection.unreachable)
    gpus_left_out = tuple(
        NotPlanned(f"{v.name} GPU {g.gpu.index}", why)
        for v in views
        if v.plannable
        for g in v.layouts
        if (why := v.left_out(g))
    )
    unhealthy = unhealthy_nodes([v for v in views if v.plannable])
    return PlanResult(result, scratch, unreachable, skipped, fragmented, gpus_left_out, unhealthy)


async def observe(
    fleet: Fleet,
    selection: Selection,
    *,
    samples: int,
    every_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    swept: Callable[[int, Window], None] = lambda done, window: None,
) -> Window:
    """``samples`` telemetry sweeps of the selected agents, ``every_s`` apart, folded into peaks.

    An agent that does not answer a sweep is noted in the window and asked again next time.
    ``swept`` hears of each sweep as it ends (how many so far, the window), for progress."""
    window = Window()
    # A node that did not answer the selection is never asked: said, not left out.
    window.failed.update({v.name: v.why_not_plannable for v in selection.unreachable})
    chosen = {v.name: selection.targets[v.name] for v in selection.reachable}
    targets = list(chosen.values())
    by_address = {t.address: name for name, t in chosen.items()}
    fields = [FB_USED, FB_TOTAL, *ACTIVITY]
    for i in range(samples):
        if i:
            await sleep(every_s)
        for o in await fleet.each(targets, lambda c: c.telemetry(fields)):
            node = by_address[o.target.address]
            if o.value is not None and o.value.pods_hidden:
                # Its pods are withheld from this identity (roles): not "nothing runs there".
                window.failed[node] = "the agent hides pods from this identity (needs mig or admin)"
            elif o.value is not None:
                window.add(node, o.value)
            else:
                window.failed[node] = str(o.error)
        swept(i + 1, window)
    return window


def added_views(added: Sequence[tuple[str, NodeLayouts]]) -> list[NodeView]:
    """Views of simulated nodes one might buy, (preset, layouts): pools select them by name,
    preset and model."""
    return [NodeView(n.name, "", layouts=n.gpus, preset=preset) for preset, n in added]


def replay_trace(
    selection: Selection | None,
    added: Sequence[tuple[str, NodeLayouts]],
    steps: Sequence[TraceStep],
    *,
    end: float | None = None,
) -> tuple[StepResult, ...]:
    # Nodes the MIG planner leaves out (dra-dynamic-mig, unknown mode) are left out here too.
    current = [v for v in (selection.views if selection else ()) if not not_mig_plannable(v)]
    views = current + added_views(added)
    nodes = layouts_of(views)
    pools = pool_nodes(views, sorted({p for s in steps for p in s.demand.pools}))
    return replay(nodes, steps, pools=pools, end=end)


#: why a pending node a rollout left unchanged was left out (`RolloutResult.left_out`)
LEFT_OUT = ("unhealthy", "not-allowed", "unreachable")


@dataclass(frozen=True, slots=True)
class RolloutResult:
    """What a rollout (or its dry run) did, and every node it left out and why: `fleet apply`
    and `fleet resume` render it, `coordinator serve` logs and counts it."""

    record: RolloutRecord
    previews: tuple[NodePreview, ...] = ()
    #: nodes left out because they did not answer (or no agent answers as them); still
    #: pending in the record.
    skipped: tuple[str, ...] = ()
    #: nodes mid-change by an operation this rollout did not start (another coordinator's,
    #: or a hand-run one's): they count against max-unavailable and are left pending.
    busy: tuple[str, ...] = ()
    #: nodes left out because a GPU (or MIG instance) of theirs failed, or their GPUs were not
    #: read (``unread``) -> what failed, or why; still pending in the record, for a resume
    #: once they are healthy.
    unhealthy: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: nodes with a degraded GPU, changed all the same -> what is degraded.
    degraded: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: nodes whose allocation mode lets no change of this kind happen (a MIG rollout on a
    #: dra-dynamic-mig node, or one whose mode is unknown) -> why; still pending in the record.
    not_allowed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: why no node could start (max-unavailable taken by nodes already unavailable); "" else
    waiting: str = ""
    #: of ``unhealthy``, the nodes whose GPUs were not read (their driver not ready) rather
    #: than failed: a wait, not a fault.
    unread: frozenset[str] = frozenset()

    @property
    def complete(self) -> bool:
        return all(
            s in (NodeState.SUCCEEDED, NodeState.UNCHANGED) for s in self.record.states().values()
        )

    def left_out(self) -> dict[str, dict[str, str]]:
        """The pending nodes left unchanged, by why (`LEFT_OUT`): node -> detail."""
        unreachable = dict.fromkeys(self.skipped, "did not answer")
        why = (dict(self.unhealthy), dict(self.not_allowed), unreachable)
        return dict(zip(LEFT_OUT, why, strict=True))

    def incomplete(self) -> list[str]:
        """Every reason the rollout did not finish, each with its nodes (one never replaces
        another); [] when it finished."""
        if self.complete:
            return []
        record = self.record
        said = [record.halted] if record.halted else []
        failed = [n for n, r in record.nodes.items() if r.state == NodeState.FAILED.value]
        if failed and not record.halted:  # a halt names its failed nodes
            said.append(f"{len(failed)} node(s) failed ({', '.join(failed)})")
        if self.skipped:
            said.append(f"{len(self.skipped)} node(s) did not answer ({', '.join(self.skipped)})")
        unread = [n for n in self.unhealthy if n in self.unread]
        failed_gpu = [n for n in self.unhealthy if n not in self.unread]
        if failed_gpu:
            said.append(
                f"{len(failed_gpu)} node(s) skipped for a failed GPU ({', '.join(failed_gpu)})"
            )
        if unread:
            said.append(
                f"{len(unread)} node(s) skipped until their driver is ready ({', '.join(unread)})"
            )
        if self.not_allowed:
            said.append(
                f"{len(self.not_allowed)} node(s) skipped: their allocation mode allows no MIG "
                f"change ({', '.join(self.not_allowed)})"
            )
        if self.waiting:
            said.append(self.waiting)
        if self.busy:
            said.append(
                f"{len(self.busy)} node(s) mid-change by an operation this rollout did not "
                f"start ({', '.join(self.busy)}), counted against max-unavailable"
            )
        return said or ["some nodes did not finish"]


def rollout_nodes(
    selection: Selection, selector: Selector, plan_nodes: Sequence[str] | None = None
) -> list[str]:
    """The nodes a new rollout names: the selected ones (of ``plan_nodes``, when a plan names
    them), and a plan's node no agent answers as where the selector could pick it: kept, not
    reached, never dropped without a word. InvalidSpec when none is found."""
    names = [v.name for v in selection.views if plan_nodes is None or v.name in plan_nodes]
    absent = set(plan_nodes or ()) - selection.seen
    missing = sorted(n for n in absent if may_pick(selector, n))
    if not names:
        raise _none_found(selector, missing, {v.name for v in selection.views})
    return sorted(names + missing)


def _none_found(chosen: Selector, missing: Sequence[str], found: set[str]) -> InvalidSpec:
    if not missing:
        return InvalidSpec(
            f"no node matches the selector {chosen}", [FieldViolation("selector", str(chosen))]
        )
    seen = ", ".join(sorted(found)[:10]) or "none"
    where = f" with selector {chosen}" if chosen.terms else ""
    return InvalidSpec(
        f"no agent answers as a node of the plan ({', '.join(missing[:10])}); "
        f"nodes found{where}: {seen}",
        [FieldViolation("plan", "a plan of this fleet's nodes (`fleet plan --out`)")],
    )


async def rollout(
    fleet: Fleet,
    selection: Selection,
    record: RolloutRecord,
    *,
    order: Sequence[str] | None = None,
    dry_run: bool = False,
    report: Report = lambda node, state, detail: None,
    wrap: Callable[[NodeAction], NodeAction] | None = None,
    holder: str = "",
) -> RolloutResult:
    """Run (or with ``dry_run`` only plan) ``record`` over the selected nodes it names.

    ``order`` is the node order (a resume puts nodes left mid-operation first). Nodes that do
    not answer are skipped and count against max-unavailable, as nodes already down. In a
    rollout that changes GPUs (`HEALTH_GATED`), nodes whose agent reports a failed GPU are
    skipped too (not counted: they answer, and nothing of theirs is being changed), and each
    node's change is gated on its health (`agent.coordinator.rollout.healthgate`,
    ``record.on_unhealthy``). ``wrap`` wraps each node's action (a drain around a MIG change).
    With ``holder`` (a coordinator's identity), each MIG change first claims its node and
    checks the claims of every selected node against max-unavailable
    (`agent.coordinator.rollout.claims`): safe beside other coordinators.
    """
    held = _held_back(selection, record)
    why_out = {**held.unhealthy, **held.not_allowed}
    left_out = set(why_out)
    reachable = {v.name for v in selection.reachable} - left_out
    names = list(order or record.nodes)
    skipped = tuple(
        n
        for n in names
        if n not in reachable and n not in left_out and not record.state(n).finished
    )
    for node in skipped:
        record.nodes[node].detail = "skipped: the agent did not answer"
    for node, why in why_out.items():
        record.nodes[node].detail = f"skipped: {why}"
    targets = {n: t for n, t in selection.targets.items() if n in record.nodes}
    if dry_run:
        live = {n: targets[n] for n in names if n in reachable}
        shown = dataclasses.replace(record, nodes={n: record.nodes[n] for n in live}, path=None)
        said = {p.node: p for p in await preview(fleet, live, shown)}
        said |= {n: NodePreview(n, "skipped", why) for n, why in why_out.items()}
        # A node that does not answer is shown, not left out: unknown, with why.
        errors = {v.name: v.error or "the agent did not answer" for v in selection.unreachable}
        nobody = "no agent answers as this node"
        said |= {n: NodePreview(n, "unknown", errors.get(n, f"{n}: {nobody}")) for n in skipped}
        previews = tuple(said[n] for n in names if n in said)
        return dataclasses.replace(held, previews=previews, skipped=skipped)
    limits = Limits(
        parse_max_unavailable(record.max_unavailable, len(record.nodes)),
        record.max_failures,
        record.node_timeout_s,
    )
    busy = await changing(fleet, selection, record)
    for node in busy:
        if node in record.nodes and not record.state(node).finished:
            record.nodes[node].detail = f"waiting: {busy[node]} is still running on the agent"
    scheduler = Scheduler(
        [n for n in names if n in reachable and n not in busy],
        limits,
        states=record.states(),
        already_unavailable=len(skipped) + len(busy),
    )
    record.save()
    held = dataclasses.replace(held, skipped=skipped, busy=tuple(sorted(busy)))
    stuck = scheduler.stuck_reason()
    if stuck is not None:  # wait: nothing may start, and each waiting node says why
        for node in scheduler.pending:
            record.nodes[node].detail = f"waiting: {stuck}"
        record.save()  # the record says why they wait, as the CLI does
        return dataclasses.replace(held, waiting=stuck)
    action = action_for(fleet, targets, record, holder=holder, scope=selection.targets)
    step = wrap(action) if wrap else action
    if record.kind in HEALTH_GATED:
        step = HealthGate(step, fleet, targets, record.on_unhealthy)
    await run_rollout(record, scheduler, step, report=report)
    return held


def _held_back(selection: Selection, record: RolloutRecord) -> RolloutResult:
    """The pending nodes a rollout leaves out, or names, and why: unhealthy (a failed GPU, or
    GPUs not read, in a kind that changes GPUs), degraded (changed all the same), not allowed
    (a MIG change the node's allocation mode forbids: left out as the planner does, not failed
    one by one)."""
    in_record = [v for v in selection.views if v.name in record.nodes]
    pending = {n for n in record.nodes if not record.state(n).finished}
    gated = record.kind in HEALTH_GATED
    unhealthy = {n: d for n, d in unhealthy_nodes(in_record).items() if n in pending and gated}
    degraded = {v.name: degraded_detail(v) for v in in_record if v.degraded_gpus}
    degraded = {n: d for n, d in degraded.items() if n in pending and n not in unhealthy}
    not_allowed = {
        v.name: why
        for v in in_record
        if record.kind == "mig"
        and v.name in pending
        and v.name not in unhealthy
        and (why := not_mig_plannable(v))
    }
    unread = unread_nodes([v for v in in_record if v.name in unhealthy])
    return RolloutResult(record, (), (), (), unhealthy, degraded, not_allowed, unread=unread)


#: Rollout kinds that change GPUs, so wait for them to be healthy (a node with a failed GPU is
#: skipped, one that turns unhealthy fails). A prewarm touches no GPU: the node's other GPUs
#: still serve pods that want a warm cache, and the cache outlives the reboot a GPU may need.
HEALTH_GATED = frozenset({"mig", "share", "power"})

#: The agent operation kind whose nodes are unavailable while it runs, by rollout kind.
_CHANGING = {"mig": "mig.apply"}


async def changing(fleet: Fleet, selection: Selection, record: RolloutRecord) -> dict[str, str]:
    """Selected nodes with an operation of the record's kind running that the record did not
    start: node -> operation. A node that does not answer is left to the skipped count."""
    kind = _CHANGING.get(record.kind)
    if kind is None:
        return {}
    live = [selection.targets[v.name] for v in selection.reachable if v.name in selection.targets]
    outcomes = await fleet.each(live, lambda c: c.running_operations(kind))
    names = {t.address: n for n, t in selection.targets.items()}
    found: dict[str, str] = {}
    for o in outcomes:
        node = names[o.target.address]
        own = record.nodes[node].operation if node in record.nodes else ""
        others = [op.name for op in o.value or () if op.name != own]
        if others:
            found[node] = others[0]
    return found
