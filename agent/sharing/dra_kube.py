"""The agent's sharing DeviceClasses in the cluster: read and create (an agent never updates or
deletes one: its name fixes its spec, `agent.sharing.dra`).

What `share show` and the node's inventory read comes from one watch of the classes the agents
manage (``cache``, shared through the edge's informers): a steady node sends nothing, where a
list every refresh made every DRA node of a fleet list them every few seconds. Each class is
written once, when the first node wants it, so the watch carries one event per class, not one
per node. A change GETs the classes it wants (what is in the cluster now, whatever the watch
says), creates the absent ones following `agent.sharing.dra.reconcile`, and puts what it created
into that cache at once, so a show right after it sees the change. A 409 on a create (another
node created the class in between) is answered by reading it again and deciding again: the same
spec is done.
"""

from __future__ import annotations

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

    def current(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """The classes of ``names`` the API server holds now (one GET each, whatever the fleet's
        size)."""
        return [found for name in names if (found := self.get(name)) is not None]

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            found = self._kube.request("GET", f"{PATH}/{name}")
        except NotFound:
            return None
        return found if isinstance(found, dict) else None

    def apply(self, changes: Sequence[Change], desired: Sequence[SharedClass]) -> list[Change]:
        """Make each change; on a 409 (created by another node in between), read that class
        again and decide again: the same spec is done. Returns the changes as made."""
        wanted = {s.name: s for s in desired}
        done: list[Change] = []
        for change in changes:
            try:
                try:
                    done.append(self._write(change))
                except Conflict:
                    fresh = reconcile_one(change.name, wanted[change.name], self.get(change.name))
                    done.append(self._write(fresh))
            except AgentError as exc:
                made = [c for c in done if c.action != "unchanged"]
                if not made:
                    raise
                raise _part_way(exc, made) from exc
        return done

    def _write(self, change: Change) -> Change:
        if change.action != "create":
            return change
        body = self._kube.request("POST", PATH, body=dict(change.body))
        made = Change("create", change.name, body if isinstance(body, dict) else change.body)
        if self._cache is not None:
            self._cache.assume(made.body)
        return made


def _owned(items: Sequence[Any]) -> list[dict[str, Any]]:
    found = [item for item in items if isinstance(item, dict) and owned(item)]
    return sorted(found, key=lambda obj: str(obj["metadata"].get("name", "")))


def _part_way(exc: AgentError, made: Sequence[Change]) -> AgentError:
    """``exc`` (same class and details, so the exit code still says why) saying which classes
    this change had already written: the cluster holds part of it, and the spec is not
    recorded until a run of the command gets through."""
    what = ", ".join(f"created DeviceClass {c.name}" for c in made)
    said = copy.copy(exc)
    said.args = (
        f"{exc}; this change had already {what}: the spec was not recorded; run the same "
        "share command again to finish it, or share clear",
    )
    return said
