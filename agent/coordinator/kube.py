"""The coordinator's Kubernetes calls: agent pods, node labels, and its Lease.

Reuses the agent's client (service-account token or kubeconfig, CA, error mapping) rather than
a second HTTP client; only the coordinator's calls are added here. Lists are paged
(``limit``/``continue``, as client-go's pager) so a large cluster is never one huge response.
Nodes are listed and watched as metadata only (``metadata_only``: PartialObjectMetadata, as
client-go's metadata informer): the coordinator reads their labels, and a full Node (its
status, images) is 10-20 KB, sent again on every status change, at 5,000 nodes.
RBAC: ``pods list`` in the agents' namespace, ``nodes list``, ``leases get/create/update`` in
its own namespace (coordinator-rbac.yaml).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.kube import PAGE_SIZE, InClusterKubeClient, dig
from agent.kube_watch import Informer
from agent.safeyaml import brief

__all__ = ["AgentPod", "KubeLister", "agent_pod", "labels_by_node"]


@dataclass(frozen=True, slots=True)
class AgentPod:
    name: str
    node: str
    ip: str | None
    phase: str
    ready: bool
    grpc_port: int | None
    #: deleted, stopping (metadata.deletionTimestamp): its agent is on its way out
    terminating: bool = False
    #: a field it cannot be dialled by (named), e.g. a grpc containerPort that is not a port
    invalid: str | None = None


class KubeLister(InClusterKubeClient):
    """Lists agent pods and node labels; blocking, so callers run it in a thread."""

    #: items per list page
    page_size = PAGE_SIZE

    @classmethod
    def in_cluster(cls) -> KubeLister:
        """The pod's own service account, else the kubeconfig; NotSupported without either."""
        client = cls.from_environment()
        assert isinstance(client, KubeLister)  # the base classmethod builds ``cls``
        return client

    def agent_pods(self, namespace: str, label_selector: str) -> tuple[AgentPod, ...]:
        query = {"labelSelector": label_selector}
        items, _ = self.list_all(_pods_path(namespace), query, self.page_size)
        return tuple(agent_pod(item) for item in items)

    def pod_informer(self, namespace: str, label_selector: str) -> Informer:
        """The agent pods, kept by list+watch (for `coordinator serve`)."""
        query = {"labelSelector": label_selector}
        return Informer(self, _pods_path(namespace), query, page_size=self.page_size)

    def node_informer(self) -> Informer:
        """Every Node's metadata (their labels), kept by list+watch."""
        return Informer(self, "/api/v1/nodes", page_size=self.page_size, metadata_only=True)

    # -- the Lease (agent.coordinator.control.lease.LeaseApi) --------------------------------------

    def _leases(self, namespace: str) -> str:
        ns = urllib.parse.quote(namespace, safe="")
        return f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"

    def get_lease(self, namespace: str, name: str) -> Mapping[str, Any]:
        obj = self.get(f"{self._leases(namespace)}/{urllib.parse.quote(name, safe='')}")
        return obj if isinstance(obj, dict) else {}

    def create_lease(self, namespace: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        out = self.request("POST", self._leases(namespace), body=obj)
        return out if isinstance(out, dict) else {}

    def update_lease(self, namespace: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        name = urllib.parse.quote(str(obj["metadata"]["name"]), safe="")
        out = self.request("PUT", f"{self._leases(namespace)}/{name}", body=obj)
        return out if isinstance(out, dict) else {}

    # -- drain (agent.coordinator.rollout.drain.DrainApi) ------------------------------------------

    def cordon(self, node: str) -> bool:
        """Mark the Node unschedulable; True when it already was (then leave it so after)."""
        path = f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
        spec = dig(self.get(path), "spec")
        if dig(spec, "unschedulable") is True:
            return True
        self._unschedulable(node, True)
        return False

    def uncordon(self, node: str) -> None:
        self._unschedulable(node, False)

    def _unschedulable(self, node: str, value: bool) -> None:
        self.request(
            "PATCH",
            f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}",
            body={"spec": {"unschedulable": value}},
            content_type="application/merge-patch+json",
        )

    def evict(self, namespace: str, pod: str) -> None:
        """POST an Eviction (policy/v1): the API server honours PodDisruptionBudgets and
        answers 429 (Busy) while one forbids it; NotFound when the pod is gone."""
        ns, name = urllib.parse.quote(namespace, safe=""), urllib.parse.quote(pod, safe="")
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        self.request("POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction", body=body)

    def node_labels_all(self) -> Mapping[str, Mapping[str, str]]:
        nodes, _ = self.list_all("/api/v1/nodes", page_size=self.page_size, metadata_only=True)
        return labels_by_node(nodes)


def _pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods"


def labels_by_node(items: list[object]) -> Mapping[str, Mapping[str, str]]:
    out: dict[str, Mapping[str, str]] = {}
    for item in items:
        name = dig(item, "metadata", "name")
        labels = dig(item, "metadata", "labels")
        if isinstance(name, str):
            out[name] = (
                {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
            )
    return out


def agent_pod(item: object) -> AgentPod:
    conditions = dig(item, "status", "conditions")
    ready = any(
        dig(c, "type") == "Ready" and dig(c, "status") == "True"
        for c in (conditions if isinstance(conditions, list) else [])
    )
    port, invalid = _grpc_port(item)
    ip = dig(item, "status", "podIP")
    return AgentPod(
        name=str(dig(item, "metadata", "name") or ""),
        node=str(dig(item, "spec", "nodeName") or ""),
        ip=ip if isinstance(ip, str) and ip else None,
        phase=str(dig(item, "status", "phase") or "Unknown"),
        ready=ready,
        grpc_port=port,
        terminating=dig(item, "metadata", "deletionTimestamp") is not None,
        invalid=invalid,
    )


def _grpc_port(item: object) -> tuple[int | None, str | None]:
    """(the containerPort of the port named grpc or None, why that field is invalid or None).
    A value that is no TCP port (0, 70000, a string; bool is an int in Python) is the field
    invalid, never a port dialled, nor the default taken in its place."""
    port, invalid = None, None
    containers = dig(item, "spec", "containers")
    for i, container in enumerate(containers if isinstance(containers, list) else []):
        ports = dig(container, "ports")
        for j, p in enumerate(ports if isinstance(ports, list) else []):
            if dig(p, "name") != "grpc":
                continue
            number = dig(p, "containerPort")
            if type(number) is int and 0 < number < 65536:
                port, invalid = number, None
            else:
                field = f"spec.containers[{i}].ports[{j}].containerPort"
                port, invalid = None, f"{field} {brief(number)} is not a port (1 to 65535)"
    return port, invalid
