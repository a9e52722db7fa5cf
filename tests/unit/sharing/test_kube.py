"""The HTTPS Kubernetes client against a local fake API server (fake_kube_api.py): no real API
server runs here, so the fake answers the real paths, verbs, auth and Status errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import AgentError, NotFound, NotSupported, PermissionDenied
from agent.kube import InClusterKubeClient
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE


def test_reads_node_labels(kube: InClusterKubeClient) -> None:
    assert kube.node_labels(NODE) == {"kubernetes.io/hostname": NODE}


def test_patches_labels_with_a_merge_patch(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    kube.patch_node_labels(NODE, {"nvidia.com/device-plugin.config": "gpu-agent"})
    assert api.nodes[NODE]["nvidia.com/device-plugin.config"] == "gpu-agent"
    patch = api.requests[-1]
    assert (patch.method, patch.path) == ("PATCH", f"/api/v1/nodes/{NODE}")
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    assert patch.body == {"metadata": {"labels": {"nvidia.com/device-plugin.config": "gpu-agent"}}}
    kube.patch_node_labels(NODE, {"nvidia.com/device-plugin.config": None})
    assert "nvidia.com/device-plugin.config" not in api.nodes[NODE]


def test_deletes_only_this_nodes_plugin_pod(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """The field selector keeps the delete to this node: other nodes' plugins keep running."""
    api, _ = kube_api
    deleted = kube.delete_pods("gpu-operator", "app=nvidia-device-plugin-daemonset", NODE)
    assert deleted == ("nvidia-device-plugin-daemonset-abcde",)
    assert sorted(p.name for p in api.pods) == [
        "gpu-feature-discovery-klmno",
        "nvidia-device-plugin-daemonset-fghij",
    ]
    listing = next(r for r in api.requests if r.method == "GET")
    assert listing.query == {
        "labelSelector": "app=nvidia-device-plugin-daemonset",
        "fieldSelector": f"spec.nodeName={NODE}",
    }


def test_no_matching_pod_deletes_nothing(kube: InClusterKubeClient) -> None:
    assert kube.delete_pods("gpu-operator", "app=nope", NODE) == ()


def test_sends_the_current_token_on_every_request(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """Projected service-account tokens rotate: the file is re-read for each request."""
    api, _ = kube_api
    kube.node_labels(NODE)
    api.token_path.write_text("token-2\n")
    kube.node_labels(NODE)
    assert [r.headers["Authorization"] for r in api.requests] == [
        "Bearer token-1",
        "Bearer token-2",
    ]


def test_forbidden_is_permission_denied_with_the_servers_message(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.forbidden.add(("PATCH", f"/api/v1/nodes/{NODE}"))
    with pytest.raises(PermissionDenied, match=r"403 Forbidden: PATCH .* is forbidden: RBAC"):
        kube.patch_node_labels(NODE, {"a": "b"})


def test_unknown_node_is_not_found(kube: InClusterKubeClient) -> None:
    with pytest.raises(NotFound, match='nodes "nope" not found'):
        kube.node_labels("nope")


def test_a_wrong_token_is_permission_denied(
    kube_api: tuple[FakeKubeApi, str], tls_cert: tuple[Path, Path], tmp_path: Path
) -> None:
    _, url = kube_api
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    with pytest.raises(PermissionDenied, match="401"):
        InClusterKubeClient(url, wrong, ca_path=tls_cert[0]).node_labels(NODE)


def test_an_untrusted_server_certificate_is_refused(
    kube_api: tuple[FakeKubeApi, str], tmp_path: Path
) -> None:
    """Without the cluster CA the self-signed server is not trusted: no token leaves."""
    api, url = kube_api
    with pytest.raises(AgentError, match=r"unreachable.*CERTIFICATE_VERIFY_FAILED"):
        InClusterKubeClient(url, api.token_path, ca_path=None).node_labels(NODE)
    assert api.requests == []


def test_an_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    with pytest.raises(AgentError, match="unreachable"):
        InClusterKubeClient("https://127.0.0.1:1", token, timeout=2).node_labels(NODE)


def test_from_service_account_reads_the_pod_environment(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("")
    with pytest.raises(NotSupported, match="KUBERNETES_SERVICE_HOST"):
        InClusterKubeClient.from_service_account({}, tmp_path)
    with pytest.raises(NotSupported, match="no service-account token"):
        InClusterKubeClient.from_service_account(
            {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, tmp_path / "missing"
        )
