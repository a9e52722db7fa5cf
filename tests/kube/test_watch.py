"""List+watch against the API stand-in over HTTPS: one list, then changes as they happen
(resuming at the last resourceVersion), a relist only on 410 Gone; the agent's own Node by a
field selector; discovery's caches for `coordinator serve`; an outage marks the cache stale."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from agent.coordinator.fleet.discovery import KubeDiscovery
from agent.coordinator.kube import KubeLister
from agent.errors import AgentError
from agent.kube import Gone, InClusterKubeClient
from agent.kube_watch import Informer, InformerFactory, NodeWatch
from tests.kube.fake_api import FakeKubeApi, Pod
from tests.kube.fixtures import NODE
from tests.unit.api.support import wait_for


@pytest.fixture
def lister(kube_api: tuple[FakeKubeApi, str], tls_cert: tuple[Path, Path]) -> KubeLister:
    api, url = kube_api
    return KubeLister(url, api.token_path, ca_path=tls_cert[0], timeout=5.0)


def test_one_list_then_changes_by_watch_and_a_relist_only_on_410(
    lister: KubeLister, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    seen = threading.Event()
    informer = Informer(lister, "/api/v1/nodes", page_size=1, watch_timeout_s=1, on_change=seen.set)
    informer.start()
    try:
        assert informer.synced.wait(10)
        assert informer.lists == 1 and len(informer.objects()) == 2  # two pages of one
        api.set_labels("gpu-node-2", {"pool": "inference"})

        def labelled() -> bool:
            return any(
                o["metadata"]["labels"].get("pool") == "inference" for o in informer.objects()
            )

        wait_for(labelled, "the change to arrive by watch", timeout=10)
        # Watches end every second (timeoutSeconds) and resume at the last version: no relist.
        wait_for(lambda: informer.watches >= 3, "the watch to be resumed", timeout=10)
        assert informer.lists == 1
        watches = [r for r in api.requests if r.query.get("watch") == "1"]
        assert all(r.query["resourceVersion"] for r in watches)
        # The history is compacted past the informer's version: 410 Gone, then one relist.
        api.compact()
        wait_for(lambda: informer.lists == 2, "a relist after 410 Gone", timeout=10)
        api.set_labels("gpu-node-3", {"pool": "train"})
        wait_for(lambda: len(informer.objects()) == 3, "the next change by watch", timeout=10)
        assert informer.lists == 2
    finally:
        informer.stop()


def test_an_outage_marks_the_cache_stale_until_the_api_answers_again(
    lister: KubeLister, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    informer = Informer(lister, "/api/v1/nodes", watch_timeout_s=1).start()
    try:
        assert informer.synced.wait(10) and informer.healthy
        api.unavailable.add("/api/v1/nodes")
        wait_for(lambda: not informer.healthy, "the outage to be noticed", timeout=10)
        assert "503" in informer.error
        api.unavailable.clear()
        wait_for(lambda: informer.healthy, "the watch to come back", timeout=15)
    finally:
        informer.stop()


def test_the_agent_watches_its_own_node_by_field_selector(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """Only this Node's changes reach the agent, each as it happens: no polling GETs."""
    api, _ = kube_api
    changes = []
    watch = NodeWatch(InformerFactory(kube).node(NODE), NODE)
    watch.informer.add_handler(lambda: changes.append(1))
    watch.informer.start()
    try:
        wait_for(lambda: watch.labels() is not None, "the first list")
        assert watch.labels() == {"kubernetes.io/hostname": NODE}
        before = len(changes)
        api.set_labels("gpu-node-2", {"other": "x"})  # another node: not seen
        api.set_labels(NODE, {"nvidia.com/mig.config": "all-1g.10gb"})
        wait_for(lambda: (watch.labels() or {}).get("nvidia.com/mig.config"), "the label")
        assert len(changes) == before + 1
        selectors = {r.query.get("fieldSelector") for r in api.requests if r.method == "GET"}
        assert selectors == {f"metadata.name={NODE}"}
        assert not [r for r in api.requests if r.path == f"/api/v1/nodes/{NODE}"]  # no GETs
    finally:
        watch.informer.stop()


def test_serve_discovery_keeps_pods_and_labels_by_watch(
    lister: KubeLister, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """Passes read the caches: after the first list, a pass makes no request at all; a label
    change is in the next pass."""
    api, _ = kube_api
    labels = {"app.kubernetes.io/name": "gpu-agent", "app.kubernetes.io/component": "agent"}
    api.pods.append(Pod("gpu-agent", "agent-1", NODE, labels, "10.0.0.1", 9401))
    discovery = KubeDiscovery(lister, "gpu-agent", watch=True)
    try:
        (first,) = asyncio.run(discovery.targets())
        assert (first.address, first.labels_known) == ("10.0.0.1:9401", True)
        listed = len([r for r in api.requests if r.query.get("watch") is None])
        api.set_labels(NODE, {"pool": "inference"})

        def relabelled() -> bool:
            (t,) = asyncio.run(discovery.targets())
            return t.labels.get("pool") == "inference"

        wait_for(relabelled, "the label in a pass", timeout=10)
        assert len([r for r in api.requests if r.query.get("watch") is None]) == listed
    finally:
        discovery.close()


class _Scripted:
    """A Lister whose list and each watch answer what the test scripted."""

    def __init__(self, items: list[dict[str, object]]) -> None:
        self.items = items
        self.events: list[tuple[str, object]] = []

    def list_all(
        self, path: str, query: object = None, page_size: int = 0, *, metadata_only: bool = False
    ) -> tuple[list, str]:
        return list(self.items), "5"

    def watch(
        self,
        path: str,
        query: object,
        resource_version: str,
        timeout_s: float,
        *,
        metadata_only: bool = False,
    ) -> object:
        return iter(self.events)


def _obj(name: str, version: str) -> dict[str, object]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def test_a_delete_of_ours_is_not_undone_by_an_event_from_before_it() -> None:
    """A sharing change deletes a DeviceClass and drops it from the watch's cache at once; the
    watch may still deliver the class as it was before the delete (an event in flight): that
    must not bring it back, while the class made again later (a newer version) comes in."""
    lister = _Scripted([_obj("gpu-agent-mps-gpu", "5")])
    informer = Informer(lister, "/apis/resource.k8s.io/v1/deviceclasses")
    informer.relist()
    informer.assume_deleted(_obj("gpu-agent-mps-gpu", "5"))
    assert informer.objects() == []
    lister.events = [("MODIFIED", _obj("gpu-agent-mps-gpu", "5"))]
    informer.watch_once()
    assert informer.objects() == []
    lister.events = [("ADDED", _obj("gpu-agent-mps-gpu", "9"))]
    informer.watch_once()
    assert informer.objects() == [_obj("gpu-agent-mps-gpu", "9")]


class _Versions:
    """A server whose first watch moves to version 9 and then answers 410, and whose list
    from version 9 answers 410 too (compacted meanwhile): the versions each list asked for."""

    def __init__(self) -> None:
        self.asked: list[str | None] = []
        #: the page size each list asked for (0: unpaged)
        self.paged: list[int] = []
        self.informer: Informer | None = None

    def list_all(
        self, path: str, query: object = None, page_size: int = 0, *, metadata_only: bool = False
    ) -> tuple[list, str]:
        self.asked.append(dict(query or {}).get("resourceVersion"))  # type: ignore[call-overload]
        self.paged.append(page_size)
        if len(self.asked) == 2:
            raise Gone("410 Gone: too old resource version: 9")
        if len(self.asked) == 3 and self.informer is not None:
            self.informer.stop()
        return [_obj("gpu-node-1", "7")], "7"

    def watch(
        self,
        path: str,
        query: object,
        resource_version: str,
        timeout_s: float,
        *,
        metadata_only: bool = False,
    ) -> object:
        yield "MODIFIED", _obj("gpu-node-1", "9")
        raise Gone("410 Gone: too old resource version: 7")


def test_lists_ask_for_the_watch_cache_as_client_gos_reflector_does() -> None:
    """Every list asked for the newest version (a consistent read from etcd): 5,000 agents
    restarted together were 5,000 etcd reads of their Node and slices. As client-go's
    reflector: the first list asks for version 0 (the API server's watch cache), a list
    after a watch's 410 for the version last seen, unpaged (a limit with that version asks
    for exactly it, from etcd), and only a list after a list's 410 for none."""
    server = _Versions()
    informer = server.informer = Informer(server, "/api/v1/nodes", backoff=(0.01, 0.02))
    thread = threading.Thread(target=informer.run, daemon=True)
    thread.start()
    thread.join(10)
    assert server.asked == ["0", "9", None]
    assert server.paged[1] == 0 and server.paged[0] > 0 and server.paged[2] > 0


def test_an_unserved_resource_is_current_again_after_a_recheck_that_failed_once() -> None:
    """Not served is normal: a discovery re-check that failed once (the API server away for a
    moment) left the informer stale until the resource was served, though the next re-check
    said not served again."""
    answers: list[object] = [None, AgentError("discovery: connection refused"), None]

    def resolve() -> str | None:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    informer = Informer(_Versions(), "/apis/x", backoff=(0.01, 0.02))  # type: ignore[arg-type]
    informer.resolve_path(resolve)
    informer.relist()
    assert informer.status()[0]
    with pytest.raises(AgentError):
        informer.relist()
    informer._failed(AgentError("discovery: connection refused"), 0.0)
    assert not informer.status()[0]
    informer.relist()
    current, said = informer.status()
    assert current and "not served" in said, said
