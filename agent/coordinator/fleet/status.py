"""`fleet status`: the nodes' views summarised per node and per MIG profile. Pure.

The answer is small by default (`status_document`): totals, counts per node state, GPU
verdict, allocation mode and model, the MIG profiles, and the records of the nodes that need
attention (unreachable, unhealthy, a failed or degraded GPU), at most ``MAX_ATTENTION``. Every
node's record comes only when asked (``nodes``): at 5,000 nodes that is 13 MB of JSON, which
no one reads whole (BENCHMARKS.md)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from agent.coordinator.fleet.capacity import free_capacity, idle_devices, slice_map
from agent.coordinator.fleet.health import STATES, UNKNOWN, GpuMark, InstanceMark
from agent.coordinator.fleet.inventory import PROCESSES, NodeView
from agent.dra.mode import Allocation
from agent.gpu.types import GpuLayout
from agent.mig.desired import current_counts

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "MAX_ATTENTION",
    "FleetStatus",
    "GpuStatus",
    "HealthStatus",
    "InstanceHealth",
    "NodeStatus",
    "ProfileStatus",
    "fleet_status",
    "status_document",
]


#: nodes needing attention listed one by one in the default answer; the rest are counted
MAX_ATTENTION = 100
#: a node with one of these GPU verdicts needs attention (unknown: no verdict, not a fault)
_ATTENTION_GPU = ("failed", "degraded")


@dataclass(frozen=True, slots=True)
class InstanceHealth:
    """A MIG instance's own verdict."""

    gpu_instance_id: int
    profile: str
    state: str
    reason: str
    action: str
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HealthStatus:
    """A GPU's verdict: the worst over the GPU and its instances (``unknown`` when the agent
    gave the GPU none), that verdict's reason, action and start, the pods the marks name, and
    the instances with a verdict of their own."""

    state: str
    reason: str = ""
    action: str = ""
    since: float | None = None
    pods: tuple[str, ...] = ()
    instances: tuple[InstanceHealth, ...] = ()


def _health(mark: GpuMark | None) -> HealthStatus:
    if mark is None:
        return HealthStatus(UNKNOWN)
    worst = mark.worst_mark[1]
    return HealthStatus(
        worst.state,
        worst.reason,
        worst.action,
        worst.since,
        mark.pods,
        tuple(_instance(i) for i in mark.instances),
    )


def _instance(i: InstanceMark) -> InstanceHealth:
    m = i.mark
    return InstanceHealth(i.gpu_instance_id, i.profile, m.state, m.reason, m.action, m.pods)


@dataclass(frozen=True, slots=True)
class GpuStatus:
    index: int
    uuid: str
    model: str
    #: on, off, pending (a mode change waits for a reset), n/a (no MIG), lost, unread (listed
    #: but its reads fail: its MIG mode is not known)
    mig: str
    slices: str
    devices: dict[str, int]
    #: None when the process lists were withheld: which devices are idle is unknown.
    idle: dict[str, int] | None
    creatable: dict[str, int]
    #: the agent's verdict (docs/health.md)
    health: HealthStatus = dataclasses.field(default_factory=lambda: HealthStatus(UNKNOWN))


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    address: str
    #: ok, unhealthy (a component or GPU is not), unreachable
    health: str
    detail: str
    models: str
    sharing: str
    #: cache items warm; None when the agent did not answer (unknown, not 0)
    warm: int | None
    idle_gpus: int | None
    gpus: tuple[GpuStatus, ...]
    #: What the agent withheld from this identity (``processes``): idle devices are then unknown.
    withheld: tuple[str, ...] = ()
    #: the worst GPU or instance verdict: healthy, degraded, failed, unknown
    gpu_health: str = UNKNOWN
    #: the node's allocation mode (device-plugin, dra, dra-dynamic-mig, none, unknown) with its
    #: evidence; None for an agent that did not answer
    allocation: Allocation | None = None
    #: False while the agent has not read its GPUs (driver not ready) or did not answer:
    #: ``gpus`` is then empty because they are unknown, not absent
    gpus_read: bool = True

    @property
    def idle(self) -> dict[str, int] | None:
        """Idle MIG devices by profile; None when unknown: the process lists were withheld, the
        agent did not answer, or a GPU's processes were not read."""
        if PROCESSES in self.withheld or self.health == "unreachable":
            return None
        total: Counter[str] = Counter()
        for g in self.gpus:
            if g.idle is None:
                return None
            total.update(g.idle)
        return dict(sorted(total.items()))


@dataclass(frozen=True, slots=True)
class ProfileStatus:
    profile: str
    devices: int
    in_use: int
    idle: int
    #: more instances that fit in the fleet's free slices, this profile alone.
    creatable: int
    #: devices on nodes that withhold their process lists: neither in use nor idle as far as
    #: this identity can tell.
    unknown: int = 0


@dataclass(frozen=True, slots=True)
class FleetStatus:
    nodes: tuple[NodeStatus, ...]
    profiles: tuple[ProfileStatus, ...]

    @property
    def gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @property
    def reachable(self) -> int:
        return sum(n.health != "unreachable" for n in self.nodes)

    @property
    def gpus_unread(self) -> int:
        """Answering nodes whose GPUs were not read (their driver is not ready): not in
        ``gpus``, which would otherwise count them as nodes without GPUs."""
        return sum(not n.gpus_read and n.health != "unreachable" for n in self.nodes)

    @property
    def idle_gpus(self) -> int:
        """GPUs idle on the nodes whose idle time is known (see ``idle_unknown``)."""
        return sum(n.idle_gpus or 0 for n in self.nodes)

    @property
    def idle_unknown(self) -> int:
        """Answering nodes, GPUs read, whose agent knows no GPU's idle time: not in
        ``idle_gpus``, which would otherwise count them as nodes with none idle."""
        return sum(
            n.idle_gpus is None and n.gpus_read and n.health != "unreachable" and bool(n.gpus)
            for n in self.nodes
        )

    @property
    def gpu_health(self) -> dict[str, int]:
        """GPUs per verdict, every state named (0 included), of the answering nodes."""
        counts = Counter(g.health.state for n in self.nodes for g in n.gpus)
        return {state: counts[state] for state in STATES}


def _mig(layout: GpuLayout, lost: bool, unread: bool) -> str:
    mode = layout.gpu.mig_mode
    if lost:
        return "lost"
    if unread:
        return "unread"  # its MIG mode is not known: not n/a (no MIG), nor the last one seen
    if mode is None:
        return "n/a"
    if mode.is_pending:
        return "pending"
    return "on" if mode.current else "off"


def _gpu(view: NodeView, layout: GpuLayout, mark: GpuMark | None) -> GpuStatus:
    # A lost GPU's instances are the last ones seen, a failed GPU's serve no pod until its
    # action is taken (`NodeView.left_out`): not counted, none idle, nothing creatable.
    # By index: a GPU lost or unread before it was read has no UUID.
    lost = layout.gpu.index in view.lost
    unread = layout.gpu.index in view.unread  # serving, but its processes are not known
    serves = unread or not view.left_out(layout)
    on = bool(layout.gpu.mig_mode and layout.gpu.mig_mode.current) and serves
    placed = [(gi.profile_id, gi.placement) for gi in layout.instances]
    idle = None  # unknown while the process lists are withheld, or not read
    if PROCESSES not in view.withheld and not unread:
        idle = dict(sorted(idle_devices(layout).items())) if serves else {}
    return GpuStatus(
        index=layout.gpu.index,
        uuid=layout.gpu.uuid,
        model=layout.gpu.name,
        mig=_mig(layout, lost, unread),
        # the last-seen layout is not live
        slices="lost" if lost else "unread" if unread else slice_map(layout),
        devices=current_counts(layout) if on else {},
        idle=idle,
        # an unread GPU's free slices are the last seen, and no change is made on it
        creatable=free_capacity(layout.profiles, placed) if on and not unread else {},
        health=_health(mark),
    )


def _models(view: NodeView) -> str:
    """``2x H100 80GB HBM3``; a GPU lost or unread before it was read is of a model nobody
    knows, and so are the GPUs of a node whose driver is not ready."""
    if view.gpus_unread:
        return "? (not read)"
    counts = Counter(g.gpu.name.removeprefix("NVIDIA ") for g in view.layouts if g.gpu.name)
    nameless = [g.gpu.index for g in view.layouts if not g.gpu.name]
    lost = sum(1 for i in nameless if i in view.lost)
    unread = len(nameless) - lost
    said = [f"{n}x {name}" for name, n in sorted(counts.items())]
    said += [f"{lost}x unknown (lost before it was read)"] if lost else []
    said += [f"{unread}x unknown (not read)"] if unread else []
    return ", ".join(said) or "-"


def _node(view: NodeView) -> NodeStatus:
    if not view.reachable:
        return NodeStatus(
            view.name,
            view.address,
            "unreachable",
            view.error or "",
            "-",
            "-",
            None,
            None,
            (),
            gpus_read=False,
        )
    problems = list(view.unhealthy) + [m.describe() for m in view.failed_gpus]
    # Not a problem of the node: what this identity may not see, said so next to the health.
    withheld = [f"{what} withheld (read role)" for what in view.withheld]
    return NodeStatus(
        name=view.name,
        address=view.address,
        health="unhealthy" if problems else "ok",
        detail="; ".join(problems + withheld),
        models=_models(view),
        sharing=view.sharing,
        warm=len(view.warm),
        idle_gpus=view.idle_gpus,
        gpus=tuple(_gpu(view, g, m) for g, m in zip(view.layouts, _marks(view), strict=True)),
        withheld=view.withheld,
        gpu_health=view.gpu_health,
        allocation=view.allocation,
        gpus_read=not view.gpus_unread,
    )


def _marks(view: NodeView) -> list[GpuMark | None]:
    """The verdict of each layout, in order (a view made without marks has none)."""
    if len(view.marks) == len(view.layouts):
        return list(view.marks)
    return [None] * len(view.layouts)


def fleet_status(views: Sequence[NodeView]) -> FleetStatus:
    nodes = tuple(_node(v) for v in views)
    devices: Counter[str] = Counter()
    idle: Counter[str] = Counter()
    creatable: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    for node in nodes:
        for g in node.gpus:
            devices.update(g.devices)
            if g.idle is None:
                unknown.update(g.devices)
            else:
                idle.update(g.idle)
            creatable.update(g.creatable)
    profiles = tuple(
        ProfileStatus(
            p, devices[p], devices[p] - idle[p] - unknown[p], idle[p], creatable[p], unknown[p]
        )
        for p in sorted(set(devices) | set(creatable))
    )
    return FleetStatus(nodes, profiles)


@cache
def _fields(kind: type[DataclassInstance]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


def _record(obj: DataclassInstance, **computed: Any) -> dict[str, Any]:
    """A record's fields in order, shallow (dataclasses.asdict deep-copies every field: 0.3 s
    for 1,000 nodes), with ``computed`` in place of the fields it names."""
    return {name: getattr(obj, name) for name in _fields(type(obj))} | computed


def _gpu_record(g: GpuStatus) -> dict[str, Any]:
    health = g.health
    return _record(g, health=_record(health, instances=tuple(_record(i) for i in health.instances)))


def _node_record(n: NodeStatus) -> dict[str, Any]:
    # Spelled out: ``idle``, a property, stands between the fields.
    return {
        "name": n.name,
        "address": n.address,
        "health": n.health,
        "detail": n.detail,
        "models": n.models,
        "sharing": n.sharing,
        "warm": n.warm,
        "idle_gpus": n.idle_gpus,
        "gpus_read": n.gpus_read,
        "gpus": [_gpu_record(g) for g in n.gpus],
        "idle": n.idle,
        "withheld": list(n.withheld),
        "gpu_health": n.gpu_health,
        "allocation": None
        if n.allocation is None
        else {
            "mode": n.allocation.mode.value,
            "evidence": n.allocation.evidence,
            "driver": n.allocation.driver or None,
        },
    }


def needs_attention(node: NodeStatus) -> bool:
    """Unreachable, unhealthy, or a GPU failed or degraded."""
    return node.health != "ok" or node.gpu_health in _ATTENTION_GPU


def _counts(values: Sequence[str]) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))


def status_document(status: FleetStatus, idle_after: str, *, nodes: bool = False) -> dict[str, Any]:
    """The JSON form of ``fleet status``: what ``-o json`` prints and ``coordinator serve``
    answers on /fleet/status, and what the table is drawn from. ``nodes``: every node's
    record too (``--nodes``), not only those that need attention."""
    attention = [n for n in status.nodes if needs_attention(n)]
    doc: dict[str, Any] = {
        "totals": {
            "nodes": len(status.nodes),
            "reachable": status.reachable,
            "gpus": status.gpus,
            "gpus_unread_nodes": status.gpus_unread,
            "idle_gpus": status.idle_gpus,
            "idle_unknown_nodes": status.idle_unknown,
            "gpu_health": status.gpu_health,
            "node_health": {
                state: sum(n.health == state for n in status.nodes)
                for state in ("ok", "unhealthy", "unreachable")
            },
            "node_gpu_health": {
                state: sum(n.gpu_health == state for n in status.nodes) for state in STATES
            },
            "allocation": _counts(
                [n.allocation.mode.value for n in status.nodes if n.allocation is not None]
            ),
            "models": _counts([n.models for n in status.nodes if n.health != "unreachable"]),
            "attention": len(attention),
        },
        "profiles": [dataclasses.asdict(p) for p in status.profiles],
        "attention": [_node_record(n) for n in attention[:MAX_ATTENTION]],
        "idle_after": idle_after,
    }
    if nodes:
        doc["nodes"] = [_node_record(n) for n in status.nodes]
    return doc
