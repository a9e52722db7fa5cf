"""The few Kubernetes API calls the agent makes, behind a narrow Protocol.

``InClusterKubeClient`` speaks plain HTTPS to the API server with the pod's service-account
token, or with what a kubeconfig names (``from_kubeconfig``: a laptop's ``KUBECONFIG``, read
with lightkube's kubeconfig model in agent/kubeconfig.py; exec credential plugins run in
agent/kube_exec.py). The transport stays the standard library's: docs/architecture.md ("The
Kubernetes client") has the measured comparison. Callers: sharing reload (node label, plugin
pod restart), the MIG label protocol (read and patch the own Node's labels), the prewarm
inventory labels, and the coordinator (lists, watches, its Lease). RBAC: nodes get/patch,
pods list/delete in the plugin's namespace.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import ssl
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent import safeyaml
from agent.errors import (
    AgentError,
    Busy,
    Conflict,
    FieldViolation,
    InvalidSpec,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from agent.kube_conn import STOPPING, Sockets
from agent.redact import redact_url

if TYPE_CHECKING:
    from agent.kube_exec import ExecPlugin

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: Items per list page (client-go's pager uses 500).
PAGE_SIZE = 500
#: Pages one list may take: 2,000 x 500 items is past any cluster this runs in.
MAX_PAGES = 2000
#: Seconds a kubeconfig's exec credential plugin may take (KUBECONFIG_EXEC_TIMEOUT: not a
#: GPU_AGENT_ name, which the agent's config would refuse as an unknown key).
EXEC_TIMEOUT_S = 10.0
#: A watch event line longer than this is refused (one object, never this big).
MAX_EVENT_BYTES = 4 << 20
#: What every call asks for: the objects, as JSON.
JSON = "application/json"
#: What a metadata-only list and watch ask for: client-go's metadata client's Accept
#: (k8s.io/client-go/metadata) without its protobuf choice, which this client does not read.
#: Only each object's metadata comes (a PartialObjectMetadataList; a PartialObjectMetadata per
#: watch event), or, from a server that cannot, the whole objects as plain JSON, read the same.
METADATA_LIST = f"{JSON};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,{JSON}"
METADATA_WATCH = f"{JSON};as=PartialObjectMetadata;g=meta.k8s.io;v=v1,{JSON}"


class Gone(AgentError):
    """410: the resourceVersion asked for is older than the API server keeps: list again."""


#: HTTP status -> domain error; anything else unexpected is a plain AgentError.
_STATUS_ERRORS: dict[int, type[AgentError]] = {
    401: PermissionDenied,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    410: Gone,
    # Too Many Requests: an eviction a PodDisruptionBudget refuses now, or API throttling.
    429: Busy,
}

#: A response body larger than this is refused: a list is paged, never this big.
MAX_RESPONSE_BYTES = 64 << 20
#: Bytes of a refused watch's answer read (a Status; the rest is not read).
MAX_ERROR_BYTES = 64 << 10
#: Characters of an error Status's message kept in an AgentError (logged at every retry, held
#: in a cache's status): an API server's own are one line.
MAX_STATUS_MESSAGE = 300
#: A bearer token file larger than this is refused unread (a projected token is ~1 KiB).
MAX_TOKEN_BYTES = 64 << 10
#: A Retry-After longer than this many digits is past any wait (the watch caps it anyway).
_MAX_RETRY_AFTER_DIGITS = 9


class KubeClient(Protocol):
    def node_labels(self, node: str) -> Mapping[str, str]:
        """The node's labels."""
        ...

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch labels onto the node; None removes a label."""
        ...

    def delete_pods(
        self, namespace: str, label_selector: str, node_name: str, *, dry_run: bool = False
    ) -> tuple[str, ...]:
        """Delete the pods matching ``label_selector`` on ``node_name``; return their names.
        ``dry_run``: the API server checks each delete (authorization included) and keeps the
        pods."""
        ...


class Requests(Protocol):
    """The one call a part that writes makes (`InClusterKubeClient.request`), so a test can
    stand in for the client."""

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = ...,
    ) -> Any: ...


class InClusterKubeClient:
    """HTTPS to the API server, authenticated with a bearer token read from a file.

    The token is re-read on every request because projected service-account tokens rotate.
    """

    def __init__(
        self,
        server: str,
        token_path: Path | None,
        ca_path: Path | None = None,
        timeout: float = 10.0,
        *,
        token: str | None = None,
        ca_data: bytes | None = None,
        client_cert: tuple[bytes, bytes] | None = None,
        insecure: bool = False,
        exec_plugin: ExecPlugin | None = None,
        proxy: str | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        """``token_path`` (re-read per request), ``token`` or ``exec_plugin`` (its token, run
        again after a 401); ``client_cert`` is (cert, key) PEM from a kubeconfig; ``insecure``
        skips the server check (kubeconfig's insecure-skip-tls-verify); ``proxy`` an
        http://[USER:PASSWORD@]HOST:PORT proxy reached with CONNECT (kubeconfig's proxy-url),
        its user info sent as Proxy-Authorization: Basic; ``tls_server_name`` the name the
        server's certificate is checked against and SNI sends, not the host (kubeconfig's
        tls-server-name)."""
        from agent.kubeconfig import refuse_server  # the kubeconfig's rule for its field

        refuse_server(server)  # before any call: each would fail (or lose part of it)
        url = urllib.parse.urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise NotSupported(f"Kubernetes API server must be an http(s) URL, got {server!r}")
        #: as shown in errors and doctor: never with user info (it is not sent either)
        self._server = redact_url(server)
        #: a server behind a path (Rancher's /k8s/clusters/<id>): every call goes under it,
        #: as kubectl sends them
        self._prefix = url.path.rstrip("/")
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        self._token_path = token_path
        self._token = token
        self._exec = exec_plugin
        # Only the proxy's address and its CONNECT header are kept: no URL with its password.
        self._proxy = _proxy_tunnel(proxy) if proxy else None
        #: the proxy in an error ("Tunnel connection failed" is the proxy's), without user info
        self._via = f" through proxy {redact_url(proxy)}" if proxy else ""
        self._timeout = timeout
        self._sockets = Sockets()  # every call's, for `close`
        self._tls_server_name = tls_server_name
        try:
            self._ssl = ssl.create_default_context(
                cafile=str(ca_path) if ca_path else None,
                cadata=ca_data.decode() if ca_data else None,
            )
            if insecure:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
            if client_cert is not None:
                _load_client_cert(self._ssl, *client_cert)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise NotSupported(f"cannot load the cluster TLS settings ({ca_path}): {exc}") from exc

    @property
    def server(self) -> str:
        return self._server

    def close(self) -> None:
        """End every call in flight at once and refuse new ones: the agent is stopping, and
        must not wait on an API server that never answers (agent/kube_conn.py)."""
        self._sockets.close()

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
    def from_kubeconfig(
        cls,
        path: Path,
        context: str | None = None,
        timeout: float = 10.0,
        *,
        exec_timeout_s: float = EXEC_TIMEOUT_S,
    ) -> InClusterKubeClient:
        """The client a kubeconfig's (current) context names: server, CA or
        insecure-skip-tls-verify, tls-server-name, proxy-url, and a token, tokenFile, client
        certificate or exec plugin (agent/kubeconfig.py). Auth-provider plugins are refused
        (NotSupported)."""
        from agent import kubeconfig

        found = kubeconfig.load(path, context, exec_timeout_s=exec_timeout_s)
        return cls(
            found.server,
            found.token_path,
            timeout=timeout,
            token=found.token,
            ca_data=found.ca_data,
            client_cert=found.client_cert,
            insecure=found.insecure,
            exec_plugin=found.exec_plugin,
            proxy=found.proxy,
            tls_server_name=found.tls_server_name,
        )

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] = os.environ, directory: Path = SERVICE_ACCOUNT_DIR
    ) -> InClusterKubeClient:
        """In a pod, its service account; elsewhere the kubeconfig (``KUBECONFIG``, first
        file, else ``~/.kube/config``), as kubectl finds it. NotSupported when neither.
        ``KUBECONFIG_EXEC_TIMEOUT`` (seconds) bounds a kubeconfig's exec plugin."""
        if environ.get("KUBERNETES_SERVICE_HOST") and (directory / "token").is_file():
            return cls.from_service_account(environ, directory)
        listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        path = Path(listed[0]) if listed else Path(environ.get("HOME", "~")) / ".kube" / "config"
        if not path.is_file():
            raise NotSupported(
                "no Kubernetes API: not in a pod (KUBERNETES_SERVICE_HOST unset) and no "
                f"kubeconfig at {path} (set KUBECONFIG)"
            )
        return cls.from_kubeconfig(path, exec_timeout_s=_exec_timeout(environ))

    @classmethod
    def in_pod(cls) -> InClusterKubeClient | None:
        """The pod's client, or None outside Kubernetes (then only kube-free paths work)."""
        try:
            return cls.from_service_account()
        except NotSupported:
            return None

    def get(
        self, path: str, query: Mapping[str, str] | None = None, *, accept: str = JSON
    ) -> object:
        """A GET on the API server, decoded JSON (for readers beyond the Protocol's calls)."""
        return self.request("GET", path, query=query, accept=accept)

    def list_all(
        self,
        path: str,
        query: Mapping[str, str] | None = None,
        page_size: int = PAGE_SIZE,
        *,
        metadata_only: bool = False,
    ) -> tuple[list[Any], str]:
        """Every item of a list, a page at a time (``limit``/``continue``), and the list's
        resourceVersion (where a watch starts); with ``metadata_only`` each item is only its
        ``metadata`` (`METADATA_LIST`)."""
        items: list[Any] = []
        version = ""
        for listing in self.pages(path, query, page_size, metadata_only=metadata_only):
            items += page_items(listing)
            version = str(dig(listing, "metadata", "resourceVersion") or "")
        return items, version

    def pages(
        self,
        path: str,
        query: Mapping[str, str] | None = None,
        page_size: int = PAGE_SIZE,
        *,
        metadata_only: bool = False,
    ) -> Iterator[Any]:
        """Each page of a list in turn (``limit``/``continue``; ``page_size`` 0: one answer,
        unpaged); AgentError past MAX_PAGES, a server that never ends its list."""
        accept = METADATA_LIST if metadata_only else JSON
        token = ""
        for _ in range(MAX_PAGES):
            page = dict(query or {}, limit=str(page_size)) if page_size else dict(query or {})
            if token:  # it carries the first page's version: a resourceVersion is refused
                page.pop("resourceVersion", None)
                page["continue"] = token
            listing = self.get(path, page, accept=accept)
            yield listing
            token = str(dig(listing, "metadata", "continue") or "")
            if not token:
                return
        raise AgentError(f"Kubernetes list {path} did not end after {MAX_PAGES} pages")

    def watch(
        self,
        path: str,
        query: Mapping[str, str],
        resource_version: str,
        timeout_s: float,
        *,
        metadata_only: bool = False,
    ) -> Iterator[tuple[str, Any]]:
        """(type, object) events after ``resource_version`` until the server ends the watch
        (``timeoutSeconds``); Gone when that version is too old (list again). With
        ``metadata_only`` each object is only its ``metadata`` (`METADATA_WATCH`)."""
        q = dict(
            query,
            watch="1",
            resourceVersion=resource_version,
            timeoutSeconds=str(max(1, int(timeout_s))),
            allowWatchBookmarks="true",
        )
        accept = METADATA_WATCH if metadata_only else JSON
        response = self.stream(path, q, timeout=timeout_s + 30, accept=accept)  # errors now
        return self._events(path, response)

    def _events(self, path: str, response: http.client.HTTPResponse) -> Iterator[tuple[str, Any]]:
        try:
            while True:
                try:
                    line = response.readline(MAX_EVENT_BYTES + 1)
                except (OSError, http.client.HTTPException) as exc:
                    raise AgentError(f"Kubernetes watch {path} broke: {exc}") from exc
                if not line:
                    return
                if len(line) > MAX_EVENT_BYTES:
                    raise AgentError(f"Kubernetes watch {path}: an event over {MAX_EVENT_BYTES} B")
                if not line.strip():
                    continue
                event = decode_json(line, f"Kubernetes watch {path}: an event")
                kind, obj = str(dig(event, "type") or ""), dig(event, "object")
                if kind == "ERROR":
                    said = _brief(dig(obj, "message"))
                    if dig(obj, "code") == 410:
                        raise Gone(f"Kubernetes watch {path}: {said}")
                    raise AgentError(f"Kubernetes watch {path}: {said}")
                yield kind, obj
        finally:
            response.close()

    def stream(
        self, path: str, query: Mapping[str, str], timeout: float, *, accept: str = JSON
    ) -> http.client.HTTPResponse:
        """A GET whose body is read as it comes (a watch: one JSON event per line).

        The caller closes the response; ``timeout`` bounds each read, not the whole stream.
        """
        self._refuse_once_closed(f"watch {path}")
        target = self._prefix + path + "?" + urllib.parse.urlencode(query)
        for refresh in (False, True):
            conn = self._connection(timeout)
            try:
                conn.request("GET", target, headers=self._headers(refresh, accept))
                response = conn.getresponse()
            # ValueError: a text that does not encode (a proxy's non-ASCII host in its CONNECT)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                conn.close()
                raise self._unreachable(f"watch {path}", exc) from exc
            if response.status != 401 or self._exec is None or refresh:
                break
            conn.close()  # the plugin's token was refused: run it again, once
        if response.status >= 400:
            data = response.read(MAX_ERROR_BYTES)  # a Status: its message is cut to 300 anyway
            conn.close()
            error = _STATUS_ERRORS.get(response.status, AgentError)
            raise _retry_after(
                error(
                    f"Kubernetes API watch {path}: {response.status} {_brief(response.reason)}: "
                    f"{_status_message(data)}"
                ),
                response,
            )
        return response

    def node_labels(self, node: str) -> Mapping[str, str]:
        obj = self.request("GET", f"/api/v1/nodes/{_segment(node)}")
        labels = dig(obj, "metadata", "labels")
        return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        self.request(
            "PATCH",
            f"/api/v1/nodes/{_segment(node)}",
            body={"metadata": {"labels": dict(labels)}},
            content_type="application/merge-patch+json",
        )

    def node_metadata(self, node: str) -> tuple[Mapping[str, str], Mapping[str, str]]:
        """The Node's (labels, annotations)."""
        obj = self.request("GET", f"/api/v1/nodes/{_segment(node)}")
        return _strings(dig(obj, "metadata", "labels")), _strings(
            dig(obj, "metadata", "annotations")
        )

    def patch_node_annotations(self, node: str, annotations: Mapping[str, str | None]) -> None:
        self.request(
            "PATCH",
            f"/api/v1/nodes/{_segment(node)}",
            body={"metadata": {"annotations": dict(annotations)}},
            content_type="application/merge-patch+json",
        )

    def post_node_event(
        self,
        node: str,
        reason: str,
        message: str,
        component: str = "gpu-agent",
        type_: str = "Normal",
    ) -> None:
        """An Event (``type_`` Normal or Warning) on the Node (namespace default, uid the node
        name, as the kubelet's), so ``kubectl describe node`` shows it."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node}.{component}."},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": component, "host": node},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.request("POST", "/api/v1/namespaces/default/events", body=body)

    def delete_pods(
        self, namespace: str, label_selector: str, node_name: str, *, dry_run: bool = False
    ) -> tuple[str, ...]:
        base = f"/api/v1/namespaces/{_segment(namespace)}/pods"
        # The node field selector keeps this to the plugin pod of *this* node.
        query = {"labelSelector": label_selector, "fieldSelector": f"spec.nodeName={node_name}"}
        pods = page_items(self.request("GET", base, query=query))
        names = [str(name) for pod in pods if (name := dig(pod, "metadata", "name"))]
        deleted = []
        dry = {"dryRun": "All"} if dry_run else None
        for name in names:
            try:
                self.request("DELETE", f"{base}/{_segment(name)}", query=dry)
            except NotFound:
                continue  # already gone: the DaemonSet is restarting it anyway
            deleted.append(name)
        return tuple(deleted)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = JSON,
        accept: str = JSON,
    ) -> Any:
        """Any call (create, update, patch, delete), its JSON decoded (None when empty). An error
        status raises its domain error, with the answer's Retry-After as ``retry_after_s``."""
        self._refuse_once_closed(f"{method} {path}")
        target = self._prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        payload = None if body is None else json.dumps(body).encode()
        for refresh in (False, True):
            headers = self._headers(refresh, accept)
            if payload is not None:
                headers["Content-Type"] = content_type
            conn = self._connection(self._timeout)
            try:
                conn.request(method, target, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read(MAX_RESPONSE_BYTES + 1)
            # ValueError: a text that does not encode (a proxy's non-ASCII host in its CONNECT)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                raise self._unreachable(f"{method} {path}", exc) from exc
            finally:
                conn.close()
            if response.status != 401 or self._exec is None or refresh:
                break  # else the plugin's token was refused: run it again, once
        if response.status >= 400:
            error = _STATUS_ERRORS.get(response.status, AgentError)
            raise _retry_after(
                error(
                    f"Kubernetes API {method} {path}: {response.status} {_brief(response.reason)}: "
                    f"{_status_message(data)}"
                ),
                response,
            )
        if len(data) > MAX_RESPONSE_BYTES:
            raise AgentError(f"Kubernetes API {method} {path}: over {MAX_RESPONSE_BYTES} bytes")
        # a proxy's page, a cut body, a hostile nesting: a failed call, not a crash
        return decode_json(data, f"Kubernetes API {method} {path}: the answer") if data else None

    def _refuse_once_closed(self, what: str) -> None:
        """Before the credential: an exec plugin would run up to its timeout for a call that
        `close` refuses anyway."""
        if self._sockets.closed:
            raise self._unreachable(what, OSError(STOPPING))

    def _unreachable(self, what: str, exc: Exception) -> AgentError:
        # a proxy's reason phrase is in a tunnel's error; a socket shut by `close` says EOF
        why = STOPPING if self._sockets.closed else _brief(str(exc))
        return AgentError(f"Kubernetes API {self._server} unreachable{self._via} ({what}): {why}")

    def _headers(self, refresh: bool = False, accept: str = JSON) -> dict[str, str]:
        headers = {"Accept": accept}
        token = self._token
        if self._exec is not None:
            token = self._exec.token(refresh)
        elif self._token_path is not None:
            token = _read_token(self._token_path)
        if token:
            if not _header_safe(token):  # http.client would raise UnicodeEncodeError, ValueError
                where = self._token_path if self._exec is None else self._exec.command
                raise PermissionDenied(
                    f"the bearer token ({where or 'the kubeconfig'}) is not printable ASCII"
                )
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        tls = self._ssl if self._https else None  # through a proxy: still end to end
        if self._proxy is not None:  # a CONNECT tunnel to the server
            host, port, tunnel_headers = self._proxy
            conn = self._sockets.connection(host, port, timeout, tls, self._tls_server_name)
            conn.set_tunnel(self._host, self._port, headers=tunnel_headers)
            return conn
        return self._sockets.connection(self._host, self._port, timeout, tls, self._tls_server_name)


def _proxy_tunnel(url: str) -> tuple[str, int, dict[str, str]]:
    """(host, port, CONNECT headers) of an http:// proxy URL. Its user info, percent-decoded,
    is the CONNECT's ``Proxy-Authorization: Basic`` (as Go's http.ProxyURL sends it for
    kubectl); it goes on the CONNECT only, never to the API server inside the tunnel."""
    parts = urllib.parse.urlsplit(url)
    headers = {}
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        pair = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        headers["Proxy-Authorization"] = f"Basic {pair}"
    return parts.hostname or "", parts.port or 80, headers


def _strings(found: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _exec_timeout(environ: Mapping[str, str]) -> float:
    raw = environ.get("KUBECONFIG_EXEC_TIMEOUT") or str(EXEC_TIMEOUT_S)
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 600:
        raise InvalidSpec(
            f"KUBECONFIG_EXEC_TIMEOUT={raw!r}: want seconds, over 0 and at most 600",
            [FieldViolation("KUBECONFIG_EXEC_TIMEOUT", "seconds in (0, 600]")],
        )
    return value


def _load_client_cert(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl loads a certificate chain from files only: a private temporary directory, removed.
    with tempfile.TemporaryDirectory(prefix="gpu-agent-kube-") as d:
        cert_path, key_path = Path(d) / "tls.crt", Path(d) / "tls.key"
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        context.load_cert_chain(cert_path, key_path)


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def dig(obj: object, *keys: str) -> object:
    """``obj[k1][k2]...`` through a decoded answer's dicts; None where a key or dict is missing."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def page_items(listing: Any) -> list[Any]:
    """A list page's ``items`` ([] when it has none)."""
    found = dig(listing, "items")
    return found if isinstance(found, list) else []


def decode_json(data: bytes, what: str) -> Any:
    """``data`` decoded as JSON; AgentError saying ``what`` (e.g. "Kubernetes API GET PATH:
    the answer") is not JSON and why, never the data itself: not JSON, not UTF-8, nested
    deeper than the parser takes (RecursionError)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise AgentError(f"{what} is not JSON this client takes: nested too deep") from None
    except json.JSONDecodeError as exc:
        raise AgentError(
            f"{what} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError:  # UnicodeDecodeError: not UTF-8 (nor -16, -32)
        raise AgentError(f"{what} is not JSON: not UTF-8 text") from None


def _read_token(path: Path) -> str:
    """The bearer token in ``path`` (re-read per request: projected tokens rotate), read no
    further than MAX_TOKEN_BYTES; PermissionDenied naming the file otherwise."""
    try:
        raw = safeyaml.read_bytes(path, "tokenFile", MAX_TOKEN_BYTES, "the bearer token file")
    except InvalidSpec as exc:
        raise PermissionDenied(str(exc)) from None
    return raw.decode("ascii", errors="replace").strip()


def _header_safe(value: str) -> bool:
    return value.isascii() and value.isprintable()


def refused_for_good(exc: Exception) -> bool:
    """Whether the API server answered ``exc`` with a 4xx other than 401, 408 and 429 (RBAC,
    validation, a webhook): the same request is refused again, unlike a 5xx, a 429, no
    answer at all, or a credential not taken (a token rotated meanwhile, an authentication
    webhook away), which a later try may get through."""
    status = getattr(exc, "http_status", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (401, 408, 429)


def _retry_after(exc: AgentError, response: http.client.HTTPResponse) -> AgentError:
    """The answer's status as ``exc.http_status`` (`refused_for_good`) and its Retry-After
    (seconds; 429 and 503 carry it) as ``exc.retry_after_s``:
    ASCII digits only (``"²".isdigit()`` is True), None for anything else (an HTTP date, junk),
    and past any wait for more than nine digits (the caller caps what it believes)."""
    exc.http_status = response.status  # type: ignore[attr-defined]
    said = (response.getheader("Retry-After") or "").strip()
    seconds = None
    if said.isascii() and said.isdigit():
        seconds = float(int(said)) if len(said) <= _MAX_RETRY_AFTER_DIGITS else 1e9
    exc.retry_after_s = seconds  # type: ignore[attr-defined]
    return exc


def _status_message(data: bytes) -> str:
    """The ``message`` of a Kubernetes Status body, else the raw body, cut to
    MAX_STATUS_MESSAGE characters either way."""
    try:
        message = dig(decode_json(data, "a Status"), "message")
    except AgentError:
        message = None
    return _brief(message or data[:MAX_STATUS_MESSAGE].decode(errors="replace"))


def _brief(said: object) -> str:
    """A Status's ``message`` (or a reason phrase, a transport error carrying a proxy's) on one
    line (control characters as spaces), cut to MAX_STATUS_MESSAGE; one that is not a string
    is not shown."""
    if not isinstance(said, str):
        return f"(a Status whose message is {type(said).__name__}, not a string)"
    text = said[: MAX_STATUS_MESSAGE + 1]
    one_line = "".join(c if c.isprintable() else " " for c in text)
    return safeyaml.capped(one_line, MAX_STATUS_MESSAGE)
