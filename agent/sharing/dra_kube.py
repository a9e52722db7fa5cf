"""The agent's sharing DeviceClasses in the cluster: list, create, update, delete.

Writes follow `agent.sharing.dra.reconcile`: an update carries the resourceVersion it read, and a
409 (someone wrote the class in between) is answered by reading it again, deciding again and
retrying once; a second 409 is the caller's Conflict.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from agent.errors import AgentError, Conflict, NotFound
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
        done: list[Change] = []
        for change in changes:
            try:
                try:
                    done.append(self._write(change))
                except Conflict:
                    fresh = reconcile_one(
                        change.name, wanted.get(change.name), self.get(change.name), node
                    )
                    done.append(self._write(fresh))
            except AgentError as exc:
                made = [c for c in done if c.action != "unchanged"]
                if not made:
                    raise
                raise _part_way(exc, made) from exc
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


_DONE = {"create": "created", "update": "updated", "delete": "deleted"}


def _part_way(exc: AgentError, made: Sequence[Change]) -> AgentError:
    """``exc`` (same class and details, so the exit code still says why) saying which classes
    this change had already written: the cluster holds part of it, and the spec is not
    recorded until a run of the command gets through."""
    what = ", ".join(f"{_DONE[c.action]} DeviceClass {c.name}" for c in made)
    said = copy.copy(exc)
    said.args = (
        f"{exc}; this change had already {what}: the spec was not recorded; run the same "
        "share command again to finish it, or share clear",
    )
    return said
