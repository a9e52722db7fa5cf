"""Image prewarm from a registry that asks for credentials: real docker-registry with htpasswd
basic auth, real containerd pulling through our CRI client with the auth from a docker config."""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.prewarm.images import CriPuller
from agent.prewarm.model import ImageRequest, ItemState
from tests.integration.prewarm_fixtures import cri
from tests.integration.prewarm_fixtures.agent import make_service

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(cri.missing_tools()), reason=f"needs Debian {cri.TOOLS}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="containerd needs root"),
]

USER, PASSWORD = "alice", "s3cret-registry-pw"
# bcrypt of PASSWORD (the registry's htpasswd accepts bcrypt only)
HTPASSWD = f"{USER}:$2b$12$VXcEQgB5m8IA8uWDJ1noy.bw.f7ga1Z5jS593ozeN0xrUNGL5CmZG\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cri.Cluster]:
    work = tmp_path_factory.mktemp("cri-auth")
    htpasswd = work / "htpasswd"
    htpasswd.write_text(HTPASSWD)
    with cri.registry_and_containerd(work, htpasswd=htpasswd) as c:
        yield c


@pytest.fixture(scope="module")
def image(cluster: cri.Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("img")
    return cri.push_image(
        work, cluster.registry, "private/model", "v1", os.urandom(1 << 18), f"{USER}:{PASSWORD}"
    )


def _docker_config(path: Path, registry: str, password: str) -> Path:
    token = base64.b64encode(f"{USER}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {registry: {"auth": token}}}))
    return path


def test_pull_uses_the_docker_config_credentials(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    svc = make_service(tmp_path)
    config = _docker_config(tmp_path / "config.json", cluster.registry, PASSWORD)
    svc._puller = CriPuller(cluster.socket, docker_config=config)
    item = svc.run(svc.submit(ImageRequest(image, name="private-model")).id)
    assert item.state is ItemState.READY, item.error
    assert CriPuller(cluster.socket).status(image).id == item.options["image_ref"]
    CriPuller(cluster.socket).remove(image)


@pytest.mark.parametrize("password", [None, "wrong-password-value"])
def test_missing_or_wrong_credentials_fail_without_showing_them(
    tmp_path: Path,
    cluster: cri.Cluster,
    image: str,
    password: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert not CriPuller(cluster.socket).status(image).id, "the image must start absent"
    config = None
    if password is not None:
        config = _docker_config(tmp_path / "config.json", cluster.registry, password)
    svc = make_service(tmp_path)
    svc._puller = CriPuller(cluster.socket, docker_config=config)
    with caplog.at_level(logging.DEBUG):
        item = svc.run(svc.submit(ImageRequest(image, name="private-model")).id)
    assert item.state is ItemState.FAILED
    assert item.error is not None
    assert "401" in item.error or "unauthorized" in item.error.lower(), item.error
    token = base64.b64encode(f"{USER}:{password}".encode()).decode()
    for text in (item.error or "", caplog.text):
        assert PASSWORD not in text
        if password is not None:
            assert password not in text and token not in text
