"""Image readiness checked against the runtime, pins in containerd and re-pull policies: our CRI
and containerd clients against a real containerd pulling from a real local docker-registry."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.errors import Conflict
from agent.prewarm.image_warm import NydusWarmer
from agent.prewarm.images import CriPuller
from agent.prewarm.labels import node_labels
from agent.prewarm.model import ImageRequest, ItemState, PullPolicy
from agent.prewarm.naming import label_key
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.registry import RegistryClient
from agent.prewarm.service import PrewarmService
from tests.integration.prewarm_fixtures import cri
from tests.integration.prewarm_fixtures.agent import LOOPBACK
from tests.integration.prewarm_fixtures.agent import make_service as _make_service

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(cri.missing_tools()), reason=f"needs Debian {cri.TOOLS}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="containerd needs root"),
]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make_service(tmp: Path, **kw: Any) -> PrewarmService:
    """With the warmer the agent has: a plain image is fully warm (labelled) once pulled."""
    warmer = NydusWarmer(RegistryClient(UrlPolicy(egress_allow=LOOPBACK)), None)
    return _make_service(tmp, warmer=warmer, **kw)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cri.Cluster]:
    work = tmp_path_factory.mktemp("cri")
    with cri.registry_and_containerd(work) as c:
        yield c


@pytest.fixture
def image(tmp_path: Path, cluster: cri.Cluster, request: pytest.FixtureRequest) -> str:
    tag = request.node.name.replace("_", "-")[-60:].strip("-")
    return cri.push_image(tmp_path, cluster.registry, "ready/img", tag, os.urandom(4096))


def test_an_image_removed_from_containerd_is_pulled_again_not_a_hit(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    """What the kubelet's image GC does: the image goes; the next request pulls, cold."""
    puller = CriPuller(cluster.socket)
    svc = make_service(tmp_path, puller=puller)
    item = svc.run(svc.submit(ImageRequest(image, name="img")).id)
    assert item.state is ItemState.READY, item.error
    assert label_key("img") in node_labels(svc.items())
    assert svc.submit(ImageRequest(image, name="img")).hits == 1  # present: a hit
    puller.remove(image)
    again = svc.submit(ImageRequest(image, name="img"))
    assert again.state is ItemState.QUEUED
    assert label_key("img") not in node_labels(svc.items())
    assert svc.run(again.id).state is ItemState.READY
    assert [p.cold for p in svc.pulls()] == [True, True]
    assert puller.present(image)


def test_audit_evicts_an_image_gone_from_containerd_and_evict_accepts_it(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    puller = CriPuller(cluster.socket)
    svc = make_service(tmp_path, puller=puller)
    svc.run(svc.submit(ImageRequest(image, name="gc")).id)
    assert svc.audit() == []
    puller.remove(image)
    [changed] = svc.audit()
    assert (changed.name, changed.state) == ("gc", ItemState.EVICTED)
    assert "no longer in the runtime" in (changed.error or "")
    assert label_key("gc") not in node_labels(svc.items())
    assert svc.evict("gc").state is ItemState.EVICTED


def test_cache_evict_removes_a_ready_image_from_containerd(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    puller = CriPuller(cluster.socket)
    svc = make_service(tmp_path, puller=puller)
    svc.run(svc.submit(ImageRequest(image, name="ev")).id)
    assert svc.evict("ev").state is ItemState.EVICTED
    assert not puller.present(image)
    assert svc.run(svc.submit(ImageRequest(image, name="ev")).id).state is ItemState.READY


def test_two_names_of_one_image_share_it_as_two_names_of_one_blob_do(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    """Two items may name one image (`--name a`, `--name b`). `cache evict a` removed it from
    containerd while `b`, pinned, stayed ready and labelled on an image that was gone: a pin
    did not keep it. As for a blob's names, evicting one name of an image is refused while
    another is pinned, and takes every name once none is; `prewarm delete a` leaves the image
    to `b`."""
    puller = CriPuller(cluster.socket)
    svc = make_service(tmp_path, puller=puller)
    svc.run(svc.submit(ImageRequest(image, name="a")).id)
    svc.run(svc.submit(ImageRequest(image, name="b", pin=True)).id)
    with pytest.raises(Conflict, match="shares its image with pinned b"):
        svc.evict("a")
    assert puller.present(image) and svc.get("a").state is ItemState.READY
    svc.delete("a")
    assert puller.present(image) and [i.name for i in svc.items()] == ["b"]
    assert svc.get("b").state is ItemState.READY
    svc.run(svc.submit(ImageRequest(image, name="c")).id)
    svc.pin("b", False)
    assert svc.evict("c").state is ItemState.EVICTED
    assert not puller.present(image) and svc.get("b").state is ItemState.EVICTED


def test_unpinning_one_name_of_an_image_keeps_it_pinned_for_another(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    """`cache pin a --unpin` took containerd's pinned label off the image while `b`, another
    name of it, was still pinned: the kubelet's image GC could then remove b's image. The
    label stays while any name of the image is pinned."""
    puller = CriPuller(cluster.socket)
    svc = make_service(tmp_path, puller=puller)
    svc.run(svc.submit(ImageRequest(image, name="a", pin=True)).id)
    svc.run(svc.submit(ImageRequest(image, name="b", pin=True)).id)
    svc.pin("a", False)
    assert puller.pinned_names(image) != [] and svc.get("a").pinned is False
    svc.pin("b", False)
    assert puller.pinned_names(image) == []


def test_a_pinned_image_is_pinned_in_containerd_and_not_evicted(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    """io.cri-containerd.pinned on every containerd name of the image (tag, digest, id)."""
    puller = CriPuller(cluster.socket)
    svc = make_service(tmp_path, puller=puller)
    item = svc.run(svc.submit(ImageRequest(image, name="pin", pin=True)).id)
    status = puller.status(image)
    names = {*status.repo_tags, *status.repo_digests, status.id}
    assert len(names) == 3 and set(puller.pinned_names(image)) == names
    with pytest.raises(Conflict, match="pinned"):
        svc.evict("pin")
    svc.pin("pin", False)
    assert puller.pinned_names(image) == []
    assert svc.get(item.id).pinned is False
    svc.pin("pin", True)
    assert set(puller.pinned_names(image)) == names


def test_pin_on_a_hit_reaches_containerd(tmp_path: Path, cluster: cri.Cluster, image: str) -> None:
    puller = CriPuller(cluster.socket)
    svc = make_service(tmp_path, puller=puller)
    svc.run(svc.submit(ImageRequest(image, name="late")).id)
    assert puller.pinned_names(image) == []
    hit = svc.submit(ImageRequest(image, name="late", pin=True))
    assert (hit.state, hit.pinned) == (ItemState.READY, True)
    assert puller.pinned_names(image)


def test_pull_policy_always_pulls_a_ready_image_again(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    svc = make_service(tmp_path, puller=CriPuller(cluster.socket))
    svc.run(svc.submit(ImageRequest(image, name="al")).id)
    assert svc.submit(ImageRequest(image, name="al")).state is ItemState.READY  # IfNotPresent
    again = svc.submit(ImageRequest(image, name="al", pull_policy=PullPolicy.ALWAYS))
    assert again.state is ItemState.QUEUED
    assert svc.run(again.id).state is ItemState.READY
    assert [p.cold for p in svc.pulls()] == [True, False]


def test_repull_hours_pull_a_moving_tag_again(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    """The tag is pushed again with new content; after the interval the audit re-pulls it."""
    clock = Clock()
    puller = CriPuller(cluster.socket)
    svc = make_service(tmp_path, puller=puller, clock=clock)
    first = svc.run(svc.submit(ImageRequest(image, name="mv", repull_hours=6)).id)
    repo, tag = image.rsplit(":", 1)
    cri.push_image(tmp_path / "again", repo.split("/", 1)[0], "ready/img", tag, os.urandom(4096))
    clock.now += 5 * 3600
    assert svc.audit() == []
    assert svc.submit(ImageRequest(image, name="mv", repull_hours=6)).state is ItemState.READY
    clock.now += 3600
    [due] = svc.audit()
    assert due.state is ItemState.QUEUED
    done = svc.run(due.id)
    assert done.state is ItemState.READY, done.error
    assert done.options["image_ref"] != first.options["image_ref"]
    assert done.options["repull_hours"] == "6"
