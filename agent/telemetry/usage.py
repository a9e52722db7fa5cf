"""Each pod's own use of a shared GPU or instance, from NVML's per-process data.

Processes are mapped to containers through their cgroup (``procs.py``). Every container kubelet
allocated the device to gets a row, 0 when it runs nothing there; a container with processes on a
device it was not allocated (e.g. one that sees all GPUs) gets a row too, because the use is real.
Processes outside pods (host daemons) are not attributed. A process that cannot be mapped (its
cgroup unreadable, or a container id kubelet does not list) could be any container's, so every
container on that device has unknown use (no row, never 0) and the caller counts the failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from agent.gpu.types import Process
from agent.telemetry.snapshot import Entity, PodRef, PodUsage


class Unmapped:
    """A process whose container cannot be told (see the module doc)."""

    def __repr__(self) -> str:
        return "UNMAPPED"


UNMAPPED = Unmapped()


def pod_usage(
    entity: Entity,
    allocated: Iterable[PodRef],
    processes: Iterable[Process],
    pod_of_pid: Callable[[int], PodRef | Unmapped | None],
    sm_percent_by_pid: Mapping[int, float] | None,
) -> tuple[list[PodUsage], int]:
    """(one row per container on ``entity`` sorted by pod, processes that could not be mapped).

    ``pod_of_pid`` gives a process's container, None for a host process, or ``UNMAPPED``.
    ``sm_percent_by_pid`` is None where NVML has no per-process utilisation (MIG), which leaves
    ``sm_utilization`` None rather than 0. Memory is None for a container whose processes NVML
    reports without a memory figure, and for every container when a process is unmapped.
    """
    memory: dict[PodRef, float | None] = {pod: 0.0 for pod in allocated}
    util: dict[PodRef, float] = {pod: 0.0 for pod in memory}
    unmapped = 0
    for process in processes:
        pod = pod_of_pid(process.pid)
        if isinstance(pod, Unmapped):
            unmapped += 1
            continue
        if pod is None:
            continue
        used = memory.get(pod, 0.0)
        if used is None or process.used_memory_bytes is None:
            memory[pod] = None
        else:
            memory[pod] = used + process.used_memory_bytes
        util[pod] = util.get(pod, 0.0) + (sm_percent_by_pid or {}).get(process.pid, 0.0)
    rows = [
        PodUsage(
            entity,
            pod,
            memory_used_bytes=None if unmapped else memory[pod],
            sm_utilization=None
            if sm_percent_by_pid is None or unmapped
            else min(util[pod], 100.0) / 100,
        )
        for pod in sorted(memory)
    ]
    return rows, unmapped
