"""Tenant-safe image prewarm, as an operator meets it: the `gpu-agent` CLI (embedded agent, real
gRPC API) with the agent's settings, a real containerd and a docker-registry that asks for
credentials. A private image (pulled with prewarm.docker_config credentials) would be, to the
kubelet, a preloaded image, usable by every pod on the node unless its
imagePullCredentialsVerificationPolicy re-verifies it: such a request is refused with the reason,
the registry sees no request and nothing is recorded (docs/security.md, "Private images")."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import PermissionDenied
from agent.prewarm.images import CriPuller
from agent.prewarm.model import ImageRequest, ItemState
from agent.prewarm.private_images import PrivateImageRule
from tests.integration.prewarm_fixtures import cli, cri
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
REPO = "tenant-a/model"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cri.Cluster]:
    work = tmp_path_factory.mktemp("cri-private")
    htpasswd = work / "htpasswd"
    htpasswd.write_text(HTPASSWD)
    with cri.registry_and_containerd(work, htpasswd=htpasswd) as c:
        yield c


@pytest.fixture(scope="module")
def image(cluster: cri.Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("img")
    return cri.push_image(
        work, cluster.registry, REPO, "v1", os.urandom(1 << 16), f"{USER}:{PASSWORD}"
    )


@pytest.fixture
def absent(cluster: cri.Cluster, image: str) -> Iterator[str]:
    """The image, absent from the runtime before and after the test."""
    assert not CriPuller(cluster.socket).present(image)
    yield image
    if CriPuller(cluster.socket).present(image):
        CriPuller(cluster.socket).remove(image)


def kubelet_config(tmp_path: Path, policy: str | None) -> Path:
    path = tmp_path / "kubelet" / "config.yaml"
    path.parent.mkdir(exist_ok=True)
    line = f"imagePullCredentialsVerificationPolicy: {policy}\n" if policy else ""
    path.write_text(
        f"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{line}"
    )
    return path


def registry_requests(cluster: cri.Cluster) -> int:
    """Lines of the registry's log that name the image's repository."""
    assert cluster.registry_log is not None
    return cluster.registry_log.read_text(errors="replace").count(f"/v2/{REPO}/")


def env_for(tmp_path: Path, cluster: cri.Cluster, **settings: str) -> dict[str, str]:
    config = docker_config(tmp_path / "docker-config.json", cluster.registry)
    return cli.agent_env(
        tmp_path, containerd_socket=str(cluster.socket), docker_config=str(config), **settings
    )


@pytest.mark.parametrize("policy", ["NeverVerifyPreloadedImages", None, "NeverVerify", "missing"])
def test_a_private_image_is_refused_where_the_kubelet_would_not_verify_it(
    tmp_path: Path, cluster: cri.Cluster, absent: str, policy: str | None
) -> None:
    """The kubelet default (set, or not set), NeverVerify, and no kubelet config to read."""
    path = tmp_path / "nowhere.yaml" if policy == "missing" else kubelet_config(tmp_path, policy)
    env = env_for(tmp_path, cluster, kubelet_config=str(path))
    before = registry_requests(cluster)
    done = cli.run(["prewarm", "image", absent, "--name", "tenant-model", "-o", "json"], env)
    assert done.returncode == PermissionDenied.exit_code, (done.stdout, done.stderr)
    assert "would be usable by every pod on this node" in done.stderr
    assert "prewarm.private_images: usable-by-every-pod" in done.stderr
    if policy == "missing":
        assert "imagePullCredentialsVerificationPolicy is not known" in done.stderr
    else:
        assert f"imagePullCredentialsVerificationPolicy is {policy or 'NeverVerifyPreloaded'}" in (
            done.stderr
        )
    assert PASSWORD not in done.stderr + done.stdout
    listed = cli.run(["prewarm", "list", "-o", "json"], env)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    assert not CriPuller(cluster.socket).present(absent)
    assert registry_requests(cluster) == before


@pytest.mark.parametrize(
    "settings",
    [
        {"kubelet_config": "AlwaysVerify"},
        {"private_images": "usable-by-every-pod"},  # and no kubelet config to read at all
    ],
)
def test_a_private_image_is_pulled_where_the_kubelet_verifies_it_or_the_operator_opts_in(
    tmp_path: Path, cluster: cri.Cluster, absent: str, settings: dict[str, str]
) -> None:
    if "kubelet_config" in settings:
        settings = {"kubelet_config": str(kubelet_config(tmp_path, settings["kubelet_config"]))}
    else:
        settings = {**settings, "kubelet_config": str(tmp_path / "nowhere.yaml")}
    env = env_for(tmp_path, cluster, **settings)
    before = registry_requests(cluster)
    done = cli.run(["prewarm", "image", absent, "--name", "tenant-model", "-o", "json"], env)
    assert done.returncode == 0, done.stderr
    [item] = json.loads(done.stdout)
    assert item["state"] == "ready", item["error"]
    assert CriPuller(cluster.socket).present(absent)
    assert registry_requests(cluster) > before  # the log shows the pull: its silence means none


def test_a_policy_that_stops_verifying_after_submit_refuses_the_pull(
    tmp_path: Path, cluster: cri.Cluster, absent: str
) -> None:
    """Checked again as the pull goes to the runtime: the item fails with the reason."""
    path = kubelet_config(tmp_path, "AlwaysVerify")
    config = docker_config(tmp_path / "docker-config.json", cluster.registry)
    svc = make_service(tmp_path)
    rule = PrivateImageRule(kubelet_config=path)
    svc._puller = CriPuller(cluster.socket, docker_config=config, private_images=rule)
    item = svc.submit(ImageRequest(absent, name="tenant-model"))
    before = registry_requests(cluster)
    kubelet_config(tmp_path, "NeverVerify")
    done = svc.run(item.id)
    assert done.state is ItemState.FAILED
    assert "imagePullCredentialsVerificationPolicy is NeverVerify," in (done.error or "")
    assert not CriPuller(cluster.socket).present(absent)
    assert registry_requests(cluster) == before
