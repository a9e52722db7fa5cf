"""Fixtures: the Kubernetes API stand-in (no API server runs here) with a real TLS certificate."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from agent.kube import InClusterKubeClient
from agent.kube_node import NodeOwner
from agent.kube_watch import InformerFactory
from tests.kube import schema
from tests.kube.fake_api import FakeKubeApi, Pod
from tests.kube.fake_edge import EdgeKubeApi

NODE = "gpu-node-1"


@contextlib.contextmanager
def started_owner(kube: Any, coalesce_s: float = 0.3, **kw: Any) -> Iterator[NodeOwner]:
    """``NODE``'s owner, started and synced; stopped with its informer on the way out."""
    owner = NodeOwner(kube, NODE, InformerFactory(kube).node(NODE), coalesce_s=coalesce_s, **kw)
    owner.start()
    try:
        assert owner.informer.synced.wait(10)
        yield owner
    finally:
        owner.stop()
        owner.informer.stop()


A = TypeVar("A", bound=FakeKubeApi)


def stand_in_kubeconfig(path: Path, url: str, ca: Path, token: str = "token-1") -> Path:
    """A kubeconfig for the API stand-in at ``url``: its CA and a bearer token."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "stand-in",
        "contexts": [{"name": "stand-in", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": url, "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": {"token": token}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def make_tls_cert(directory: Path, san: str = "IP:127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate naming only ``san`` (``ca.crt``, ``tls.key`` in
    ``directory``), made with the openssl command; the benchmarks use it too."""
    cert, key = directory / "ca.crt", directory / "tls.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={san.split(':', 1)[1]}",
            "-addext", f"subjectAltName={san}",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test TLS certificate")
    return make_tls_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def kube_api(tmp_path: Path, tls_cert: tuple[Path, Path]) -> Iterator[tuple[FakeKubeApi, str]]:
    """The fake API server with one node and its device-plugin pod, plus another node's pod
    (with discovery, as every API server answers it: tests/kube/fake_edge.py)."""
    yield from _serve(EdgeKubeApi(token_path=_token(tmp_path)), tls_cert)


@pytest.fixture
def edge_api(kube_api: tuple[FakeKubeApi, str]) -> tuple[EdgeKubeApi, str]:
    """`kube_api` as what it is: with call counts, bookmarks and injected failures."""
    api, url = kube_api
    assert isinstance(api, EdgeKubeApi)
    return api, url


def _token(tmp_path: Path) -> Path:
    token = tmp_path / "token"
    token.write_text("token-1\n")
    return token


def _serve(api: A, tls_cert: tuple[Path, Path]) -> Iterator[tuple[A, str]]:
    api.nodes[NODE] = {"kubernetes.io/hostname": NODE}
    api.nodes["gpu-node-2"] = {}
    plugin = {"app": "nvidia-device-plugin-daemonset"}
    api.pods += [
        Pod("gpu-operator", "nvidia-device-plugin-daemonset-abcde", NODE, dict(plugin)),
        Pod("gpu-operator", "nvidia-device-plugin-daemonset-fghij", "gpu-node-2", dict(plugin)),
        Pod("gpu-operator", "gpu-feature-discovery-klmno", NODE, {"app": "gpu-feature-discovery"}),
    ]
    server, url = api.serve(*tls_cert)
    schema.take()  # a failure of an earlier test's leftover thread is not this test's
    try:
        yield api, url
    finally:
        api.close()
        server.shutdown()
        server.server_close()
    failures = schema.take()
    assert not failures, "the Kubernetes schema refuses:\n" + "\n".join(failures)


@pytest.fixture
def kube(kube_api: tuple[FakeKubeApi, str], tls_cert: tuple[Path, Path]) -> InClusterKubeClient:
    api, url = kube_api
    return InClusterKubeClient(url, api.token_path, ca_path=tls_cert[0], timeout=5.0)
