"""SharingService on a DRA node, against the Kubernetes API stand-in: ``set`` creates the DRA
driver's DeviceClasses instead of writing the plugin's file, a class that is there is never
written again (by this node or any other), ``clear`` and ``rollback`` change the node's spec,
and the stand-in (the API server's validation) accepted every write."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from agent.config import SharingSettings
from agent.dra.mode import Allocation, AllocationMode
from agent.errors import AgentError, Conflict, InvalidSpec, NotSupported
from agent.kube import InClusterKubeClient
from agent.kube_watch import Informer
from agent.sharing import dra, dra_kube, parse
from agent.sharing.service import SharingService
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.sharing.layouts import node

DRA = Allocation(AllocationMode.DRA, "ResourceSlices of gpu.nvidia.com", "gpu.nvidia.com")


def ts(replicas: int = 4, name: str = "nvidia.com/gpu") -> Any:
    return parse(
        {"sharing": {"timeSlicing": {"resources": [{"name": name, "replicas": replicas}]}}}
    )


def mps(replicas: int = 4) -> Any:
    return parse({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": replicas}]}}})


class Mode:
    def __init__(self, allocation: Allocation) -> None:
        self.allocation = allocation

    def __call__(self) -> Allocation:
        return self.allocation


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    d = tmp_path / "nvidia-device-plugin"
    d.mkdir()
    return d / "config.yaml"


def service(
    path: Path,
    kube: Any,
    mode: Allocation | Mode = DRA,
    node_name: str = NODE,
    device_classes: Informer | None = None,
) -> SharingService:
    settings = SharingSettings(config_path=path, reload="none")
    provider = mode if isinstance(mode, Mode) else Mode(mode)
    return SharingService(
        settings,
        lambda: node(8),
        kube,
        node_name=node_name,
        clock=lambda: 1000.0,
        allocation=provider,
        device_classes=device_classes,
    )


def classes(api: FakeKubeApi) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in api.dra("deviceclasses")}


def params(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["config"][0]["opaque"]["parameters"]


def test_set_on_a_dra_node_writes_device_classes_not_the_plugin_file(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    result = service(config_path, kube).set(ts())
    assert result.changed and result.dra is not None
    assert [(o.name, o.state) for o in result.dra.objects] == [
        ("gpu-agent-time-slicing-gpu", "created")
    ]
    stored = classes(api)["gpu-agent-time-slicing-gpu"]
    assert stored["metadata"]["labels"][dra.MANAGED_BY] == "gpu-agent"
    assert stored["metadata"]["annotations"] == {dra.RESOURCE_NAME: "nvidia.com/gpu"}
    assert params(stored)["sharing"] == {
        "strategy": "TimeSlicing",
        "timeSlicingConfig": {"interval": "Default"},
    }
    assert not config_path.exists()  # the device plugin's file is left alone
    assert "not carried" in result.dra.notes[0].description


def test_a_second_set_creates_its_class_and_the_same_set_changes_nothing(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """Another spec is another class (the name carries the MPS share); the one the node used
    before stays for the other nodes that may use it (docs/dra.md, "Several nodes, one
    class")."""
    api, _ = kube_api
    svc = service(config_path, kube)
    svc.set(mps(4))
    before = classes(api)["gpu-agent-mps-gpu-25pct"]
    result = svc.set(mps(2))
    assert [(o.name, o.state) for o in result.dra.objects] == [
        ("gpu-agent-mps-gpu-50pct", "created")
    ]
    stored = classes(api)["gpu-agent-mps-gpu-50pct"]
    assert params(stored)["sharing"]["mpsConfig"] == {"defaultActiveThreadPercentage": 50}
    assert classes(api)["gpu-agent-mps-gpu-25pct"] == before  # not written
    switched = svc.set(ts())
    assert [(o.name, o.state) for o in switched.dra.objects] == [
        ("gpu-agent-time-slicing-gpu", "created")
    ]
    assert sorted(classes(api)) == [
        "gpu-agent-mps-gpu-25pct",
        "gpu-agent-mps-gpu-50pct",
        "gpu-agent-time-slicing-gpu",
    ]
    again = svc.set(ts())
    assert not again.changed
    assert [(o.name, o.state) for o in again.dra.objects] == [
        ("gpu-agent-time-slicing-gpu", "unchanged")
    ]


def test_show_lists_the_objects_and_what_drifted(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    svc = service(config_path, kube)
    svc.set(ts())
    view = svc.show()
    assert view.dra is not None and not view.problems and view.advertised == ()
    assert view.config.sharing == ts().sharing
    assert [(o.name, o.state) for o in view.dra.objects] == [
        ("gpu-agent-time-slicing-gpu", "present")
    ]
    edited = classes(api)["gpu-agent-time-slicing-gpu"]
    params(edited)["sharing"]["timeSlicingConfig"]["interval"] = "Forever"  # by hand
    api.put_dra("deviceclasses", edited)
    view = svc.show()
    assert [o.state for o in view.dra.objects] == ["differs"]
    fields = [p.field for p in view.problems]
    assert "gpu-agent-time-slicing-gpu" in fields
    assert any(f.endswith("timeSlicingConfig.interval") for f in fields)


def test_clear_forgets_the_spec_and_rollback_restores_it_writing_no_class(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    svc = service(config_path, kube)
    svc.set(ts())
    there = classes(api)
    cleared = svc.clear()
    assert cleared.changed and cleared.dra.objects == ()
    assert classes(api) == there  # other nodes may use it: left as it is
    assert svc.show().dra.objects == () and svc.show().config.sharing == parse({}).sharing
    restored = svc.rollback()
    assert restored.changed
    assert [(o.name, o.state) for o in restored.dra.objects] == [
        ("gpu-agent-time-slicing-gpu", "unchanged")
    ]
    assert svc.show().config.sharing == ts().sharing
    undone = svc.rollback()  # a second rollback undoes the first
    assert undone.changed and svc.show().dra.objects == () and classes(api) == there


def test_unknown_mode_refuses_every_change_naming_it(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    unknown = Allocation(AllocationMode.UNKNOWN, "the API server has not answered")
    svc = service(config_path, kube, unknown)
    for change in (lambda: svc.set(ts()), svc.clear, svc.rollback):
        with pytest.raises(Conflict, match="allocation mode unknown"):
            change()
    assert classes(api) == {} and not config_path.exists()


def test_device_plugin_mode_writes_the_plugin_file_as_before(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    plugin = Allocation(AllocationMode.DEVICE_PLUGIN, "nvidia.com/gpu in node capacity")
    result = service(config_path, kube, plugin).set(ts())
    assert result.dra is None and parse(config_path.read_bytes()) == result.config
    assert classes(api) == {}


def test_a_refused_spec_writes_nothing(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    bad = parse(
        {
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "resources": [{"name": "gpu", "replicas": 2}],
                }
            }
        }
    )
    with pytest.raises(InvalidSpec) as caught:
        service(config_path, kube).set(bad)
    assert [v.field for v in caught.value.violations] == ["sharing.timeSlicing.renameByDefault"]
    assert classes(api) == {} and sorted(config_path.parent.iterdir()) == []


def test_nodes_with_different_specs_each_get_their_class_and_a_clear_writes_none(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient, tmp_path: Path
) -> None:
    """Formerly the second node was refused (exit 4) while the first used the class with
    another config; each spec now has a class of its own."""
    api, _ = kube_api
    other = tmp_path / "other" / "config.yaml"
    other.parent.mkdir()
    service(other, kube, node_name="gpu-node-2").set(mps(4))
    service(config_path, kube).set(mps(2))
    assert sorted(classes(api)) == ["gpu-agent-mps-gpu-25pct", "gpu-agent-mps-gpu-50pct"]
    writes = len(_class_writes(api))
    service(other, kube, node_name="gpu-node-2").clear()
    assert len(_class_writes(api)) == writes
    assert sorted(classes(api)) == ["gpu-agent-mps-gpu-25pct", "gpu-agent-mps-gpu-50pct"]


def _class_writes(api: FakeKubeApi) -> list[Any]:
    return [r for r in api.requests if r.method != "GET" and r.path.startswith(dra_kube.PATH)]


def test_a_fleet_setting_one_spec_writes_its_class_once_and_a_clear_writes_nothing(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient, tmp_path: Path
) -> None:
    """Every node's agent used to PUT the one cluster-wide class to add itself to its
    ``gpu-agent.io/nodes`` annotation: at 5,000 nodes a fleet rollout PUT a class of up to
    200 KB 5,000 times, each sent by the watch to every DRA agent, concurrent nodes met 409s,
    and the object neared the API server's size limit; every clear PUT it again. Now the first
    node creates it, the others only read it, and its size does not depend on the fleet's."""
    api, _ = kube_api
    nodes = [f"gpu-node-{i:03}" for i in range(200)]
    paths = {n: tmp_path / n / "config.yaml" for n in nodes}
    sizes = []
    for n in nodes:
        paths[n].parent.mkdir()
        service(paths[n], kube, node_name=n).set(ts())
        sizes.append(len(json.dumps(classes(api)["gpu-agent-time-slicing-gpu"])))
    assert len(_class_writes(api)) == 1
    assert set(sizes) == {sizes[0]} and sizes[0] < 2048
    for n in nodes[:50]:
        assert service(paths[n], kube, node_name=n).clear().changed
    assert len(_class_writes(api)) == 1
    assert list(classes(api)) == ["gpu-agent-time-slicing-gpu"]


class RacingKube:
    """The stand-in's client, with another node creating the class just before our POST."""

    def __init__(self, kube: InClusterKubeClient, api: FakeKubeApi, body: dict[str, Any]) -> None:
        self._kube, self._api, self._body, self.posts = kube, api, body, 0

    def list_all(self, path: str, query: Any = None, page_size: int = 500) -> Any:
        return self._kube.list_all(path, query, page_size)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "POST":
            self.posts += 1
            self._kube.request("POST", path, body=self._body)  # the other node's, first
        return self._kube.request(method, path, **kwargs)


def test_a_create_that_meets_a_409_reads_the_class_again_and_takes_the_same_one(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    (shared,) = dra.plan(mps(4), DRA).classes
    racing = RacingKube(kube, api, dra.device_class(shared))
    result = service(config_path, racing).set(mps(4))
    assert racing.posts == 1  # 409 AlreadyExists, read again: the same spec, done
    assert [o.state for o in result.dra.objects] == ["unchanged"] and result.changed
    edited = dra.device_class(shared)
    params(edited)["sharing"]["mpsConfig"] = {}
    api.delete_dra("deviceclasses", "gpu-agent-mps-gpu-25pct")
    with pytest.raises(Conflict, match="does not carry the spec its name stands for"):
        service(config_path, RacingKube(kube, api, edited)).set(mps(4))


def test_without_a_kubernetes_client_a_dra_change_is_refused(config_path: Path) -> None:
    with pytest.raises(NotSupported, match="Kubernetes API client"):
        service(config_path, None).set(ts())


def test_show_degrades_when_the_api_server_is_down(
    config_path: Path,
    kube_api: tuple[FakeKubeApi, str],
    kube: InClusterKubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, _ = kube_api
    svc = service(config_path, kube)
    svc.set(ts())
    down = InClusterKubeClient("https://127.0.0.1:9", api.token_path, timeout=1.0)
    view = service(config_path, down).show()
    assert view.dra is not None and "unreachable" in view.dra.error
    assert view.config.sharing == ts().sharing  # the spec is still shown
    with pytest.raises(AgentError, match="unreachable"):
        service(config_path, down).set(mps(2))
    # Read from the watch, the same: not "no class", but why none could be read.
    monkeypatch.setattr(dra_kube, "SYNC_WAIT_S", 0.5)
    watched = Informer(down, dra_kube.PATH, dra_kube.QUERY, backoff=(5.0, 5.0))
    try:
        svc = service(config_path, down, device_classes=watched)
        view = svc.show()
        assert view.dra is not None and view.dra.objects == ()
        assert "DeviceClasses not read" in view.dra.error and "unreachable" in view.dra.error
    finally:
        watched.stop()


def test_a_change_that_fails_part_way_says_what_it_made(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """An API server blip on the second of two DeviceClasses left the first created while the
    error said only "500 Internal Server Error". The error now says what was made and that the
    spec was not recorded, and the same set run again finishes the change (docs/dra.md,
    "Several nodes, one class")."""
    api, _ = kube_api
    two = parse(
        {
            "sharing": {
                "timeSlicing": {
                    "resources": [
                        {"name": "nvidia.com/gpu", "replicas": 4},
                        {"name": "nvidia.com/mig-1g.10gb", "replicas": 4},
                    ]
                }
            }
        }
    )
    api.failing[("POST", "/apis/resource.k8s.io/v1/deviceclasses")] = (1, 1)
    with pytest.raises(AgentError) as raised:
        service(config_path, kube).set(two)
    said = str(raised.value)
    assert "500" in said and "created DeviceClass gpu-agent-time-slicing-gpu" in said, said
    assert "the spec was not recorded" in said, said
    assert service(config_path, kube).show().dra.objects == ()  # the node's spec is unchanged
    finished = service(config_path, kube).set(two)
    assert sorted(classes(api)) == [
        "gpu-agent-time-slicing-gpu",
        "gpu-agent-time-slicing-mig-1g.10gb",
    ]
    assert finished.changed and not service(config_path, kube).show().problems


def test_with_the_mode_unknown_show_does_not_count_what_a_plugin_advertises(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """With the allocation mode unknown (the API server not answering yet), ``share show``
    counted ADVERTISED from the plugin's file as if a device plugin surely handed the GPUs out,
    while every change was refused because that is not known. It now says the count is not
    known and why, and still shows the file (docs/dra.md, "Sharing under DRA")."""
    plugin = Allocation(AllocationMode.DEVICE_PLUGIN, "nvidia.com/gpu in node capacity")
    service(config_path, kube, plugin).set(ts())
    unknown = Allocation(AllocationMode.UNKNOWN, "the API server has not answered")
    view = service(config_path, kube, unknown).show()
    assert view.advertised == ()
    assert view.advertised_unknown.startswith("allocation mode unknown (the API server has not")
    assert view.config.sharing == ts().sharing and view.dra is None


def _class_lists(api: FakeKubeApi) -> int:
    return len(
        [
            r
            for r in api.requests
            if r.method == "GET" and r.path == dra_kube.PATH and r.query.get("watch") is None
        ]
    )


def test_show_reads_the_watched_classes_and_sends_nothing_while_nothing_changes(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """The node's inventory refreshes sharing every 5 s: a list of the DeviceClasses in each
    show made every DRA node of a fleet list them every 5 s (1,000 lists a second at 5,000
    nodes). Show reads one watch of them; a change GETs the classes it names and puts what it
    created into the watch's cache, so a show right after it sees it; a hand edit arrives by
    the watch."""
    api, _ = kube_api
    watched = Informer(kube, dra_kube.PATH, dra_kube.QUERY, watch_timeout_s=5.0)
    svc = service(config_path, kube, device_classes=watched)
    try:
        svc.set(ts())
        assert [(o.name, o.state) for o in svc.show().dra.objects] == [
            ("gpu-agent-time-slicing-gpu", "present")
        ]
        lists = _class_lists(api)
        for _ in range(10):
            assert not svc.show().problems
        assert _class_lists(api) == lists  # the shows sent nothing
        edited = classes(api)["gpu-agent-time-slicing-gpu"]
        params(edited)["sharing"]["timeSlicingConfig"]["interval"] = "Forever"  # by hand
        api.put_dra("deviceclasses", edited)
        deadline = time.monotonic() + 10
        while svc.show().dra.objects[0].state != "differs" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.show().dra.objects[0].state == "differs"
        svc.clear()
        assert svc.show().dra.objects == ()  # at once, not when the watch says so
        assert _class_lists(api) == lists  # clear lists nothing
    finally:
        watched.stop()
