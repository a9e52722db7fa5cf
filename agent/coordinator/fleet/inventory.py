"""One node as the coordinator sees it, rebuilt from the agent's answer (agent/wire's records).

Nothing here is kept between sweeps: the agents hold the truth and are asked again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.health import DEGRADED, FAILED, UNKNOWN, GpuMark, gpu_marks, worst
from agent.dra.mode import Allocation
from agent.gpu.types import GpuLayout
from agent.wire import node as wire

__all__ = ["NodeView", "node_view", "unreachable_view"]

PROCESSES = "processes"
WITHHELD_PROCESSES = (
    "the agent withholds its process lists from this identity (read role): give the "
    "coordinator's identity the mig or admin role (roles.mig / roles.admin) to plan here"
)


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node's agent answer (or why there is none)."""

    name: str
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    layouts: tuple[GpuLayout, ...] = ()
    #: indices of GPUs that stopped answering the driver (their layout is the last known);
    #: by index, as one lost before it was read has no UUID
    lost: frozenset[int] = frozenset()
    #: index -> why the GPU's processes (and layout) were not read in the agent's latest
    #: sample: its empty process list is unknown, not idle (by index: one never read has no
    #: UUID)
    unread: Mapping[int, str] = field(default_factory=dict)
    #: e.g. ``time-slicing nvidia.com/gpu x4``, ``none``, or ``unknown`` when unread.
    sharing: str = "unknown"
    warm: tuple[str, ...] = ()
    #: what is wrong with the node, with why: its agent's degraded parts, then its lost GPUs,
    #: then those listed but not read (``GPU 1 not read: <call>: <error>``)
    unhealthy: tuple[str, ...] = ()
    #: GPUs idle at least the idle threshold; None when not asked for, or when the agent
    #: knows no GPU's idle time (no telemetry sample yet, or an agent from before the field).
    idle_gpus: int | None = None
    preset: str = ""
    agent_version: str = ""
    error: str | None = None
    #: What the agent withheld from this identity's roles (``processes``): shown as withheld,
    #: never as empty.
    withheld: tuple[str, ...] = ()
    #: each GPU's health verdict (and its instances'), as the agent reported it
    marks: tuple[GpuMark, ...] = ()
    #: How the node's GPUs reach pods (docs/dra.md); None when the agent did not answer.
    allocation: Allocation | None = None
    #: why the agent has not read its GPUs (its driver is not ready); "" when it has: an empty
    #: ``layouts`` is then a node without GPUs, not one whose GPUs are unknown
    gpus_unread: str = ""

    @property
    def gpu_health(self) -> str:
        """The worst GPU or instance verdict: healthy, degraded, failed; unknown when the
        agent did not answer or gave a GPU no verdict (never healthy unchecked)."""
        if self.error is not None:
            return UNKNOWN
        return worst(m.state for m in self.marks)

    @property
    def failed_gpus(self) -> tuple[GpuMark, ...]:
        """GPUs failed themselves or with a failed instance."""
        return tuple(m for m in self.marks if m.state == FAILED)

    @property
    def degraded_gpus(self) -> tuple[GpuMark, ...]:
        return tuple(m for m in self.marks if m.state == DEGRADED)

    @property
    def reachable(self) -> bool:
        """The agent answered."""
        return self.error is None

    @property
    def plannable(self) -> bool:
        """Answered with what planning needs: withheld process lists would read as idle GPUs."""
        return self.error is None and PROCESSES not in self.withheld

    @property
    def why_not_plannable(self) -> str:
        if self.error is not None:
            return self.error
        return WITHHELD_PROCESSES if not self.plannable else ""

    @property
    def models(self) -> tuple[str, ...]:
        """The models of the GPUs read (a GPU lost before it was read has none known)."""
        return tuple(sorted({g.gpu.name for g in self.layouts if g.gpu.name}))

    def left_out(self, layout: GpuLayout) -> str:
        """Why planning leaves this GPU out, "" when it may use it: lost (no layout to read),
        not read (its processes unknown: it may be busy), or failed itself (its devices serve
        no pod until its action is taken)."""
        index = layout.gpu.index
        if index in self.lost:
            return "lost: the driver does not answer for it"
        if index in self.unread:
            return f"not read: {self.unread[index]}: its processes are not known"
        for m in self.marks:
            if m.uuid == layout.gpu.uuid and m.mark.state == FAILED:
                return f"failed: {m.mark.reason} (action {m.mark.action}): it serves no pod"
        return ""

    @property
    def usable_layouts(self) -> tuple[GpuLayout, ...]:
        """The GPUs planning may use (`left_out`)."""
        return tuple(g for g in self.layouts if not self.left_out(g))


def _sharing(node: wire.NodeView) -> str:
    """The config in the node's file, and ``(not loaded)`` while its agent says the plugin has
    not loaded it."""
    sharing = node.sharing
    if sharing is None:
        return "unknown"
    if sharing.strategy is None or not sharing.resources:
        said = "none"
    else:
        resources = ", ".join(f"{name} x{replicas}" for name, replicas in sharing.resources)
        said = f"{sharing.strategy} {resources}"
    if sharing.pickup == "not-loaded":
        said += " (not loaded)"
    return said


def _idle_gpus(
    node: wire.NodeView, idle_after_s: float | None, marks: tuple[GpuMark, ...]
) -> int | None:
    """The GPUs idle ``idle_after_s`` or longer; a lost GPU, or one marked failed, is no idle
    capacity (it serves no pod until its action is taken), whatever its last idle figure."""
    if idle_after_s is None or node.driver.why_not is not None:
        return None
    failed = {m.uuid for m in marks if m.mark.state == FAILED}
    gpus = [g for g in node.gpus if not g.lost and g.layout.gpu.uuid not in failed]
    known = [g.idle_seconds for g in gpus if g.idle_seconds is not None]
    if gpus and not known:
        return None  # unknown is not "none idle"
    return sum(1 for seconds in known if seconds >= idle_after_s)


def node_view(target: Target, node: wire.NodeView, idle_after_s: float | None = None) -> NodeView:
    """``idle_after_s``: count the GPUs idle at least that long (from each GPU's
    ``idle_seconds``); None leaves the count unknown. An agent that withholds its process
    lists is shown with what it did send and marked so (``withheld``); it is not planned on."""
    gpus = node.gpus
    marks = gpu_marks(gpus)
    return NodeView(
        name=node.name or target.node or target.address,
        address=target.address,
        labels=target.labels,
        layouts=tuple(g.layout for g in gpus),
        lost=frozenset(g.layout.gpu.index for g in gpus if g.lost),
        unread={
            g.layout.gpu.index: g.unread or "never read"
            for g in gpus
            if (g.unread or g.never_read) and not g.lost
        },
        sharing=_sharing(node),
        warm=tuple(sorted(i.name for i in node.cache if i.warm)),
        unhealthy=tuple(f"{c.name}: {c.detail}" for c in node.degraded)
        + tuple(
            f"GPU {g.layout.gpu.index} lost: {g.detail or 'it does not answer'}"
            for g in gpus
            if g.lost
        )
        + tuple(
            f"GPU {g.layout.gpu.index} not read: {g.unread or 'never read'}"
            for g in gpus
            if (g.unread or g.never_read) and not g.lost
        ),
        idle_gpus=_idle_gpus(node, idle_after_s, marks),
        preset=node.simulated_preset,
        agent_version=node.agent_version,
        withheld=(PROCESSES,) if node.processes_hidden else (),
        marks=marks,
        allocation=node.allocation,
        gpus_unread=node.driver.why_not or "",
    )


def unreachable_view(target: Target, error: str) -> NodeView:
    return NodeView(
        name=target.node or target.address,
        address=target.address,
        labels=target.labels,
        error=error,
    )
