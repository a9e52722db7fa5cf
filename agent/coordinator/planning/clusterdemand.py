"""MIG demand taken from the cluster: what Pending pods ask for, plus what running pods hold.

Under the device plugin's mixed strategy each MIG profile is its own extended resource,
``nvidia.com/mig-<profile>`` with ``+`` written as ``.`` (``nvidia.com/mig-1g.10gb.me`` is
``1g.10gb+me``, reference/mig.md §7.9). Time-slicing advertises the same names with N replicas
per device, or ``<name>.shared`` when renamed: a request then counts replicas, and the devices
needed are the replicas over N, rounded up. Whole GPUs (``nvidia.com/gpu``) are not MIG demand.

Per pod: its ``spec.priority`` (what its PriorityClass resolved to) is the entry's priority, and
its ``nodeSelector`` the entry's pool. A pod's request is Kubernetes' effective request: the sum
over its containers, or the largest init container's when larger. Pods Pending and Running
count (a running pod's devices stay wanted while it runs); finished ones do not.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import ceil

from agent.coordinator.planning.claimdemand import (
    ClaimDemand,
    PendingRequest,
    list_capped,
    pool_of,
)
from agent.coordinator.planning.demand import Demand, DemandEntry
from agent.errors import InvalidSpec
from agent.gpu.profiles import parse_profile
from agent.kube import InClusterKubeClient, dig
from agent.safeyaml import ascii_int

__all__ = [
    "ClusterDemand",
    "cluster_client",
    "demand_from_pods",
    "list_pods",
    "mig_profile",
    "sharing_replicas",
    "with_claims",
]

MIG_PREFIX = "nvidia.com/mig-"
#: Pods read at most: far above a cluster's GPU pods, a bound on what one answer may cost.
MAX_PODS = 200_000
_RESOURCE = re.compile(r"^(\d+g\.\d+gb)((?:\.me(?:\.all)?)|\.gfx)?(-me)?(\.shared)?$", re.ASCII)


@dataclass(frozen=True, slots=True)
class ClusterDemand:
    demand: Demand
    #: pods waiting for MIG devices, and pods holding them.
    pending: int
    running: int
    #: what was left out, and why (whole-GPU requests, names that are no profile, ...).
    notes: tuple[str, ...] = ()
    #: who waits for which devices (pending pods and pending ResourceClaims), for the report
    #: of demand that only fragmentation keeps from fitting.
    waiting: tuple[PendingRequest, ...] = ()


def cluster_client() -> InClusterKubeClient:
    """In a pod its service account, elsewhere the kubeconfig, as kubectl finds it (as every
    fleet command that talks to the API)."""
    return InClusterKubeClient.from_environment()


def list_pods(client: InClusterKubeClient) -> list[object]:
    """Every pod not finished, page by page (RBAC: pods list, cluster-wide)."""
    running = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
    return list_capped(client, "/api/v1/pods", MAX_PODS, "pods", running)


def mig_profile(resource: str) -> tuple[str, bool] | None:
    """``nvidia.com/mig-1g.10gb.me.shared`` -> (``1g.10gb+me``, shared); None if not MIG."""
    if not resource.startswith(MIG_PREFIX):
        return None
    found = _RESOURCE.match(resource.removeprefix(MIG_PREFIX))
    if found is None:
        return None
    base, attr, no_me, shared = found.groups()
    name = base + ("+" + attr[1:] if attr else "") + (no_me or "")
    try:
        return str(parse_profile(name)), bool(shared)
    except InvalidSpec:
        return None


def sharing_replicas(sharing: Iterable[str]) -> dict[str, int]:
    """Resource -> replicas per device, from nodes' sharing (``time-slicing nvidia.com/mig-1g.10gb
    x4``, as `fleet status` shows it); the smallest count where nodes differ (more devices)."""
    out: dict[str, int] = {}
    for text in sharing:
        strategy, _, rest = text.partition(" ")
        if strategy != "time-slicing":
            continue
        for part in rest.split(","):
            name, _, text = part.strip().rpartition(" x")
            count = ascii_int(text)
            if name and count:
                out[name] = min(out.get(name, count), count)
    return out


def demand_from_pods(
    items: Iterable[object], replicas: Mapping[str, int] | None = None
) -> ClusterDemand:
    """The demand the pods make (pure; see the module doc)."""
    per_replica = replicas or {}
    wanted: Counter[tuple[str, int, str | None, str]] = Counter()
    waiting: list[PendingRequest] = []
    pending = running = whole = 0
    bad: Counter[str] = Counter()
    for item in items:
        phase = dig(item, "status", "phase")
        if phase not in ("Pending", "Running"):
            continue
        asked = _requests(item)
        mig = {}
        for resource, n in asked.items():
            found = mig_profile(resource)
            if found is not None:
                mig[resource] = (found[0], n)
            elif resource.startswith(MIG_PREFIX):
                bad[resource] += 1
            elif resource in ("nvidia.com/gpu", "nvidia.com/gpu.shared"):
                whole += 1
        if not mig:
            continue
        if phase == "Pending" and not dig(item, "spec", "nodeName"):
            pending += 1
        else:
            running += 1
        priority = dig(item, "spec", "priority")
        level = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
        pool = pool_of(dig(item, "spec", "nodeSelector"))
        for resource, (profile, n) in mig.items():
            base = resource.removesuffix(".shared")
            wanted[(profile, level, pool, base)] += n
            if phase == "Pending" and not dig(item, "spec", "nodeName"):
                who = f"{dig(item, 'metadata', 'namespace')}/{dig(item, 'metadata', 'name')}"
                devices = ceil(n / per_replica.get(base, 1))
                waiting.append(PendingRequest(who, profile, devices, level, pool))
    entries: Counter[tuple[str, int, str | None]] = Counter()
    for (profile, level, pool, resource), n in wanted.items():
        entries[(profile, level, pool)] += ceil(n / per_replica.get(resource, 1))
    notes = []
    if whole:
        notes.append(f"{whole} pod(s) ask for whole GPUs (nvidia.com/gpu): not MIG demand")
    notes += [f"{n} pod(s) ask for {r}, which names no MIG profile" for r, n in sorted(bad.items())]
    shared = sorted({r for (_, _, _, r) in wanted if r in per_replica})
    notes += [
        f"{r} is time-sliced x{per_replica[r]}: replicas counted as devices / {per_replica[r]}"
        for r in shared
    ]
    demand = Demand(
        tuple(
            DemandEntry(profile, n, None, level, pool)
            for (profile, level, pool), n in sorted(
                entries.items(), key=lambda kv: (-kv[0][1], kv[0][0], kv[0][2] or "")
            )
        )
    )
    return ClusterDemand(demand, pending, running, tuple(notes), tuple(waiting))


def with_claims(found: ClusterDemand, claims: ClaimDemand) -> ClusterDemand:
    """The pods' extended-resource demand plus their ResourceClaims' (one demand, by entry)."""
    entries: Counter[tuple[str, int, str | None]] = Counter()
    for e in found.demand.entries:
        entries[(e.profile, e.priority, e.pool)] += e.count
    entries.update(claims.wanted)
    demand = Demand(
        tuple(
            DemandEntry(profile, n, None, level, pool)
            for (profile, level, pool), n in sorted(
                entries.items(), key=lambda kv: (-kv[0][1], kv[0][0], kv[0][2] or "")
            )
        )
    )
    counted = (
        f"{claims.pending_claims} ResourceClaim(s) pending, {claims.allocated_claims} allocated "
        "with MIG devices"
    )
    return ClusterDemand(
        demand,
        found.pending,
        found.running,
        (*found.notes, counted, *claims.notes),
        (*found.waiting, *claims.pending),
    )


def _requests(pod: object) -> Counter[str]:
    """Kubernetes' effective request per resource: containers summed, or the largest init's."""
    total: Counter[str] = Counter()
    for c in _list(dig(pod, "spec", "containers")):
        total.update(_container(c))
    for c in _list(dig(pod, "spec", "initContainers")):
        for name, n in _container(c).items():
            total[name] = max(total[name], n)
    return total


def _container(container: object) -> Counter[str]:
    out: Counter[str] = Counter()
    # Extended resources: limits and requests must be equal; a limit alone sets the request.
    limits = dig(container, "resources", "limits")
    requests = dig(container, "resources", "requests")
    for source in (limits, requests):
        if not isinstance(source, dict):
            continue
        for name, raw in source.items():
            n = _quantity(raw)
            if n is not None and name.startswith("nvidia.com/"):
                out[name] = max(out[name], n)
    return out


def _quantity(raw: object) -> int | None:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw if 0 <= raw <= 10_000 else None
    if isinstance(raw, str):
        return ascii_int(raw.strip(), 5)
    return None


def _list(obj: object) -> list[object]:
    return obj if isinstance(obj, list) else []
