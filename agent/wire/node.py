"""NodeService on the wire: GPUs, MIG layouts, health marks and the allocation mode.

Records -> messages for the agent's GetNode and its events; messages -> records
(`layout_from`, `allocation_of`) for every client: the CLI's MIG reads and the coordinator's
planning run the same pure functions on these records that the agent runs on its driver's, so
a layout is read once, by the agent, and converted here once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from agent._proto.gpuagent.v1 import agent_pb2, events_pb2, sharing_pb2
from agent.dra.mode import Allocation, AllocationMode
from agent.errors import DriverNotReady, FieldViolation, InvalidSpec, ModeRefused
from agent.gpu.types import (
    ComputeInstance,
    GiProfile,
    GpuInfo,
    GpuInstance,
    GpuLayout,
    MigMode,
    Placement,
    Process,
)
from agent.health.machine import Mark, State
from agent.telemetry.xid import xid_message
from agent.wire.prewarm import ItemStatus, item_status_from
from agent.wire.timestamps import seconds, timestamp

if TYPE_CHECKING:  # the server's side only: clients load no health monitor
    from agent.health.monitor import HealthChange

__all__ = [
    "Component",
    "NodeGpu",
    "NodeSharing",
    "NodeView",
    "allocation_of",
    "allocation_pb",
    "gpu_instance_pb",
    "gpu_lost_event_pb",
    "gpu_pb",
    "health_event_pb",
    "health_mark_pb",
    "layout_from",
    "mig_layout_event_pb",
    "node_from",
    "xid_event_pb",
]


_HEALTH_STATES = {
    State.HEALTHY: agent_pb2.HEALTH_STATE_HEALTHY,
    State.DEGRADED: agent_pb2.HEALTH_STATE_DEGRADED,
    State.FAILED: agent_pb2.HEALTH_STATE_FAILED,
}


def health_mark_pb(mark: Mark, reason: str) -> agent_pb2.HealthMark:
    """``reason``: the mark's reason as shown (`Mark.describe`)."""
    return agent_pb2.HealthMark(
        state=_HEALTH_STATES[mark.state],
        reason=reason,
        since=timestamp(mark.since),
        action=mark.action,
        pods=list(mark.pods),
    )


def health_event_pb(change: HealthChange) -> events_pb2.HealthEvent:
    return events_pb2.HealthEvent(
        gpu_index=max(change.gpu_index, 0),
        gpu_uuid=change.target.known_uuid,
        gpu_instance_id=change.target.gpu_instance,
        previous=_HEALTH_STATES[change.before],
        mark=health_mark_pb(change.mark, change.reason),
        held=change.held,
    )


def mig_layout_event_pb(layout: GpuLayout) -> events_pb2.MigLayoutEvent:
    """A GPU's MIG mode or instances changed (by anyone, not only this agent)."""
    g = layout.gpu
    event = events_pb2.MigLayoutEvent(
        gpu_index=g.index,
        gpu_uuid=g.uuid,
        instances=[gpu_instance_pb(gi) for gi in layout.instances],
    )
    if g.mig_mode is not None:
        event.mig_mode.CopyFrom(
            agent_pb2.MigMode(current=g.mig_mode.current, pending=g.mig_mode.pending)
        )
    return event


def gpu_lost_event_pb(layout: GpuLayout, detail: str) -> events_pb2.GpuLostEvent:
    """``detail``: the driver's error for the GPU."""
    return events_pb2.GpuLostEvent(
        gpu_index=layout.gpu.index, gpu_uuid=layout.gpu.uuid, detail=detail
    )


def xid_event_pb(
    gpu_index: int, gpu_uuid: str, gpu_instance_id: int | None, xid: int, count: int
) -> events_pb2.XidEvent:
    """``count`` new XIDs of one kind on a GPU (or one of its instances) since the last event."""
    return events_pb2.XidEvent(
        gpu_index=gpu_index,
        gpu_uuid=gpu_uuid,
        gpu_instance_id=gpu_instance_id,
        xid=xid,
        message=xid_message(xid),
        count=count,
    )


def placement_pb(p: Placement) -> agent_pb2.Placement:
    return agent_pb2.Placement(start=p.start, size=p.size)


def gpu_instance_pb(gi: GpuInstance) -> agent_pb2.GpuInstance:
    return agent_pb2.GpuInstance(
        id=gi.id,
        profile_id=gi.profile_id,
        profile_name=gi.profile_name,
        placement=placement_pb(gi.placement),
        compute_instances=[
            agent_pb2.ComputeInstance(
                id=ci.id,
                profile_id=ci.profile_id,
                placement=placement_pb(ci.placement),
                uuid=ci.uuid or "",
            )
            for ci in gi.compute_instances
        ],
    )


def process_pb(p: Process) -> agent_pb2.Process:
    # pids of processes in other namespaces can exceed nothing here, but keep uint32 safe.
    return agent_pb2.Process(
        pid=p.pid & 0xFFFFFFFF,
        used_memory_bytes=p.used_memory_bytes,
        gpu_instance_id=p.gpu_instance_id,
        compute_instance_id=p.compute_instance_id,
    )


def mig_profile_pb(p: GiProfile) -> agent_pb2.MigProfile:
    return agent_pb2.MigProfile(
        id=p.id,
        name=p.name,
        slice_count=p.slice_count,
        memory_slices=p.memory_slices,
        instance_count=p.instance_count,
        memory_mb=p.memory_mb,
        placements=[placement_pb(x) for x in p.placements],
        constant=p.constant,
    )


def gpu_pb(
    layout: GpuLayout,
    *,
    lost: bool = False,
    idle_seconds: float | None = None,
    lost_detail: str = "",
    unread: str = "",
    never_read: bool = False,
) -> agent_pb2.Gpu:
    """``idle_seconds``: from the telemetry sampler; None leaves the field absent (unknown).
    ``lost_detail``: the driver's error for a lost GPU. ``unread``: why its layout and
    processes were not read in the latest sample (its process list is then withheld: a stale
    one is never served); ``never_read``: only its identity is known."""
    g = layout.gpu
    gpu = agent_pb2.Gpu(
        index=g.index,
        uuid=g.uuid,
        name=g.name,
        pci_bus_id=g.pci_bus_id,
        memory_total_bytes=g.memory_total_bytes,
        mig_capable=g.mig_capable,
        instances=[gpu_instance_pb(gi) for gi in layout.instances],
        processes=[] if unread else [process_pb(p) for p in layout.processes],
        pci_device_id=g.pci_device_id & 0xFFFFFFFF,
        pci_subsystem_id=g.pci_subsystem_id & 0xFFFFFFFF,
        mig_profiles=[mig_profile_pb(p) for p in layout.profiles],
        health=agent_pb2.GPU_HEALTH_LOST if lost else agent_pb2.GPU_HEALTH_OK,
        idle_seconds=idle_seconds,
        health_detail=lost_detail if lost else "",
        unread=unread,
        never_read=never_read,
    )
    if g.mig_mode is not None:
        gpu.mig_mode.CopyFrom(
            agent_pb2.MigMode(current=g.mig_mode.current, pending=g.mig_mode.pending)
        )
    return gpu


# -- a node, back into records -------------------------------------------------------------------


#: How a missing driver is put in words (the gpu-driver component's detail, the refusals).
DRIVER_NOT_READY = "waiting for the NVIDIA driver"


@dataclass(frozen=True, slots=True)
class NodeDriver:
    """GetNode's `Driver`: whether GPU reads can be answered at all."""

    #: True: attached; False: not ready (``cause``, ``reason`` say why); None: not tried yet,
    #: or an agent too old to say
    attached: bool | None
    #: one word: ``library_not_found``, ``driver_not_loaded``, ``no_gpus``, ``nvml_error``, ...
    cause: str = ""
    reason: str = ""

    @property
    def why_not(self) -> str | None:
        """The refusal's words while not ready; None otherwise."""
        if self.attached is not False:
            return None
        return f"{DRIVER_NOT_READY} ({self.cause or 'unknown'}): {self.reason}"


@dataclass(frozen=True, slots=True)
class Component:
    """One part of the agent and whether it works (``detail``: why not, or what it did)."""

    name: str
    healthy: bool
    detail: str


@dataclass(frozen=True, slots=True)
class NodeGpu:
    """One GPU of a node as its agent reports it."""

    layout: GpuLayout
    #: the GPU stopped answering; ``detail`` is the driver's error
    lost: bool
    detail: str
    #: its health mark (the reason as shown); None before the agent's first verdict
    condition: Mark | None
    #: GPU-instance id -> that instance's mark, for the instances judged
    instance_conditions: Mapping[int, Mark]
    #: seconds without activity, from the telemetry sampler; None when unknown
    idle_seconds: float | None
    #: why its layout and processes were not read in the latest sample; "" when they were
    #: (while set, ``layout.processes`` is empty because unknown)
    unread: str = ""
    #: its layout was never read: memory, PCI ids, MIG mode and instances are unknown
    never_read: bool = False


@dataclass(frozen=True, slots=True)
class NodeSharing:
    """The device plugin's sharing as GetNode reports it."""

    #: "time-slicing" or "mps"; None when it shares nothing (or in a strategy this client
    #: does not know)
    strategy: str | None
    #: (resource, replicas) of each shared resource
    resources: tuple[tuple[str, int], ...]
    #: whether the plugin runs it: loaded, signalled, not-loaded, unknown ("" from an agent
    #: that does not say)
    pickup: str = ""


@dataclass(frozen=True, slots=True)
class NodeView:
    """GetNode's node: its GPUs, how pods get them, and the agent's own health."""

    name: str
    driver_version: str
    agent_version: str
    #: the simulator preset the agent runs on; "" on real NVML
    simulated_preset: str
    #: the caller's roles do not show processes: every GPU's processes were withheld
    processes_hidden: bool
    allocation: Allocation
    components: tuple[Component, ...]
    gpus: tuple[NodeGpu, ...]
    #: the device plugin's sharing; None when the agent could not read it
    sharing: NodeSharing | None
    #: the node's cache items (files and images), as far as readiness goes
    cache: tuple[ItemStatus, ...]
    driver: NodeDriver = NodeDriver(None)
    #: why the agent refuses any MIG change here now (its allocation mode); "" when allowed
    mig_refusal: str = ""

    @property
    def degraded(self) -> tuple[Component, ...]:
        """The agent's parts that do not work as they should, with why. The gpu-driver
        component counts only while no driver is attached: attached, its complaints are GPUs
        lost or not read, which each GPU says itself (``NodeGpu.lost``, ``detail``,
        ``unread``, ``never_read``): a client that drops it must name those."""
        return tuple(
            c
            for c in self.components
            if not c.healthy and (c.name != "gpu-driver" or self.driver.attached is False)
        )

    def require_driver(self, feature: str) -> None:
        """The one rule for every GPU read a client makes from this answer (mig show, plan,
        assert, export, checkpoint, generate-config, metrics): an empty node because no driver
        is attached is DriverNotReady (exit 11) naming the cause, never an empty success."""
        driver = self.driver
        if driver.attached is False:
            raise DriverNotReady(
                f"{feature} needs the NVIDIA driver, which is not ready "
                f"({driver.cause or 'unknown'}): {driver.reason}"
            )

    def refuse_mig_change(self, what: str) -> None:
        """The agent's refusal of a MIG change, for a client that skips a change already in
        place (mig apply/restore with hooks assert first): a no-op is refused as a real change
        would be by the agent (ModeRefused, exit 12), never "applied"."""
        if self.mig_refusal:
            raise ModeRefused(f"{what} refused: {self.mig_refusal}")


_HEALTH_STATES_FROM = {pb: state for state, pb in _HEALTH_STATES.items()}
_STRATEGIES_FROM = {
    sharing_pb2.SHARING_STRATEGY_TIME_SLICING: "time-slicing",
    sharing_pb2.SHARING_STRATEGY_MPS: "mps",
}


def _sharing_from(node: agent_pb2.Node) -> NodeSharing | None:
    if not node.HasField("sharing"):
        return None
    config = node.sharing
    return NodeSharing(
        _STRATEGIES_FROM.get(config.strategy),
        tuple((r.name, r.replicas) for r in config.resources),
        node.sharing_pickup,
    )


def _mark_from(pb: agent_pb2.HealthMark) -> Mark | None:
    state = _HEALTH_STATES_FROM.get(pb.state)
    if state is None:  # a state this client does not know: not a verdict it can show
        return None
    return Mark(state, pb.reason, seconds(pb.since), pb.action, tuple(pb.pods))


def node_from(node: agent_pb2.Node) -> NodeView:
    """GetNode's answer as records: the layouts as `layout_from` reads them."""
    return NodeView(
        name=node.name,
        driver_version=node.driver_version,
        agent_version=node.agent_version,
        simulated_preset=node.simulated_preset,
        processes_hidden=node.processes_hidden,
        allocation=allocation_of(node),
        components=tuple(Component(c.name, c.healthy, c.detail) for c in node.health.components),
        gpus=tuple(
            NodeGpu(
                layout=layout_from(g),
                lost=g.health == agent_pb2.GPU_HEALTH_LOST,
                detail=g.health_detail,
                condition=_mark_from(g.condition) if g.HasField("condition") else None,
                instance_conditions={
                    gi.id: mark
                    for gi in g.instances
                    if gi.HasField("condition") and (mark := _mark_from(gi.condition)) is not None
                },
                idle_seconds=g.idle_seconds if g.HasField("idle_seconds") else None,
                unread=g.unread,
                never_read=g.never_read,
            )
            for g in node.gpus
        ),
        sharing=_sharing_from(node),
        cache=tuple(item_status_from(i) for i in node.cache.items),
        driver=_driver_from(node.driver),
        mig_refusal=node.allocation.mig_refusal,
    )


_DRIVER_ATTACHED = {
    agent_pb2.DRIVER_STATE_ATTACHED: True,
    agent_pb2.DRIVER_STATE_NOT_READY: False,
}


def _driver_from(pb: agent_pb2.Driver) -> NodeDriver:
    return NodeDriver(_DRIVER_ATTACHED.get(pb.state), pb.cause, pb.reason)


# -- the allocation mode ------------------------------------------------------------------------

_MODES = {
    AllocationMode.UNKNOWN: agent_pb2.ALLOCATION_MODE_UNSPECIFIED,
    AllocationMode.DEVICE_PLUGIN: agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN,
    AllocationMode.DRA: agent_pb2.ALLOCATION_MODE_DRA,
    AllocationMode.DRA_DYNAMIC_MIG: agent_pb2.ALLOCATION_MODE_DRA_DYNAMIC_MIG,
    AllocationMode.NONE: agent_pb2.ALLOCATION_MODE_NONE,
}
_MODES_FROM = {pb: mode for mode, pb in _MODES.items()}


def allocation_pb(allocation: Allocation) -> agent_pb2.Allocation:
    return agent_pb2.Allocation(
        mode=_MODES[allocation.mode], evidence=allocation.evidence, dra_driver=allocation.driver
    )


def allocation_of(node: agent_pb2.Node) -> Allocation:
    """A node's allocation mode as its agent reports it; an agent from before the field sends
    none: unknown, and said why."""
    if not node.HasField("allocation"):
        return Allocation(AllocationMode.UNKNOWN, "not reported by this agent (an older version)")
    found = node.allocation
    mode = _MODES_FROM.get(found.mode, AllocationMode.UNKNOWN)
    return Allocation(mode, found.evidence, found.dra_driver)


# -- layouts, back into records -------------------------------------------------------------------

_K = TypeVar("_K")
_V = TypeVar("_V")


def _interned(cache: dict[_K, _V], key: _K, make: Callable[[], _V], bound: int) -> _V:
    """The one value kept for ``key``, made on first sight. A plain dict rather than lru_cache:
    it runs for every instance of every GPU of a sweep; past ``bound`` entries (agents sending
    odd values) it starts afresh."""
    found = cache.get(key)
    if found is None:
        if len(cache) >= bound:
            cache.clear()
        found = cache[key] = make()
    return found


_MAX_PLACEMENTS = 1024
_placements: dict[tuple[int, int], Placement] = {}
#: Memory slices of a GPU an answer may claim: 8 on every MIG GPU so far. A reader draws one
#: cell per slice, so an agent's answer of 2**32 slices must not reach it.
MAX_MEMORY_SLICES = 64


def memory_slices(value: int, field: str) -> int:
    """``value``, an agent's count or offset of memory slices, checked against the bound."""
    if value > MAX_MEMORY_SLICES:
        raise InvalidSpec(
            f"the agent's answer gives {field} {value}: more memory slices than a GPU has",
            [FieldViolation(field, f"at most {MAX_MEMORY_SLICES}")],
        )
    return value


def _placement(p: agent_pb2.Placement) -> Placement:
    # Frozen and few: one object per distinct placement.
    key = (memory_slices(p.start, "placement.start"), memory_slices(p.size, "placement.size"))
    return _interned(_placements, key, lambda: Placement(*key), _MAX_PLACEMENTS)


_MAX_MODELS = 256  # a bound, should drivers ever vary per GPU
_ProfilesKey = tuple[bytes, ...]
_profiles_seen: dict[_ProfilesKey, tuple[GiProfile, ...]] = {}


def _profiles(gpu: agent_pb2.Gpu) -> tuple[GiProfile, ...]:
    """The GPU's profiles, converted once per model: the driver reports the same profiles and
    placements for every board of a product and memory size, and a 1,000-node sweep would
    otherwise build a quarter of a million placements."""
    # Keyed by the profiles' own bytes (serialising is C code, cheap): a key that only guessed
    # at sameness (model, memory, count) served one GPU's profiles for another's. MigProfile has
    # no map fields, so plain serialising is already byte-stable (and a third faster).
    key = tuple(p.SerializeToString() for p in gpu.mig_profiles)
    return _interned(
        _profiles_seen, key, lambda: tuple(_profile(p) for p in gpu.mig_profiles), _MAX_MODELS
    )


def _profile(p: agent_pb2.MigProfile) -> GiProfile:
    # The API carries what planning needs; engine counts are not part of it.
    return GiProfile(
        constant=p.constant,
        id=p.id,
        name=p.name,
        slice_count=p.slice_count,
        memory_slices=memory_slices(p.memory_slices, "mig_profiles.memory_slices"),
        instance_count=p.instance_count,
        memory_mb=p.memory_mb,
        multiprocessor_count=0,
        copy_engines=0,
        decoders=0,
        encoders=0,
        jpegs=0,
        ofas=0,
        placements=tuple(_placement(x) for x in p.placements),
    )


def layout_from(gpu: agent_pb2.Gpu) -> GpuLayout:
    # Positional arguments (in the records' field order): this runs for every GPU of a sweep,
    # and keyword passing is a measurable part of its cost.
    mode = gpu.mig_mode
    info = GpuInfo(
        gpu.index,
        gpu.uuid,
        gpu.name,
        gpu.pci_bus_id,
        gpu.pci_device_id,
        gpu.pci_subsystem_id,
        gpu.memory_total_bytes,
        MigMode(mode.current, mode.pending) if gpu.mig_capable else None,
    )
    instances = tuple(
        GpuInstance(
            gi.id,
            gi.profile_id,
            gi.profile_name,
            _placement(gi.placement),
            tuple(
                ComputeInstance(ci.id, ci.profile_id, _placement(ci.placement), ci.uuid or None)
                for ci in gi.compute_instances
            ),
        )
        for gi in gpu.instances
    )
    processes = tuple(
        Process(
            p.pid,
            p.used_memory_bytes if p.HasField("used_memory_bytes") else None,
            p.gpu_instance_id if p.HasField("gpu_instance_id") else None,
            p.compute_instance_id if p.HasField("compute_instance_id") else None,
        )
        for p in gpu.processes
    )
    return GpuLayout(info, _profiles(gpu), instances, processes)
