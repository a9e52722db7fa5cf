"""Pod attribution end to end: a real gRPC PodResources server on a Unix socket, simulated GPU
processes in pod cgroups, kubelet's container log links, and the scraped /metrics text."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import TelemetrySettings
from agent.telemetry.service import TelemetryService, build_telemetry
from tests.unit.api.support import wait_for
from tests.unit.telemetry.httpd import scrape, serve_metrics
from tests.unit.telemetry.kubelet import FakeKubelet, serve
from tests.unit.telemetry.simnode import SimNode, sim_node

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
SHARED = [("team-a", "nb-1", 1000), ("team-b", "nb-2", 2000), ("team-c", "train-3", 3000)]


def _cid(n: int) -> str:
    return f"{n:064x}"


def _cgroup(n: int) -> str:
    uid = f"0d6e1c2a_8f3b_4c5d_9e7f_{n:012x}"
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid}.slice/cri-containerd-{_cid(n)}.scope"
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[SimNode, TelemetryService, Path]]:
    """GPU 0 time-sliced between three pods; GPU 1 in MIG mode, one pod per instance."""
    node = sim_node(tmp_path / "state")
    logs = tmp_path / "containers"
    logs.mkdir()
    gpu0 = node.uuids[0]
    rows = []
    for i, (namespace, pod, mib) in enumerate(SHARED, start=1):
        node.control.start_process(1000 + i, 0, used_memory_mib=mib, cgroup=_cgroup(i))
        (logs / f"{pod}_{namespace}_main-{_cid(i)}.log").touch()
        rows.append((namespace, pod, "main", "nvidia.com/gpu.shared", [f"{gpu0}::{i - 1}"]))
    node.control.start_process(999, 0, used_memory_mib=500)  # a host process, in no pod
    node.control.set_workload(0, sm_active=0.8)  # the simulator splits it evenly: 20 % each
    mig = []
    for slot, (pod, mib) in enumerate([("infer-a", 700), ("infer-b", 900)]):
        gi = node.create_instance(1, "1g.10gb", slot=slot)
        n = 10 + slot
        node.control.start_process(
            2000 + slot,
            1,
            used_memory_mib=mib,
            gpu_instance=gi.id,
            compute_instance=0,
            cgroup=_cgroup(n),
        )
        (logs / f"{pod}_serving_server-{_cid(n)}.log").touch()
        mig.append(gi.id)
    layout = node.driver.layout(node.uuids[1])
    for gi, pod in zip(layout.instances, ["infer-a", "infer-b"], strict=True):
        rows.append(
            (
                "serving",
                pod,
                "server",
                "nvidia.com/mig-1g.10gb",
                [gi.compute_instances[0].uuid or ""],
            )
        )
    socket = tmp_path / "kubelet.sock"
    settings = TelemetrySettings(interval_s=0.2, kubelet_socket=socket, container_log_dir=logs)
    with serve(socket, FakeKubelet(rows)):
        service = build_telemetry(
            node.driver,
            settings,
            hostname="node-1",
            proc_root=node.control.proc_root,
        )
        service.start()
        try:
            _wait_until_attributed(service)
            yield node, service, tmp_path
        finally:
            service.stop()


def _wait_until_attributed(service: TelemetryService, timeout: float = 30.0) -> None:
    """Until a scrape has GPM rates and pod labels on them: two GPM samples and one pod refresh
    have landed (a condition, not a guess at how long they take)."""
    deadline = time.monotonic() + timeout
    while True:
        families = _families(service)
        tensor = families.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", [])
        if any("pod" in s.labels for s in tensor) and families.get(
            "gpu_agent_pod_sm_utilization_ratio"
        ):
            return
        assert time.monotonic() < deadline, "no attributed GPM rates in time"
        time.sleep(0.05)


def _families(service: TelemetryService) -> dict[str, list]:  # type: ignore[type-arg]
    with serve_metrics(service.exporter) as port:
        _, body = scrape(port, "text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(body)}


def test_time_sliced_gpu_gives_each_of_three_pods_its_own_row(cluster) -> None:  # type: ignore[no-untyped-def]
    _node, service, _ = cluster
    families = _families(service)
    rows = [s for s in families["gpu_agent_pod_memory_used_bytes"] if s.labels["gpu"] == "0"]
    got = sorted(
        (s.labels["namespace"], s.labels["pod"], s.labels["container"], s.value) for s in rows
    )
    assert got == [(ns, pod, "main", mib * MIB) for ns, pod, mib in SHARED]
    util = [s for s in families["gpu_agent_pod_sm_utilization_ratio"] if s.labels["gpu"] == "0"]
    assert sorted((s.labels["pod"], s.value) for s in util) == [
        ("nb-1", 0.2),
        ("nb-2", 0.2),
        ("train-3", 0.2),
    ]
    # The device's own series stay one row, without any one pod's labels (not "last writer").
    fb = [s for s in families["DCGM_FI_DEV_FB_USED"] if s.labels["gpu"] == "0"]
    assert len(fb) == 1
    assert "pod" not in fb[0].labels
    assert fb[0].value == 1000 + 2000 + 3000 + 500


def test_mig_instances_carry_their_pod_labels(cluster) -> None:  # type: ignore[no-untyped-def]
    _node, service, _ = cluster
    families = _families(service)
    fb = {
        s.labels["GPU_I_ID"]: (s.labels.get("pod"), s.labels.get("namespace"), s.value)
        for s in families["DCGM_FI_DEV_FB_USED"]
        if s.labels["gpu"] == "1" and "GPU_I_ID" in s.labels
    }
    assert sorted(fb.values()) == [("infer-a", "serving", 700), ("infer-b", "serving", 900)]
    tensor = [s for s in families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] if s.labels["gpu"] == "1"]
    assert {s.labels.get("pod") for s in tensor if "GPU_I_ID" in s.labels} == {"infer-a", "infer-b"}


def test_no_series_is_duplicated(cluster) -> None:  # type: ignore[no-untyped-def]
    _node, service, _ = cluster
    families = _families(service)
    assert "DCGM_FI_DEV_FB_USED" in families  # a scrape with no series duplicates none
    for name, samples in families.items():
        keys = Counter((s.name, tuple(sorted(s.labels.items()))) for s in samples)
        assert max(keys.values()) == 1, name


def test_label_sets_are_stable_between_scrapes(cluster) -> None:  # type: ignore[no-untyped-def]
    _node, service, _ = cluster

    def label_sets() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {
            (s.name, tuple(sorted(s.labels.items())))
            for samples in _families(service).values()
            for s in samples
            if not s.name.startswith(
                ("gpu_agent_collection", "gpu_agent_scrape", "gpu_agent_telemetry_errors")
            )
        }

    first = label_sets()
    assert any(dict(labels).get("pod") for _, labels in first)  # pod rows are among them
    time.sleep(0.5)
    assert label_sets() == first


def test_a_process_that_cannot_be_mapped_leaves_the_pods_unknown_not_zero(cluster) -> None:  # type: ignore[no-untyped-def]
    """A pod process whose container kubelet does not list could be any pod's: GPU 0's pods
    get no memory row (not 0.0), the failure is counted, GPU 1's pods keep theirs."""
    node, service, _ = cluster
    node.control.start_process(1099, 0, used_memory_mib=64, cgroup=_cgroup(99))  # no log link

    def gpu0_rows_gone() -> dict[str, list] | None:  # type: ignore[type-arg]
        families = _families(service)
        rows = families.get("gpu_agent_pod_memory_used_bytes", [])
        return None if any(s.labels["gpu"] == "0" for s in rows) else families

    families = wait_for(gpu0_rows_gone, "GPU 0's pod rows to go unknown", 10)
    assert {s.labels["pod"] for s in families["gpu_agent_pod_memory_used_bytes"]} == {
        "infer-a",
        "infer-b",
    }
    errors = {
        s.labels["kind"]: s.value
        for s in families["gpu_agent_telemetry_errors"]
        if s.name.endswith("_total")
    }
    assert errors["pod_mapping"] >= 1
