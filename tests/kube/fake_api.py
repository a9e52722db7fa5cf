"""A fake Kubernetes API server over HTTPS, for the few calls sharing makes.

It is a fake because no API server runs on the machines this project is built and tested on.
It answers the real paths, verbs, content types, bearer-token check and Status error bodies for:
GET/PATCH ``/api/v1/nodes/{name}``, GET (list with labelSelector and fieldSelector) and DELETE
``/api/v1/namespaces/{ns}/pods[/{name}]``. Every request is recorded for assertions.
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Pod:
    namespace: str
    name: str
    node: str
    labels: dict[str, str]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: object


@dataclass
class FakeKubeApi:
    token_path: Path
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: list[Pod] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    #: (method, path) pairs answered 403 Forbidden, as RBAC would.
    forbidden: set[tuple[str, str]] = field(default_factory=set)
    #: (method, path) -> (skip, count): after ``skip`` more such requests, ``count`` fail with
    #: 500 (an API server blip).
    failing: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)

    def serve(self, cert: Path, key: Path) -> tuple[ThreadingHTTPServer, str]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                api._handle(self)

            def do_PATCH(self) -> None:
                api._handle(self)

            def do_DELETE(self) -> None:
                api._handle(self)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        return server, f"https://127.0.0.1:{server.server_address[1]}"

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        path = urllib.parse.unquote(url.path)
        self.requests.append(Request(h.command, path, query, dict(h.headers.items()), body))
        if h.headers.get("Authorization") != f"Bearer {self.token_path.read_text().strip()}":
            return _reply(h, 401, _status(401, "Unauthorized"))
        if (h.command, path) in self.forbidden:
            return _reply(h, 403, _status(403, f"{h.command} {path} is forbidden: RBAC"))
        skip, count = self.failing.get((h.command, path), (0, 0))
        if skip > 0:
            self.failing[(h.command, path)] = (skip - 1, count)
        elif count > 0:
            self.failing[(h.command, path)] = (0, count - 1)
            return _reply(h, 500, _status(500, "etcdserver: request timed out"))
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            return self._node(h, parts[3], body)
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 5 and parts[4] == "pods":
            return self._pods(h, parts[3], parts[5] if len(parts) == 6 else None, query)
        return _reply(h, 404, _status(404, "the server could not find the requested resource"))

    def _node(self, h: BaseHTTPRequestHandler, name: str, body: object) -> None:
        if name not in self.nodes:
            return _reply(h, 404, _status(404, f'nodes "{name}" not found'))
        if h.command == "PATCH":
            if h.headers.get("Content-Type") != "application/merge-patch+json":
                return _reply(h, 415, _status(415, "unsupported media type"))
            assert isinstance(body, dict)
            for key, value in body["metadata"]["labels"].items():
                if value is None:
                    self.nodes[name].pop(key, None)
                else:
                    self.nodes[name][key] = value
        obj = {"kind": "Node", "metadata": {"name": name, "labels": dict(self.nodes[name])}}
        return _reply(h, 200, obj)

    def _pods(
        self, h: BaseHTTPRequestHandler, ns: str, name: str | None, query: dict[str, str]
    ) -> None:
        if name is None and h.command == "GET":
            selector = dict(
                kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if kv
            )
            fields = dict(
                kv.split("=", 1) for kv in query.get("fieldSelector", "").split(",") if kv
            )
            items = [
                {"metadata": {"name": p.name, "namespace": p.namespace, "labels": p.labels}}
                for p in self.pods
                if p.namespace == ns
                and all(p.labels.get(k) == v for k, v in selector.items())
                and fields.get("spec.nodeName", p.node) == p.node
            ]
            return _reply(h, 200, {"kind": "PodList", "items": items})
        if name is not None and h.command == "DELETE":
            for pod in self.pods:
                if pod.namespace == ns and pod.name == name:
                    self.pods.remove(pod)
                    return _reply(h, 200, {"kind": "Pod", "metadata": {"name": name}})
            return _reply(h, 404, _status(404, f'pods "{name}" not found'))
        return _reply(h, 405, _status(405, "method not allowed"))


def _status(code: int, message: str) -> dict[str, object]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "code": code,
    }


def _reply(h: BaseHTTPRequestHandler, code: int, obj: object) -> None:
    data = json.dumps(obj).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)
