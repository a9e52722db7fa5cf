"""The few Kubernetes API calls the agent makes, behind a narrow Protocol.

``InClusterKubeClient`` speaks plain HTTPS to the API server with the pod's service-account
token: no client library, since three calls do not justify a dependency. Callers: sharing reload
(node label, plugin pod restart), the MIG label protocol (read and patch the own Node's labels)
and the prewarm inventory labels. RBAC: nodes get/patch, pods list/delete in the plugin's
namespace.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from agent.errors import AgentError, Conflict, NotFound, NotSupported, PermissionDenied

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: HTTP status -> domain error; anything else unexpected is a plain AgentError.
_STATUS_ERRORS: dict[int, type[AgentError]] = {
    401: PermissionDenied,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
}


class KubeClient(Protocol):
    def node_labels(self, node: str) -> Mapping[str, str]:
        """The node's labels."""
        ...

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch labels onto the node; None removes a label."""
        ...

    def delete_pods(self, namespace: str, label_selector: str, node_name: str) -> tuple[str, ...]:
        """Delete the pods matching ``label_selector`` on ``node_name``; return their names."""
        ...


class InClusterKubeClient:
    """HTTPS to the API server, authenticated with a bearer token read from a file.

    The token is re-read on every request because projected service-account tokens rotate.
    """

    def __init__(
        self, server: str, token_path: Path, ca_path: Path | None = None, timeout: float = 10.0
    ) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise NotSupported(f"Kubernetes API server must be an http(s) URL, got {server!r}")
        self._server = server
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        self._token_path = token_path
        self._timeout = timeout
        try:
            self._ssl = ssl.create_default_context(cafile=str(ca_path) if ca_path else None)
        except (OSError, ssl.SSLError) as exc:
            raise NotSupported(f"cannot load the cluster CA {ca_path}: {exc}") from exc

    @classmethod
    def from_service_account(
        cls, environ: Mapping[str, str] = os.environ, directory: Path = SERVICE_ACCOUNT_DIR
    ) -> InClusterKubeClient:
        """The client a pod gets from its environment; NotSupported outside a pod."""
        host = environ.get("KUBERNETES_SERVICE_HOST")
        port = environ.get("KUBERNETES_SERVICE_PORT", "443")
        token = directory / "token"
        if not host:
            raise NotSupported("not running in a Kubernetes pod: KUBERNETES_SERVICE_HOST is unset")
        if not token.is_file():
            raise NotSupported(
                f"no service-account token at {token} (automountServiceAccountToken?)"
            )
        if ":" in host:
            host = f"[{host}]"  # IPv6 literal
        return cls(f"https://{host}:{port}", token, directory / "ca.crt")

    @classmethod
    def in_pod(cls) -> InClusterKubeClient | None:
        """The pod's client, or None outside Kubernetes (then only kube-free paths work)."""
        try:
            return cls.from_service_account()
        except NotSupported:
            return None

    def get(self, path: str, query: Mapping[str, str] | None = None) -> object:
        """A GET on the API server, decoded JSON (for readers beyond the Protocol's calls)."""
        return self._request("GET", path, query=query)

    def node_labels(self, node: str) -> Mapping[str, str]:
        obj = self._request("GET", f"/api/v1/nodes/{_segment(node)}")
        labels = _dig(obj, "metadata", "labels")
        return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        self._request(
            "PATCH",
            f"/api/v1/nodes/{_segment(node)}",
            body={"metadata": {"labels": dict(labels)}},
            content_type="application/merge-patch+json",
        )

    def delete_pods(self, namespace: str, label_selector: str, node_name: str) -> tuple[str, ...]:
        base = f"/api/v1/namespaces/{_segment(namespace)}/pods"
        # The node field selector keeps this to the plugin pod of *this* node.
        query = {"labelSelector": label_selector, "fieldSelector": f"spec.nodeName={node_name}"}
        listing = self._request("GET", base, query=query)
        items = _dig(listing, "items")
        names = [
            str(name)
            for item in (items if isinstance(items, list) else [])
            if (name := _dig(item, "metadata", "name"))
        ]
        deleted = []
        for name in names:
            try:
                self._request("DELETE", f"{base}/{_segment(name)}")
            except NotFound:
                continue  # already gone: the DaemonSet is restarting it anyway
            deleted.append(name)
        return tuple(deleted)

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> object:
        target = path + ("?" + urllib.parse.urlencode(query) if query else "")
        try:
            token = self._token_path.read_text().strip()
        except OSError as exc:
            raise PermissionDenied(f"cannot read the service-account token: {exc}") from exc
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            conn.request(method, target, body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise AgentError(
                f"Kubernetes API {self._server} unreachable ({method} {path}): {exc}"
            ) from exc
        finally:
            conn.close()
        if response.status >= 400:
            error = _STATUS_ERRORS.get(response.status, AgentError)
            raise error(
                f"Kubernetes API {method} {path}: {response.status} {response.reason}: "
                f"{_status_message(data)}"
            )
        return json.loads(data) if data else None


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _dig(obj: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _status_message(data: bytes) -> str:
    """The ``message`` of a Kubernetes Status body, else the raw body (shortened)."""
    try:
        message = _dig(json.loads(data), "message")
    except ValueError:
        message = None
    return str(message) if message else data.decode(errors="replace")[:200]
