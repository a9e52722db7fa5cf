"""The two Kubernetes reads discovery needs: agent pods, and node labels.

Reuses the sharing service's in-cluster client (service-account token, cluster CA, error
mapping) rather than a second HTTP client; only the list calls are added here. RBAC:
``pods list`` in the agents' namespace, ``nodes list`` (coordinator-rbac.yaml grants both).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from agent.kube import InClusterKubeClient

__all__ = ["AgentPod", "KubeLister"]


@dataclass(frozen=True, slots=True)
class AgentPod:
    name: str
    node: str
    ip: str | None
    phase: str
    ready: bool
    grpc_port: int | None


def _get(obj: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _items(listing: object) -> list[object]:
    items = _get(listing, "items")
    return items if isinstance(items, list) else []


class KubeLister(InClusterKubeClient):
    """Lists agent pods and node labels; blocking, so callers run it in a thread."""

    @classmethod
    def in_cluster(cls) -> KubeLister:
        """The pod's own service account; NotSupported outside a pod."""
        client = cls.from_service_account()
        assert isinstance(client, KubeLister)  # the base classmethod builds ``cls``
        return client

    def agent_pods(self, namespace: str, label_selector: str) -> tuple[AgentPod, ...]:
        path = f"/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods"
        listing = self.get(path, {"labelSelector": label_selector})
        return tuple(_pod(item) for item in _items(listing))

    def node_labels_all(self) -> Mapping[str, Mapping[str, str]]:
        out: dict[str, Mapping[str, str]] = {}
        for item in _items(self.get("/api/v1/nodes")):
            name = _get(item, "metadata", "name")
            labels = _get(item, "metadata", "labels")
            if isinstance(name, str):
                out[name] = (
                    {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
                )
        return out


def _pod(item: object) -> AgentPod:
    conditions = _get(item, "status", "conditions")
    ready = any(
        _get(c, "type") == "Ready" and _get(c, "status") == "True"
        for c in (conditions if isinstance(conditions, list) else [])
    )
    port = None
    containers = _get(item, "spec", "containers")
    for container in containers if isinstance(containers, list) else []:
        ports = _get(container, "ports")
        for p in ports if isinstance(ports, list) else []:
            number = _get(p, "containerPort")
            if _get(p, "name") == "grpc" and isinstance(number, int):
                port = number
    ip = _get(item, "status", "podIP")
    return AgentPod(
        name=str(_get(item, "metadata", "name") or ""),
        node=str(_get(item, "spec", "nodeName") or ""),
        ip=ip if isinstance(ip, str) and ip else None,
        phase=str(_get(item, "status", "phase") or "Unknown"),
        ready=ready,
        grpc_port=port,
    )
