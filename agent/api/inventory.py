"""The node inventory GetNode serves: rebuilt in the background, read without any I/O.

A request never calls NVML, reads a file or queries SQLite: it takes the latest prebuilt
response (one reference, swapped whole). The GPUs (layouts, processes, lost ones, idle seconds)
come from the telemetry sampler's per-tick snapshot, so the inventory makes no NVML call of its
own (BENCHMARKS.md, "NVML calls per node"); it is rebuilt with every snapshot and at least every
second. The cache is re-read every 2 s and the sharing config (which scans processes for the
device plugin) every 5 s; `poke` asks for a fresh snapshot and refreshes the rest at once after a
change the agent made. Refreshing also notices MIG layout changes and lost GPUs and publishes
them as events.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agent import __version__
from agent._proto.gpuagent.v1 import agent_pb2, cache_pb2, sharing_pb2
from agent.api.events import EventBus
from agent.dra.mode import Allocation
from agent.errors import AgentError
from agent.gpu.attach import DriverLink
from agent.gpu.types import GpuInfo, GpuLayout
from agent.health.machine import Mark
from agent.health.store import Target
from agent.loops import call_soon_from_thread
from agent.prewarm.inventory import Inventory as CacheInventory
from agent.sharing import SharingView
from agent.sharing.reload import unobservable
from agent.telemetry.snapshot import GpuStatus, Snapshot
from agent.wire.node import (
    DRIVER_NOT_READY,
    allocation_pb,
    gpu_lost_event_pb,
    gpu_pb,
    health_mark_pb,
    mig_layout_event_pb,
    xid_event_pb,
)
from agent.wire.prewarm import cache_inventory_pb
from agent.wire.sharing import sharing_config_pb
from agent.wire.timestamps import timestamp

log = logging.getLogger(__name__)

__all__ = ["NodeInventory"]

XidKey = tuple[int, int | None, int]  # (GPU index, GPU instance id or None, XID)
#: the health marks: target -> (GPU index, mark, reason as shown)
HealthMarks = Callable[[], Mapping[Target, tuple[int, Mark, str]]]

GPU_EVERY_S = 1.0
CACHE_EVERY_S = 2.0
SHARING_EVERY_S = 5.0


@dataclass
class _Part:
    """One refreshed part of the node: its proto, and whether its last refresh worked."""

    healthy: bool = False
    detail: str = "not read yet"
    read_at: float = 0.0


@dataclass
class _Gpus(_Part):
    layouts: tuple[GpuLayout, ...] = ()
    lost: dict[int, str] = field(default_factory=dict)  # GPU index -> the driver's error
    #: GPU index -> why its layout and processes were not read in the snapshot (the call)
    unread: dict[int, str] = field(default_factory=dict)
    #: GPUs whose layout was never read: only their identity is known
    never_read: frozenset[int] = frozenset()
    driver_version: str = ""
    #: the driver link as GetNode's `Driver` reports it (unspecified before the first verdict)
    driver: agent_pb2.Driver = field(default_factory=agent_pb2.Driver)
    #: monotonic time of what this came from (a snapshot's ``taken_mono``): orders refreshes
    taken_mono: float = 0.0


class NodeInventory:
    def __init__(
        self,
        bus: EventBus,
        *,
        node_name: str,
        simulated_preset: str | None,
        cache: Callable[[], CacheInventory] | None = None,
        xids: Callable[[], Mapping[XidKey, int]] | None = None,
        xid_unwatched: Callable[[], str | None] | None = None,
        telemetry: Callable[[], Snapshot | None] | None = None,
        wake: Callable[[], None] | None = None,
        fresh: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        state: Callable[[], tuple[bool, str]] | None = None,
        health: HealthMarks | None = None,
        kube: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        """``state``: the state store's (healthy, detail), shown as the "state" component;
        ``kube``: the Kubernetes edge's, as the "kubernetes" component (agent/kube_edge.py).
        ``health``: the health marks filled in each GPU's and instance's ``condition``.
        ``xid_unwatched``: why XID events are not watched (None: they are), shown as the
        "xid-events" component while the driver is attached: a mark nobody feeds is no
        verdict."""
        self._bus = bus
        self._health = health
        self._state_health = state
        self._kube_health = kube
        self._fresh = fresh
        self._node_name = node_name
        self._preset = simulated_preset or ""
        self._sharing_source: Callable[[], SharingView] | None = None
        self._allocation_source: Callable[[], Allocation] | None = None
        self._allocation: Allocation | None = None
        self._mig_refusal: Callable[[], str | None] = lambda: None
        self._mig_unrolled: Callable[[], str] = lambda: ""
        self._cache_source = cache
        self._xid_source = xids
        self._xid_unwatched = xid_unwatched
        self._xids_seen: dict[XidKey, int] = {}
        self._telemetry = telemetry
        self._wake = wake
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()  # one refresher of each part at a time
        self._gpus = _Gpus()
        self._sharing = _Part()
        self._sharing_pb: sharing_pb2.SharingConfig | None = None
        self._sharing_pickup = ""  # the plugin's pickup state of that config
        self._cache = _Part()
        self._cache_pb: cache_pb2.CacheInventory | None = None
        self._response = agent_pb2.GetNodeResponse()
        self._redacted = agent_pb2.GetNodeResponse()
        self._poked: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- reads (any thread, no I/O) -----------------------------------------------------------

    def response(self, *, processes: bool = True) -> agent_pb2.GetNodeResponse:
        """The node; without ``processes`` every process list is withheld (and says so)."""
        return self._response if processes else self._redacted

    def layouts(self) -> tuple[GpuLayout, ...]:
        """The latest layouts of the GPUs that answer and were read in the latest snapshot, for
        services that need the node's shape without NVML: a lost GPU cannot be shared or
        partitioned, and one not read (`unread_gpus`) has a stale or unknown layout and
        process list (the device plugin's own read of it fails too), so neither is counted as
        advertised, nor taken as "no process runs" (the reclaimable mark)."""
        gpus = self._gpus
        skip = gpus.lost.keys() | gpus.unread.keys() | gpus.never_read
        return tuple(layout for layout in gpus.layouts if layout.gpu.index not in skip)

    def gpus_unread(self) -> str:
        """Why the GPUs were not read (the driver not attached yet, or gone); "" once a
        snapshot of an attached driver listed them. An empty `layouts` means no GPU only then."""
        gpus = self._gpus
        if gpus.driver.state == agent_pb2.DRIVER_STATE_ATTACHED:
            return ""
        if gpus.driver.state == agent_pb2.DRIVER_STATE_UNSPECIFIED:
            return "the agent is starting: its first read of the GPUs has not come yet"
        return gpus.detail

    def lost_gpus(self) -> tuple[int, ...]:
        """The indices of the GPUs that do not answer now."""
        return tuple(sorted(self._gpus.lost))

    def unread_gpus(self) -> dict[int, str]:
        """The GPUs listed that are not lost but were not read in the latest snapshot (index ->
        the failing call and its error; "never read" when none was said)."""
        gpus = self._gpus
        unread = (gpus.unread.keys() | gpus.never_read) - gpus.lost.keys()
        return {i: gpus.unread.get(i) or "never read" for i in sorted(unread)}

    def every_gpu_lost(self) -> bool:
        """The node has GPUs and every one is lost (a node with no GPU is not this)."""
        gpus = self._gpus
        return bool(gpus.layouts) and len(gpus.lost) == len(gpus.layouts)

    def no_gpu_answers(self) -> str:
        """When the node has GPUs and none answers, each lost or not read (a GPU waiting for a
        reset), what each is: ``every GPU is lost (GPU 0, 1)``, or ``GPU 0 lost, GPU 1 cannot
        be read (<call>: <error>)``; "" while one answers, or with no GPU."""
        gpus = self._gpus
        indices = sorted(layout.gpu.index for layout in gpus.layouts)
        unread = self.unread_gpus()  # never-read ones too, as the layouts leave them out
        if not indices or any(i not in gpus.lost and i not in unread for i in indices):
            return ""
        if self.every_gpu_lost():
            return f"every GPU is lost (GPU {', '.join(map(str, indices))})"
        return ", ".join(
            f"GPU {i} lost" if i in gpus.lost else f"GPU {i} cannot be read ({unread[i]})"
            for i in indices
        )

    def watch_sharing(self, show: Callable[[], SharingView]) -> None:
        """Also refresh the sharing config (the sharing service reads `layouts`, so it comes
        after this inventory is built)."""
        self._sharing_source = show

    def watch_allocation(
        self, current: Callable[[], Allocation], mig_refusal: Callable[[], str | None]
    ) -> None:
        """Show the node's allocation mode (agent.dra) and whether it refuses MIG changes
        (the MIG service's rule): read at every rebuild."""
        self._allocation_source = current
        self._mig_refusal = mig_refusal

    def watch_mig_journal(self, unrolled: Callable[[], str]) -> None:
        """Show a degraded "mig" component while ``unrolled`` says why a kept MIG journal
        could not be rolled back (the MIG service's words; "" when none is kept)."""
        self._mig_unrolled = unrolled

    def refresh_allocation(self) -> None:
        """Rebuild now if the allocation mode changed (any thread; no I/O)."""
        source = self._allocation_source
        if source is not None and source() != self._allocation:
            with self._lock:
                self._rebuild()

    # -- refreshes (blocking: worker threads) --------------------------------------------------

    def refresh_all(self) -> None:
        self.refresh_gpus()
        self.refresh_cache()
        self.refresh_sharing()

    def refresh_gpus(self, snapshot: Snapshot | None = None) -> None:
        """Take the GPUs from the telemetry sampler's snapshot (``snapshot``, or its latest):
        no NVML call of its own. A GPU down in it is reported lost with its last known layout
        (or only its index when it was lost before the agent started); the others serve."""
        with self._lock:
            if snapshot is None and self._telemetry is not None:
                snapshot = self._telemetry()
            if snapshot is None:
                return  # nothing collected yet: GetNode keeps saying "not read yet"
            before = self._gpus
            if snapshot.taken_mono < before.taken_mono:
                return  # the 1 s refresh raced a newer snapshot pushed by the sampler
            by_index = {layout.gpu.index: layout for layout in snapshot.layouts}
            layouts: list[GpuLayout] = []
            lost: dict[int, str] = {}
            unread: dict[int, str] = {}
            never: set[int] = set()
            for status in snapshot.gpus:
                index = status.gpu.index
                layout = by_index.get(index)
                if layout is None:
                    never.add(index)
                    layout = _placeholder(status)
                layouts.append(layout)
                if status.up is False:
                    lost[index] = status.detail or "the GPU does not answer"
                elif status.unread:
                    unread[index] = status.unread
            problems = [f"GPU {i} lost: {why}" for i, why in lost.items()]
            problems += [f"GPU {i} not read: {why}" for i, why in unread.items()]
            self._gpus = _Gpus(
                healthy=not problems,
                detail="; ".join(problems) or f"{len(layouts)} GPU(s) read",
                read_at=snapshot.taken_at,
                taken_mono=snapshot.taken_mono,
                layouts=tuple(layouts),
                lost=lost,
                unread=unread,
                never_read=frozenset(never),
                driver_version=snapshot.driver_version,
                driver=agent_pb2.Driver(state=agent_pb2.DRIVER_STATE_ATTACHED),
            )
            self._announce(before, self._gpus)
            self._announce_xids()
            self._rebuild(snapshot)

    def follow(self, link: DriverLink) -> None:
        """GetNode lists the GPUs once the driver attached, and says why while it is away."""
        link.register(
            attach=lambda _: self.refresh_gpus(),
            detach=lambda gone: self.driver_missing(gone.cause, gone.reason),
        )

    def driver_missing(self, cause: str, reason: str) -> None:
        """The driver is not attached (yet, or any more): no GPUs; GetNode's `Driver` says
        so with its cause (``library_not_found``, ...), which every client's GPU read refuses
        on (`NodeView.require_driver`), and the gpu-driver component says it in words.
        The next snapshot after an attach replaces this."""
        with self._lock:
            self._gpus = _Gpus(
                healthy=False,
                detail=f"{DRIVER_NOT_READY} ({cause}): {reason}",
                read_at=self._clock(),
                taken_mono=self._monotonic(),
                driver=agent_pb2.Driver(
                    state=agent_pb2.DRIVER_STATE_NOT_READY, cause=cause, reason=reason
                ),
            )
            self._rebuild()

    def refresh_sharing(self) -> None:
        if self._sharing_source is None:
            return
        with self._lock:
            try:
                view = self._sharing_source()
            except AgentError as exc:
                self._sharing_pb = None  # unreadable now: unknown, not the last one read
                self._sharing_pickup = ""
                self._sharing = _Part(False, str(exc), self._clock())
            else:
                self._sharing_pb = sharing_config_pb(view.config)
                self._sharing_pickup = view.pickup.state
                self._sharing = _Part(*sharing_health(view), self._clock())
            self._rebuild()

    def refresh_cache(self) -> None:
        if self._cache_source is None:
            return
        with self._lock:
            try:
                inv = self._cache_source()
            except (AgentError, OSError) as exc:  # the cache dir gone or unreadable: not fatal
                self._cache = _Part(False, str(exc), self._clock())
            else:
                self._cache_pb = cache_inventory_pb(inv.usage, inv.items)
                self._cache = _Part(True, f"{len(inv.items)} item(s)", self._clock())
            self._rebuild()

    def _announce(self, before: _Gpus, after: _Gpus) -> None:
        old = {layout.gpu.uuid: layout for layout in before.layouts}
        for layout in after.layouts:
            uuid, index = layout.gpu.uuid, layout.gpu.index
            if index in after.lost:
                if index not in before.lost:
                    log.error(
                        "GPU %d (%s) lost: %s", index, uuid or "uuid unknown", after.lost[index]
                    )
                    self._bus.publish(gpu_lost=gpu_lost_event_pb(layout, after.lost[index]))
                continue
            if index in before.lost:
                log.warning("GPU %d (%s) answers NVML again", index, uuid or "uuid unknown")
            prior = old.get(uuid)
            if prior is not None and _mig_shape(prior) != _mig_shape(layout):
                self._bus.publish(mig_layout=mig_layout_event_pb(layout))

    def _announce_xids(self) -> None:
        if self._xid_source is None:
            return
        counts = dict(self._xid_source())
        by_index = {layout.gpu.index: layout.gpu.uuid for layout in self._gpus.layouts}
        for key, count in counts.items():
            new = count - self._xids_seen.get(key, 0)
            if new > 0:
                index, gi, xid = key
                self._bus.publish(xid=xid_event_pb(index, by_index.get(index, ""), gi, xid, new))
        self._xids_seen = counts

    def _rebuild(self, snapshot: Snapshot | None = None) -> None:
        gpus = self._gpus
        if snapshot is None and self._telemetry is not None:
            snapshot = self._telemetry()
        idle = snapshot.gpu_idle_seconds() if snapshot is not None else {}
        parts: list[tuple[str, _Part]] = [("gpu-driver", gpus)]
        if self._sharing_source is not None:
            parts.append(("sharing", self._sharing))
        if self._cache_source is not None:
            parts.append(("cache", self._cache))
        components = [
            agent_pb2.ComponentHealth(name=name, healthy=part.healthy, detail=part.detail)
            for name, part in parts
        ]
        if self._xid_unwatched is not None and gpus.driver.state == agent_pb2.DRIVER_STATE_ATTACHED:
            why = self._xid_unwatched()
            components.append(
                agent_pb2.ComponentHealth(
                    name="xid-events", healthy=why is None, detail=why or "watched on every GPU"
                )
            )
        if snapshot is not None and snapshot.sources:
            components.append(_telemetry_health(snapshot))
        for name, said in (("state", self._state_health), ("kubernetes", self._kube_health)):
            if said is not None:
                healthy, detail = said()
                components.append(
                    agent_pb2.ComponentHealth(name=name, healthy=healthy, detail=detail)
                )
        unrolled = self._mig_unrolled()
        if unrolled:
            components.append(agent_pb2.ComponentHealth(name="mig", healthy=False, detail=unrolled))
        node = agent_pb2.Node(
            name=self._node_name,
            driver_version=gpus.driver_version,
            gpus=[
                gpu_pb(
                    layout,
                    lost=layout.gpu.index in gpus.lost,
                    idle_seconds=idle.get(layout.gpu.uuid),
                    lost_detail=gpus.lost.get(layout.gpu.index, ""),
                    unread=gpus.unread.get(layout.gpu.index, ""),
                    never_read=layout.gpu.index in gpus.never_read,
                )
                for layout in gpus.layouts
            ],
            health=agent_pb2.NodeHealth(
                healthy=all(c.healthy for c in components), components=components
            ),
            observe_time=timestamp(gpus.read_at),
            simulated_preset=self._preset,
            agent_version=__version__,
            driver=gpus.driver,
        )
        self._conditions(node)
        if self._allocation_source is not None:
            self._allocation = self._allocation_source()
            node.allocation.CopyFrom(allocation_pb(self._allocation))
            node.allocation.mig_refusal = self._mig_refusal() or ""
        if self._sharing_pb is not None:
            node.sharing.CopyFrom(self._sharing_pb)
            node.sharing_pickup = self._sharing_pickup
        if self._cache_pb is not None:
            node.cache.CopyFrom(self._cache_pb)
        self._response = agent_pb2.GetNodeResponse(node=node)
        redacted = agent_pb2.GetNodeResponse()
        redacted.CopyFrom(self._response)
        for gpu in redacted.node.gpus:
            del gpu.processes[:]
            # A health mark names the pods on its GPU or instance when it was entered.
            del gpu.condition.pods[:]
            for gi in gpu.instances:
                del gi.condition.pods[:]
        redacted.node.processes_hidden = True
        self._redacted = redacted

    def _conditions(self, node: agent_pb2.Node) -> None:
        if self._health is None:
            return
        marks = self._health()
        for gpu in node.gpus:
            uuid = Target.gpu(gpu.uuid, gpu.index).gpu_uuid
            found = marks.get(Target(uuid))
            if found is not None:
                gpu.condition.CopyFrom(health_mark_pb(found[1], found[2]))
            for gi in gpu.instances:
                found = marks.get(Target(uuid, gi.id))
                if found is not None:
                    gi.condition.CopyFrom(health_mark_pb(found[1], found[2]))

    # -- the background loop --------------------------------------------------------------------

    def settle(self) -> None:
        """Blocking (worker threads only): return once GetNode shows the GPUs as they are now,
        after a change the agent finished (a MIG apply), not a snapshot taken while it ran."""
        if self._fresh is not None and self._fresh():
            self.refresh_gpus()
        self.poke()

    def poke(self) -> None:
        """Refresh everything soon (after the agent changed the node); safe from any thread.
        The GPUs come with the sampler's next snapshot, which this asks for at once."""
        if self._wake is not None:
            self._wake()
        poked, loop = self._poked, self._loop
        if poked is not None and loop is not None:
            call_soon_from_thread(loop, poked.set)

    async def run(self) -> None:
        """Refresh until cancelled; a failed read is reported in health, never fatal."""
        self._loop = asyncio.get_running_loop()
        self._poked = asyncio.Event()
        due = {"gpus": 0.0, "cache": 0.0, "sharing": 0.0}
        every = {"gpus": GPU_EVERY_S, "cache": CACHE_EVERY_S, "sharing": SHARING_EVERY_S}
        refresh = {
            "gpus": self.refresh_gpus,
            "cache": self.refresh_cache,
            "sharing": self.refresh_sharing,
        }
        while True:
            now = time.monotonic()
            for part, at in due.items():
                if at <= now:
                    await asyncio.to_thread(refresh[part])
                    due[part] = time.monotonic() + every[part]
            wait = max(min(due.values()) - time.monotonic(), 0.0)
            try:
                await asyncio.wait_for(self._poked.wait(), wait)
            except TimeoutError:
                continue
            self._poked.clear()
            due = dict.fromkeys(due, 0.0)


def _telemetry_health(snapshot: Snapshot) -> agent_pb2.ComponentHealth:
    """The "telemetry" component: its sources (readers) of the latest tick, and why each that
    was not read (kubelet failing, DCGM's hostengine gone, ...) is degraded."""
    down = [f"{s.source}: {s.degraded}" for s in snapshot.sources if s.degraded is not None]
    read = ", ".join(s.source for s in snapshot.sources)
    return agent_pb2.ComponentHealth(
        name="telemetry", healthy=not down, detail="; ".join(down) or f"every source read: {read}"
    )


def _placeholder(status: GpuStatus) -> GpuLayout:
    """A GPU whose layout was never read: only what its status knows (its index, maybe a
    UUID); the zeros are sent with ``never_read``, which says they are unknown."""
    g = status.gpu
    return GpuLayout(GpuInfo(g.index, g.uuid, g.name, g.pci_bus_id, 0, 0, 0, None), (), (), ())


def _mig_shape(layout: GpuLayout) -> tuple[object, ...]:
    mode = layout.gpu.mig_mode
    return (
        None if mode is None else (mode.current, mode.pending),
        tuple((gi.profile_id, gi.placement, gi.compute_instances) for gi in layout.instances),
    )


def sharing_health(view: SharingView) -> tuple[bool, str]:
    """The sharing component's (healthy, detail): degraded while the file breaks a rule, the
    plugin has not loaded it (``plugin not-loaded: why``; GetNode's ``sharing_pickup``) or
    whether it has cannot be seen (no hostPID), or a DRA node's DeviceClasses could not be
    read; the plugin's pickup state is always said."""
    said = [f"plugin {view.pickup.state}: {view.pickup.detail}"]
    # Without hostPID whether the plugin runs the file cannot be checked: degraded, not fine.
    bad = view.pickup.state == "not-loaded" or unobservable(view.pickup)
    if view.dra is not None and view.dra.error:
        said.append(f"DeviceClasses not read: {view.dra.error}")
        bad = True
    problems = "; ".join(map(str, view.problems))
    if problems:
        said.insert(0, problems)
    return not (bad or problems), "; ".join(said)
