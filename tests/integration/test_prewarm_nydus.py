"""Nydus image prewarm against real services: containerd's CRI pulling from a docker-registry,
and the data blobs warmed through tinyproxy standing in for dfdaemon's HTTP proxy.

containerd here cannot run the Nydus snapshotter (there is no nydusd on these machines), so the
images are "Nydus-shaped": their manifests carry the ``containerd.io/snapshot/nydus-blob`` and
``…/nydus-bootstrap`` annotations as nydusify writes them, while the layers stay valid gzip
tars that this containerd unpacks with its native snapshotter. The snapshotter side (lazy mount,
nydusd reading through dfdaemon) is not exercised. What is: the manifest read from the registry,
the layer classification, every data blob requested through the proxy at the URL nydusd would
request with the Dragonfly headers (seen by a recording proxy chained behind tinyproxy), the
digest checks, and the inventory (warmth, byte counts, node labels, metrics).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.errors import PermissionDenied
from agent.prewarm.fetch_http import HttpFetcher
from agent.prewarm.image_warm import NydusWarmer
from agent.prewarm.images import CriPuller
from agent.prewarm.inventory import PrewarmCollector
from agent.prewarm.labels import node_labels
from agent.prewarm.model import ImageRequest, ImageWarmth, ItemState, Warmth
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.registry import RegistryClient
from agent.prewarm.snapshotter import SnapshotterClient
from tests.integration.prewarm_fixtures import cli, cri
from tests.integration.prewarm_fixtures.agent import LOOPBACK, make_service
from tests.integration.prewarm_fixtures.nydus_image import PushedImage, push_nydus_shaped
from tests.integration.prewarm_fixtures.recording_proxy import RecordingProxy
from tests.integration.prewarm_fixtures.snapshotter import FakeSnapshotter
from tests.integration.prewarm_fixtures.tinyproxy import tinyproxy

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(cri.missing_tools()), reason=f"needs Debian {cri.TOOLS}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="containerd needs root"),
    pytest.mark.skipif(
        not os.path.exists("/usr/bin/tinyproxy"), reason="Debian package tinyproxy is missing"
    ),
]
KIB = 1024
MIB = 1024 * KIB


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cri.Cluster]:
    work = tmp_path_factory.mktemp("cri")
    with cri.registry_and_containerd(work) as c:
        yield c


@pytest.fixture
def dragonfly(tmp_path: Path) -> Iterator[tuple[str, RecordingProxy]]:
    """(proxy URL, what reached the far side): tinyproxy relaying through a recording proxy."""
    with RecordingProxy() as recorder, tinyproxy(tmp_path, upstream=recorder.address) as (url, _):
        yield url, recorder


def _warmer(proxy: str | None = None, **kw: object) -> NydusWarmer:
    # Default policy: no plain http in general; the loopback registry is reached over http
    # because loopback registries are insecure by rule, not because the policy allows http.
    fetcher = None
    if proxy is not None:
        fetcher = lambda policy: HttpFetcher(policy, proxy=proxy, backoff_s=0.01, timeout_s=10)  # noqa: E731
    return NydusWarmer(RegistryClient(UrlPolicy(egress_allow=LOOPBACK)), fetcher, **kw)  # type: ignore[arg-type]


def _blob_gets(recorder: RecordingProxy) -> list[str]:
    return [r.url for r in recorder.requests if "/blobs/" in r.url]


def _metrics(svc: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The /metrics text of the prewarm collector, parsed: (series, sorted labels) -> value."""
    registry = CollectorRegistry()
    registry.register(PrewarmCollector(svc.inventory))  # type: ignore[attr-defined]
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _series(metric: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return metric, tuple(sorted(labels.items()))


def _push(cluster: cri.Cluster, repo: str, tag: str = "v1") -> PushedImage:
    return push_nydus_shaped(
        cluster.registry, repo, tag, [os.urandom(3 * MIB // 2), os.urandom(300 * KIB)]
    )


def test_nydus_data_blobs_are_warmed_through_the_dragonfly_proxy(
    tmp_path: Path, cluster: cri.Cluster, dragonfly: tuple[str, RecordingProxy]
) -> None:
    """As a user would: the CLI with the agent's settings; every data blob passes the proxy."""
    proxy, recorder = dragonfly
    image = _push(cluster, "llm/server")
    env = cli.agent_env(tmp_path, containerd_socket=str(cluster.socket), dragonfly_proxy=proxy)
    args = ["prewarm", "image", image.ref, "--name", "llm-server", "-o", "json"]
    done = cli.run(args, env, timeout=120)
    assert done.returncode == 0, done.stderr
    [item] = json.loads(done.stdout)
    assert item["state"] == "ready", item["error"]
    full = {
        "warmth": "full",
        "lazy": True,
        "blobs_total": 3,
        "blobs_warm": 3,
        "bytes_total": image.bytes_total,
        "bytes_warm": image.bytes_total,
        "ratio": 1.0,
    }
    assert item["warmth"] == full
    assert item["options"]["via"] == "dragonfly-proxy"
    assert item["options"]["manifest_digest"] == image.manifest_digest

    # Exactly the data blobs, at the URLs nydusd's registry backend requests, each once, whole,
    # through tinyproxy, with the header that makes dfdaemon serve (and keep) it via P2P.
    wanted = [f"http://{cluster.registry}/v2/llm/server/blobs/{b.digest}" for b in image.data_blobs]
    assert sorted(_blob_gets(recorder)) == sorted(wanted)
    for relayed in recorder.requests:
        assert relayed.method == "GET" and relayed.status == 200
        assert relayed.headers["X-Dragonfly-Use-P2P"] == "true"
        assert "tinyproxy" in relayed.headers.get("Via", "")
    sizes = {
        f"http://{cluster.registry}/v2/llm/server/blobs/{b.digest}": b.size
        for b in image.data_blobs
    }
    assert {r.url: r.body_bytes for r in recorder.requests} == sizes

    listed = cli.run(["prewarm", "list", "-o", "json"], env)
    assert listed.returncode == 0, listed.stderr
    assert [i["warmth"] for i in json.loads(listed.stdout)] == [full]
    table = cli.run(["cache", "list"], env)
    assert "WARMTH" in table.stdout and "llm-server" in table.stdout

    svc = make_service(tmp_path)
    assert node_labels(svc.items()) == {"gpu-agent.io/cache.llm-server": "ready"}
    metrics = _metrics(svc)
    assert metrics[_series("gpu_agent_prewarm_image_warm_ratio", name="llm-server")] == 1.0
    assert metrics[_series("gpu_agent_prewarm_image_warmth", name="llm-server", warmth="full")] == 1
    for kind in ("total", "warm"):
        key = _series("gpu_agent_prewarm_image_bytes", name="llm-server", kind=kind)
        assert metrics[key] == image.bytes_total


def test_without_dragonfly_a_nydus_image_is_bootstrap_only_and_not_labelled(
    tmp_path: Path, cluster: cri.Cluster
) -> None:
    """No Dragonfly: the pull warmed the bootstrap alone; the snapshotter gets a prefetch hint."""
    image = _push(cluster, "lazy/img")
    assert image.bootstrap is not None
    with FakeSnapshotter(tmp_path / "system.sock") as snapshotter:
        warmer = _warmer(
            snapshotter=SnapshotterClient(snapshotter.socket_path), prefetch_list="/etc/nydus/all"
        )
        svc = make_service(tmp_path, puller=CriPuller(cluster.socket), warmer=warmer)
        item = svc.run(svc.submit(ImageRequest(image.ref, name="lazy", runtime_handler="nydus")).id)
    assert item.state is ItemState.READY, item.error
    assert item.image_warmth == ImageWarmth(
        Warmth.BOOTSTRAP_ONLY,
        lazy=True,
        blobs_total=3,
        blobs_warm=1,
        bytes_total=image.bytes_total,
        bytes_warm=image.bootstrap.size,
    )
    assert CriPuller(cluster.socket).status(image.ref).id == item.options["image_ref"]
    [hint] = snapshotter.received
    assert (hint.method, hint.path) == ("PUT", "/api/v1/prefetch")
    assert json.loads(hint.body) == [{"image": image.ref, "prefetch": "/etc/nydus/all"}]
    assert item.options["prefetch_hint"] == "sent"

    assert node_labels(svc.items()) == {}
    metrics = _metrics(svc)
    assert metrics[_series("gpu_agent_prewarm_image_warmth", name="lazy", warmth="bootstrap-only")]
    assert metrics[_series("gpu_agent_prewarm_image_warmth", name="lazy", warmth="full")] == 0
    ratio = metrics[_series("gpu_agent_prewarm_image_warm_ratio", name="lazy")]
    assert ratio == pytest.approx(image.bootstrap.size / image.bytes_total) and ratio < 0.01
    # Asked again, it is warmed again (Dragonfly may be there now), not counted as a hit.
    again = svc.submit(ImageRequest(image.ref, name="lazy", runtime_handler="nydus"))
    assert again.state is ItemState.QUEUED and again.hits == 0


def test_a_blob_that_does_not_match_its_digest_fails_the_item(
    tmp_path: Path, cluster: cri.Cluster, dragonfly: tuple[str, RecordingProxy]
) -> None:
    proxy, recorder = dragonfly
    image = _push(cluster, "bad/blob")
    first, second = image.data_blobs
    recorder.corrupt.add(f"/v2/bad/blob/blobs/{second.digest}")  # a bad peer or cache
    svc = make_service(tmp_path, puller=CriPuller(cluster.socket), warmer=_warmer(proxy))
    item = svc.run(svc.submit(ImageRequest(image.ref, name="bad")).id)
    assert item.state is ItemState.FAILED
    assert item.error is not None
    assert f"data blob {second.digest}" in item.error
    assert f"{second.digest}: the bytes hash to sha256:" in item.error
    warmth = item.image_warmth
    assert warmth is not None and warmth.warmth is Warmth.PARTIAL
    assert warmth.bytes_warm == first.size + image.layers[-1].size
    assert node_labels(svc.items()) == {}
    assert len(_blob_gets(recorder)) == 2  # the first verified, the second refused


def test_a_plain_image_is_fully_warm_after_the_pull(
    tmp_path: Path, cluster: cri.Cluster, dragonfly: tuple[str, RecordingProxy]
) -> None:
    proxy, recorder = dragonfly
    ref = cri.push_image(tmp_path, cluster.registry, "plain/app", "v1", os.urandom(MIB))
    svc = make_service(tmp_path, puller=CriPuller(cluster.socket), warmer=_warmer(proxy))
    item = svc.run(svc.submit(ImageRequest(ref, name="plain-app")).id)
    assert item.state is ItemState.READY, item.error
    warmth = item.image_warmth
    assert warmth is not None
    assert (warmth.warmth, warmth.lazy, warmth.blobs_warm) == (Warmth.FULL, False, 1)
    assert warmth.bytes_warm == warmth.bytes_total > MIB // 2  # one gzip'd layer of random data
    assert recorder.requests == []  # nothing is lazy, nothing to warm through Dragonfly
    assert node_labels(svc.items()) == {"gpu-agent.io/cache.plain-app": "ready"}
    # Same image, same name again: a hit.
    assert svc.submit(ImageRequest(ref, name="plain-app")).hits == 1


def test_an_image_whose_manifest_cannot_be_read_is_pulled_but_not_called_warm(
    tmp_path: Path, cluster: cri.Cluster
) -> None:
    """containerd pulled it, the agent may not read the registry: ready, warmth unknown."""
    image = _push(cluster, "hidden/img")
    warmer = NydusWarmer(RegistryClient(UrlPolicy(denied_hosts=("127.0.0.0/8",))))
    svc = make_service(tmp_path, puller=CriPuller(cluster.socket), warmer=warmer)
    item = svc.run(svc.submit(ImageRequest(image.ref, name="hidden")).id)
    assert item.state is ItemState.READY, item.error
    assert item.image_warmth == ImageWarmth(Warmth.UNKNOWN)
    assert "denied" in item.options["warmth_error"]
    assert node_labels(svc.items()) == {}


# bcrypt of PULL_PASSWORD (docker-registry's htpasswd accepts bcrypt only); test-only secret.
PULL_USER, PULL_PASSWORD = "puller", "nydus-pull-pw"
HTPASSWD = f"{PULL_USER}:$2b$12$z.2fAQwoa/at/WTA7svUhu8CLvZGPeZNZefS0mWjXikqUGXq/.1I2\n"


@pytest.fixture(scope="module")
def private_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A docker-registry (no containerd) asking for basic auth on every request."""
    work = tmp_path_factory.mktemp("private-registry")
    (work / "htpasswd").write_text(HTPASSWD)
    port, proc = cri.start_registry(work, work / "htpasswd")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(20)


def test_blobs_of_a_private_registry_carry_its_credentials_through_the_proxy(
    tmp_path: Path, private_registry: str, dragonfly: tuple[str, RecordingProxy]
) -> None:
    """The manifest is read with docker config credentials (the registry's Basic challenge), and
    every blob request through "dfdaemon" carries them, so dfdaemon can fetch from the source."""
    proxy, recorder = dragonfly
    creds = f"{PULL_USER}:{PULL_PASSWORD}"
    image = push_nydus_shaped(
        private_registry, "team/private", "v1", [os.urandom(MIB)], creds=creds
    )
    token = base64.b64encode(creds.encode()).decode()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {private_registry: {"auth": token}}}))
    fetcher = lambda policy: HttpFetcher(policy, proxy=proxy, backoff_s=0.01, timeout_s=10)  # noqa: E731
    warmer = NydusWarmer(RegistryClient(UrlPolicy(egress_allow=LOOPBACK), config), fetcher)
    result = warmer.warm(image.ref, "nydus", lambda *_, **__: None, lambda: False)
    assert result.warmth.warmth is Warmth.FULL
    assert result.warmth.bytes_warm == image.bytes_total
    [relayed] = recorder.requests
    assert (
        relayed.url
        == f"http://{private_registry}/v2/team/private/blobs/{image.data_blobs[0].digest}"
    )
    assert relayed.headers["Authorization"] == f"Basic {token}"
    assert relayed.status == 200  # the registry accepted them

    anonymous = NydusWarmer(RegistryClient(UrlPolicy(egress_allow=LOOPBACK)), fetcher)
    with pytest.raises(PermissionDenied) as err:
        anonymous.warm(image.ref, "nydus", lambda *_, **__: None, lambda: False)
    assert "basic auth" in str(err.value) and PULL_PASSWORD not in str(err.value)
