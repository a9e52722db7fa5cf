"""The processes reader: per-container GPU memory and SM utilisation of the entities the
attribution stage found held (agent/telemetry/attribution.py), from NVML's process lists and
each process's cgroup under the host's /proc. A GPU whose list fails gives no rows this tick,
and the source is degraded naming it and the failing call; the others go on.

Per tick it re-reads only what can have changed: the process lists are the ones the frame read
for the planner's layout (one call per GPU; per MIG device only where that read failed), a
process's cgroup is read once while NVML keeps reporting its PID on the same GPU instance from
one tick to the next (a PID reused by another pod's process has to leave the list first), and
an entity whose holders and processes are what they were keeps last tick's rows."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from agent.errors import AgentError, DeviceLost, NotSupported
from agent.gpu.readings import MigLayout, NodeReader
from agent.gpu.types import Process
from agent.telemetry.procs import ContainerDirectory, read_container_id
from agent.telemetry.reader import Frame, Part, Reader
from agent.telemetry.snapshot import Entity, PodRef, PodUsage
from agent.telemetry.stats import TelemetryStats
from agent.telemetry.usage import UNMAPPED, Unmapped, pod_usage

log = logging.getLogger(__name__)

#: (PID, GPU index, GPU instance id or None): a process where NVML reports it
_Seen = tuple[int, int, int | None]
#: an entity's holders and processes, and the rows they gave
_Rows = tuple[tuple[PodRef, ...], tuple[Process, ...], list[PodUsage]]

__all__ = ["ProcessReader"]


class ProcessReader(Reader):
    name = "processes"
    after_attribution = True

    def __init__(
        self,
        reader: NodeReader,
        stats: TelemetryStats,
        proc_root: Path,
        containers: ContainerDirectory | None,
        interval_s: float,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._reader = reader
        self._stats = stats
        self._proc_root = proc_root
        self._containers = containers
        self._interval_s = interval_s
        self._wall = wall_clock
        #: GPU -> NVML timestamp (µs) of the newest utilisation sample; -1: unsupported there
        self._util_since_us: dict[int, int] = {}
        #: container ids (None: a host process) of the processes read last tick, and this one
        self._cids: dict[_Seen, str | None] = {}
        self._cids_next: dict[_Seen, str | None] = {}
        #: entity -> its rows of this tick, where no utilisation applies and all were mapped
        self._rows: dict[Entity, _Rows] = {}
        #: this tick's ``Frame.ours``: whether this agent changed a GPU since the tick began
        self._ours: Callable[[int], bool] = lambda _gpu: False

    def read(self, frame: Frame) -> Part:
        """The usage rows of every held entity; the one holder's rows carry its DRA claim."""
        result = frame.attribution
        self._ours = frame.ours
        # A GPU whose process list the frame could not read: said, naming the GPU and the call,
        # so no one takes the lists served as current (GetNode's are withheld meanwhile).
        unread = "; ".join(f"GPU {i}: {why}" for i, why in sorted(frame.unread.items())) or None
        if result is None:
            return Part(degraded=unread)
        out: list[PodUsage] = []
        self._cids, self._cids_next = self._cids_next, {}
        kept, self._rows = self._rows, {}
        for sample in result.samples:
            allocated = result.holders.get(sample.entity)
            if not allocated:
                continue
            index = sample.entity.gpu.index
            listed = frame.processes.get(index)
            rows = self.usage(sample.entity, frame.layouts[index], allocated, listed, kept)
            claim, uid = sample.claim, sample.pod_uid
            if claim is not None:
                rows = [
                    replace(r, claim=claim, pod_uid=uid) if r.pod == sample.pod else r for r in rows
                ]
            out.extend(rows)
        return Part(usage=tuple(out), degraded=unread)

    def usage(
        self,
        entity: Entity,
        layout: MigLayout,
        allocated: tuple[PodRef, ...],
        listed: tuple[Process, ...] | None = None,
        kept: Mapping[Entity, _Rows] | None = None,
    ) -> list[PodUsage]:
        """One row per container of ``allocated`` on ``entity``. ``listed``: the GPU's process
        list read this tick, if any; ``kept``: last tick's rows, reused where nothing changed."""
        try:
            processes, util = self._processes(entity, layout, listed)
        except DeviceLost:
            return []
        except AgentError as exc:
            if not self._ours(entity.gpu.index):  # not one that met this agent's MIG change
                self._stats.error("nvml")
            log.debug("process list of %s failed: %s", entity, exc)
            return []
        last = (kept or {}).get(entity)
        if util is None and last is not None and last[:2] == (allocated, processes):
            self._keep(entity, processes)
            self._rows[entity] = last
            return last[2]
        rows, unmapped = pod_usage(
            entity, allocated, processes, lambda pid: self._pod_of_pid(entity, pid), util
        )
        if unmapped:
            # Unknown, not 0: the rows go without a memory figure (gpu_agent_pod_memory_used_bytes
            # has none) and the failures are counted.
            self._stats.error("pod_mapping", unmapped)
            log.debug("%s: %d process(es) not mapped to a container", entity, unmapped)
        elif util is None:
            self._rows[entity] = (allocated, processes, rows)
        return rows

    def _processes(
        self, entity: Entity, layout: MigLayout, listed: tuple[Process, ...] | None
    ) -> tuple[tuple[Process, ...], dict[int, float] | None]:
        """The entity's processes, and per-process SM utilisation where NVML has it."""
        gpu = entity.gpu.index
        if entity.instance is None:
            if layout.enabled:
                return (), None
            processes = self._reader.processes(gpu) if listed is None else listed
            return processes, self._process_util(gpu)
        gi = entity.instance.gpu_instance_id
        if listed is not None:
            return tuple(p for p in listed if p.gpu_instance_id == gi), None
        instance = next(i for i in layout.instances if i.id == gi)
        return tuple(p for d in instance.devices for p in self._reader.processes(gpu, d.uuid)), None

    def _keep(self, entity: Entity, processes: tuple[Process, ...]) -> None:
        """Carry the entity's processes' container ids into the next tick unread."""
        gi = None if entity.instance is None else entity.instance.gpu_instance_id
        for p in processes:
            seen = (p.pid, entity.gpu.index, gi)
            if seen in self._cids:
                self._cids_next[seen] = self._cids[seen]

    def _process_util(self, gpu: int) -> dict[int, float] | None:
        since_us = self._util_since_us.get(gpu, 0)
        if since_us < 0:
            return None  # NVML said unsupported on this GPU
        since = since_us or int((self._wall() - self._interval_s) * 1e6)
        try:
            util, newest = self._reader.process_utilization(gpu, since)
        except NotSupported as exc:
            self._util_since_us[gpu] = -1
            log.warning("per-process utilisation is not supported on GPU %d: %s", gpu, exc)
            return None
        self._util_since_us[gpu] = newest
        return util

    def _pod_of_pid(self, entity: Entity, pid: int) -> PodRef | Unmapped | None:
        if self._containers is None:
            return UNMAPPED
        gi = None if entity.instance is None else entity.instance.gpu_instance_id
        seen = (pid, entity.gpu.index, gi)
        if seen in self._cids:
            cid = self._cids[seen]  # reported there last tick too: the same process
        else:
            try:
                cid = read_container_id(self._proc_root, pid)
            except OSError:
                return UNMAPPED  # no host /proc (hostPID off), or the process is not ours to read
        self._cids_next[seen] = cid
        if cid is None:
            return None  # a host process
        pod = self._containers.lookup(cid)
        return UNMAPPED if pod is None else pod
