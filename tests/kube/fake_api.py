"""A stand-in Kubernetes API server over HTTPS, for the calls the agent and coordinator make.

It is a stand-in because no API server runs on the machines this project is built and tested
on. It answers the real paths, verbs, content types, bearer-token check and Status error bodies
for: GET/PATCH ``/api/v1/nodes/{name}``, GET ``/api/v1/nodes`` (list, paged with
``limit``/``continue``), GET (list with labelSelector, fieldSelector, paging) and DELETE
``/api/v1/namespaces/{ns}/pods[/{name}]``, and GET/POST/PUT
``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]`` and
``/api/v1/namespaces/{ns}/configmaps[/{name}]``, POST ``/api/v1/namespaces/{ns}/events``, and
POST ``/api/v1/namespaces/{ns}/pods/{name}/eviction`` (429 while ``pdb_refusals`` says the
pod's disruption budget refuses, as the real server answers, with ``pdb_retry_after`` as its
Retry-After; otherwise the pod is deleted), and
``resource.k8s.io/v1`` ResourceSlices, DeviceClasses, ResourceClaims and ResourceClaimTemplates
(list, get, watch, create, update, delete, the claims' ``/status``; tests/kube/fake_dra.py says
what of their schema and semantics is modelled), and ``resource.k8s.io/v1alpha3``
DeviceTaintRules (cluster scoped; list with ``labelSelector``, get, create, delete; a create
needs a DNS-subdomain name, ``spec.taint.key`` a label name and ``spec.taint.effect`` one of
None, NoSchedule, NoExecute; ``device_taint_rules = False`` answers 404 as a cluster without
the DRADeviceTaints feature gate does).
A Node merge-patch may set ``spec.unschedulable`` (cordon) and ``spec.taints`` (a list: replaced
whole, as RFC 7386 says). PATCH ``/api/v1/nodes/{name}/status`` (the status subresource) takes a
strategic-merge patch of ``status.conditions``: conditions merge by ``type`` (the list's patch
merge key in the Node schema), the others are kept; nothing else of the status is modelled.
A Node carries the ``status`` (allocatable, capacity) a test sets with ``set_node_status``,
as its kubelet would; a pod DELETE calls ``on_delete`` (a test's DaemonSet controller
recreating the pod).
Like the real server:
- every write bumps one cluster-wide ``resourceVersion``; a PUT whose
  ``metadata.resourceVersion`` is stale is 409 Conflict, a POST of an existing name 409
  AlreadyExists, a PUT of a missing object 404;
- label keys and values are validated (prefix a DNS subdomain <= 253, name <= 63 of
  ``[A-Za-z0-9._-]`` starting and ending alphanumeric; values the same, or empty): 422 Invalid;
  so are a Node's taints (key a label key, value a label value, effect NoSchedule,
  PreferNoSchedule or NoExecute, unique by key and effect);
- a write's media type and a time's wire format are held to what the server decodes: 415, 400
  (tests/kube/schema.py ``unsupported_media``, ``check_request``);
- a Node merge-patch with ``metadata.resourceVersion`` is a precondition: stale is 409;
- ``?watch=1`` on the node and pod lists streams ``{"type", "object"}`` lines: with a
  ``resourceVersion``, every change after it (ADDED/MODIFIED/DELETED, the object carrying its
  new version), with none or "0" the current objects as ADDED first; a version older than the
  retained history (``compact``) is an ERROR event with a 410 Status, as the real server's
  "too old resource version"; BOOKMARK events (tests/kube/fake_edge.py) go only to a watch
  that asked for them (``allowWatchBookmarks``, a bool parameter as Go reads one: absent, "0"
  or "false" is no); the watch ends after ``timeoutSeconds``. ``fieldSelector``
  ``metadata.name=`` (nodes) and ``labelSelector`` (pods) filter it.

Every body and served object is checked against the real schema (tests/kube/schema.py), unless
``validate`` is False: a benchmark serving thousands of objects (bench/coordinator_kube.py) turns
the check off, as it costs far more CPU than the answer (the tests keep it on).
Authentication: the bearer token, or a client certificate ``client_ca`` signed. Not modelled:
authorization beyond the ``forbidden`` set; admission and defaulting (objects are the fields
the code reads); strategic-merge and JSON patches; ``resourceVersionMatch``; an expired
``continue`` (410); field selectors but ``spec.nodeName`` on pods and ``metadata.name`` on
node watches; label selectors but ``k=v`` conjunctions; chunked encoding (a watch is an
HTTP/1.0 body ended by closing). Every request is recorded for assertions, its headers (the
``Accept`` a metadata-only list or watch sends) and the bytes answered to it (``sent``)
included (tests/kube/fake_edge.py adds discovery, bookmarks, faults and counts of open
watches). Every GET, list and watch honours ``Accept`` as the real server does: metadata only
(``PartialObjectMetadataList``, ``PartialObjectMetadata``) when asked (tests/kube/fake_meta.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.kube import fake_dra, fake_meta, schema
from tests.kube.schema import DNS as _DNS
from tests.kube.schema import label_problem


@dataclass
class Pod:
    namespace: str
    name: str
    node: str
    labels: dict[str, str]
    #: status.podIP and a container port named "grpc", for agent pods
    ip: str | None = None
    grpc_port: int | None = None
    ready: bool = True
    #: deleted and stopping: metadata.deletionTimestamp is set
    terminating: bool = False

    def obj(self) -> dict[str, Any]:
        ports = [{"name": "grpc", "containerPort": self.grpc_port}] if self.grpc_port else []
        status: dict[str, Any] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if self.ready else "False"}],
        }
        if self.ip:
            status["podIP"] = self.ip
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": self.labels,
        }
        if self.terminating:
            metadata["deletionTimestamp"] = "2026-12-07T16:00:00Z"
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"nodeName": self.node, "containers": [{"name": "c", "ports": ports}]},
            "status": status,
        }


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: object
    #: bytes of the answer's body sent so far (a watch's grow with each event)
    sent: int = 0


@dataclass
class FakeKubeApi:
    token_path: Path
    #: the API server's --client-ca-file
    client_ca: Path | None = None
    #: the server name each TLS client asked for (SNI; None: it sent none)
    server_names: list[str | None] = field(default_factory=list)
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: list[Pod] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    #: (method, path) pairs answered 403 Forbidden, as RBAC would.
    forbidden: set[tuple[str, str]] = field(default_factory=set)
    #: (method, path) -> (skip, count): after ``skip`` more such requests, ``count`` fail with
    #: 500 (an API server blip).
    failing: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    #: resource ("leases", "configmaps", "events") -> (namespace, name) -> object
    stores: dict[str, dict[tuple[str, str], dict[str, Any]]] = field(default_factory=dict)
    #: name -> resourceVersion of that Node's last write
    node_versions: dict[str, str] = field(default_factory=dict)
    #: name -> that Node's annotations
    node_annotations: dict[str, dict[str, str]] = field(default_factory=dict)
    #: (namespace, pod) -> evictions still refused (429) by its PodDisruptionBudget
    pdb_refusals: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the Retry-After (seconds) of those 429s; None: none sent
    pdb_retry_after: int | None = None
    #: called (namespace, pod) after an eviction deleted a pod: the kubelet stopping it
    on_evict: Any = field(default=lambda ns, name: None)
    #: called (namespace, pod) after a DELETE removed a pod (its DaemonSet making a new one:
    #: tests/kube/fake_dra_plugin.py); called with the lock held, so it must not block
    on_delete: Any = field(default=lambda ns, name: None)
    #: name -> that Node's ``status`` (``allocatable`` and ``capacity``, as the kubelet sets)
    node_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Nodes marked spec.unschedulable (cordoned)
    unschedulable: set[str] = field(default_factory=set)
    #: name -> that Node's spec.taints
    node_taints: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: name -> that Node's status.conditions
    node_conditions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: whether resource.k8s.io/v1alpha3 DeviceTaintRules are served (the alpha feature gate)
    device_taint_rules: bool = True
    #: paths answered 503, as an API server that is down (e.g. during an upgrade)
    unavailable: set[str] = field(default_factory=set)
    #: check every body and served object against the real schema (off only for benchmarks)
    validate: bool = True
    #: whether metadata-only answers are served (False: a server too old to, fake_meta.py)
    serves_metadata: bool = True
    #: the path the API is served under, as behind Rancher's proxy (/k8s/clusters/<id>):
    #: anything outside it is 404; requests are recorded without it
    prefix: str = ""
    version: int = 1
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: (version, resource, type, object) of every change, for watches; ``compact`` trims it
    history: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)
    compacted: int = 0
    closed: bool = False

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    @property
    def taint_versions(self) -> list[str]:
        """The versions DeviceTaintRules are answered at: one store behind them all."""
        return ["v1alpha3"]

    @property
    def leases(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.stores.setdefault("leases", {})

    @property
    def configmaps(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.stores.setdefault("configmaps", {})

    @property
    def events(self) -> list[dict[str, Any]]:
        """Events posted, oldest first."""
        found = self.stores.get("events", {})
        return sorted(found.values(), key=lambda e: int(e["metadata"]["resourceVersion"]))

    def bump(self) -> str:
        self.version += 1
        return str(self.version)

    # -- changes made by a test (a user with kubectl), seen by watches --------------------------

    def set_labels(self, node: str, labels: dict[str, str | None]) -> None:
        with self.lock:
            kind = "MODIFIED" if node in self.nodes else "ADDED"
            current = self.nodes.setdefault(node, {})
            for key, value in labels.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            self.node_versions[node] = self.bump()
            self._record("nodes", kind, self._node_obj(node))

    def set_node_status(self, node: str, status: dict[str, Any]) -> None:
        """Replace the Node's status (its kubelet reporting allocatable/capacity), seen by
        watches."""
        with self.lock:
            self.node_status[node] = copy.deepcopy(status)
            self.node_versions[node] = self.bump()
            self._record("nodes", "MODIFIED", self._node_obj(node))

    def put_dra(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a resource.k8s.io object as its writer would (a DRA driver
        publishing a slice, kubectl, the scheduler writing a claim's status): validated like a
        request, seen by watches."""
        kind, namespaced = fake_dra.RESOURCES[resource]
        problems = fake_dra.invalid(kind, obj)
        if problems:
            raise ValueError("; ".join(problems))
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or "default") if namespaced else "", str(meta["name"]))
        with self.lock:
            event = "MODIFIED" if key in self.stores.get(resource, {}) else "ADDED"
            return self._dra_write(resource, key, obj, event, namespaced)

    def delete_dra(self, resource: str, name: str, namespace: str = "") -> None:
        with self.lock:
            obj = self.stores.setdefault(resource, {}).pop((namespace, name))
            self.bump()
            self._record(resource, "DELETED", obj)

    def dra(self, resource: str) -> list[dict[str, Any]]:
        """The stored objects of a resource.k8s.io resource, by (namespace, name)."""
        with self.lock:
            store = self.stores.get(resource, {})
            return [copy.deepcopy(store[k]) for k in sorted(store)]

    def compact(self) -> None:
        """Forget the history: a watch from any version seen so far gets 410 Gone."""
        with self.lock:
            self.compacted = self.version
            self.history.clear()
            self.bump()  # a list from now on starts past the compacted versions

    def close(self) -> None:
        """End every watch (the test is over)."""
        with self.lock:
            self.closed = True
            self.changed.notify_all()

    def _record(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        self.history.append((self.version, resource, kind, copy.deepcopy(obj)))
        self.changed.notify_all()

    def serve(self, cert: Path, key: Path) -> tuple[ThreadingHTTPServer, str]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                """Quiet: tests read ``requests``, not the server's log."""

            def do_GET(self) -> None:
                api._handle(self)

            do_PATCH = do_DELETE = do_POST = do_PUT = do_GET

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.sni_callback = lambda _sock, name, _context: self.server_names.append(name)
        if self.client_ca is not None:
            context.load_verify_locations(self.client_ca)
            context.verify_mode = ssl.CERT_OPTIONAL
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
        if self.prefix:
            if not path.startswith(self.prefix + "/"):
                return _reply(h, 404, _status(404, f"{path} is not under {self.prefix}"))
            path = path.removeprefix(self.prefix)
        h.record = Request(h.command, path, query, dict(h.headers.items()), body)  # type: ignore[attr-defined]
        self.requests.append(h.record)  # type: ignore[attr-defined]
        token = f"Bearer {self.token_path.read_text().strip()}"
        by_cert = self.client_ca is not None and h.connection.getpeercert()
        if h.headers.get("Authorization") != token and not by_cert:
            return _reply(h, 401, _status(401, "Unauthorized"))
        if (h.command, path) in self.forbidden:
            return _reply(h, 403, _status(403, f"{h.command} {path} is forbidden: RBAC"))
        skip, count = self.failing.get((h.command, path), (0, 0))
        if skip > 0:
            self.failing[(h.command, path)] = (skip - 1, count)
        elif count > 0:
            self.failing[(h.command, path)] = (0, count - 1)
            return _reply(h, 500, _status(500, "etcdserver: request timed out"))
        if path in self.unavailable:
            return _reply(h, 503, _status(503, "the server is currently unable to handle it"))
        try:  # read by _reply and _watch: what the answer is converted to
            h.convert = fake_meta.negotiate(  # type: ignore[attr-defined]
                h.headers.get("Accept"), self.serves_metadata
            )
        except fake_meta.NotAcceptable as exc:
            return _reply(h, 406, _status(406, str(exc), "NotAcceptable"))
        parts = path.strip("/").split("/")
        h.validate = self.validate  # type: ignore[attr-defined]  # read by _reply
        media = h.headers.get("Content-Type") or ""
        if (refused := schema.unsupported_media(h.command, parts, media)) is not None:
            return _reply(h, 415, _status(415, refused, "UnsupportedMediaType"))
        if self.validate and (refused := schema.check_request(h.command, parts, media, body)):
            return _reply(h, 400, _status(400, refused, "BadRequest"))
        if query.get("watch") in ("1", "true") and h.command == "GET":
            if parts == ["api", "v1", "nodes"]:
                return self._watch(h, "nodes", query)
            if parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["pods"]:
                return self._watch(h, "pods", query, parts[3])
            dra = self._dra_target(parts)
            if dra is not None and dra[2] is None:
                return self._watch(h, dra[0], query, dra[1])
            return _reply(h, 405, _status(405, "watch is served on the node, pod and DRA lists"))
        with self.lock:
            if parts[:2] == ["apis", fake_dra.GROUP] and parts[3:4] == ["devicetaintrules"]:
                served = self.device_taint_rules and parts[2] in self.taint_versions
                if served and len(parts) in (4, 5):
                    return self._taint_rules(h, parts[4] if len(parts) == 5 else None, query, body)
                return _reply(h, 404, _status(404, "the server could not find the resource"))
            if parts[:2] == ["apis", fake_dra.GROUP]:
                return self._dra(h, parts, query, body)
            if parts == ["api", "v1", "nodes"] and h.command == "GET":
                nodes = [self._node_obj(n) for n in sorted(self.nodes)]
                return _reply(h, 200, self._page("NodeList", nodes, query))
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                return self._node(h, parts[3], body)
            if parts[:3] == ["api", "v1", "nodes"] and parts[4:] == ["status"]:
                return self._node_status(h, parts[3], body)
            pods = parts[:3] == ["api", "v1", "namespaces"] and parts[4:5] == ["pods"]
            if pods and len(parts) == 7 and parts[6] == "eviction" and h.command == "POST":
                return self._evict(h, parts[3], parts[5], body)
            if pods and len(parts) in (5, 6):
                return self._pods(h, parts[3], parts[5] if len(parts) == 6 else None, query)
            lease = ["apis", "coordination.k8s.io", "v1", "namespaces"]
            if parts[:4] == lease and len(parts) in (6, 7) and parts[5] == "leases":
                name = parts[6] if len(parts) == 7 else None
                return self._namespaced(h, "leases", parts[4], name, body)
            core = ["api", "v1", "namespaces"]
            if parts[:3] == core and len(parts) in (5, 6) and parts[4] in ("configmaps", "events"):
                name = parts[5] if len(parts) == 6 else None
                return self._namespaced(h, parts[4], parts[3], name, body)
        return _reply(h, 404, _status(404, "the server could not find the requested resource"))

    def _page(
        self, kind: str, items: list[dict[str, Any]], query: dict[str, str]
    ) -> dict[str, Any]:
        """One page of a list: ``limit`` items from the ``continue`` offset (an opaque token)."""
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items)
        chunk = items[start : start + limit]
        metadata: dict[str, Any] = {"resourceVersion": str(self.version)}
        if start + limit < len(items):
            metadata["continue"] = str(start + limit)
        return {"kind": kind, "apiVersion": "v1", "metadata": metadata, "items": chunk}

    def _node_obj(self, name: str) -> dict[str, Any]:
        version = self.node_versions.setdefault(name, "1")
        spec: dict[str, Any] = {"unschedulable": True} if name in self.unschedulable else {}
        if self.node_taints.get(name):
            spec["taints"] = copy.deepcopy(self.node_taints[name])
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "spec": spec,
            "status": copy.deepcopy(self.node_status.get(name, {}))
            | {"conditions": copy.deepcopy(self.node_conditions.get(name, []))},
            "metadata": {
                "name": name,
                "labels": dict(self.nodes[name]),
                "annotations": dict(self.node_annotations.get(name, {})),
                "resourceVersion": version,
            },
        }

    def _watch(
        self, h: BaseHTTPRequestHandler, resource: str, query: dict[str, str], ns: str = ""
    ) -> None:
        name = query.get("fieldSelector", "").removeprefix("metadata.name=")
        wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if kv)

        def matches(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            if resource in fake_dra.RESOURCES:
                return (not ns or meta.get("namespace") == ns) and fake_dra.field_selected(
                    resource, obj, query.get("fieldSelector", "")
                )
            if resource == "nodes":
                return not name or meta.get("name") == name
            labels = meta.get("labels") or {}
            return meta.get("namespace") == ns and all(
                labels.get(k) == v for k, v in wanted.items()
            )

        # Only when asked (a bool parameter: absent, "0" or "false" is false, as Go reads it).
        asked = query.get("allowWatchBookmarks")
        bookmarks = asked is not None and asked.lower() not in ("0", "false")
        version = query.get("resourceVersion", "")
        with self.lock:
            if version and version != "0" and int(version) <= self.compacted:
                first: list[tuple[str, dict[str, Any]]] = [
                    ("ERROR", _status(410, f"too old resource version: {version}", "Expired"))
                ]
                since = None
            elif version and version != "0":
                first, since = [], int(version)
            else:
                if resource == "nodes":
                    current = [self._node_obj(n) for n in sorted(self.nodes)]
                elif resource in fake_dra.RESOURCES:
                    current = self.dra(resource)
                else:
                    current = [p.obj() for p in self.pods]
                first, since = [("ADDED", o) for o in current if matches(o)], self.version
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()

        def send(kind: str, obj: dict[str, Any]) -> None:
            obj = fake_meta.convert(obj, getattr(h, "convert", None))
            if self.validate:
                schema.check_reply(200 if kind != "ERROR" else 410, obj, f"watch {h.path}")
            data = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            h.wfile.write(data)
            h.wfile.flush()
            _count(h, data)

        # the client went away, or an event the Accept cannot carry (the real server ends the
        # watch then)
        with contextlib.suppress(
            BrokenPipeError, ConnectionResetError, ssl.SSLError, fake_meta.NotAcceptable
        ):
            for kind, obj in first:
                send(kind, obj)
            deadline = time.monotonic() + min(float(query.get("timeoutSeconds") or 60), 600)
            while since is not None and not self.closed and time.monotonic() < deadline:
                with self.lock:
                    events = [
                        e
                        for e in self.history
                        if e[0] > since
                        and e[1] == resource
                        and (bookmarks if e[2] == "BOOKMARK" else matches(e[3]))
                    ]
                    if not events:
                        self.changed.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                        continue
                for event in events:
                    send(event[2], event[3])
                since = events[-1][0]

    @staticmethod
    def _dra_target(parts: list[str]) -> tuple[str, str, str | None, bool] | None:
        """(resource, namespace, name, status subresource) of a resource.k8s.io/v1 path."""
        if parts[:3] != ["apis", fake_dra.GROUP, fake_dra.VERSION]:
            return None
        rest, ns = parts[3:], ""
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        if not rest or rest[0] not in fake_dra.RESOURCES or len(rest) > 3:
            return None
        if fake_dra.RESOURCES[rest[0]][1] != bool(ns) and not (len(rest) == 1 and not ns):
            return None  # a namespaced kind outside a namespace lists all namespaces
        if len(rest) == 3 and rest[2] != "status":
            return None
        return rest[0], ns, rest[1] if len(rest) >= 2 else None, len(rest) == 3

    def _dra(
        self, h: BaseHTTPRequestHandler, parts: list[str], query: dict[str, str], body: object
    ) -> None:
        target = self._dra_target(parts)
        if target is None:
            return _reply(h, 404, _status(404, "the server could not find the requested resource"))
        resource, ns, name, status = target
        kind, namespaced = fake_dra.RESOURCES[resource]
        store = self.stores.setdefault(resource, {})
        if name is None and h.command == "GET":
            try:
                items = [
                    o
                    for o in self.dra(resource)
                    if (not ns or o["metadata"].get("namespace") == ns)
                    and fake_dra.field_selected(resource, o, query.get("fieldSelector", ""))
                ]
            except ValueError as exc:
                return _reply(h, 400, _status(400, str(exc), "BadRequest"))
            page = self._page(f"{kind}List", items, query)
            return _reply(h, 200, page | {"apiVersion": "resource.k8s.io/v1"})
        key = (ns, name or "")
        if name is None and h.command == "POST":
            if not isinstance(body, dict):
                return _reply(h, 400, _status(400, "the body must be an object"))
            meta = body.get("metadata") or {}
            key = (ns, str(meta.get("name") or ""))
            problems = fake_dra.invalid(kind, body)
            if problems:
                return self._invalid(h, kind, key[1], problems)
            if key in store:
                message = f'{resource}.{fake_dra.GROUP} "{key[1]}" already exists'
                return _reply(h, 409, _status(409, message, "AlreadyExists"))
            if meta.get("resourceVersion"):
                return _reply(h, 400, _status(400, "resourceVersion should not be set on create"))
            obj = fake_dra.keep_status(None, body)
            return _reply(h, 201, self._dra_write(resource, key, obj, "ADDED", namespaced))
        if name is None:
            return _reply(h, 405, _status(405, "method not allowed"))
        if key not in store:
            return _reply(h, 404, _status(404, f'{resource}.{fake_dra.GROUP} "{name}" not found'))
        stored = store[key]
        if h.command == "GET":
            return _reply(h, 200, copy.deepcopy(stored))
        if h.command == "DELETE":
            del store[key]
            self.bump()
            self._record(resource, "DELETED", stored)
            return _reply(h, 200, stored)
        if h.command != "PUT" or not isinstance(body, dict):
            return _reply(h, 405, _status(405, "method not allowed"))
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want and want != stored["metadata"]["resourceVersion"]:
            return _reply(h, 409, _conflict(f"{resource}.{fake_dra.GROUP}", name))
        if status:
            if resource != "resourceclaims":
                return _reply(h, 404, _status(404, "the server could not find the resource"))
            obj = copy.deepcopy(stored)
            obj["status"] = copy.deepcopy(body.get("status") or {})
        else:
            problems = fake_dra.invalid(kind, body)
            if resource == "resourceclaims" and body.get("spec") != stored.get("spec"):
                problems.append("spec: Invalid value: field is immutable")
            if problems:
                return self._invalid(h, kind, name, problems)
            obj = fake_dra.keep_status(stored, body)
        return _reply(h, 200, self._dra_write(resource, key, obj, "MODIFIED", namespaced))

    def _dra_write(
        self,
        resource: str,
        key: tuple[str, str],
        obj: dict[str, Any],
        event: str,
        namespaced: bool,
    ) -> dict[str, Any]:
        kind = fake_dra.RESOURCES[resource][0]
        obj = dict(obj, kind=kind, apiVersion=f"{fake_dra.GROUP}/{fake_dra.VERSION}")
        stored = self._store(self.stores.setdefault(resource, {}), key, obj)
        if not namespaced:
            stored["metadata"].pop("namespace", None)
        self._record(resource, event, stored)
        return copy.deepcopy(stored)

    @staticmethod
    def _invalid(h: BaseHTTPRequestHandler, kind: str, name: str, problems: list[str]) -> None:
        message = f'{kind}.{fake_dra.GROUP} "{name}" is invalid: {"; ".join(problems)}'
        return _reply(h, 422, _status(422, message, "Invalid"))

    def _node(self, h: BaseHTTPRequestHandler, name: str, body: object) -> None:
        if name not in self.nodes:
            return _reply(h, 404, _status(404, f'nodes "{name}" not found'))
        if h.command == "PATCH":
            if h.headers.get("Content-Type") != "application/merge-patch+json":
                return _reply(h, 415, _status(415, "unsupported media type"))
            assert isinstance(body, dict)
            metadata = body.get("metadata") or {}
            want = metadata.get("resourceVersion")
            if want is not None and want != self.node_versions.setdefault(name, "1"):
                return _reply(h, 409, _conflict("nodes", name))
            labels = metadata.get("labels") or {}
            bad = [p for k, v in labels.items() if v is not None and (p := label_problem(k, v))]
            bad += [p for k in labels if (p := label_problem(k, ""))]
            spec = body.get("spec") or {}
            bad += schema.taint_problems(spec.get("taints"))
            if bad:
                return _reply(h, 422, _status(422, f'Node "{name}" is invalid: {"; ".join(bad)}'))
            for key, value in labels.items():
                if value is None:
                    self.nodes[name].pop(key, None)
                else:
                    self.nodes[name][key] = value
            if "taints" in spec:
                self.node_taints[name] = list(spec["taints"] or [])
            if "unschedulable" in spec:
                if spec["unschedulable"]:
                    self.unschedulable.add(name)
                else:
                    self.unschedulable.discard(name)
            notes = self.node_annotations.setdefault(name, {})
            for key, value in (metadata.get("annotations") or {}).items():
                if value is None:
                    notes.pop(key, None)
                else:
                    notes[key] = str(value)
            self.node_versions[name] = self.bump()
            self._record("nodes", "MODIFIED", self._node_obj(name))
        return _reply(h, 200, self._node_obj(name))

    def _node_status(self, h: BaseHTTPRequestHandler, name: str, body: object) -> None:
        if name not in self.nodes:
            return _reply(h, 404, _status(404, f'nodes "{name}" not found'))
        if h.command != "PATCH":
            return _reply(h, 405, _status(405, "only PATCH is served on the Node's status"))
        if h.headers.get("Content-Type") != "application/strategic-merge-patch+json":
            return _reply(h, 415, _status(415, "unsupported media type"))
        assert isinstance(body, dict)
        conditions = self.node_conditions.setdefault(name, [])
        for patch in (body.get("status") or {}).get("conditions") or []:
            if not patch.get("type") or patch.get("status") not in ("True", "False", "Unknown"):
                message = f'Node "{name}" is invalid: status.conditions: type and status required'
                return _reply(h, 422, _status(422, message, "Invalid"))
            found = next((c for c in conditions if c["type"] == patch["type"]), None)
            if found is None:
                conditions.append(dict(patch))
            else:
                found.update(patch)
        self.node_versions[name] = self.bump()
        self._record("nodes", "MODIFIED", self._node_obj(name))
        return _reply(h, 200, self._node_obj(name))

    @property
    def taint_rules(self) -> dict[str, dict[str, Any]]:
        """DeviceTaintRules by name."""
        return {k[1]: v for k, v in self.stores.get("devicetaintrules", {}).items()}

    def _taint_rules(
        self, h: BaseHTTPRequestHandler, name: str | None, query: dict[str, str], body: object
    ) -> None:
        store = self.stores.setdefault("devicetaintrules", {})
        if name is None and h.command == "GET":
            wanted = dict(
                kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if kv
            )
            items = [
                o
                for o in store.values()
                if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
            ]
            page = self._page("DeviceTaintRuleList", items, query)
            return _reply(h, 200, page | {"apiVersion": f"{fake_dra.GROUP}/v1alpha3"})
        if name is None and h.command == "POST":
            assert isinstance(body, dict)
            meta, spec = body.get("metadata") or {}, body.get("spec") or {}
            rule = str(meta.get("name") or "")
            taint = spec.get("taint") or {}
            problems = []
            if not rule or len(rule) > 253 or not _DNS.match(rule):
                problems.append("metadata.name: a lowercase RFC 1123 subdomain")
            if not isinstance(taint.get("key"), str) or label_problem(taint["key"], ""):
                problems.append("spec.taint.key: must be a label name")
            if taint.get("effect") not in ("None", "NoSchedule", "NoExecute"):
                problems.append('spec.taint.effect: supported values: "None", "NoExecute", ...')
            if problems:
                message = f'DeviceTaintRule.resource.k8s.io "{rule}" is invalid: ' + "; ".join(
                    problems
                )
                return _reply(h, 422, _status(422, message, "Invalid"))
            if ("", rule) in store:
                message = f'devicetaintrules.resource.k8s.io "{rule}" already exists'
                return _reply(h, 409, _status(409, message, "AlreadyExists"))
            return _reply(h, 201, self._store(store, ("", rule), body, "devicetaintrules"))
        if name is not None and ("", name) not in store:
            return _reply(h, 404, _status(404, f'devicetaintrules "{name}" not found'))
        if name is not None and h.command == "GET":
            return _reply(h, 200, store[("", name)])
        if name is not None and h.command == "DELETE":
            gone = store.pop(("", name))
            self.bump()
            return _reply(h, 200, gone)
        return _reply(h, 405, _status(405, "method not allowed"))

    def _namespaced(
        self,
        h: BaseHTTPRequestHandler,
        resource: str,
        ns: str,
        name: str | None,
        body: object,
    ) -> None:
        """GET/POST/PUT of a namespaced object (Lease, ConfigMap), with the server's
        resourceVersion rules; POST of an Event (kept, never read back)."""
        store = self.stores.setdefault(resource, {})
        if name is None and h.command == "POST":
            assert isinstance(body, dict)
            meta = body.get("metadata") or {}
            if resource == "events":
                meta = dict(
                    meta, name=meta.get("name") or f"{meta.get('generateName', '')}{self.version}"
                )
                body = dict(body, metadata=meta)
            key = (ns, str(meta.get("name") or ""))
            if not key[1]:
                return _reply(h, 422, _status(422, f"{resource}: metadata.name: Required value"))
            if key in store:
                message = f'{resource} "{key[1]}" already exists'
                return _reply(h, 409, _status(409, message, "AlreadyExists"))
            if meta.get("resourceVersion"):
                return _reply(h, 400, _status(400, "resourceVersion should not be set on create"))
            return _reply(h, 201, self._store(store, key, body, resource))
        if name is None:
            return _reply(h, 405, _status(405, "method not allowed"))
        key = (ns, name)
        if key not in store:
            return _reply(h, 404, _status(404, f'{resource} "{name}" not found'))
        if h.command == "GET":
            return _reply(h, 200, store[key])
        if h.command == "PUT":
            assert isinstance(body, dict)
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want and want != store[key]["metadata"]["resourceVersion"]:
                return _reply(h, 409, _conflict(resource, name))
            return _reply(h, 200, self._store(store, key, body, resource))
        return _reply(h, 405, _status(405, "method not allowed"))

    def _store(
        self,
        store: dict[tuple[str, str], dict[str, Any]],
        key: tuple[str, str],
        body: dict[str, Any],
        resource: str = "",
    ) -> dict[str, Any]:
        """Stored as the server keeps it: its apiVersion and kind, name, a new version."""
        obj = copy.deepcopy(body)
        if resource:
            obj["apiVersion"], obj["kind"] = schema.KINDS[resource]
        obj["metadata"] = dict(obj.get("metadata") or {})
        obj["metadata"].update(namespace=key[0], name=key[1], resourceVersion=self.bump())
        store[key] = obj
        return obj

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
                p.obj()
                for p in self.pods
                if p.namespace == ns
                and all(p.labels.get(k) == v for k, v in selector.items())
                and fields.get("spec.nodeName", p.node) == p.node
            ]
            return _reply(h, 200, self._page("PodList", items, query))
        if name is not None and h.command == "DELETE":
            for pod in self.pods:
                if pod.namespace == ns and pod.name == name:
                    if query.get("dryRun") == "All":  # authorized and admitted, kept
                        return _reply(h, 200, pod.obj())
                    self.pods.remove(pod)
                    self.on_delete(ns, name)
                    return _reply(h, 200, pod.obj())
            return _reply(h, 404, _status(404, f'pods "{name}" not found'))
        return _reply(h, 405, _status(405, "method not allowed"))

    def _evict(self, h: BaseHTTPRequestHandler, ns: str, name: str, body: object) -> None:
        """policy/v1 Eviction: 429 while the pod's disruption budget refuses, else deleted."""
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            return _reply(h, 400, _status(400, "the body must be a policy/v1 Eviction"))
        pod = next((p for p in self.pods if p.namespace == ns and p.name == name), None)
        if pod is None:
            return _reply(h, 404, _status(404, f'pods "{name}" not found'))
        left = self.pdb_refusals.get((ns, name), 0)
        if left > 0:
            self.pdb_refusals[(ns, name)] = left - 1
            message = "Cannot evict pod as it would violate the pod's disruption budget."
            after = self.pdb_retry_after
            headers = {} if after is None else {"Retry-After": str(after)}
            return _reply(h, 429, _status(429, message, "TooManyRequests"), headers)
        self.pods.remove(pod)
        self.on_evict(ns, name)
        return _reply(h, 201, _status(201, "", "") | {"status": "Success"})


def _status(code: int, message: str, reason: str = "") -> dict[str, object]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _conflict(resource: str, name: str) -> dict[str, object]:
    return _status(
        409,
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        "Conflict",
    )


def _reply(
    h: BaseHTTPRequestHandler, code: int, obj: object, headers: dict[str, str] | None = None
) -> None:
    if code < 300 and isinstance(obj, dict):
        try:
            obj = fake_meta.convert(obj, getattr(h, "convert", None))
        except fake_meta.NotAcceptable as exc:
            code, obj, headers = 406, _status(406, str(exc), "NotAcceptable"), None
    if getattr(h, "validate", True):
        schema.check_reply(code, obj, f"{h.command} {h.path}")
    data = json.dumps(obj).encode()
    h.send_response(code)
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)
    _count(h, data)


def _count(h: BaseHTTPRequestHandler, data: bytes) -> None:
    record = getattr(h, "record", None)
    if record is not None:
        record.sent += len(data)
