"""One node as the coordinator sees it, rebuilt from the agent's answers (proto -> records).

Nothing here is kept between sweeps: the agents hold the truth and are asked again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent._proto.gpuagent.v1 import agent_pb2, cache_pb2, sharing_pb2
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.health import DEGRADED, FAILED, UNKNOWN, GpuMark, gpu_marks, worst
from agent.dra.mode import Allocation
from agent.gpu.types import GpuLayout
from agent.wire.node import allocation_of, layout_from

__all__ = ["NodeView", "node_view", "unreachable_view"]

PROCESSES = "processes"
WITHHELD_PROCESSES = (
    "the agent withholds its process lists from this identity (read role): give the "
    "coordinator's identity the mig or admin role (roles.mig / roles.admin) to plan here"
)

_STRATEGIES = {
    sharing_pb2.SHARING_STRATEGY_TIME_SLICING: "time-slicing",
    sharing_pb2.SHARING_STRATEGY_MPS: "mps",
}


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node's agent answer (or why there is none)."""

    name: str
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    layouts: tuple[GpuLayout, ...] = ()
    #: UUIDs of GPUs that stopped answering the driver (their layout is the last known).
    lost: frozenset[str] = frozenset()
    #: e.g. ``time-slicing nvidia.com/gpu x4``, ``none``, or ``unknown`` when unread.
    sharing: str = "unknown"
    warm: tuple[str, ...] = ()
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
        return tuple(sorted({g.gpu.name for g in self.layouts}))

    @property
    def usable_layouts(self) -> tuple[GpuLayout, ...]:
        return tuple(g for g in self.layouts if g.gpu.uuid not in self.lost)


def _sharing(node: agent_pb2.Node) -> str:
    if not node.HasField("sharing"):
        return "unknown"
    config = node.sharing
    strategy = _STRATEGIES.get(config.strategy)
    if strategy is None or not config.resources:
        return "none"
    resources = ", ".join(f"{r.name} x{r.replicas}" for r in config.resources)
    return f"{strategy} {resources}"


def _idle_gpus(gpus: Sequence[agent_pb2.Gpu], idle_after_s: float | None) -> int | None:
    if idle_after_s is None:
        return None
    known = [g.idle_seconds for g in gpus if g.HasField("idle_seconds")]
    if gpus and not known:
        return None  # unknown is not "none idle"
    return sum(1 for seconds in known if seconds >= idle_after_s)


def is_warm(item: cache_pb2.CacheItem) -> bool:
    """Ready, and for an image all of its data (a bootstrap-only Nydus image is not warm).

    Agents from before image warmth send no ``image_warmth``: their ready images count."""
    if item.state != cache_pb2.CACHE_ITEM_STATE_READY:
        return False
    if not item.HasField("image_warmth"):
        return True
    return item.image_warmth.level == cache_pb2.IMAGE_WARMTH_LEVEL_FULL


def node_view(target: Target, node: agent_pb2.Node, idle_after_s: float | None = None) -> NodeView:
    """``idle_after_s``: count the GPUs idle at least that long (from each GPU's
    ``idle_seconds``); None leaves the count unknown. An agent that withholds its process
    lists is shown with what it did send and marked so (``withheld``); it is not planned on."""
    gpus = node.gpus
    return NodeView(
        name=node.name or target.node or target.address,
        address=target.address,
        labels=target.labels,
        layouts=tuple(layout_from(g) for g in gpus),
        lost=frozenset(g.uuid for g in gpus if g.health == agent_pb2.GPU_HEALTH_LOST),
        sharing=_sharing(node),
        warm=tuple(sorted(i.name for i in node.cache.items if is_warm(i))),
        unhealthy=tuple(f"{c.name}: {c.detail}" for c in node.health.components if not c.healthy),
        idle_gpus=_idle_gpus(gpus, idle_after_s),
        preset=node.simulated_preset,
        agent_version=node.agent_version,
        withheld=(PROCESSES,) if node.processes_hidden else (),
        marks=gpu_marks(gpus),
        allocation=allocation_of(node),
    )


def unreachable_view(target: Target, error: str) -> NodeView:
    return NodeView(
        name=target.node or target.address,
        address=target.address,
        labels=target.labels,
        error=error,
    )
