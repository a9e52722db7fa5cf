"""Which version of each API the agent uses, chosen from what the API server serves.

Kubernetes moves APIs between versions (DRA: ``resource.k8s.io`` v1beta1 -> v1beta2 -> v1 in
1.34; DeviceTaintRule: v1alpha3 in 1.33-1.35, v1beta2 from 1.36), and a server stops serving
the old one a few releases later. A hard-coded version either 404s on a newer cluster or is
missing on an older one; both look like "the feature does nothing". So each resource names the
versions the agent can read and write, best first (`WANTED`), and `ApiVersions` asks discovery
(``/apis/<group>``, then ``/apis/<group>/<version>`` for the resource list) once per group
version, caching the answer for the life of the process: a version a server serves does not
go away under a running agent (an upgrade restarts the agent's pod with the node's drain or
not at all, and the doctor re-checks hourly). A resource served at no wanted version is
reported once in the log and by `ApiVersions.unserved`, and asked again only every
``UNSERVED_RECHECK_S`` (a cluster upgraded, or a feature gate turned on, under running agents:
found within the hour, two requests per node per hour until then).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent import safeyaml
from agent.errors import NotFound

log = logging.getLogger(__name__)

__all__ = ["WANTED", "ApiVersions", "Resource"]

#: Served versions named in the "not served" warning; a server serving more is said by count.
SHOWN_VERSIONS = 6
#: Characters of those names (a version name is the server's: not bounded by it).
SHOWN_CHARS = 120
#: How long "not served" is believed before discovery is asked again.
UNSERVED_RECHECK_S = 3600.0


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    #: plural, as in the URL
    name: str
    #: the versions the agent reads and writes this resource at, best first
    versions: tuple[str, ...]
    #: what the agent does with it (said when it is not served)
    purpose: str


#: The resources whose version the agent picks by discovery. ResourceSlices of v1beta1 have
#: another shape (``devices[].basic``): not read. Core v1 (Nodes, Events, Pods) is always
#: served; coordination.k8s.io/v1 Leases since 1.14.
WANTED = {
    "resourceslices": Resource(
        "resource.k8s.io",
        "resourceslices",
        ("v1", "v1beta2"),
        "the allocation mode and DRA claim attribution",
    ),
    "devicetaintrules": Resource(
        "resource.k8s.io",
        "devicetaintrules",
        ("v1beta2", "v1alpha3"),
        "DRA device taints of failed GPUs",
    ),
    "leases": Resource("coordination.k8s.io", "leases", ("v1",), "the coordinator's lease"),
    "events": Resource("events.k8s.io", "events", ("v1",), "Events (core v1 Events otherwise)"),
}


class Getter(Protocol):
    def get(self, path: str, query: Mapping[str, str] | None = None) -> object: ...


class ApiVersions:
    """``path(resource)``: the collection URL at the best served version, or None (reported
    once). Thread-safe; at most one discovery request per group and per group version."""

    def __init__(
        self,
        client: Getter,
        wanted: Mapping[str, Resource] = WANTED,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._wanted = wanted
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, tuple[str, ...]] = {}
        self._resources: dict[str, frozenset[str]] = {}
        self._chosen: dict[str, str | None] = {}
        #: resource -> when its "not served" answer is asked again
        self._recheck_at: dict[str, float] = {}
        #: resource -> why it is not used (said once)
        self.unserved: dict[str, str] = {}

    def version(self, resource: str) -> str | None:
        """The version the agent uses for ``resource``; None when the server serves none of
        ``WANTED[resource].versions``. A failed discovery raises AgentError and is asked again
        next time (the server was away: that is not "not served")."""
        with self._lock:
            want = self._wanted[resource]
            if resource in self._chosen:
                if resource not in self.unserved or self._clock() < self._recheck_at[resource]:
                    return self._chosen[resource]
                self._forget(want.group)
            served = self._served_versions(want.group)
            chosen = None
            for version in want.versions:
                if version in served and want.name in self._resource_names(want.group, version):
                    chosen = version
                    break
            self._chosen[resource] = chosen
            if chosen is None:
                self._recheck_at[resource] = self._clock() + UNSERVED_RECHECK_S
                if resource not in self.unserved:
                    why = (
                        f"{want.group} serves {_versions(served)}, none of "
                        f"{'/'.join(want.versions)} with {want.name}: no {want.purpose}"
                    )
                    self.unserved[resource] = why
                    log.warning("Kubernetes API: %s (asked again hourly)", why)
            else:
                self.unserved.pop(resource, None)
                log.info("Kubernetes API: %s at %s/%s", want.name, want.group, chosen)
            return chosen

    def forget(self, resource: str) -> None:
        """The server answered 404 at the path chosen for ``resource`` (an API turned off under
        a running agent): its discovery answers are asked again at the next call."""
        with self._lock:
            self._chosen.pop(resource, None)
            self._forget(self._wanted[resource].group)

    def _forget(self, group: str) -> None:
        """Drop the discovery answers of ``group``: asked again at the next call."""
        self._groups.pop(group, None)
        for key in [k for k in self._resources if k.startswith(f"{group}/")]:
            del self._resources[key]

    def path(self, resource: str) -> str | None:
        """``/apis/<group>/<version>/<resource>`` at the chosen version, or None."""
        version = self.version(resource)
        if version is None:
            return None
        want = self._wanted[resource]
        return f"/apis/{want.group}/{version}/{want.name}"

    def api_version(self, resource: str) -> str | None:
        """``<group>/<version>``, an object's ``apiVersion``, or None."""
        version = self.version(resource)
        return None if version is None else f"{self._wanted[resource].group}/{version}"

    def _served_versions(self, group: str) -> tuple[str, ...]:
        if group not in self._groups:
            self._groups[group] = tuple(
                str(v.get("version"))
                for v in self._listed(f"/apis/{group}", "versions")
                if v.get("version")
            )
        return self._groups[group]

    def _resource_names(self, group: str, version: str) -> frozenset[str]:
        key = f"{group}/{version}"
        if key not in self._resources:
            self._resources[key] = frozenset(
                str(r.get("name"))
                for r in self._listed(f"/apis/{key}", "resources")
                if "/" not in str(r.get("name"))
            )
        return self._resources[key]

    def _listed(self, path: str, key: str) -> list[dict[str, Any]]:
        """The objects a discovery document lists under ``key``; none where it is not served."""
        try:
            found = self._client.get(path)
        except NotFound:
            return []
        listed = found.get(key) if isinstance(found, dict) else None
        return [e for e in listed if isinstance(e, dict)] if isinstance(listed, list) else []


def _versions(served: tuple[str, ...]) -> str:
    """The served versions for a log line and `ApiVersions.unserved`: the first few, cut, and
    how many in all when there are more (a server may list any number, of any length)."""
    if not served:
        return "no version"
    shown = safeyaml.capped("/".join(served[:SHOWN_VERSIONS]), SHOWN_CHARS)
    if len(served) > SHOWN_VERSIONS:
        shown += f" (and {len(served) - SHOWN_VERSIONS} more, {len(served)} versions)"
    return shown
