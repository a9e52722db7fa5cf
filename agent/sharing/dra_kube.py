"""The agent's sharing DeviceClasses in the cluster: list, create, update, delete.

Writes follow `agent.sharing.dra.reconcile`: an update carries the resourceVersion it read, and a
409 (someone wrote the class in between) is answered by reading it again, deciding again and
retrying once; a second 409 is the caller's Conflict.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from agent.errors import Conflict, NotFound
from agent.kube import Requests
from agent.sharing.dra import AGENT, MANAGED_BY, Change, SharedClass, owned, reconcile_one

PATH = "/apis/resource.k8s.io/v1/deviceclasses"


@runtime_checkable
class DraKube(Requests, Protocol):
    """The calls this module makes (agent.kube.InClusterKubeClient has them)."""

    def list_all(
        self, path: str, query: Mapping[str, str] | None = None, page_size: int = ...
    ) -> tuple[list[Any], str]: ...


class DeviceClasses:
    def __init__(self, kube: DraKube) -> None:
        self._kube = kube

    def owned(self) -> list[dict[str, Any]]:
        """The DeviceClasses the agent manages (any node's), in name order."""
        items, _ = self._kube.list_all(PATH, {"labelSelector": f"{MANAGED_BY}={AGENT}"})
        found = [item for item in items if isinstance(item, dict) and owned(item)]
        return sorted(found, key=lambda obj: str(obj["metadata"].get("name", "")))

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            found = self._kube.request("GET", f"{PATH}/{name}")
        except NotFound:
            return None
        return found if isinstance(found, dict) else None

    def apply(
        self, changes: Sequence[Change], desired: Sequence[SharedClass], node: str
    ) -> list[Change]:
        """Make each change; on a 409, read that class again, decide again, retry once.
        Returns the changes as made."""
        wanted = {s.name: s for s in desired}
        done = []
        for change in changes:
            try:
                done.append(self._write(change))
            except Conflict:
                fresh = reconcile_one(
                    change.name, wanted.get(change.name), self.get(change.name), node
                )
                done.append(self._write(fresh))
        return done

    def _write(self, change: Change) -> Change:
        if change.action == "create":
            body = self._kube.request("POST", PATH, body=dict(change.body))
        elif change.action == "update":
            body = self._kube.request("PUT", f"{PATH}/{change.name}", body=dict(change.body))
        elif change.action == "delete":
            version = str(change.body.get("metadata", {}).get("resourceVersion") or "")
            precondition = (
                {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "preconditions": {"resourceVersion": version},
                }
                if version
                else None
            )
            with contextlib.suppress(NotFound):  # already gone: what delete wanted
                self._kube.request("DELETE", f"{PATH}/{change.name}", body=precondition)
            return change
        else:
            return change
        return Change(change.action, change.name, body if isinstance(body, dict) else change.body)
