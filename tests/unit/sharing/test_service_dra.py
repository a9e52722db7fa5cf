"""SharingService on a DRA node, against the Kubernetes API stand-in: ``set`` writes the DRA
driver's DeviceClasses instead of the plugin's file, a second set updates them, ``clear``
removes them, ``rollback`` restores them, and the stand-in (the API server's validation)
accepted every write."""

from __future__ import annotations

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
    assert stored["metadata"]["annotations"][dra.NODES] == NODE
    assert params(stored)["sharing"] == {
        "strategy": "TimeSlicing",
        "timeSlicingConfig": {"interval": "Default"},
    }
    assert not config_path.exists()  # the device plugin's file is left alone
    assert "not carried" in result.dra.notes[0].description


def test_a_second_set_updates_the_objects_and_the_same_set_changes_nothing(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    svc = service(config_path, kube)
    svc.set(mps(4))
    version = classes(api)["gpu-agent-mps-gpu"]["metadata"]["resourceVersion"]
    result = svc.set(mps(2))
    assert [(o.name, o.state) for o in result.dra.objects] == [("gpu-agent-mps-gpu", "updated")]
    stored = classes(api)["gpu-agent-mps-gpu"]
    assert params(stored)["sharing"]["mpsConfig"] == {"defaultActiveThreadPercentage": 50}
    assert stored["metadata"]["resourceVersion"] != version
    switched = svc.set(ts())
    assert sorted((o.name, o.state) for o in switched.dra.objects) == [
        ("gpu-agent-mps-gpu", "deleted"),
        ("gpu-agent-time-slicing-gpu", "created"),
    ]
    assert list(classes(api)) == ["gpu-agent-time-slicing-gpu"]
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


def test_clear_removes_the_objects_and_rollback_restores_them(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    svc = service(config_path, kube)
    svc.set(ts())
    cleared = svc.clear()
    assert cleared.changed
    assert [(o.name, o.state) for o in cleared.dra.objects] == [
        ("gpu-agent-time-slicing-gpu", "deleted")
    ]
    assert classes(api) == {}
    assert svc.show().dra.objects == ()
    restored = svc.rollback()
    assert [(o.name, o.state) for o in restored.dra.objects] == [
        ("gpu-agent-time-slicing-gpu", "created")
    ]
    assert list(classes(api)) == ["gpu-agent-time-slicing-gpu"]
    undone = svc.rollback()  # a second rollback undoes the first
    assert classes(api) == {} and undone.changed


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


def test_another_nodes_class_with_another_config_is_refused_before_any_write(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient, tmp_path: Path
) -> None:
    api, _ = kube_api
    other = tmp_path / "other" / "config.yaml"
    other.parent.mkdir()
    service(other, kube, node_name="gpu-node-2").set(mps(4))
    with pytest.raises(Conflict, match="gpu-node-2"):
        service(config_path, kube).set(mps(2))
    assert classes(api)["gpu-agent-mps-gpu"]["metadata"]["annotations"][dra.NODES] == "gpu-node-2"
    service(config_path, kube).set(mps(4))  # the same spec joins it
    assert dra.nodes_of(classes(api)["gpu-agent-mps-gpu"]) == {NODE, "gpu-node-2"}
    service(other, kube, node_name="gpu-node-2").clear()
    assert dra.nodes_of(classes(api)["gpu-agent-mps-gpu"]) == {NODE}


class RacingKube:
    """The stand-in's client, with somebody else writing a class just before our first PUT."""

    def __init__(self, kube: InClusterKubeClient, api: FakeKubeApi) -> None:
        self._kube, self._api, self.puts = kube, api, 0

    def list_all(self, path: str, query: Any = None, page_size: int = 500) -> Any:
        return self._kube.list_all(path, query, page_size)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "PUT":
            self.puts += 1
            if self.puts == 1:
                name = path.rsplit("/", 1)[1]
                obj = next(
                    o for o in self._api.dra("deviceclasses") if o["metadata"]["name"] == name
                )
                obj["metadata"].pop("resourceVersion")
                self._api.put_dra("deviceclasses", obj)  # bumps the version under us
        return self._kube.request(method, path, **kwargs)


def test_an_update_that_meets_a_409_is_decided_again_and_retried_once(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    service(config_path, kube).set(mps(4))
    racing = RacingKube(kube, api)
    result = service(config_path, racing).set(mps(2))
    assert racing.puts == 2
    assert [o.state for o in result.dra.objects] == ["updated"]
    assert params(classes(api)["gpu-agent-mps-gpu"])["sharing"]["mpsConfig"] == {
        "defaultActiveThreadPercentage": 50
    }


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


def test_a_change_that_fails_part_way_says_what_it_made_and_show_names_the_leftover(
    config_path: Path, kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """An API server blip on the second of two DeviceClasses left the first created while the
    error said only "500 Internal Server Error", and ``share show`` then called the leftover
    "DeviceClass differs from the spec set on this node". The error now says what was made and
    that the spec was not recorded, show says the spec does not name the class, and the same
    set run again finishes the change (docs/dra.md, "Several nodes, one class")."""
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
    view = service(config_path, kube).show()
    assert [(o.name, o.state) for o in view.dra.objects] == [
        ("gpu-agent-time-slicing-gpu", "differs")
    ]
    assert [p.description for p in view.problems] == [
        "DeviceClass lists this node, but the spec set on this node does not name it (left by "
        "a change that failed part-way?): run that share command again, or share clear"
    ]
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
    nodes). Show reads one watch of them; a change lists them afresh (it writes against the
    versions it read) and puts what it wrote into the watch's cache, so a show right after it
    sees it; a hand edit arrives by the watch."""
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
        assert _class_lists(api) == lists + 1  # clear's own list, nothing else
    finally:
        watched.stop()
