"""The collection loop: one thread runs the chosen readers once per interval into a Snapshot.

Per tick: the frame (which GPUs answer, their MIG layouts: ``topology.py``), then every reader
chosen for the counters (``readers.py``; one per source: NVML device readings, GPM, DCGM, XIDs,
kubelet's pod resources, DRA claims) against it, their parts merged; then the attribution stage
(``attribution.py``) and the readers that need it (processes); then one immutable
:class:`Snapshot` is published, which is all a scrape ever reads.

A reader that raises degrades alone: its series are absent this tick (never 0), the snapshot
names it with the reason (``gpu_agent_collection_source_up``), the others publish as usual.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from agent.gpu.readings import GpuIdentity, MigLayout
from agent.telemetry.attribution import Attribution, attribute_samples
from agent.telemetry.idle import IdleTracker
from agent.telemetry.pods import UnresolvedClaims
from agent.telemetry.procs import ContainerDirectory
from agent.telemetry.reader import Frame, Part, Reader, merge
from agent.telemetry.snapshot import (
    Entity,
    EntitySample,
    GpuStatus,
    HealthReadings,
    InstanceIdentity,
    Snapshot,
    SourceStatus,
)
from agent.telemetry.stats import TelemetryStats
from agent.telemetry.support import SupportBook
from agent.telemetry.topology import Topology
from dcgm.fields import Field

log = logging.getLogger(__name__)

__all__ = ["Sampler", "SamplerOptions"]

_REASON_MAX = 200  # a degraded reader's reason, as a label value


@dataclass(frozen=True)
class SamplerOptions:
    interval_s: float = 1.0
    idle_threshold_percent: float = 5.0
    hostname: str = ""
    #: root of /proc for the processes' cgroups (the simulator keeps its own)
    proc_root: Path = Path("/proc")


class Sampler:
    """Collects on its own thread; :meth:`latest` is what scrapes render."""

    def __init__(
        self,
        topology: Topology,
        readers: Sequence[Reader],
        selected: Sequence[Field],
        stats: TelemetryStats,
        options: SamplerOptions,
        *,
        containers: ContainerDirectory | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._topology = topology
        self._readers = tuple(readers)
        self._stats = stats
        self._options = options
        self._containers = containers
        self._unresolved = UnresolvedClaims(stats)
        self._support = SupportBook(selected)
        self._clock = clock
        self._wall = wall_clock
        #: counted from this sampler's first reading of each entity (agent/telemetry/idle.py)
        self._idle = IdleTracker(options.idle_threshold_percent)
        #: reader -> why it failed last tick, for logging each change once
        self._degraded: dict[str, str | None] = {}
        self._latest: Snapshot | None = None
        self._subscribers: list[Callable[[Snapshot], None]] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: ticks started / the latest tick finished, for :meth:`fresh`
        self._ticks = threading.Condition()
        self._started_seq = 0
        self._done_seq = 0

    # -- lifecycle --------------------------------------------------------------------------------

    def latest(self) -> Snapshot | None:
        return self._latest

    def subscribe(self, callback: Callable[[Snapshot], None]) -> None:
        """Call ``callback`` on the sampler thread with every snapshot, just before publishing."""
        self._subscribers.append(callback)

    def start(self) -> None:
        self.tick()
        self._thread = threading.Thread(target=self._run, name="gpu-agent-sampler", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Collect now rather than at the next interval (after the agent changed a GPU)."""
        self._wake.set()

    def fresh(self, timeout_s: float = 5.0) -> bool:
        """Block until a snapshot collected after this call is published (waking the sampler),
        so what the agent just changed is in it. False on timeout, or with no sampler thread."""
        if self._thread is None or not self._thread.is_alive():
            return False
        with self._ticks:
            target = self._started_seq + 1
        self.wake()
        with self._ticks:
            return self._ticks.wait_for(lambda: self._done_seq >= target, timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        for reader in self._readers:
            reader.close()

    def _run(self) -> None:
        interval = self._options.interval_s
        deadline = self._clock() + interval
        while True:
            self._wake.wait(max(0.0, deadline - self._clock()))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:
                self._stats.error("sampler")
                log.exception("telemetry collection failed; serving the previous snapshot")
            # Fixed rate; after an overrun, skip the missed ticks rather than bursting. A tick
            # woken early (``wake``) that ended before the deadline leaves it where it is: moving
            # it on per woken tick put a burst of N wake-ups N intervals ahead (after a run of
            # API changes, no snapshot for as many seconds).
            now = self._clock()
            if now >= deadline:
                deadline = max(deadline + interval, now)

    # -- one tick ---------------------------------------------------------------------------------

    def tick(self) -> Snapshot:
        """Collect once and publish the snapshot."""
        with self._ticks:
            self._started_seq += 1
            seq = self._started_seq
        try:
            return self._tick()
        finally:
            with self._ticks:
                self._done_seq = max(self._done_seq, seq)
                self._ticks.notify_all()

    def _tick(self) -> Snapshot:
        started = self._clock()
        taken_at = self._wall()
        if self._containers is not None:
            self._containers.begin()
        driver, nvml = self._topology.versions()
        frame = self._topology.frame(started)
        self._stats.observe_source("layouts", self._clock() - started)
        self._support.reset(frame.changed)
        statuses: list[SourceStatus] = []
        early = merge(self._read(frame, statuses, after_attribution=False))
        gpus, answered = self._topology.settle(frame, early.lost, early.failed)
        attributed = self._attribute(frame, answered, early)
        # A GPU this agent changes is not read this tick: not a process list that failed.
        unread = {i: why for i, why in frame.unread.items() if not frame.ours(i)}
        late_frame = replace(frame, layouts=answered, attribution=attributed, unread=unread)
        late = merge(self._read(late_frame, statuses, after_attribution=True))
        # What a GPU this agent changed meanwhile refused is no fact of its new layout: it is
        # asked again next tick (``Topology.settle``), and said then.
        changed = self._topology.reconfigured
        self._support.note(
            n for n in (*early.unsupported, *late.unsupported) if n[0] not in changed
        )
        snapshot = Snapshot(
            taken_at=taken_at,
            taken_mono=started,
            hostname=self._options.hostname,
            driver_version=driver,
            nvml_version=nvml,
            gpus=gpus,
            entities=attributed.samples,
            pods=late.usage,
            xids=early.xids,
            xid_recent=early.xid_recent,
            clock_events=early.clock_events,
            p2p=early.p2p,
            # Only for the GPUs read this tick: of one down, failing or never read, nothing is
            # read whatever it supports.
            support=self._support.rows(tuple(frame.gpus[i] for i in sorted(answered))),
            layouts=self._topology.placed(),
            health=_health(frame, answered, early, gpus),
            sources=tuple(statuses),
        )
        self._support.report(_kinds(frame))
        self._stats.observe_collection(self._clock() - started)
        # Subscribers (the exporter's pre-encoding) see it first, so no scrape finds a snapshot
        # that is published but not encoded yet.
        for callback in self._subscribers:
            callback(snapshot)
        self._latest = snapshot
        return snapshot

    def _read(
        self, frame: Frame, statuses: list[SourceStatus], *, after_attribution: bool
    ) -> Iterable[Part]:
        """Each reader of this stage's part; one that raises is reported and left out, one
        that serves its last answer (``Part.degraded``) is reported and kept."""
        parts = []
        for reader in self._readers:
            if reader.after_attribution is not after_attribution:
                continue
            began = self._clock()
            try:
                part = reader.read(frame)
            except Exception as exc:  # any source's failure is that source's alone
                statuses.append(SourceStatus(reader.name, self._degrade(reader.name, exc)))
                continue
            if part.degraded is not None:  # a kept or partial answer: not wholly read
                statuses.append(SourceStatus(reader.name, self._degrade(reader.name, part)))
            else:
                self._stats.observe_source(reader.name, self._clock() - began)
                if self._degraded.pop(reader.name, None) is not None:
                    log.warning("telemetry source %s is read again", reader.name)
                statuses.append(SourceStatus(reader.name))
            parts.append(part)
        return parts

    def _degrade(self, name: str, failure: Exception | Part) -> str:
        """The reason a reader failed (raised, its series absent) or serves a kept or partial
        answer (a part with ``degraded``); counted each tick, logged when it changes."""
        if isinstance(failure, Part):
            reason, effect = failure.degraded or "", "serving a kept or partial answer"
        else:
            reason, effect = str(failure) or type(failure).__name__, "its series are absent"
        reason = reason[:_REASON_MAX]
        self._stats.error(name)
        if self._degraded.get(name) != reason:
            log.warning("telemetry source %s failed, %s: %s", name, effect, reason)
            if isinstance(failure, Exception):
                log.debug("telemetry source %s failure", name, exc_info=failure)
        self._degraded[name] = reason
        return reason

    def _attribute(
        self, frame: Frame, answered: Mapping[int, MigLayout], part: Part
    ) -> Attribution:
        """The answering GPUs' and instances' samples, with their idle seconds, through the
        attribution stage (pods, DRA claims, MIG UUIDs)."""
        began = self._clock()
        samples: list[EntitySample] = []
        for entity, key in _entities(frame.gpus, answered):
            idle = self._idle.update(entity, part.activity.get(key), frame.now)
            values = MappingProxyType(part.values.get(key, {}))
            samples.append(EntitySample(entity, values, idle_seconds=idle))
        self._idle.retain(s.entity for s in samples)
        uids = self._containers.pod_uid if self._containers is not None else (lambda _: None)
        up = {frame.gpus[i].uuid for i in answered}
        placed = [p for p in frame.placed if p.gpu.uuid in up]
        result = attribute_samples(samples, frame.gpus, answered, placed, part.allocations, uids)
        self._unresolved.report(result.unresolved)
        self._stats.observe_source("attribution", self._clock() - began)
        return result


def _entities(
    gpus: tuple[GpuIdentity, ...], layouts: Mapping[int, MigLayout]
) -> Iterable[tuple[Entity, tuple[int, int | None]]]:
    """Each answering GPU, then its GPU instances, with their reading keys."""
    for index in sorted(layouts):
        gpu = gpus[index]
        yield Entity(gpu), (index, None)
        for instance in layouts[index].instances:
            entity = Entity(gpu, InstanceIdentity(instance.id, instance.profile))
            yield entity, (index, instance.id)


def _health(
    frame: Frame,
    answered: Mapping[int, MigLayout],
    early: Part,
    statuses: Sequence[GpuStatus],
) -> tuple[HealthReadings, ...]:
    """The health readings of each GPU that is not lost: those read, and which calls failed.
    A GPU that did not answer this tick (its collection or its layout failed, or it never
    answered) read nothing: said so, for its marks to hold and for none to be made for it."""
    out = [
        HealthReadings(frame.gpus[i], early.health[i], early.health_unread.get(i, ""))
        for i in answered
        if i in early.health
    ]
    out += [
        HealthReadings(
            frame.gpus[i],
            MappingProxyType({}),
            early.health_unread.get(i) or s.unread or "not read this tick",
        )
        for s in statuses
        if (i := s.gpu.index) not in answered and s.up is not False
    ]
    return tuple(out)


def _kinds(frame: Frame) -> dict[int, tuple[str, str]]:
    """Each read GPU's model and MIG mode, to say once what GPUs of a model do not support."""
    return {
        i: (frame.gpus[i].name or "model unknown", f"MIG {'on' if layout.enabled else 'off'}")
        for i, layout in frame.layouts.items()
    }
