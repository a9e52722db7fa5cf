"""The node inventory GetNode serves: rebuilt in the background, read without any I/O.

A request never calls NVML, reads a file or queries SQLite: it takes the latest prebuilt
response (one reference, swapped whole). Background refreshes read the GPUs every second, the
cache every 2 s and the sharing config (which scans processes for the device plugin) every 5 s;
`poke` refreshes at once after a change the agent made. Each GPU also carries its idle seconds
from the telemetry sampler's latest snapshot (taken at every rebuild, without NVML), so the
coordinator's sweep needs no second call per node. Refreshing also notices MIG layout
changes and lost GPUs and publishes them as events.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agent import __version__
from agent._proto.gpuagent.v1 import agent_pb2, cache_pb2, events_pb2, sharing_pb2
from agent.api.convert import (
    cache_inventory_pb,
    gpu_instance_pb,
    gpu_pb,
    sharing_config_pb,
    timestamp,
)
from agent.api.events import EventBus
from agent.errors import AgentError, DeviceLost
from agent.gpu import GpuDriver
from agent.gpu.types import GpuLayout
from agent.prewarm.inventory import Inventory as CacheInventory
from agent.sharing import SharingView
from agent.telemetry.snapshot import Snapshot
from agent.telemetry.xid import xid_message

log = logging.getLogger(__name__)

__all__ = ["NodeInventory"]

XidKey = tuple[int, int | None, int]  # (GPU index, GPU instance id or None, XID)

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
    lost: dict[str, str] = field(default_factory=dict)  # uuid -> the driver's error
    driver_version: str = ""


class NodeInventory:
    def __init__(
        self,
        gpu: GpuDriver,
        bus: EventBus,
        *,
        node_name: str,
        simulated_preset: str | None,
        cache: Callable[[], CacheInventory] | None = None,
        xids: Callable[[], Mapping[XidKey, int]] | None = None,
        telemetry: Callable[[], Snapshot | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._gpu = gpu
        self._bus = bus
        self._node_name = node_name
        self._preset = simulated_preset or ""
        self._sharing_source: Callable[[], SharingView] | None = None
        self._cache_source = cache
        self._xid_source = xids
        self._xids_seen: dict[XidKey, int] = {}
        self._telemetry = telemetry
        self._clock = clock
        self._lock = threading.Lock()  # one refresher of each part at a time
        self._gpus = _Gpus()
        self._sharing = _Part()
        self._sharing_pb: sharing_pb2.SharingConfig | None = None
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
        """The latest GPU layouts, for services that need the node's shape without NVML."""
        return self._gpus.layouts

    def watch_sharing(self, show: Callable[[], SharingView]) -> None:
        """Also refresh the sharing config (the sharing service reads `layouts`, so it comes
        after this inventory is built)."""
        self._sharing_source = show

    # -- refreshes (blocking: worker threads) --------------------------------------------------

    def refresh_all(self) -> None:
        self.refresh_gpus()
        self.refresh_cache()
        self.refresh_sharing()

    def refresh_gpus(self) -> None:
        with self._lock:
            before = self._gpus
            now = self._clock()
            try:
                infos = self._gpu.gpus()
                uuids = [g.uuid for g in infos]
                driver = self._gpu.driver_version()
            except AgentError as exc:
                # The whole enumeration failed (a lost GPU breaks it): keep the known GPUs.
                uuids = [layout.gpu.uuid for layout in before.layouts]
                driver = before.driver_version
                enumeration_error: str | None = str(exc)
            else:
                enumeration_error = None
            layouts: list[GpuLayout] = []
            lost: dict[str, str] = {}
            known = {layout.gpu.uuid: layout for layout in before.layouts}
            for uuid in uuids:
                try:
                    layouts.append(self._gpu.layout(uuid))
                except DeviceLost as exc:
                    lost[uuid] = str(exc)
                    if uuid in known:
                        layouts.append(known[uuid])
                except AgentError as exc:
                    log.warning("cannot read GPU %s: %s", uuid, exc)
                    if uuid in known:
                        layouts.append(known[uuid])
            layouts.sort(key=lambda layout: layout.gpu.index)
            problems = [enumeration_error] if enumeration_error else []
            problems += [f"GPU {u} lost: {why}" for u, why in lost.items()]
            self._gpus = _Gpus(
                healthy=not problems,
                detail="; ".join(problems) or f"{len(layouts)} GPU(s) read",
                read_at=now,
                layouts=tuple(layouts),
                lost=lost,
                driver_version=driver,
            )
            self._announce(before, self._gpus)
            self._announce_xids()
            self._rebuild()

    def refresh_sharing(self) -> None:
        if self._sharing_source is None:
            return
        with self._lock:
            try:
                view = self._sharing_source()
            except AgentError as exc:
                self._sharing = _Part(False, str(exc), self._clock())
            else:
                self._sharing_pb = sharing_config_pb(view.config)
                problems = "; ".join(f"{p.field}: {p.description}" for p in view.problems)
                self._sharing = _Part(
                    not problems, problems or f"plugin {view.pickup.state}", self._clock()
                )
            self._rebuild()

    def refresh_cache(self) -> None:
        if self._cache_source is None:
            return
        with self._lock:
            try:
                inv = self._cache_source()
            except AgentError as exc:
                self._cache = _Part(False, str(exc), self._clock())
            else:
                self._cache_pb = cache_inventory_pb(inv.usage, inv.items)
                self._cache = _Part(True, f"{len(inv.items)} item(s)", self._clock())
            self._rebuild()

    def _announce(self, before: _Gpus, after: _Gpus) -> None:
        old = {layout.gpu.uuid: layout for layout in before.layouts}
        for layout in after.layouts:
            uuid = layout.gpu.uuid
            if uuid in after.lost:
                if uuid not in before.lost:
                    log.error(
                        "GPU %s (index %d) lost: %s", uuid, layout.gpu.index, after.lost[uuid]
                    )
                    self._bus.publish(gpu_lost=_gpu_lost(layout, after.lost[uuid]))
                continue
            prior = old.get(uuid)
            if prior is not None and _mig_shape(prior) != _mig_shape(layout):
                self._bus.publish(mig_layout=_mig_layout_event(layout))

    def _announce_xids(self) -> None:
        if self._xid_source is None:
            return
        counts = dict(self._xid_source())
        by_index = {layout.gpu.index: layout.gpu.uuid for layout in self._gpus.layouts}
        for key, count in counts.items():
            new = count - self._xids_seen.get(key, 0)
            if new > 0:
                index, gi, xid = key
                self._bus.publish(
                    xid=events_pb2.XidEvent(
                        gpu_index=index,
                        gpu_uuid=by_index.get(index, ""),
                        gpu_instance_id=gi,
                        xid=xid,
                        message=xid_message(xid),
                        count=new,
                    )
                )
        self._xids_seen = counts

    def _rebuild(self) -> None:
        gpus = self._gpus
        snapshot = self._telemetry() if self._telemetry is not None else None
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
        node = agent_pb2.Node(
            name=self._node_name,
            driver_version=gpus.driver_version,
            gpus=[
                gpu_pb(
                    layout,
                    lost=layout.gpu.uuid in gpus.lost,
                    idle_seconds=idle.get(layout.gpu.uuid),
                )
                for layout in gpus.layouts
            ],
            health=agent_pb2.NodeHealth(
                healthy=all(c.healthy for c in components), components=components
            ),
            observe_time=timestamp(gpus.read_at),
            simulated_preset=self._preset,
            agent_version=__version__,
        )
        if self._sharing_pb is not None:
            node.sharing.CopyFrom(self._sharing_pb)
        if self._cache_pb is not None:
            node.cache.CopyFrom(self._cache_pb)
        self._response = agent_pb2.GetNodeResponse(node=node)
        redacted = agent_pb2.GetNodeResponse()
        redacted.CopyFrom(self._response)
        for gpu in redacted.node.gpus:
            del gpu.processes[:]
        redacted.node.processes_hidden = True
        self._redacted = redacted

    # -- the background loop --------------------------------------------------------------------

    def poke(self) -> None:
        """Refresh everything soon (after the agent changed the node); safe from any thread."""
        poked, loop = self._poked, self._loop
        if poked is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(poked.set)

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


def _mig_shape(layout: GpuLayout) -> tuple[object, ...]:
    mode = layout.gpu.mig_mode
    return (
        None if mode is None else (mode.current, mode.pending),
        tuple((gi.profile_id, gi.placement, gi.compute_instances) for gi in layout.instances),
    )


def _mig_layout_event(layout: GpuLayout) -> events_pb2.MigLayoutEvent:
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


def _gpu_lost(layout: GpuLayout, detail: str) -> events_pb2.GpuLostEvent:
    return events_pb2.GpuLostEvent(
        gpu_index=layout.gpu.index, gpu_uuid=layout.gpu.uuid, detail=detail
    )
