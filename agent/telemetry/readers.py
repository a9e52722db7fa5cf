"""The registry of readers: which sources a counter set needs, as dcgm-exporter picks its
collectors from its counters CSV, and the sampler that runs them.

``choose`` is the plan (pure: the counters and the sources this node has in, names out);
``build_sampler`` makes the chosen readers over the node's sources and the sampler over them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.gpu.readings import NodeReader
from agent.telemetry.dcgm_backend import DcgmReader, ProfilingBackend
from agent.telemetry.devices import DeviceReader
from agent.telemetry.dra import DraDevices, DraReader
from agent.telemetry.gpm import GpmReader
from agent.telemetry.pods import PodsReader, PodWatcher
from agent.telemetry.processes import ProcessReader
from agent.telemetry.procs import ContainerDirectory
from agent.telemetry.reader import Reader
from agent.telemetry.sampler import Sampler, SamplerOptions
from agent.telemetry.stats import TelemetryStats
from agent.telemetry.topology import Topology
from agent.telemetry.xid import XidReader, XidWatcher
from dcgm.counters import CounterSet
from dcgm.fields import Gpm, XidEvents, XidWindow

__all__ = ["Sources", "build_sampler", "choose"]

#: Every reader, in the order they run: a GPU's utilisation from NVML comes before GPM's
#: GR-engine activity for idle tracking, and processes come after attribution.
ORDER = ("devices", "gpm", "dcgm", "xid", "pods", "dra", "processes")


@dataclass(frozen=True)
class Sources:
    """What this node has to read from, besides NVML (None: not here)."""

    xids: XidWatcher | None = None
    pods: PodWatcher | None = None
    dra: DraDevices | None = None
    profiling: ProfilingBackend | None = None
    containers: ContainerDirectory | None = None


def choose(counters: CounterSet, *, pods: bool, dra: bool, dcgm: bool) -> tuple[str, ...]:
    """The readers ``counters`` needs, given whether kubelet, DRA's slices and DCGM are here.

    NVML device readings and GPM always run: GPU health, layouts and idle tracking use them
    whatever the CSV selects (GPM's GR-engine activity is the only utilisation of a MIG
    instance); DCGM only for selected DCP fields; XID events for their fields; processes only
    where pods are attributed.
    """
    sources = {type(c.field.source) for c in counters.values}
    wanted = {
        "devices": True,
        "gpm": True,
        "dcgm": dcgm and Gpm in sources,
        "xid": bool(sources & {XidEvents, XidWindow}),
        "pods": pods,
        "dra": pods and dra,
        "processes": pods,
    }
    return tuple(name for name in ORDER if wanted[name])


def build_sampler(
    reader: NodeReader,
    counters: CounterSet,
    stats: TelemetryStats,
    options: SamplerOptions,
    sources: Sources = Sources(),
    *,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
) -> Sampler:
    """The sampler over the readers ``choose`` picks for ``counters`` on this node."""
    fields = [c.field for c in counters.values]
    names = choose(
        counters,
        pods=sources.pods is not None,
        dra=sources.dra is not None,
        dcgm=sources.profiling is not None,
    )
    makers: dict[str, Callable[[], Reader]] = {
        "devices": lambda: DeviceReader(reader, fields, stats),
        "gpm": lambda: GpmReader(reader, fields, stats, clock, dcgm="dcgm" in names),
        "xid": lambda: XidReader(sources.xids, fields),
        "processes": lambda: ProcessReader(
            reader, stats, options.proc_root, sources.containers, options.interval_s, wall_clock
        ),
    }
    profiling, watcher, dra = sources.profiling, sources.pods, sources.dra
    if profiling is not None:
        makers["dcgm"] = lambda: DcgmReader(profiling, fields)
    if watcher is not None:
        makers["pods"] = lambda: PodsReader(watcher)
        if dra is not None:
            makers["dra"] = lambda: DraReader(dra, watcher.current, watcher.failing)
    sampler = Sampler(
        Topology(reader, stats),
        [makers[name]() for name in names],
        fields,
        stats,
        options,
        containers=sources.containers,
        clock=clock,
        wall_clock=wall_clock,
    )
    if sources.xids is not None:
        # Whatever the counters select: a GPU lost when the event set opened is registered
        # once a tick finds it answering (the health marks need its XIDs too).
        sampler.subscribe(sources.xids.on_snapshot)
    return sampler
