"""The API stand-in (tests/kube/fake_api.py) with what the agent's edge to Kubernetes is
tested against: discovery, counts, bookmarks and the failures a real API server answers.

- ``/version`` (the server's version.Info: v1.34.1);
- discovery: ``/apis``, ``/apis/<group>`` (APIGroup) and ``/apis/<group>/<version>``
  (APIResourceList) from ``served``; DeviceTaintRules are answered at every version in
  ``taint_versions`` (the stand-in's store is one) and 404 at any other, as a server that
  serves only that version;
- DRA resources (its store is one, at v1) are answered at every version ``served`` lists them
  under and 404 at any other, as a server that serves only those versions (1.33: v1beta2);
- counts: every call with its time (``calls``), the watches open now and at most
  (``open_watches``, ``most_watches``): what "silent in steady state" is asserted with;
- ``bookmark(resource)``: a BOOKMARK event (only a resourceVersion) on every watch of it that
  asked for bookmarks (``allowWatchBookmarks``), as the real server sends them only then;
- ``fail_next(method, path, code, count, retry_after)``: the next ``count`` matching calls (a
  path prefix; a watch is a GET) answer ``code`` (429 with ``Retry-After``, sent as given: a
  number, or what a broken proxy sends; a 5xx), their Status saying ``message`` (or, as bytes,
  the body itself);
- ``expire_watches``: while True, every watch from a version answers 410 Gone (an ERROR event)
  while lists still answer, as a server whose watch cache cannot serve the version it listed;
- ``short_watches``: while True, every watch is taken (200) and ended at once with no event, as
  a proxy or an overloaded server that drops them;
- ``garble_next(method, path, body, watch)``: the next matching call (only a watch, or only
  not one, when ``watch`` says) answers 200 with ``body``: by default not JSON (a proxy's HTML
  page), or what a test makes (JSON nested deeper than a parser takes);
- ``restart()``: every open watch is cut (the connection reset) and, until ``up()``, every
  call answers 503, as an API server going away and coming back.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.kube import fake_dra, schema
from tests.kube.fake_api import FakeKubeApi, _reply, _status

TAINTS = "devicetaintrules"


@dataclass(frozen=True)
class Call:
    at: float
    method: str
    path: str
    query: dict[str, str]

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("1", "true")

    @property
    def write(self) -> bool:
        return self.method in ("PATCH", "POST", "PUT", "DELETE")


def _served() -> dict[str, dict[str, list[str]]]:
    return {
        fake_dra.GROUP: {
            fake_dra.VERSION: sorted(fake_dra.RESOURCES),
            "v1alpha3": [TAINTS],
        },
        "coordination.k8s.io": {"v1": ["leases"]},
        "events.k8s.io": {"v1": ["events"]},
    }


@dataclass
class EdgeKubeApi(FakeKubeApi):
    #: group -> version -> resources, as discovery answers
    served: dict[str, dict[str, list[str]]] = field(default_factory=_served)
    calls: list[Call] = field(default_factory=list)
    open_watches: int = 0
    most_watches: int = 0
    #: (method, path prefix) -> [count, code, retry_after, body, watch]
    faults: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    down: bool = False
    expire_watches: bool = False
    short_watches: bool = False
    _watchers: set[BaseHTTPRequestHandler] = field(default_factory=set)
    _count_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def taint_versions(self) -> list[str]:
        versions = self.served.get(fake_dra.GROUP, {})
        return [v for v, resources in versions.items() if TAINTS in resources]

    def since(self, at: float) -> list[Call]:
        with self._count_lock:
            return [c for c in self.calls if c.at >= at]

    def fail_next(
        self,
        method: str,
        path: str,
        code: int,
        count: int = 1,
        retry_after: int | str | None = None,
        message: str | bytes = "injected by the test",
    ) -> None:
        with self._count_lock:
            self.faults[(method, path)] = [count, code, retry_after, message, None]

    def garble_next(
        self, method: str, path: str, body: bytes | None = None, watch: bool | None = None
    ) -> None:
        with self._count_lock:
            self.faults[(method, path)] = [1, 200, None, body, watch]

    def bookmark(self, resource: str) -> None:
        with self.lock:
            version = self.bump()
            # As the real server: the watched kind with only a resourceVersion.
            api_version, kind = schema.KINDS[resource]
            obj = {
                "apiVersion": api_version,
                "kind": kind,
                "metadata": {"resourceVersion": version},
            }
            self.history.append((int(version), resource, "BOOKMARK", obj))
            self.changed.notify_all()

    def restart(self) -> None:
        """Cut every open watch and answer 503 until `up`."""
        self.down = True
        with self._count_lock:
            cut = list(self._watchers)
        for h in cut:
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)

    def up(self) -> None:
        self.down = False

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        path, query = unquote(url.path), dict(parse_qsl(url.query))
        with self._count_lock:
            self.calls.append(Call(time.monotonic(), h.command, path, query))
            watch = query.get("watch") in ("1", "true")
            fault = next(
                (
                    f
                    for (m, p), f in self.faults.items()
                    if m == h.command and path.startswith(p) and f[0] > 0 and f[4] in (None, watch)
                ),
                None,
            )
            if fault is not None and fault[0] > 0:
                fault[0] -= 1
            else:
                fault = None
        if self.down:
            return _reply(h, 503, _status(503, "the server is shutting down", "ServiceUnavailable"))
        if fault is not None:
            return _fault(h, *fault[1:4])
        parts = path.strip("/").split("/")
        if path == "/version" and h.command == "GET":  # version.Info, as kubectl version reads
            h.validate = False  # type: ignore[attr-defined]  # no kind: nothing to check it by
            return _reply(h, 200, {"major": "1", "minor": "34", "gitVersion": "v1.34.1"})
        if parts[0] == "apis" and len(parts) <= 3 and h.command == "GET":
            return self._discovery(h, parts[1:])
        if parts[:2] == ["apis", fake_dra.GROUP] and _dra_resource(parts) in fake_dra.RESOURCES:
            if _dra_resource(parts) not in self.served.get(fake_dra.GROUP, {}).get(parts[2], ()):
                return _reply(h, 404, _status(404, "the server could not find the resource"))
            h.path = h.path.replace(f"/{parts[2]}/", f"/{fake_dra.VERSION}/", 1)
        return super()._handle(h)

    def _discovery(self, h: BaseHTTPRequestHandler, parts: list[str]) -> None:
        if not parts:
            groups = [self._group(g) for g in sorted(self.served)]
            return _reply(h, 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        versions = self.served.get(parts[0])
        if not versions or (len(parts) == 2 and parts[1] not in versions):
            return _reply(h, 404, _status(404, "the server could not find the requested resource"))
        if len(parts) == 1:
            return _reply(h, 200, {"kind": "APIGroup", "apiVersion": "v1"} | self._group(parts[0]))
        resources = [
            {
                "name": r,
                "singularName": r[:-1],
                "namespaced": False,
                "kind": schema.KINDS[r][1] if r in schema.KINDS else r.title(),
                "verbs": ["get", "list", "watch"],
            }
            for r in versions[parts[1]]
        ]
        answer = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "/".join(parts)}
        return _reply(h, 200, answer | {"resources": resources})

    def _group(self, group: str) -> dict[str, Any]:
        versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in self.served[group]]
        return {"name": group, "versions": versions, "preferredVersion": versions[0]}

    def _watch(
        self, h: BaseHTTPRequestHandler, resource: str, query: dict[str, str], ns: str = ""
    ) -> None:
        if self.short_watches:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        with self._count_lock:
            self.open_watches += 1
            self.most_watches = max(self.most_watches, self.open_watches)
            self._watchers.add(h)
        if self.expire_watches:
            with self.lock:
                self.compacted = self.version  # the version just listed is already too old
        try:
            super()._watch(h, resource, query, ns)
        except (OSError, ssl.SSLError):
            pass  # cut by `restart`
        finally:
            with self._count_lock:
                self.open_watches -= 1
                self._watchers.discard(h)


def _dra_resource(parts: list[str]) -> str:
    """The resource of a resource.k8s.io path (``apis/<group>/<version>[/namespaces/<ns>]/<r>``)."""
    rest = parts[3:]
    return rest[2] if rest[:1] == ["namespaces"] and len(rest) >= 3 else (rest[:1] or [""])[0]


def _fault(
    h: BaseHTTPRequestHandler, code: int, retry_after: int | str | None, said: str | bytes | None
) -> None:
    """``said``: the Status message of an error, or the body as bytes (None for a 200: a
    proxy's page)."""
    if isinstance(said, bytes):
        data = said
    elif code == 200:
        data = b"<html>a proxy's page</html>"
    else:
        message = said if isinstance(said, str) else "injected by the test"
        body = _status(code, message, "TooManyRequests" if code == 429 else "")
        data = json.dumps(body).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    if retry_after is not None:
        h.send_header("Retry-After", str(retry_after))
    h.end_headers()
    h.wfile.write(data)
