"""Reclaimable GPUs marked on the Node, against the API stand-in: after the reclaim time under
the idle threshold with no process a GPU is in ``gpu-agent.io/reclaimable`` with an Event;
the mark follows the set and clears on use; an excluded pool is never marked; unknown idle
time marks nothing."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.coordinator.planning.catalog import preset_layouts
from agent.errors import AgentError, InvalidSpec
from agent.gpu.types import Process
from agent.kube import InClusterKubeClient
from agent.kube_edge import KubeEdge
from agent.reclaim import ANNOTATION, ExcludeSelector, ReclaimMarker, _OwnedMarks, reclaimable
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fake_edge import EdgeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.api.support import wait_for

DAY = 86400.0
LAYOUTS = preset_layouts("dgx-h100", NODE)
BUSY = dataclasses.replace(LAYOUTS[1], processes=(Process(4242, 1 << 30, None, None),))


def idle(*seconds: float | None) -> dict[str, float]:
    return {LAYOUTS[i].gpu.uuid: s for i, s in enumerate(seconds) if s is not None}


def test_only_gpus_idle_long_enough_with_no_process_are_reclaimable() -> None:
    layouts = (LAYOUTS[0], BUSY, LAYOUTS[2], LAYOUTS[3])
    assert reclaimable(layouts, idle(DAY, 2 * DAY, DAY - 1, None), DAY) == (0,)


def test_a_gpu_with_a_failed_health_mark_is_not_reclaimable_however_long_it_idles() -> None:
    """It idles because it is broken (say XID 79): an autoscaler handing it back as spare
    capacity would hide a repair; once the mark clears it is counted again."""
    layouts = LAYOUTS[:2]
    broken = {LAYOUTS[1].gpu.uuid}
    assert reclaimable(layouts, idle(2 * DAY, 2 * DAY), DAY, broken) == (0,)
    assert reclaimable(layouts, idle(2 * DAY, 2 * DAY), DAY) == (0, 1)


class Marker:
    def __init__(self, kube: InClusterKubeClient, exclude: str = "") -> None:
        self.idle: Mapping[str, float] | None = None
        self.layouts = (LAYOUTS[0], BUSY, *LAYOUTS[2:])
        self.marker = ReclaimMarker(
            kube,
            NODE,
            lambda: kube.node_metadata(NODE),
            lambda: self.layouts,
            lambda: self.idle,
            DAY,
            ExcludeSelector.parse(exclude),
        )


def events(api: FakeKubeApi) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in api.events]


def test_the_mark_and_its_events_follow_idle_gpus_and_clear_on_use(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    m = Marker(kube)
    assert m.marker.mark() is None and not api.requests  # no telemetry yet: nothing
    m.idle = idle(DAY + 5, DAY + 5, 10, DAY, 0, 0, 0, 0)
    assert m.marker.mark() == (0, 3)
    assert api.node_annotations[NODE] == {ANNOTATION: "0,3"}
    assert events(api) == [
        ("GpusReclaimable", "GPU(s) 0,3 idle for 24 h or more with no process: reclaimable")
    ]
    event = api.events[0]
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == NODE
    patches = len([r for r in api.requests if r.method == "PATCH"])
    assert m.marker.mark() == (0, 3)  # unchanged: no write, no Event
    assert len([r for r in api.requests if r.method == "PATCH"]) == patches
    m.idle = idle(DAY + 70, DAY + 70, 10, 0, 0, 0, 0, 0)  # GPU 3 used again
    assert m.marker.mark() == (0,) and api.node_annotations[NODE] == {ANNOTATION: "0"}
    m.idle = idle(1, DAY, 10, 0, 0, 0, 0, 0)  # GPU 0 too
    assert m.marker.mark() == ()
    assert ANNOTATION not in api.node_annotations[NODE]
    assert events(api)[-1] == ("GpusInUse", "GPU(s) 0 are in use again (or excluded)")


def test_an_excluded_pool_is_never_marked(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.nodes[NODE]["pool"] = "inference"
    m = Marker(kube, exclude="pool=inference")
    m.idle = idle(*[2 * DAY] * 8)
    assert m.marker.mark() == ()
    assert not api.node_annotations.get(NODE) and api.events == []


def test_a_bad_exclude_selector_names_the_setting() -> None:
    with pytest.raises(InvalidSpec, match="reclaim_exclude_selector term 'pool'"):
        ExcludeSelector.parse("pool")
    assert ExcludeSelector.parse("pool!=train").matches({"pool": "inference"})
    assert not ExcludeSelector.parse("").matches({"pool": "inference"})


def test_a_mark_whose_first_write_failed_still_gets_its_event(
    kube: InClusterKubeClient, edge_api: tuple[EdgeKubeApi, str]
) -> None:
    """The marker posted the Event only in the pass whose write went through: when the
    Node's owner wrote the annotation on its own retry after a failed write, the next pass
    found the annotation as wanted and the GpusReclaimable Event never came."""
    api, _ = edge_api
    edge = KubeEdge.build(kube, NODE)
    edge.start()
    try:
        assert edge.owner.informer.synced.wait(10)
        metadata = edge.owner.node_object
        m = ReclaimMarker(
            _OwnedMarks(edge),
            NODE,
            lambda: _metadata(metadata()),
            lambda: (LAYOUTS[0], BUSY, *LAYOUTS[2:]),
            lambda: idle(DAY + 5, 0, 0, 0, 0, 0, 0, 0),
            DAY,
            ExcludeSelector.parse(""),
        )
        api.fail_next("PATCH", f"/api/v1/nodes/{NODE}", 503)
        with pytest.raises(AgentError):
            m.mark()
        wait_for(lambda: api.node_annotations.get(NODE, {}).get(ANNOTATION) == "0", "retried")
        assert m.mark() == (0,)
        assert [reason for reason, _ in events(api)] == ["GpusReclaimable"]
        assert m.mark() == (0,) and len(api.events) == 1  # said once
    finally:
        edge.stop()


def _metadata(node: object) -> tuple[Mapping[str, str], Mapping[str, str]]:
    meta = node["metadata"] if isinstance(node, dict) else {}
    return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})


def test_a_pass_before_the_nodes_watch_listed_waits_for_the_list_not_a_minute(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient, tmp_path: Path
) -> None:
    """The agent's tasks start before its Node watch has listed: the first reclaim pass
    raised "the Node is not listed yet", logged an ERROR with a traceback, and the mark came
    a minute later. Such a pass marks nothing, quietly, and the first list wakes the next."""
    from agent.reclaim import reclaim_tasks
    from tests.unit.doctor.support import config

    api, _ = edge_api
    made = config(tmp_path, node_name=NODE)
    made = dataclasses.replace(
        made, telemetry=dataclasses.replace(made.telemetry, idle_reclaim_after_s=DAY)
    )
    snapshot = SimpleNamespace(gpu_idle_seconds=lambda: idle(2 * DAY))
    parts: Any = SimpleNamespace(layouts=lambda: LAYOUTS, latest=lambda: snapshot, marks=dict)
    edge = KubeEdge.build(kube, NODE)
    (task,) = reclaim_tasks(edge, made, parts, parts, parts)
    woken = threading.Event()
    for subscribe in task.wakes:
        subscribe(woken.set)
    try:
        assert task.work() is None  # not listed: nothing marked, and no failure
        assert not woken.is_set()
        edge.start()  # the watch lists
        assert woken.wait(10), "the first list did not wake the pass"
        assert task.work() == (0,)
        wait_for(lambda: api.node_annotations.get(NODE, {}).get(ANNOTATION) == "0", "marked")
    finally:
        edge.stop()
