"""The agent's edge to Kubernetes against the API stand-in over HTTPS (tests/kube/fake_edge.py
counts every call): the Node's one owner writes only a difference, once per burst, never
others' keys; a watch survives 410, bookmarks, a restarting server, 429 and 5xx without a tight
loop and says when its cache is stale; API versions come from discovery, an unserved one is
said once and not asked again."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

import pytest

from agent.health.device_taints import DeviceTaints
from agent.health.machine import Mark, Policy, State
from agent.health.monitor import HealthMonitor
from agent.health.publish import build_publisher
from agent.health.store import Target
from agent.kube import InClusterKubeClient
from agent.kube_discovery import ApiVersions
from agent.kube_edge import KubeEdge
from agent.kube_node import Claim
from agent.kube_watch import Informer
from tests.kube.fake_edge import Call, EdgeKubeApi
from tests.kube.fixtures import NODE, started_owner
from tests.kube.test_dra_api import gpu_slice
from tests.unit.api.support import wait_for

NODE_PATH = f"/api/v1/nodes/{NODE}"
CACHE = Claim("cache", label_prefixes=("gpu-agent.io/cache.",))
HEALTH = Claim("health", label_keys=frozenset({"gpu-agent.io/health"}), condition="GPUHealthy")
MIG_STATE = "nvidia.com/mig.config.state"
THEIRS = {"feature.node.kubernetes.io/pci-10de.present": "true", "team": "vision"}


def _writes(api: EdgeKubeApi, since: float) -> list[Call]:
    return [c for c in api.since(since) if c.write]


def _patched_labels(api: EdgeKubeApi) -> set[str]:
    return {
        key
        for r in api.requests
        if r.method == "PATCH" and isinstance(r.body, dict)
        for key in ((r.body.get("metadata") or {}).get("labels") or {})
    }


def test_a_burst_of_changes_is_one_node_write_and_a_restatement_is_none(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    with started_owner(kube) as owner:
        began = time.monotonic()
        # A cache item turned ready, a health mark, the MIG protocol's state: one burst.
        owner.part(CACHE).set(labels={"gpu-agent.io/cache.llama": "ready"})
        condition = {"status": "False", "reason": "GpusFailed", "message": "GPU 0 failed"}
        owner.part(HEALTH).set(labels={"gpu-agent.io/health": "failed"}, condition=condition)
        owner.write_now({MIG_STATE: "success"})  # the MIG protocol writes at once
        wait_for(lambda: api.nodes[NODE].get("gpu-agent.io/health") == "failed", "the marks")
        wait_for(lambda: owner.informer.objects()[0]["status"]["conditions"], "the condition")
        writes = _writes(api, began)
        assert [c.path for c in writes if c.path == NODE_PATH] == [NODE_PATH]  # one write
        assert [c.path for c in writes if c.path != NODE_PATH] == [f"{NODE_PATH}/status"]
        assert api.nodes[NODE]["gpu-agent.io/cache.llama"] == "ready"
        assert api.nodes[NODE][MIG_STATE] == "success"

        # The same state again (every pass of every feature restates it): no request at all.
        settled = time.monotonic()
        owner.part(CACHE).set(labels={"gpu-agent.io/cache.llama": "ready"})
        owner.part(HEALTH).set(labels={"gpu-agent.io/health": "failed"}, condition=condition)
        assert not owner.write_now({MIG_STATE: "success"})
        owner.wake()
        assert not owner.sync()
        time.sleep(0.6)  # two coalescing windows of the owner's thread: it must stay quiet
        assert [c for c in api.since(settled) if not c.watch] == []


def test_keys_of_other_writers_are_never_touched_and_ours_are_put_back_once(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    api.set_labels(NODE, {**THEIRS, "gpu-agent.io/cache.old": "ready"})
    with started_owner(kube, coalesce_s=0.05) as owner:
        owner.part(CACHE).set(labels={"gpu-agent.io/cache.new": "ready"})
        wait_for(lambda: "gpu-agent.io/cache.old" not in api.nodes[NODE], "the stale label gone")
        api.set_labels(NODE, {"team": "speech", "user/extra": "1"})  # a user, meanwhile
        # Someone removes our label: the watch shows it, the owner puts it back, once.
        began = time.monotonic()
        api.set_labels(NODE, {"gpu-agent.io/cache.new": None})
        wait_for(lambda: api.nodes[NODE].get("gpu-agent.io/cache.new") == "ready", "put back")
        time.sleep(0.3)  # several coalescing windows: no second write
        assert len(_writes(api, began)) == 1
        labels = api.nodes[NODE]
        assert labels["team"] == "speech" and labels["user/extra"] == "1"
        assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
        assert _patched_labels(api) <= {"gpu-agent.io/cache.new", "gpu-agent.io/cache.old"}


def test_a_throttled_node_write_waits_the_servers_retry_after(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """The owner retried a refused write after its own back-off (1 s, jittered), ignoring the
    Retry-After of a 429: an API server shedding load had every node's write back before
    the time it asked for."""
    api, _ = edge_api
    with started_owner(kube, coalesce_s=0.01, backoff=(0.05, 0.1)) as owner:
        api.fail_next("PATCH", NODE_PATH, 429, count=1, retry_after=2)
        owner.part(CACHE).set(labels={"gpu-agent.io/cache.llama": "ready"})
        wait_for(lambda: api.nodes[NODE].get("gpu-agent.io/cache.llama") == "ready", "written")
        first, second = [c.at for c in api.since(0) if c.write][:2]
        assert second - first >= 1.9  # the server's Retry-After, not the 0.05 s back-off


def test_a_refused_status_write_is_retried_alone_with_back_off_and_keeps_no_label_off(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """A refused status write ended every Node write: the sharing reload's label was never
    sent (`share set` failed blaming the status) and every retry repeated the refused
    condition first. The Node patch goes on its own; the status alone is retried, backed off."""
    api, _ = edge_api
    status = f"{NODE_PATH}/status"
    api.forbidden.add(("PATCH", status))
    with started_owner(kube, coalesce_s=0.01, backoff=(0.1, 0.4)) as owner:
        began = time.monotonic()
        condition = {"status": "False", "reason": "GpusFailed", "message": "GPU 0 failed"}
        owner.part(HEALTH).set(labels={"gpu-agent.io/health": "failed"}, condition=condition)
        assert owner.write_now({"nvidia.com/device-plugin.config": "ts-4"})  # no raise
        assert api.nodes[NODE]["nvidia.com/device-plugin.config"] == "ts-4"
        assert api.nodes[NODE]["gpu-agent.io/health"] == "failed"
        wait_for(lambda: len([c for c in _writes(api, began) if c.path == status]) >= 5, "retries")
        writes = _writes(api, began)
        assert [c.path for c in writes if c.path != status] == [NODE_PATH]  # sent once
        at = [c.at for c in writes if c.path == status]
        gaps = [b - a for a, b in itertools.pairwise(at)]
        assert gaps[0] >= 0.04 and max(gaps[2:]) >= 0.15, gaps  # backed off, not a tight loop
        assert "status write (GPUHealthy) failed" in owner.error
        assert "Node write" not in owner.error
        api.forbidden.discard(("PATCH", status))
        wait_for(lambda: not owner.error, "the status written once allowed", timeout=5)
        assert [c for c in api.node_conditions[NODE] if c["type"] == "GPUHealthy"]


def test_a_write_answered_with_a_body_that_is_not_json_is_retried_not_fatal(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """A Node write answered 200 with a proxy's HTML page raised a bare ValueError that ended
    the owner's thread: the agent never wrote its Node again until restarted, and nothing
    said so. The answer is now a failed call: said, and retried with the back-off."""
    api, _ = edge_api
    with started_owner(kube, coalesce_s=0.01, backoff=(0.05, 0.1)) as owner:
        api.garble_next("PATCH", NODE_PATH)
        owner.part(CACHE).set(labels={"gpu-agent.io/cache.llama": "ready"})
        wait_for(lambda: api.nodes[NODE].get("gpu-agent.io/cache.llama") == "ready", "written")
        owner.part(CACHE).set(labels={"gpu-agent.io/cache.qwen": "ready"})
        wait_for(lambda: api.nodes[NODE].get("gpu-agent.io/cache.qwen") == "ready", "and later")


def _informer(kube: InClusterKubeClient, **kw: Any) -> Informer:
    return Informer(kube, "/api/v1/nodes", {"fieldSelector": f"metadata.name={NODE}"}, **kw)


def _lists(api: EdgeKubeApi) -> list[Call]:
    return [c for c in api.since(0) if c.path == "/api/v1/nodes" and not c.watch]


def test_410_gone_relists_once_and_a_server_that_keeps_answering_410_is_backed_off(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    informer = _informer(kube, watch_timeout_s=1, backoff=(0.5, 2.0)).start()
    try:
        assert informer.synced.wait(10)
        api.compact()  # the next watch resumes from a version the server forgot: 410, relist
        wait_for(lambda: informer.lists == 2, "one relist after 410", timeout=10)
        assert informer.lists == 2
        api.fail_next("GET", "/api/v1/nodes", 410, count=1000)
        api.compact()
        began = time.monotonic()
        wait_for(lambda: not informer.healthy, "the 410s noticed", timeout=10)
        time.sleep(3)  # three seconds of a server answering only 410
        calls = [c for c in api.since(began) if c.path == "/api/v1/nodes"]
        assert len(calls) <= 7, [round(c.at - began, 2) for c in calls]  # not a tight loop
        current, detail = informer.status()
        assert not current and "stale" in detail and "410" in detail
    finally:
        informer.stop()


def test_a_quiet_watch_whose_version_is_compacted_each_time_relists_at_once_and_stays_current(
    edge_api: tuple[EdgeKubeApi, str],
    kube: InClusterKubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A quiet Node on a server that sends no bookmarks sees its version compacted away
    during every watch: each 410 after a watch that lasted is the normal case, listed again
    at once, never waited on as a failure (a stale cache and a warning every few minutes)."""
    api, _ = edge_api
    informer = _informer(kube, watch_timeout_s=2.0, backoff=(2.0, 4.0)).start()
    try:
        assert informer.synced.wait(10)
        with caplog.at_level(logging.WARNING, logger="agent.kube_watch"):
            for lists in (2, 3):
                wait_for(lambda: api.open_watches == 1, "a quiet watch open")
                api.compact()  # the version it watches from is gone when it ends
                wait_for(lambda n=lists: informer.lists == n, "relisted", timeout=8)
        # Its own warnings only: another test's agent may still log in this worker.
        warned = [r.getMessage() for r in caplog.records if r.name == "agent.kube_watch"]
        assert not warned, warned
        assert informer.healthy
    finally:
        informer.stop()


def test_a_server_whose_watches_all_answer_410_while_lists_succeed_is_backed_off(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """Each 410 used to list again at once whenever a list came between: a server whose lists
    answered but whose every watch said 410 got a list and a watch per few milliseconds from
    every agent (hundreds a second each), a fleet-wide storm."""
    api, _ = edge_api
    api.expire_watches = True
    began = time.monotonic()
    informer = _informer(kube, backoff=(0.5, 2.0)).start()
    try:
        time.sleep(3)
        lists = [round(c.at - began, 2) for c in _lists(api)]
        assert 2 <= len(lists) <= 8, lists  # 0, at once, then 0.5, 1, 2 s (+-50 %): not hundreds
        api.expire_watches = False  # the server's watches work again: the cache is current
        api.set_labels(NODE, {"after": "410s"})
        wait_for(lambda: informer.objects()[0]["metadata"]["labels"].get("after"), "resumed")
        assert informer.healthy
    finally:
        informer.stop()


def _watches(api: EdgeKubeApi, since: float) -> list[float]:
    return [c.at - since for c in api.since(since) if c.path == "/api/v1/nodes" and c.watch]


def test_watches_the_server_ends_at_once_are_backed_off_with_jitter_not_every_second(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """A watch the server took and ended at once with nothing in it was opened again exactly
    one second later, forever: behind a proxy that drops watches every agent of a fleet sent
    one a second, all in step. Such a watch now waits the doubling, jittered back-off."""
    api, _ = edge_api
    api.short_watches = True
    began = time.monotonic()
    informer = _informer(kube, backoff=(0.3, 2.4)).start()
    try:
        assert informer.synced.wait(10)
        time.sleep(6)
        gaps = [b - a for a, b in itertools.pairwise(_watches(api, began))]
        assert 2 <= len(gaps) <= 8, gaps  # 0.3, 0.6, 1.2, 2.4, 2.4 s (+-50 %)
        assert max(gaps) >= 1.5 * min(gaps), gaps  # doubling
        api.short_watches = False
        api.set_labels(NODE, {"after": "short"})
        wait_for(lambda: informer.objects()[0]["metadata"]["labels"].get("after"), "resumed", 10)
    finally:
        informer.stop()


def test_429_waits_the_servers_retry_after(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    api.fail_next("GET", "/api/v1/nodes", 429, count=1, retry_after=2)
    informer = _informer(kube, backoff=(0.05, 0.1)).start()
    try:
        assert informer.synced.wait(10)
        first, second = _lists(api)[:2]
        assert second.at - first.at >= 1.9  # Retry-After, not the 0.05 s back-off
    finally:
        informer.stop()


def test_5xx_backs_off_doubling_with_jitter(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    api.fail_next("GET", "/api/v1/nodes", 500, count=4)
    informer = _informer(kube, backoff=(0.2, 10.0)).start()
    try:
        assert informer.synced.wait(15)
        at = [c.at for c in _lists(api)]
        gaps = [b - a for a, b in itertools.pairwise(at)][:4]
        nominal = [0.2, 0.4, 0.8, 1.6]
        for gap, want in zip(gaps, nominal, strict=True):
            assert 0.5 * want <= gap <= 1.5 * want + 0.15, (gaps, nominal)
        assert any(abs(g - w) > 0.01 for g, w in zip(gaps, nominal, strict=True))  # jittered
    finally:
        informer.stop()


def test_bookmarks_move_the_version_without_a_change_or_a_relist(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    changes = threading.Semaphore(0)
    informer = _informer(kube, on_change=changes.release).start()
    try:
        assert informer.synced.wait(10) and changes.acquire(timeout=1)
        api.bookmark("nodes")
        wait_for(lambda: informer.resource_version == str(api.version), "the bookmark's version")
        assert not changes.acquire(timeout=0.2) and informer.lists == 1
    finally:
        informer.stop()


def test_a_restarting_api_server_leaves_a_stale_cache_said_then_resumes_without_relist(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    informer = _informer(kube, backoff=(0.2, 1.0)).start()
    try:
        assert informer.synced.wait(10)
        wait_for(lambda: api.open_watches == 1, "the watch open")
        began = time.monotonic()
        api.restart()
        wait_for(lambda: not informer.healthy, "the restart noticed", timeout=10)
        current, detail = informer.status()
        assert not current and "/api/v1/nodes" in detail and "503" in detail
        assert informer.objects()  # the last answer is kept
        time.sleep(2)
        assert len(api.since(began)) <= 6  # backed off: 0.2, 0.4, 0.8, 1.0 s ...
        api.up()
        api.set_labels(NODE, {"after": "restart"})
        wait_for(lambda: informer.objects()[0]["metadata"]["labels"].get("after"), "resumed")
        assert informer.healthy and informer.lists == 1  # resumed at its version
    finally:
        informer.stop()


def _failed_marks() -> dict[Target, tuple[int, Mark, str]]:
    return {Target("GPU-0"): (0, Mark(State.FAILED, "XID 79", 1.0), "XID 79")}


def _slices() -> list[dict[str, Any]]:
    device = {
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-0"}},
    }
    spec = {"driver": "gpu.nvidia.com", "nodeName": NODE, "pool": {"name": NODE, "generation": 1}}
    return [{"spec": spec | {"devices": [device]}}]


def test_device_taint_rules_are_written_at_the_version_the_server_serves(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    api.served["resource.k8s.io"] = {"v1": ["resourceslices"], "v1beta2": ["devicetaintrules"]}
    apis = ApiVersions(kube)
    rules = DeviceTaints(
        kube.request,
        NODE,
        _failed_marks,
        lambda: {Target("GPU-0"): ("GPU-0",)},
        slices=_slices,
        rules=lambda: apis.path("devicetaintrules"),
    )
    rules.sync()
    posts = [r for r in api.requests if r.method == "POST"]
    assert [r.path for r in posts] == ["/apis/resource.k8s.io/v1beta2/devicetaintrules"]
    assert posts[0].body["apiVersion"] == "resource.k8s.io/v1beta2"  # type: ignore[index]
    assert not [c for c in api.calls if "v1alpha3" in c.path]
    before = len(api.calls)
    rules.sync()  # nothing changed: the rules it wrote are known, nothing is listed again
    assert len(api.calls) == before


def test_an_unserved_api_is_said_once_and_asked_again_only_hourly(
    edge_api: tuple[EdgeKubeApi, str],
    kube: InClusterKubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, _ = edge_api
    api.served["resource.k8s.io"] = {"v1": ["resourceslices"]}
    apis = ApiVersions(kube)
    rules = DeviceTaints(
        kube.request,
        NODE,
        _failed_marks,
        lambda: {Target("GPU-0"): ("GPU-0",)},
        slices=_slices,
        rules=lambda: apis.path("devicetaintrules"),
    )
    with caplog.at_level(logging.WARNING, logger="agent.kube_discovery"):
        rules.sync()
        asked = len(api.calls)
        for _ in range(3):
            rules.sync()
    assert len(api.calls) == asked <= 2  # /apis/resource.k8s.io and its v1 list, once
    assert not [c for c in api.calls if "devicetaintrules" in c.path]
    said = [r for r in caplog.records if "devicetaintrules" in r.getMessage()]
    assert len(said) == 1 and "asked again hourly" in said[0].getMessage()
    assert "devicetaintrules" in apis.unserved
    assert apis.path("resourceslices") == "/apis/resource.k8s.io/v1/resourceslices"


def test_a_server_serving_thousands_of_versions_is_said_in_a_bounded_line(
    edge_api: tuple[EdgeKubeApi, str],
    kube: InClusterKubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The "not served" warning (and `unserved`, which the doctor shows) names the first few
    versions the server lists and how many in all, never all of them: a server listing 5,000
    versions of 100 characters is one short line, not 500 KB in the log at every start."""
    api, _ = edge_api
    long = [f"v{n}alpha{'x' * 90}" for n in range(5000)]
    api.served["resource.k8s.io"] = {"v1": ["resourceslices"], **{v: [] for v in long}}
    apis = ApiVersions(kube)
    with caplog.at_level(logging.WARNING, logger="agent.kube_discovery"):
        assert apis.path("devicetaintrules") is None
    (said,) = [r.getMessage() for r in caplog.records if "devicetaintrules" in r.getMessage()]
    assert len(said) < 400, len(said)
    assert "serves v1/v0alpha" in said and "(and 4995 more, 5001 versions)" in said, said
    assert "v1beta2/v1alpha3 with devicetaintrules" in said
    assert apis.unserved["devicetaintrules"] in said


def test_slices_watched_after_discovery_failed_at_start_use_the_version_the_server_serves(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """An agent that started while discovery failed (the API server away) watched its
    ResourceSlices at v1 for good: on a server serving them only at v1beta2 (Kubernetes
    1.33) that watch answered 404 until the agent was restarted, so the allocation mode,
    claim attribution and device taints never saw the node's DRA devices."""
    api, _ = edge_api
    api.served["resource.k8s.io"] = {"v1beta2": ["resourceslices", "deviceclasses"]}
    api.put_dra("resourceslices", gpu_slice("node-gpus", NODE, ["gpu-0"]))
    api.fail_next("GET", "/apis/resource.k8s.io", 503, count=1)  # discovery, at the start
    edge = KubeEdge.build(kube, NODE)
    slices = edge.slices()
    assert edge.slices() is slices  # one informer, one watch, for every reader
    slices.start()
    try:
        wait_for(lambda: len(slices.objects()) == 1, "the slices listed", timeout=15)
        assert slices.path == "/apis/resource.k8s.io/v1beta2/resourceslices"
        assert slices.status()[0]
    finally:
        edge.stop()


def test_the_publisher_built_for_a_pod_keeps_a_failed_rule_until_the_slices_are_listed(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """As the agent wires it (`build_publisher`): its DRA device-taint pass reads the edge's
    slice informer, which a restarted agent has not listed yet; an empty cache read as "no
    device" deleted the failed GPU's rule."""
    api, _ = edge_api
    api.served["resource.k8s.io"] = {"v1": ["resourceslices"], "v1beta2": ["devicetaintrules"]}
    api.put_dra("resourceslices", gpu_slice("node-gpus", NODE, ["gpu-0"]))
    health = HealthMonitor(Policy(), None)
    health.shown = _failed_marks  # type: ignore[method-assign]  # restored from the state dir
    uuids = {Target("GPU-0"): ("GPU-gpu-0",)}  # the slice's device gpu-0
    health.device_uuids = lambda: uuids  # type: ignore[method-assign]
    before = KubeEdge.build(kube, NODE)
    try:
        before.slices().start().synced.wait(10)
        publisher = build_publisher(before, NODE, health, taint=False)
        assert publisher is not None
        publisher.sync()
    finally:
        before.stop()
    rules = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
    (rule,) = kube.request("GET", rules)["items"]
    restarted = KubeEdge.build(kube, NODE)  # its slice informer not started: never listed
    publisher = build_publisher(restarted, NODE, health, taint=False)
    assert publisher is not None
    publisher.sync()
    assert [r["metadata"]["name"] for r in kube.request("GET", rules)["items"]] == [
        rule["metadata"]["name"]
    ]
