"""Writes beside the Node that the API server refuses (a missing RBAC verb, an admission
webhook, throttling) are held back with a jittered, doubling back-off and said while they
last, never re-sent every health pass (10 s): 5,000 nodes refused together were 500 requests
a second, forever."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.errors import AgentError, PermissionDenied
from agent.health.device_taints import DeviceTaints
from agent.health.machine import Mark, Policy, State
from agent.health.monitor import HealthChange, HealthMonitor
from agent.health.publish import NodePublisher, build_publisher
from agent.health.store import Target
from agent.kube import InClusterKubeClient
from agent.kube_edge import KubeEdge
from agent.kube_node import NodeOwner
from agent.kube_watch import InformerFactory
from tests.kube.fake_edge import EdgeKubeApi
from tests.kube.fixtures import NODE
from tests.kube.test_dra_api import gpu_slice
from tests.kube.test_kube_edge import _failed_marks, _slices

PASSES = 30  # five minutes of health passes
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
EVENTS = "/api/v1/namespaces/default/events"


def _requests(api: EdgeKubeApi, since: int, part: str) -> list[tuple[str, str]]:
    return [(c.method, c.path) for c in api.calls[since:] if part in c.path and not c.watch]


def _dra_api(api: EdgeKubeApi) -> None:
    api.served["resource.k8s.io"] = {"v1": ["resourceslices"], "v1beta2": ["devicetaintrules"]}
    api.put_dra("resourceslices", gpu_slice("node-gpus", NODE, ["gpu-0"]))


def test_a_refused_device_taint_rule_is_not_sent_again_every_pass_and_is_said(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    _dra_api(api)
    health = HealthMonitor(Policy(), None)
    health.shown = _failed_marks  # type: ignore[method-assign]
    health.device_uuids = lambda: {Target("GPU-0"): ("GPU-gpu-0",)}  # type: ignore[method-assign]
    edge = KubeEdge.build(kube, NODE)
    try:
        assert edge.slices().start().synced.wait(10)
        assert edge.node_informer().start().synced.wait(10)
        publisher = build_publisher(edge, NODE, health, taint=False)
        assert publisher is not None
        api.fail_next("POST", RULES, 403, count=1000, message="devicetaintrules is forbidden")
        began = len(api.calls)
        for _ in range(PASSES):
            publisher.sync()
        assert _requests(api, began, "devicetaintrules") == [("GET", RULES), ("POST", RULES)]
        healthy, detail = edge.health()
        assert not healthy and "DeviceTaintRule create" in detail and "403" in detail
    finally:
        edge.stop()


def _rules(kube: InClusterKubeClient, now: list[float]) -> DeviceTaints:
    return DeviceTaints(
        kube.request,
        NODE,
        _failed_marks,
        lambda: {Target("GPU-0"): ("GPU-0",)},
        slices=_slices,
        rules=lambda: RULES,
        clock=lambda: now[0],
    )


def _posts_at(api: EdgeKubeApi, rules: DeviceTaints, now: list[float], at: list[float]) -> int:
    began = len(api.calls)
    for t in at:
        now[0] = t
        rules.sync()
    return len([c for c in _requests(api, began, "devicetaintrules") if c[0] == "POST"])


def test_a_refused_rule_is_tried_again_after_a_doubling_back_off_and_a_429s_retry_after(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    _dra_api(api)
    now = [0.0]
    rules = _rules(kube, now)
    api.fail_next("POST", RULES, 403, count=1000)
    assert _posts_at(api, rules, now, [0.0]) == 1
    assert _posts_at(api, rules, now, [10.0, 14.0]) == 0  # the first wait: 15-30 s
    assert _posts_at(api, rules, now, [30.0]) == 1
    assert _posts_at(api, rules, now, [40.0, 50.0, 59.0]) == 0  # then 30-60 s
    assert _posts_at(api, rules, now, [90.0]) == 1
    # The RBAC fixed, the server throttles: Retry-After 250 s, longer than the 120-240 s due.
    api.faults.clear()
    api.fail_next("POST", RULES, 429, count=1, retry_after=250)
    assert _posts_at(api, rules, now, [300.0]) == 1
    assert _posts_at(api, rules, now, [500.0, 549.0]) == 0
    assert _posts_at(api, rules, now, [551.0, 561.0]) == 1  # created, then nothing to send
    assert list(api.taint_rules) == [f"gpu-agent.{NODE}.{NODE}.gpu-0"]
    assert rules.refused() == ""


def test_a_create_that_got_through_unseen_is_not_made_twice(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """A 5xx whose create went through (a proxy timing out after the server took it): the
    retry's 409 says the rule is there; nothing is listed again, nothing is refused."""
    api, _ = edge_api
    _dra_api(api)
    now = [0.0]
    rules = _rules(kube, now)
    api.fail_next("POST", RULES, 503, count=1)
    assert _posts_at(api, rules, now, [0.0]) == 1
    assert "503" in rules.refused()
    name = f"gpu-agent.{NODE}.{NODE}.gpu-0"
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": {"gpu-agent.io/node": NODE}},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"},
            "taint": {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"},
        },
    }
    kube.request("POST", RULES, body=body)  # what the 503 hid
    began = len(api.calls)
    assert _posts_at(api, rules, now, [31.0, 41.0]) == 1
    assert _requests(api, began, "devicetaintrules") == [("POST", RULES)]
    assert rules.refused() == "" and list(api.taint_rules) == [name]


def _publisher(kube: InClusterKubeClient, now: list[float] | None = None) -> NodePublisher:
    owner = NodeOwner(kube, NODE, InformerFactory(kube).node(NODE))  # not started: no write
    if now is None:
        return NodePublisher(kube, owner, dict, taint=False)
    return NodePublisher(kube, owner, dict, taint=False, clock=lambda: now[0])


def _change(gpu: int) -> HealthChange:
    failed = Mark(State.FAILED, "XID 79", 1.0, "reboot-node")
    return HealthChange(Target(f"GPU-{gpu}"), gpu, State.HEALTHY, failed, "XID 79")


def _events_at(
    api: EdgeKubeApi, publisher: NodePublisher, now: list[float], at: list[float]
) -> int:
    began = len(api.calls)
    for t in at:
        now[0] = t
        publisher.sync()
    return len(_requests(api, began, EVENTS))


def test_an_event_refused_for_good_is_dropped_once_and_holds_no_later_one_back(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """A webhook or RBAC refusing Events (403): the refused Event was posted every pass
    forever, and every later Event waited behind it."""
    api, _ = edge_api
    now = [0.0]  # the passes' times, not the publisher's: a refusal for good waits no back-off
    publisher = _publisher(kube)
    api.fail_next("POST", EVENTS, 403, count=1, message="events is forbidden")
    publisher.on_change(_change(0))
    publisher.on_change(_change(1))
    assert _events_at(api, publisher, now, [float(t) for t in range(0, PASSES * 10, 10)]) == 2
    assert [e["message"][:5] for e in api.events] == ["GPU 1"]  # the later one, at once
    assert publisher.refused() == ""  # one got through since
    api.fail_next("POST", EVENTS, 403, count=1000, message="events is forbidden")
    publisher.on_change(_change(0))
    assert _events_at(api, publisher, now, [400.0, 410.0, 420.0]) == 1
    assert "refused, dropped" in publisher.refused() and "403" in publisher.refused()


def test_events_the_server_does_not_take_wait_a_back_off_and_a_429s_retry_after(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    now = [0.0]
    publisher = _publisher(kube, now)
    api.fail_next("POST", EVENTS, 503, count=1000)
    publisher.on_change(_change(0))
    publisher.on_change(_change(1))
    assert _events_at(api, publisher, now, [0.0, 1.0, 4.0]) == 1  # then 5-10 s
    assert "2 health Event(s) not posted" in publisher.refused()
    assert _events_at(api, publisher, now, [10.0, 19.0]) == 1  # then 10-20 s
    api.faults.clear()
    api.fail_next("POST", EVENTS, 429, count=1, retry_after=100)  # longer than 20-40 s
    assert _events_at(api, publisher, now, [30.0, 60.0, 129.0]) == 1
    assert _events_at(api, publisher, now, [131.0, 141.0]) == 2  # both, in order, once
    assert [e["message"][:5] for e in api.events] == ["GPU 0", "GPU 1"]
    assert publisher.refused() == ""


@pytest.fixture
def informers(kube: InClusterKubeClient) -> Iterator[InformerFactory]:
    made = InformerFactory(kube)
    yield made
    made.stop()


def _owner(informers: InformerFactory, **kw: Any) -> NodeOwner:
    """The Node's owner over a listed watch, its thread not started: only the test writes."""
    informer = informers.node(NODE).start()
    assert informer.synced.wait(10)
    return NodeOwner(informers.client, NODE, informer, **kw)  # type: ignore[arg-type]


PENDING = {"nvidia.com/mig.config.state": "pending"}


def test_a_callers_node_write_waits_the_owners_back_off(
    edge_api: tuple[EdgeKubeApi, str], informers: InformerFactory
) -> None:
    """The MIG label protocol and the sharing reload write at once (`write_now`): after a
    refused Node write each of their passes sent it again, inside the owner's back-off."""
    api, _ = edge_api
    owner = _owner(informers)
    api.fail_next("PATCH", f"/api/v1/nodes/{NODE}", 403, count=1000)
    with pytest.raises(AgentError, match="403"):
        owner.write_now(PENDING)
    began = len(api.calls)
    for _ in range(10):
        with pytest.raises(AgentError, match=r"403.*held back, again in"):
            owner.write_now(PENDING)
    assert [c for c in api.calls[began:] if c.write] == []


def _wait_after(owner: NodeOwner, api: EdgeKubeApi, code: int, failures: int) -> float:
    """The owner's wait after ``failures`` writes in a row answered ``code``."""
    api.fail_next("PATCH", f"/api/v1/nodes/{NODE}", code, count=1000)
    for _ in range(failures):
        time.sleep(max(0.0, owner.held_until - time.monotonic()))  # the back-off, waited out
        with pytest.raises(AgentError, match=str(code)):
            owner.write_now(PENDING)
    return owner.held_until - time.monotonic()


@pytest.mark.parametrize(
    ("code", "refused"), [(403, True), (422, True), (503, False), (401, False)]
)
def test_a_node_write_refused_for_good_backs_off_past_the_30s_cap(
    edge_api: tuple[EdgeKubeApi, str], informers: InformerFactory, code: int, refused: bool
) -> None:
    """Back-off of 0.01 s doubling to 0.02 s here (1 s to 30 s in the agent): a write the
    server will refuse again (403, 422) doubles on past it (to 10 min in the agent)."""
    api, _ = edge_api
    owner = _owner(informers, backoff=(0.01, 0.02), refused_max_s=600.0)
    wait = _wait_after(owner, api, code, failures=6)  # due: 0.32 s refused, else 0.02 s
    assert (wait > 0.02 * 1.5) is refused, wait


def test_a_status_write_refused_for_good_backs_off_alone_and_the_labels_still_go(
    edge_api: tuple[EdgeKubeApi, str], informers: InformerFactory
) -> None:
    """No nodes/status verb (403): the condition was sent again at the 30 s cap forever (the
    status and the Node shared one back-off, and only a refused Node patch doubled past it).
    Now the status doubles on past the cap alone: 0.01 s doubling to 0.02 s here, the
    refused one on past it; and every label change still goes at once."""
    from agent.kube_node import Claim

    api, _ = edge_api
    owner = _owner(informers, backoff=(0.01, 0.02), refused_max_s=600.0)
    health = owner.part(Claim("health", label_keys=frozenset({"h"}), condition="GPUHealthy"))
    status_path = f"/api/v1/nodes/{NODE}/status"
    api.fail_next("PATCH", status_path, 403, count=1000)
    began, ended = len(api.calls), time.monotonic() + 1.5
    n = 0
    while time.monotonic() < ended:  # a changing condition and label, every 5 ms for 1.5 s
        n += 1
        condition = {"type": "GPUHealthy", "status": "True", "reason": f"R{n}", "message": "m"}
        health.set(labels={"h": str(n)}, condition=condition)
        owner.sync()
        assert api.nodes[NODE]["h"] == str(n)  # the labels are never held by the status
        time.sleep(0.005)
    tried = [c for c in api.calls[began:] if c.write and c.path == status_path]
    # doubling from 0.01 s, even each wait halved by jitter: at most 10 in 1.5 s; at the
    # 0.02 s cap some 50 (18 in 1 s measured on a loaded machine)
    assert 1 <= len(tried) <= 10, len(tried)
    assert "403" in owner.error


def _labels_refused(informers: InformerFactory) -> NodeOwner:
    """The Node's owner (its thread not started; back-off 60 s) over a client whose Node
    patches a webhook refuses (403), not its status's."""
    node_path = f"/api/v1/nodes/{NODE}"

    class LabelsRefused:
        def request(self, method: str, path: str, **kw: Any) -> Any:
            if method == "PATCH" and path == node_path:
                raise PermissionDenied(f"PATCH {path}: 403 Forbidden: denied by a webhook")
            return informers.client.request(method, path, **kw)

    informer = informers.node(NODE).start()
    assert informer.synced.wait(10)
    return NodeOwner(LabelsRefused(), NODE, informer, backoff=(60.0, 120.0))  # type: ignore[arg-type]


def test_a_refused_node_patch_holds_back_neither_the_condition_nor_says_it_was_written(
    edge_api: tuple[EdgeKubeApi, str],
    informers: InformerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A webhook refusing a label (403) held the status write back too, so GPUHealthy=False
    waited out the Node patch's back-off (up to 10 minutes); and a part held back was logged
    as written."""
    import logging

    from agent.kube_node import Claim

    api, _ = edge_api
    node_path = f"/api/v1/nodes/{NODE}"
    owner = _labels_refused(informers)
    health = owner.part(Claim("health", label_keys=frozenset({"h"}), condition="GPUHealthy"))
    healthy = {"type": "GPUHealthy", "status": "True", "reason": "Ok", "message": "m"}
    health.set(labels={"h": "0"}, condition=healthy)
    with pytest.raises(AgentError, match="403"):
        owner.sync()
    assert owner.held_until - time.monotonic() > 10  # the Node patch, held back now
    began = len(api.calls)
    health.set(labels={"h": "1"}, condition={**healthy, "status": "False", "reason": "Xid"})
    with caplog.at_level(logging.INFO, logger="agent.kube_node"):
        assert owner.sync()  # the condition goes now; the labels wait for the owner
    assert "403" in owner.error  # the labels' failure still said
    writes = [c.path for c in api.calls[began:] if c.write]
    assert writes == [f"{node_path}/status"], writes
    wrote = [r.getMessage() for r in caplog.records if "wrote" in r.getMessage()]
    assert wrote == [f"Node {NODE}: wrote GPUHealthy"], wrote  # not the label held back


def test_a_callers_refused_write_backs_off_longer_each_time(
    edge_api: tuple[EdgeKubeApi, str], informers: InformerFactory
) -> None:
    """The MIG label protocol's one-shot label refused (403): once its back-off ended, the
    owner's pass found nothing of its own to write and started the back-off over, so the
    caller's label was sent again about every second, never doubling toward the cap."""
    api, _ = edge_api
    owner = _owner(informers, backoff=(0.05, 1.0), refused_max_s=600.0)
    api.fail_next("PATCH", f"/api/v1/nodes/{NODE}", 403, count=1000)
    waits = []
    for _ in range(4):
        with pytest.raises(AgentError, match="403"):
            owner.write_now(PENDING)
        waits.append(owner.held_until - time.monotonic())
        assert not owner.sync()  # the owner's pass in the back-off: nothing of its own
        assert "403" in owner.error  # the failure stands while its back-off runs
        time.sleep(max(0.0, owner.held_until - time.monotonic()) + 0.01)
        assert not owner.sync()  # and after it: nothing left to write, said no more
        assert owner.error == ""
    # 0.05 s doubling, each shortened by up to half: the fourth is 0.2-0.4 s, never the first's
    assert waits[3] > 0.05 * 1.5, waits
