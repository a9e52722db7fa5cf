"""Per-pod rows from NVML's per-process data."""

from __future__ import annotations

from agent.gpu.readings import GpuIdentity
from agent.gpu.types import Process
from agent.telemetry.snapshot import Entity, PodRef
from agent.telemetry.usage import UNMAPPED, pod_usage

GPU = Entity(GpuIdentity(0, "GPU-a", "H100", "00000000:18:00.0", 0))
A, B, C = PodRef("ns", "a", "main"), PodRef("ns", "b", "main"), PodRef("other", "c", "x")
MIB = 1024 * 1024


def _proc(pid: int, mib: int | None) -> Process:
    return Process(pid, None if mib is None else mib * MIB, None, None)


def test_each_container_sums_its_own_processes() -> None:
    owners = {1: A, 2: A, 3: B, 4: None}  # pid 4: a host process
    rows, _ = pod_usage(
        GPU,
        [A, B],
        [_proc(1, 100), _proc(2, 50), _proc(3, 10), _proc(4, 999)],
        owners.get,
        {1: 30.0, 2: 10.0, 3: 5.0, 4: 50.0},
    )
    assert [(r.pod, r.memory_used_bytes, r.sm_utilization) for r in rows] == [
        (A, 150 * MIB, 0.4),
        (B, 10 * MIB, 0.05),
    ]


def test_an_allocated_container_without_processes_uses_nothing() -> None:
    rows, _ = pod_usage(GPU, [A], [], {}.get, {})
    assert [(r.memory_used_bytes, r.sm_utilization) for r in rows] == [(0.0, 0.0)]


def test_a_container_using_a_gpu_it_was_not_given_is_shown() -> None:
    rows, _ = pod_usage(GPU, [A], [_proc(7, 20)], {7: C}.get, None)
    assert [(r.pod, r.memory_used_bytes) for r in rows] == [(A, 0.0), (C, 20 * MIB)]


def test_unknown_memory_and_missing_utilisation_are_not_zero() -> None:
    """MIG has no per-process utilisation; NVML may report no memory figure (practice 8)."""
    rows, _ = pod_usage(GPU, [A], [_proc(1, None), _proc(2, 5)], {1: A, 2: A}.get, None)
    assert [(r.memory_used_bytes, r.sm_utilization) for r in rows] == [(None, None)]


def test_an_unmapped_process_makes_every_container_unknown_not_zero() -> None:
    """Its memory could be anyone's: no figure (no gpu_agent_pod_memory_used_bytes row) for any
    container on the device, and the count for the error counter."""
    owners = {1: A, 2: UNMAPPED, 3: None}
    rows, unmapped = pod_usage(
        GPU, [A, B], [_proc(1, 100), _proc(2, 50), _proc(3, 7)], owners.get, {1: 30.0}
    )
    assert unmapped == 1
    assert [(r.pod, r.memory_used_bytes, r.sm_utilization) for r in rows] == [
        (A, None, None),
        (B, None, None),
    ]


def test_host_processes_are_not_a_mapping_failure() -> None:
    rows, unmapped = pod_usage(GPU, [A], [_proc(3, 7)], {3: None}.get, None)
    assert unmapped == 0 and [r.memory_used_bytes for r in rows] == [0.0]
