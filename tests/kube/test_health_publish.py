"""The health marks on the Node (agent/health/publish.py), written to the API stand-in: labels,
the GPUHealthy condition through the status subresource, the opt-in taint, Events; everything
else on the Node is kept, and an API server that is away gets it all when it returns."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.errors import AgentError
from agent.health.device_taints import RULES, UNSERVED_RETRY_S, DeviceTaints
from agent.health.machine import Mark, State
from agent.health.monitor import HealthChange
from agent.health.publish import NodePublisher, plan
from agent.health.store import Target
from agent.kube import InClusterKubeClient
from agent.kube_node import NodeOwner
from agent.kube_watch import Informer, InformerFactory
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.api.support import wait_for

FAILED = Mark(State.FAILED, "XID 79 (GPU has fallen off the bus): needs reboot-node", 10.0,
              "reboot-node", ("ml/train-0",), 10.0)  # fmt: skip
OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _marks(gpu0: Mark, gi: Mark | None = None) -> dict[Target, tuple[int, Mark, str]]:
    marks = {Target("GPU-0"): (0, gpu0, gpu0.reason), Target("GPU-1"): (1, Mark(), "")}
    if gi is not None:
        marks[Target("GPU-1", 2)] = (1, gi, gi.reason)
    return marks


_STARTED: list[InformerFactory] = []


@pytest.fixture(autouse=True)
def _stop_informers() -> Iterator[None]:
    yield
    while _STARTED:
        _STARTED.pop().stop()


def _owner(kube: InClusterKubeClient, clock: float | None = None, **kw: Any) -> NodeOwner:
    """The Node's owner over a listed watch of the Node; its writes are made by `sync`."""
    informers = InformerFactory(kube)
    _STARTED.append(informers)
    informer = informers.node(NODE).start()
    assert informer.synced.wait(10)
    if clock is None:
        return NodeOwner(kube, NODE, informer, **kw)
    return NodeOwner(kube, NODE, informer, clock=lambda: clock, **kw)


def _condition(api: FakeKubeApi) -> dict[str, str]:
    found = [c for c in api.node_conditions.get(NODE, []) if c["type"] == "GPUHealthy"]
    assert len(found) == 1
    return found[0]


def test_a_failed_gpu_is_labelled_conditioned_tainted_and_cleared_keeping_the_rest(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    api.node_taints[NODE] = [dict(OTHER_TAINT)]
    api.node_conditions[NODE] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    marks = _marks(FAILED)
    owner = _owner(kube)
    publisher = NodePublisher(kube, owner, lambda: marks, taint=True)
    publisher.sync()
    owner.sync()
    labels = api.nodes[NODE]
    assert labels["gpu-agent.io/health"] == "failed"
    assert labels["gpu-agent.io/health.failed-gpus"] == "1"
    assert labels["gpu-agent.io/health.healthy-gpus"] == "1"
    assert labels["gpu-agent.io/health.degraded-gpus"] == "0"
    assert labels["kubernetes.io/hostname"] == NODE
    condition = _condition(api)
    assert condition["status"] == "False" and condition["reason"] == "GpusFailed"
    assert "GPU 0 failed: XID 79" in condition["message"]
    assert {"type": "Ready", "status": "True", "reason": "KubeletReady"} in api.node_conditions[
        NODE
    ]
    ours = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}
    assert api.node_taints[NODE] == [OTHER_TAINT, ours]
    status_patch = [r for r in api.requests if r.path == f"/api/v1/nodes/{NODE}/status"][-1]
    assert status_patch.headers["Content-Type"] == "application/strategic-merge-patch+json"

    marks.update(_marks(Mark(State.HEALTHY, "no new error for 600 s", 700.0)))
    publisher.sync()
    owner.sync()
    assert labels["gpu-agent.io/health"] == "healthy"
    assert labels["gpu-agent.io/health.failed-gpus"] == "0"
    assert _condition(api)["status"] == "True"
    assert _condition(api)["reason"] == "GpusHealthy"
    assert api.node_taints[NODE] == [OTHER_TAINT]


def test_a_refused_status_write_still_labels_and_taints_a_failed_gpu(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """The condition was written first and its failure ended the write: with no nodes/status
    verb (or a webhook refusing it) an XID 79 GPU got no health labels and no taint, and took
    pods. Each PATCH now goes on its own; the failed one is named and alone sent again."""
    api, _ = kube_api
    status = f"/api/v1/nodes/{NODE}/status"
    api.forbidden.add(("PATCH", status))
    api.node_taints[NODE] = [dict(OTHER_TAINT)]
    owner = _owner(kube, backoff=(0.3, 0.6))
    NodePublisher(kube, owner, lambda: _marks(FAILED), taint=True).sync()
    owner.sync()  # the refused status is the owner's to retry, not the caller's failure
    assert api.nodes[NODE]["gpu-agent.io/health"] == "failed"
    ours = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}
    assert api.node_taints[NODE] == [OTHER_TAINT, ours]
    assert "the status write (GPUHealthy) failed" in owner.error and "403" in owner.error
    assert "Node write" not in owner.error

    # Retried after its back-off: only the refused status, never the labels and taint written.
    sent = len(api.requests)
    assert not owner.sync()  # within the back-off: nothing sent
    wait_for(owner.sync, "the status tried again after its back-off", timeout=5)
    assert [r.path for r in api.requests[sent:] if r.method == "PATCH"] == [status]
    api.forbidden.discard(("PATCH", status))
    sent = len(api.requests)
    wait_for(owner.sync, "and again, allowed", timeout=5)
    assert [r.path for r in api.requests[sent:] if r.method == "PATCH"] == [status]
    assert _condition(api)["reason"] == "GpusFailed" and owner.error == ""
    assert not owner.sync()


def test_without_the_taint_setting_no_taint_is_written(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    owner = _owner(kube)
    NodePublisher(kube, owner, lambda: _marks(FAILED), taint=False).sync()
    owner.sync()
    assert api.nodes[NODE]["gpu-agent.io/health"] == "failed"
    assert NODE not in api.node_taints
    assert not [r for r in api.requests if r.method == "PATCH" and "taints" in str(r.body)]


def test_before_any_gpu_was_checked_the_node_says_unknown_never_healthy(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """With no mark yet (the driver not loaded at the agent's start, nothing read) the Node
    was labelled healthy with GPUHealthy=True "0 GPU(s) healthy": a scheduler or a
    remediation job trusted GPUs nobody had checked."""
    api, _ = kube_api
    api.set_labels(NODE, {"gpu-agent.io/health.healthy-gpus": "8"})  # an earlier agent's count
    owner = _owner(kube)
    NodePublisher(kube, owner, dict, taint=True).sync()
    owner.sync()
    labels = api.nodes[NODE]
    assert labels["gpu-agent.io/health"] == "unknown"
    assert not [k for k in labels if k.startswith("gpu-agent.io/health.")]  # no count claimed
    condition = _condition(api)
    assert condition["status"] == "Unknown" and condition["reason"] == "GpusNotChecked"
    assert NODE not in api.node_taints

    published = plan(_marks(Mark()))  # once a snapshot read them: healthy
    assert published.labels["gpu-agent.io/health"] == "healthy" and published.status == "True"


def test_before_any_gpu_was_checked_an_earlier_failed_taint_is_not_lifted(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """With no mark yet (the state dir new, the driver not ready) the publisher stated "no
    taint" and the owner lifted the failed taint an earlier agent had put on the Node, and
    the device taint pass deleted that agent's DeviceTaintRules: the broken GPU took pods
    again before anything had been read. Unknown keeps them until a GPU is read."""
    api, _ = kube_api
    ours = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}
    api.node_taints[NODE] = [dict(OTHER_TAINT), dict(ours)]
    passes: list[int] = []
    owner = _owner(kube)
    publisher = NodePublisher(kube, owner, dict, taint=True, device_taints=lambda: passes.append(1))
    publisher.sync()
    owner.sync()
    assert api.nodes[NODE]["gpu-agent.io/health"] == "unknown"
    assert api.node_taints[NODE] == [OTHER_TAINT, ours]
    assert passes == []  # no rule is deleted (nor made) on no evidence


def test_an_instance_that_is_not_healthy_makes_the_node_degraded() -> None:
    degraded = Mark(State.DEGRADED, "XID 13 (Graphics Engine Exception) (3 ...)", 5.0)
    published = plan(_marks(Mark(), degraded))
    assert published.labels["gpu-agent.io/health"] == "degraded"
    assert published.labels["gpu-agent.io/health.healthy-gpus"] == "2"
    assert published.status == "False" and not published.tainted
    assert "GPU 1 GPU instance 2 degraded" in published.message


def test_a_gpu_without_a_verdict_keeps_the_node_from_healthy_but_not_from_failed() -> None:
    """A GPU first seen while its health readings fail has no mark: healthy marks beside it
    say unknown (the counts of the judged ones kept), a failed one still says failed."""
    why = {2: "nvmlDeviceGetTotalEccErrors: Unknown Error"}
    published = plan(_marks(Mark()), unjudged=why)
    assert published.labels["gpu-agent.io/health"] == "unknown"
    assert published.labels["gpu-agent.io/health.healthy-gpus"] == "2"
    assert published.status == "Unknown" and published.reason == "GpusNotChecked"
    assert "GPU 2 not judged yet: health readings fail (nvmlDeviceGetTotalEccErrors" in (
        published.message
    )
    failed = plan(_marks(FAILED), unjudged=why)
    assert failed.labels["gpu-agent.io/health"] == "failed" and failed.status == "False"
    assert failed.tainted and "GPU 2 not judged yet" in failed.message


def test_with_the_api_server_away_the_marks_and_events_wait_for_it(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    api.unavailable = {f"/api/v1/nodes/{NODE}", "/api/v1/namespaces/default/events"}
    owner = _owner(kube, backoff=(0.05, 0.1))
    now = [0.0]
    marks = lambda: _marks(FAILED)  # noqa: E731
    publisher = NodePublisher(kube, owner, marks, taint=False, clock=lambda: now[0])
    publisher.on_change(HealthChange(Target("GPU-0"), 0, State.HEALTHY, FAILED, FAILED.reason))
    publisher.sync()  # logged, not raised
    with pytest.raises(AgentError, match="503"):  # the owner's worker retries it
        owner.sync()
    assert "gpu-agent.io/health" not in api.nodes[NODE] and not api.events
    api.unavailable = set()
    now[0] = 10.0  # the Events' back-off after a 503: 5-10 s
    publisher.sync()
    time.sleep(max(0.0, owner.held_until - time.monotonic()))  # the owner's back-off, over
    assert owner.sync()
    assert api.nodes[NODE]["gpu-agent.io/health"] == "failed"
    (event,) = api.events
    assert event["reason"] == "GpuFailed" and event["type"] == "Warning"
    assert event["message"] == (
        "GPU 0 (GPU-0) healthy -> failed: XID 79 (GPU has fallen off the bus): needs "
        "reboot-node; action: reboot-node; pods: ml/train-0"
    )
    publisher.sync()
    assert not owner.sync()  # nothing changed: nothing written
    assert len(api.events) == 1  # sent once


def _dra_node(api: FakeKubeApi) -> None:
    """NVIDIA's DRA driver on the node: GPU 0 whole, GPU 1 with a MIG device of instance 2."""
    devices = [
        {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-0"}}},
        {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-1"}}},
        {
            "name": "gpu-1-mig-19-0",
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": "MIG-1-2"},
                "parentUUID": {"string": "GPU-1"},
            },
        },
    ]
    api.put_dra(
        "resourceslices",
        {
            "metadata": {"name": f"{NODE}-gpu"},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        },
    )


def test_failed_devices_get_dra_device_taint_rules_removed_when_they_clear(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    _dra_node(api)
    theirs = {
        "metadata": {"name": "admin-rule", "labels": {"team": "ops"}},
        "spec": {
            "deviceSelector": {"device": "gpu-7"},
            "taint": {"key": "ops/x", "effect": "None"},
        },
    }
    kube.request("POST", RULES, body=theirs)
    marks = _marks(FAILED, Mark(State.FAILED, "XID 95 (Uncontained ECC error)", 5.0, "reset-gpu"))
    uuids = {Target("GPU-0"): ("GPU-0",), Target("GPU-1"): ("GPU-1",),
             Target("GPU-1", 2): ("MIG-1-2",)}  # fmt: skip
    rules = DeviceTaints(kube.request, NODE, lambda: marks, lambda: uuids)
    NodePublisher(kube, _owner(kube), lambda: marks, taint=False, device_taints=rules.sync).sync()
    made = {n: r for n, r in api.taint_rules.items() if n != "admin-rule"}
    assert sorted(made) == [
        f"gpu-agent.{NODE}.{NODE}.gpu-0",
        f"gpu-agent.{NODE}.{NODE}.gpu-1-mig-19-0",
    ]
    rule = made[f"gpu-agent.{NODE}.{NODE}.gpu-0"]
    assert rule["spec"] == {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"},
        "taint": {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"},
    }
    assert rule["metadata"]["labels"] == {"gpu-agent.io/node": NODE}
    marks.clear()
    marks.update(_marks(Mark(State.HEALTHY, "no new error for 600 s", 700.0), Mark()))
    rules.sync()
    assert sorted(api.taint_rules) == ["admin-rule"]  # the admin's rule is not the agent's


def test_a_failed_gpus_device_taint_follows_slices_that_appear_after_the_mark(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """The device taints were synced only when the Node's marks changed: a failed mark
    restored at start, before the ResourceSlices were listed (or before the DRA driver
    published them again), never got its DeviceTaintRule, and the scheduler kept
    allocating the broken GPU."""
    api, _ = kube_api
    marks = _marks(FAILED)
    slices: list[object] = []  # the slice informer's cache, not listed yet
    rules = DeviceTaints(
        kube.request,
        NODE,
        lambda: marks,
        lambda: {Target("GPU-0"): ("GPU-0",), Target("GPU-1"): ("GPU-1",)},
        slices=lambda: list(slices),
    )
    publisher = NodePublisher(
        kube, _owner(kube), lambda: marks, taint=False, device_taints=rules.sync
    )
    publisher.sync()
    assert not api.taint_rules  # no device known yet
    _dra_node(api)
    slices.extend(kube.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"])
    publisher.sync()  # the marks are as they were; the devices are new
    assert sorted(api.taint_rules) == [f"gpu-agent.{NODE}.{NODE}.gpu-0"]
    calls = len(api.requests)
    publisher.sync()  # nothing changed: no request
    assert len(api.requests) == calls


def test_a_restart_keeps_a_failed_gpus_device_taint_while_the_slices_are_not_listed(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """A restarted agent restores the failed mark, but its ResourceSlice informer had not
    listed yet: its empty cache read as "no device", and the pass deleted the rule, so the
    broken GPU was allocated again until the list came (never, were the list refused).
    Before the first list nothing is deleted; after it, the rule is as wanted."""
    api, _ = kube_api
    _dra_node(api)
    marks = _marks(FAILED)
    uuids = lambda: {Target("GPU-0"): ("GPU-0",), Target("GPU-1"): ("GPU-1",)}  # noqa: E731
    DeviceTaints(kube.request, NODE, lambda: marks, uuids).sync()  # the agent before
    tainted = [f"gpu-agent.{NODE}.{NODE}.gpu-0"]
    assert sorted(api.taint_rules) == tainted
    informer = Informer(kube, "/apis/resource.k8s.io/v1/resourceslices")
    restarted = DeviceTaints(kube.request, NODE, lambda: marks, uuids, slices=informer.listed)
    restarted.sync()  # not started: never listed
    assert sorted(api.taint_rules) == tainted
    informer.start()
    try:
        informer.synced.wait(5)
        restarted.sync()
        assert sorted(api.taint_rules) == tainted
        marks = _marks(Mark())  # cleared: now the rule goes
        restarted.sync()
        assert not api.taint_rules
    finally:
        informer.stop()


def test_a_cluster_without_device_taints_is_asked_again_later(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    _dra_node(api)
    api.device_taint_rules = False
    now = [0.0]
    marks = _marks(FAILED)
    rules = DeviceTaints(kube.request, NODE, lambda: marks, lambda: {Target("GPU-0"): ("GPU-0",)},
                         clock=lambda: now[0])  # fmt: skip
    rules.sync()  # 404: no error, nothing written
    asked = len(api.requests)
    rules.sync()
    assert len(api.requests) == asked  # not asked again at once
    api.device_taint_rules = True
    now[0] = UNSERVED_RETRY_S
    rules.sync()
    assert list(api.taint_rules) == [f"gpu-agent.{NODE}.{NODE}.gpu-0"]


def test_the_condition_keeps_its_transition_time_across_a_restart_and_moves_on_a_change(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    api.node_conditions[NODE] = [
        {"type": "GPUHealthy", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]
    marks = _marks(FAILED)
    owner = _owner(kube, clock=1.8e9)
    publisher = NodePublisher(kube, owner, lambda: marks, taint=False)
    publisher.sync()  # a restarted agent: still failed, so still since then
    owner.sync()
    assert _condition(api)["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert _condition(api)["lastHeartbeatTime"] == "2027-01-15T08:00:00Z"
    marks.update(_marks(Mark(State.HEALTHY, "no new error for 600 s", 700.0)))
    publisher.sync()
    owner.sync()
    assert _condition(api)["lastTransitionTime"] == "2027-01-15T08:00:00Z"


def test_while_the_driver_is_away_the_node_says_unknown_keeps_the_taint_and_then_the_marks(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """With the driver detached the Node kept `health=healthy` and GPUHealthy=True from marks
    nobody could check. Meanwhile: unknown, the condition Unknown with the driver's reason and
    the marks kept, the failed taint and device taints left as they are; the marks again once
    the driver is back."""
    api, _ = kube_api
    away: list[str | None] = [None]
    passes: list[int] = []
    owner = _owner(kube)
    publisher = NodePublisher(
        kube,
        owner,
        lambda: _marks(FAILED),
        taint=True,
        device_taints=lambda: passes.append(1),
        driver_away=lambda: away[0],
    )
    publisher.sync()
    owner.sync()
    ours = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}
    assert api.node_taints[NODE] == [ours] and passes == [1]
    away[0] = "driver_not_loaded: NVML: Driver Not Loaded"
    publisher.sync()
    owner.sync()
    labels = api.nodes[NODE]
    assert labels["gpu-agent.io/health"] == "unknown"
    assert not [k for k in labels if k.startswith("gpu-agent.io/health.")]  # no count claimed
    condition = _condition(api)
    assert condition["status"] == "Unknown" and condition["reason"] == "DriverNotReady"
    assert condition["message"] == (
        "GPU health is not checked while the NVIDIA driver is not ready: driver_not_loaded: "
        "NVML: Driver Not Loaded; kept for its return: GPU 0 failed"
    )
    assert api.node_taints[NODE] == [ours] and passes == [1]
    away[0] = None
    publisher.sync()
    owner.sync()
    assert labels["gpu-agent.io/health"] == "failed" and _condition(api)["status"] == "False"
