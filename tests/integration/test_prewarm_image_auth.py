"""Image prewarm from a registry that asks for credentials: real docker-registry with htpasswd
basic auth, real containerd pulling through our CRI client with the auth from a docker config.

A private image is pulled only where the kubelet re-verifies credentials for it or the operator
accepts that every pod may run it (agent/prewarm/private_images.py): these tests give the
agent a kubelet config that says AlwaysVerify; test_prewarm_private_images.py tests the rule."""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.prewarm.images import CriPuller
from agent.prewarm.model import ImageRequest, ItemState
from agent.prewarm.private_images import PrivateImageRule
from tests.integration.prewarm_fixtures import cri
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.private_registry import (
    HTPASSWD,
    PASSWORD,
    USER,
    docker_config,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(cri.missing_tools()), reason=f"needs Debian {cri.TOOLS}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="containerd needs root"),
]


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


def verifying_kubelet(tmp_path: Path) -> PrivateImageRule:
    """The rule with a kubelet config that re-verifies credentials for every image."""
    path = tmp_path / "kubelet-config.yaml"
    path.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "imagePullCredentialsVerificationPolicy: AlwaysVerify\n"
    )
    return PrivateImageRule(kubelet_config=path)


def test_pull_uses_the_docker_config_credentials(
    tmp_path: Path, cluster: cri.Cluster, image: str
) -> None:
    svc = make_service(tmp_path)
    config = docker_config(tmp_path / "config.json", cluster.registry, PASSWORD)
    rule = verifying_kubelet(tmp_path)
    svc._puller = CriPuller(cluster.socket, docker_config=config, private_images=rule)
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
        config = docker_config(tmp_path / "config.json", cluster.registry, password)
    svc = make_service(tmp_path)
    rule = verifying_kubelet(tmp_path)
    svc._puller = CriPuller(cluster.socket, docker_config=config, private_images=rule)
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
