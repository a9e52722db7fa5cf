"""The processes reader: per-container GPU memory and SM utilisation of the entities the
attribution stage found held (agent/telemetry/attribution.py), from NVML's process lists and
each process's cgroup under the host's /proc. A GPU whose list fails gives no rows this tick;
the others go on."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from agent.errors import AgentError, DeviceLost, NotSupported
from agent.gpu.readings import MigLayout, NodeReader
from agent.telemetry.procs import ContainerDirectory, read_container_id
from agent.telemetry.reader import Frame, Part, Reader
from agent.telemetry.snapshot import Entity, PodRef, PodUsage
from agent.telemetry.stats import TelemetryStats
from agent.telemetry.usage import UNMAPPED, Unmapped, pod_usage

log = logging.getLogger(__name__)

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

    def read(self, frame: Frame) -> Part:
        """The usage rows of every held entity; the one holder's rows carry its DRA claim."""
        result = frame.attribution
        if result is None:
            return Part()
        out: list[PodUsage] = []
        for sample in result.samples:
            allocated = result.holders.get(sample.entity)
            if not allocated:
                continue
            layout = frame.layouts[sample.entity.gpu.index]
            rows = self.usage(sample.entity, layout, allocated)
            claim, uid = sample.claim, sample.pod_uid
            if claim is not None:
                rows = [
                    replace(r, claim=claim, pod_uid=uid) if r.pod == sample.pod else r for r in rows
                ]
            out.extend(rows)
        return Part(usage=tuple(out))

    def usage(
        self, entity: Entity, layout: MigLayout, allocated: tuple[PodRef, ...]
    ) -> list[PodUsage]:
        """One row per container of ``allocated`` on ``entity``."""
        gpu = entity.gpu.index
        try:
            if entity.instance is None:
                processes = self._reader.processes(gpu) if not layout.enabled else ()
                util = None if layout.enabled else self._process_util(gpu)
            else:
                instance = next(
                    i for i in layout.instances if i.id == entity.instance.gpu_instance_id
                )
                processes = tuple(
                    p for d in instance.devices for p in self._reader.processes(gpu, d.uuid)
                )
                util = None
        except DeviceLost:
            return []
        except AgentError as exc:
            self._stats.error("nvml")
            log.debug("process list of %s failed: %s", entity, exc)
            return []
        rows, unmapped = pod_usage(entity, allocated, processes, self._pod_of_pid, util)
        if unmapped:
            # Unknown, not 0: the rows go without a memory figure (gpu_agent_pod_memory_used_bytes
            # has none) and the failures are counted.
            self._stats.error("pod_mapping", unmapped)
            log.debug("%s: %d process(es) not mapped to a container", entity, unmapped)
        return rows

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

    def _pod_of_pid(self, pid: int) -> PodRef | Unmapped | None:
        if self._containers is None:
            return UNMAPPED
        try:
            cid = read_container_id(self._proc_root, pid)
        except OSError:
            return UNMAPPED  # no host /proc (hostPID off), or the process is not ours to read
        if cid is None:
            return None  # a host process
        pod = self._containers.lookup(cid)
        return UNMAPPED if pod is None else pod
