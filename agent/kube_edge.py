"""The agent's edge to Kubernetes, built once: shared informers, API versions, the Node's owner.

In steady state an agent holds two watches (its Node, its ResourceSlices; on a DRA node whose
sharing is read, the agents' DeviceClasses too) and makes no other
request: every feature reads those caches (`KubeEdge.node_informer`, `KubeEdge.slices`),
writes its Node through the one `NodeOwner`, and learns the API versions once from discovery
(agent/kube_discovery.py). `OwnedNodeLabels` gives the features written against the narrow
`KubeClient` protocol (the MIG label protocol, the sharing reload, the DRA republisher) the
same: labels from the watch, label writes through the owner, pod deletes passed on.
``gpu_agent_kube_cache_current{resource}`` says which cache is stale.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.errors import AgentError
from agent.kube import PAGE_SIZE, InClusterKubeClient
from agent.kube_discovery import WANTED, ApiVersions
from agent.kube_node import NodeOwner
from agent.kube_watch import Informer, InformerFactory

__all__ = ["KubeEdge", "KubeEdgeCollector", "OwnedNodeLabels"]


@dataclass
class KubeEdge:
    client: InClusterKubeClient
    node: str
    informers: InformerFactory
    apis: ApiVersions
    owner: NodeOwner
    #: what each writer beside the Node's owner has refused now ("" when nothing), said in
    #: `health` while it lasts (DeviceTaintRules, Events: agent/health/publish.py)
    refusals: list[Callable[[], str]] = field(default_factory=list, init=False, repr=False)
    _slices: Informer | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def build(cls, client: InClusterKubeClient, node: str) -> KubeEdge:
        informers = InformerFactory(client)
        owner = NodeOwner(client, node, informers.node(node))
        return cls(client, node, informers, ApiVersions(client), owner)

    def node_informer(self) -> Informer:
        return self.informers.node(self.node)

    def slices(self) -> Informer:
        """This node's ResourceSlices (every driver), one informer for every reader, at the
        version discovery chose (v1 where it serves none the agent reads). Discovery is asked
        by the informer's thread before it lists, never here: this is called while the agent
        is built, and a hung API server (a 10 s timeout per request) must not hold its start;
        while discovery fails (the API server away) it is asked again before each list, so the
        informer converges on the served version without a restart. On a cluster that serves
        no ResourceSlices (no DRA API) nothing is listed: the cache is empty, and discovery
        is asked again hourly (agent/kube_discovery.py)."""
        with self._lock:
            if self._slices is None:
                want = WANTED["resourceslices"]
                best = f"/apis/{want.group}/{want.versions[0]}/{want.name}"
                query = {"fieldSelector": f"spec.nodeName={self.node}"}
                self._slices = self.informers.informer(best, query)
                self._slices.resolve_path(
                    lambda: self.apis.path("resourceslices"),
                    forget=lambda: self.apis.forget("resourceslices"),
                )
            return self._slices

    def health(self) -> tuple[bool, str]:
        """(healthy, detail): GetNode's "kubernetes" component. Unhealthy while a watched
        cache is stale (the API server away, refusing, throttling), the Node's last write
        failed, or another write is refused for now, naming each with why; GPU work goes on
        either way."""
        problems = self.informers.stale()
        if self.owner.error:
            problems.append(f"Node {self.node} not written yet: {self.owner.error}")
        problems += [said for refused in self.refusals if (said := refused())]
        if problems:
            return False, "; ".join(problems)
        watching = [i for i in self.informers.informers() if not i.unserved]
        said = f"{len(watching)} watch(es) current, the Node written"
        for why in self.apis.unserved.values():  # not served is not degraded: said, healthy
            said += f"; not served: {why}"
        return True, said

    def current(self) -> bool:
        """Whether every watch started is current (the informers' state: no request)."""
        return bool(self.informers.informers()) and not self.informers.stale()

    def labels_client(self) -> OwnedNodeLabels:
        return OwnedNodeLabels(self.client, self.owner)

    def start(self) -> None:
        self.owner.start()

    def stop(self) -> None:
        self.owner.stop()
        self.informers.stop()


class OwnedNodeLabels:
    """The `KubeClient` protocol over the edge: the own Node's labels from its watch (no GET),
    label writes through the owner (diffed: a label already as asked is not written)."""

    def __init__(self, client: InClusterKubeClient, owner: NodeOwner) -> None:
        self._client = client
        self._owner = owner

    def node_labels(self, node: str) -> Mapping[str, str]:
        self._own(node)
        return self._owner.labels()

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        self._own(node)
        self._owner.write_now(labels)

    def delete_pods(
        self, namespace: str, label_selector: str, node_name: str, *, dry_run: bool = False
    ) -> tuple[str, ...]:
        return self._client.delete_pods(namespace, label_selector, node_name, dry_run=dry_run)

    # Other objects than the Node (DeviceClasses a sharing change writes) pass straight on.
    def list_all(
        self, path: str, query: Mapping[str, str] | None = None, page_size: int = PAGE_SIZE
    ) -> tuple[list[Any], str]:
        return self._client.list_all(path, query, page_size)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> Any:
        if path.startswith(f"/api/v1/nodes/{self._owner.node}"):
            raise AgentError("the agent's Node is written by its owner (agent/kube_node.py)")
        return self._client.request(method, path, query=query, body=body, content_type=content_type)

    def _own(self, node: str) -> None:
        if node != self._owner.node:
            raise AgentError(f"the agent writes only its own Node {self._owner.node}, not {node}")


class KubeEdgeCollector(Collector):
    """``gpu_agent_kube_cache_current{resource}``: 1 while a watched cache is current, 0 while
    it is the last answer kept (the API server away or refusing); none for a cache never
    started (`InformerFactory.informers`)."""

    def __init__(self, edge: KubeEdge) -> None:
        self._edge = edge

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "gpu_agent_kube_cache_current",
            "1 while the agent's watch of this Kubernetes resource is current, 0 while its "
            "cache is the last answer kept.",
            labels=["resource"],
        )
        for informer in self._edge.informers.informers():
            current, _ = informer.status()
            gauge.add_metric([informer.path.rsplit("/", 1)[-1]], 1.0 if current else 0.0)
        yield gauge
