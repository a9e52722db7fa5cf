"""The processes reader reads per tick only what can have changed: a process NVML keeps
reporting on the same GPU instance keeps its container (its cgroup is not read again); one that
left the list is read afresh when a PID comes back, so a reused PID finds its own pod."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.telemetry.pods import PodResourcesClient, PodWatcher
from agent.telemetry.procs import ContainerDirectory
from agent.telemetry.sampler import Sampler
from agent.telemetry.snapshot import PodUsage, Snapshot
from agent.telemetry.stats import TelemetryStats
from tests.unit.telemetry.kubelet import FakeKubelet, serve
from tests.unit.telemetry.simnode import SimNode, sim_node

MIB = 1024 * 1024
PID = 2000


def _cgroup(n: int) -> str:
    return f"0::/kubepods.slice/kubepods-pod{n:032x}.slice/cri-containerd-{n:064x}.scope"


@pytest.fixture
def mig_pods(tmp_path: Path) -> Iterator[tuple[SimNode, Sampler, int]]:
    """GPU 1 in MIG mode with one 1g.10gb instance, allocated to pod-a and pod-b's containers
    as a shared device (kubelet lists both); pod-a's process runs on it."""
    node = sim_node(tmp_path / "state")
    logs = tmp_path / "containers"
    logs.mkdir()
    gi = node.create_instance(1, "1g.10gb")
    ci_uuid = node.driver.layout(node.uuids[1]).instances[0].compute_instances[0].uuid or ""
    for n, pod in ((1, "pod-a"), (2, "pod-b")):
        (logs / f"{pod}_ml_main-{n:064x}.log").touch()
    rows = [("ml", pod, "main", "nvidia.com/mig-1g.10gb", [ci_uuid]) for pod in ("pod-a", "pod-b")]
    node.control.start_process(
        PID, 1, used_memory_mib=700, gpu_instance=gi.id, compute_instance=0, cgroup=_cgroup(1)
    )
    socket = tmp_path / "kubelet.sock"
    with serve(socket, FakeKubelet(rows)):
        watcher = PodWatcher(PodResourcesClient(socket), socket, 60, TelemetryStats())
        watcher.refresh()
        sampler = node.sampler(pods=watcher, containers=ContainerDirectory(logs))
        yield node, sampler, gi.id


def _rows(snapshot: Snapshot) -> dict[str, PodUsage]:
    return {u.pod.name: u for u in snapshot.pods if u.entity.gpu.index == 1}


def test_a_process_still_reported_keeps_its_pod_without_a_cgroup_read(
    mig_pods: tuple[SimNode, Sampler, int],
) -> None:
    node, sampler, gi = mig_pods
    assert _rows(sampler.tick())["pod-a"].memory_used_bytes == 700 * MIB
    # Its cgroup can no longer be read; NVML still reports it there: the same process.
    (node.control.proc_root / str(PID) / "cgroup").unlink()
    rows = _rows(sampler.tick())
    assert rows["pod-a"].memory_used_bytes == 700 * MIB
    assert rows["pod-b"].memory_used_bytes == 0.0
    # A new figure from NVML is a new row, not last tick's.
    node.control.stop_process(PID)
    node.control.start_process(PID, 1, used_memory_mib=900, gpu_instance=gi, compute_instance=0)
    assert _rows(sampler.tick())["pod-a"].memory_used_bytes == 900 * MIB


def test_a_pid_back_after_a_tick_away_is_read_again(
    mig_pods: tuple[SimNode, Sampler, int],
) -> None:
    """pod-a's process exits; a tick without it; then pod-b's process gets the same PID."""
    node, sampler, gi = mig_pods
    assert _rows(sampler.tick())["pod-a"].memory_used_bytes == 700 * MIB
    node.control.stop_process(PID)
    rows = _rows(sampler.tick())
    assert rows["pod-a"].memory_used_bytes == 0.0
    node.control.start_process(
        PID, 1, used_memory_mib=300, gpu_instance=gi, compute_instance=0, cgroup=_cgroup(2)
    )
    rows = _rows(sampler.tick())
    assert rows["pod-b"].memory_used_bytes == 300 * MIB
    assert rows["pod-a"].memory_used_bytes == 0.0
