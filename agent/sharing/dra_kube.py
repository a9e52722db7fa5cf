"""The agent's sharing DeviceClasses in the cluster: read, create, update, delete.

What `share show` and the node's inventory read comes from one watch of the classes the agents
manage (``cache``, shared through the edge's informers): a steady node sends nothing, where a
list every refresh made every DRA node of a fleet list them every few seconds. A change lists
them afresh, since it writes against the versions it read, and puts what it wrote into that cache
at once, so a show right after it sees the change. Writes follow `agent.sharing.dra.reconcile`:
an update carries the resourceVersion it read, and a 409 (someone wrote the class in between)
is answered by reading it again, deciding again and retrying once; a second 409 is the caller's
Conflict.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from agent.errors import AgentError, Conflict, NotFound
from agent.kube import Requests
from agent.kube_watch import Informer
from agent.sharing.dra import AGENT, MANAGED_BY, Change, SharedClass, owned, reconcile_one

PATH = "/apis/resource.k8s.io/v1/deviceclasses"
#: the selector of the classes the agents manage: what the cache watches
QUERY = {"labelSelector": f"{MANAGED_BY}={AGENT}"}
#: how long a first read waits for the watch's first list
SYNC_WAIT_S = 5.0


@runtime_checkable
class DraKube(Requests, Protocol):
    """The calls this module makes (agent.kube.InClusterKubeClient has them)."""

    def list_all(
        self, path: str, query: Mapping[str, str] | None = None, page_size: int = ...
    ) -> tuple[list[Any], str]: ...


class DeviceClasses:
    def __init__(self, kube: DraKube, cache: Informer | None = None) -> None:
        """``cache``: the watch of ``PATH`` with ``QUERY`` that reads come from (started at the
        first read); without one every read lists."""
        self._kube = kube
        self._cache = cache

    def owned(self) -> list[dict[str, Any]]:
        """The DeviceClasses the agent manages (any node's), in name order, as the watch has
        them; AgentError while it is not current (not listed yet, or the API server away), as
        a list would fail then. Only the read that starts the watch waits for its list."""
        if self._cache is None:
            return self.listed()
        if not self._cache.started:
            self._cache.start().synced.wait(SYNC_WAIT_S)
        current, detail = self._cache.status()
        if not current:
            raise AgentError(f"DeviceClasses not read: {detail}")
        return _owned(self._cache.objects())

    def listed(self) -> list[dict[str, Any]]:
        """:meth:`owned`, listed from the API server now (what a change writes against)."""
        items, _ = self._kube.list_all(PATH, QUERY)
        return _owned(items)

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
        made = self._made(change)
        if self._cache is not None and change.action in ("create", "update"):
            self._cache.assume(made.body)
        elif self._cache is not None and change.action == "delete":
            self._cache.assume_deleted(change.body)
        return made

    def _made(self, change: Change) -> Change:
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


def _owned(items: Sequence[Any]) -> list[dict[str, Any]]:
    found = [item for item in items if isinstance(item, dict) and owned(item)]
    return sorted(found, key=lambda obj: str(obj["metadata"].get("name", "")))


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
