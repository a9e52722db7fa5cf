"""MIG demand from DRA ResourceClaims: what pods ask NVIDIA's DRA driver (``gpu.nvidia.com``) for.

A pod names its claims in ``spec.resourceClaims[]``: either ``resourceClaimName`` (a claim made
beforehand, maybe shared by several pods) or ``resourceClaimTemplateName`` (Kubernetes makes
one claim per pod from the template; ``status.resourceClaimStatuses[]`` then maps the pod's
claim name to the generated claim's name, and an entry without a name means none was needed).
Until the claim is generated, the template's ``spec.spec`` is the claim the pod waits for.

Claim demand is for DRA nodes with static MIG devices: its entries' pool is ``allocation=dra``
(with the pod's nodeSelector), so the planner places it there and nowhere else.

A claim with ``status.allocation`` is allocated (its devices are held: they count as running
pods' devices do); one without it, referenced by a Pending pod, is pending demand. Each claim
counts once however many pods share it.

A request maps to a MIG profile only in the form the driver documents: ``exactly`` with
``deviceClassName: mig.nvidia.com`` and one CEL selector that is a plain equality on the
profile attribute, ``device.attributes['gpu.nvidia.com'].profile == '3g.40gb'``. Everything
else is left out with its reason, never guessed: ``firstAvailable`` lists, ``allocationMode:
All``, other or compound expressions, a class without a profile selector. ``gpu.nvidia.com``
requests are whole GPUs (not MIG demand).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.errors import InvalidSpec
from agent.gpu.profiles import parse_profile
from agent.kube import InClusterKubeClient, dig, page_items

__all__ = [
    "ClaimDemand",
    "PendingRequest",
    "claim_key",
    "demand_from_claims",
    "list_capped",
    "list_claims",
    "list_templates",
    "pool_of",
    "request_profile",
]

GROUP_PATH = "/apis/resource.k8s.io/v1"
MIG_CLASS = "mig.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
#: Claims (and templates) read at most per list: far above a cluster's, a bound on one answer.
MAX_CLAIMS = 100_000
#: A selector longer than this is not one of the simple forms: left out unread.
MAX_SELECTOR = 1024
#: Kubernetes allows 32 requests per claim; more is not a claim the server accepted.
MAX_REQUESTS = 32
MAX_COUNT = 10_000
#: The pool term claim demand carries: only nodes whose mode is dra can hold planned devices.
DRA_POOL = "allocation=dra"
_PAGE = 500

_PROFILE_SELECTOR = re.compile(
    r"""^\s*device\.attributes\[\s*(['"])gpu\.nvidia\.com\1\s*\]\.profile\s*==\s*"""
    r"""(['"])([0-9a-z.+,-]{1,64})\2\s*$"""
)


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """Devices one pending claim (or pod) waits for: who, which profile, how many, and the
    waiting pod's priority and pool (its nodeSelector)."""

    who: str
    profile: str
    count: int
    priority: int = 0
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimDemand:
    #: (profile, priority, pool) -> devices, pending and allocated claims together
    wanted: Mapping[tuple[str, int, str | None], int]
    pending: tuple[PendingRequest, ...]
    #: claims counted: waiting for an allocation, and allocated
    pending_claims: int
    allocated_claims: int
    #: what was left out, and why, one line each (bounded)
    notes: tuple[str, ...] = ()


def claim_key(claim: object) -> tuple[str, str]:
    return str(dig(claim, "metadata", "namespace") or ""), str(dig(claim, "metadata", "name"))


def list_capped(
    client: InClusterKubeClient,
    path: str,
    cap: int,
    what: str,
    query: Mapping[str, str] | None = None,
) -> list[object]:
    """Every item of a cluster-wide list, page by page; refused past ``cap`` (named ``what``),
    so a planner never holds an unbounded cluster in memory."""
    items: list[object] = []
    for page in client.pages(path, query, _PAGE):
        items += page_items(page)
        if len(items) > cap:
            raise InvalidSpec(f"more than {cap} {what} in the cluster: not read")
    return items


def _list(client: InClusterKubeClient, resource: str) -> list[object]:
    return list_capped(client, f"{GROUP_PATH}/{resource}", MAX_CLAIMS, resource)


def list_claims(client: InClusterKubeClient) -> list[object]:
    """Every ResourceClaim, all namespaces, page by page (RBAC: resourceclaims list)."""
    return _list(client, "resourceclaims")


def list_templates(client: InClusterKubeClient) -> list[object]:
    """Every ResourceClaimTemplate, all namespaces (RBAC: resourceclaimtemplates list)."""
    return _list(client, "resourceclaimtemplates")


def request_profile(request: object) -> tuple[str, int] | str:
    """(profile, count) for a request of one MIG profile, else why it is not one (a reason)."""
    if not isinstance(request, dict):
        return "a request that is not an object"
    if "firstAvailable" in request:
        return "firstAvailable (a list of alternatives) is not mapped to one profile"
    exactly = request.get("exactly")
    if not isinstance(exactly, dict):
        return "a request without `exactly`"
    device_class = exactly.get("deviceClassName")
    if device_class == GPU_CLASS:
        return "whole GPU"
    if device_class != MIG_CLASS:
        return "other class"
    if exactly.get("allocationMode", "ExactCount") != "ExactCount":
        return "allocationMode All (every matching device) is not a count of one profile"
    count = exactly.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        return f"count must be an integer 1..{MAX_COUNT}"
    selectors = exactly.get("selectors")
    if not isinstance(selectors, list) or not selectors:
        return f"{MIG_CLASS} without a profile selector asks for any MIG device, not one profile"
    if len(selectors) != 1:
        return "more than one selector: only one profile equality is read"
    expression = dig(selectors[0], "cel", "expression")
    if not isinstance(expression, str):
        return "a selector without a CEL expression"
    if len(expression) > MAX_SELECTOR:
        return f"a CEL selector longer than {MAX_SELECTOR} characters is not read"
    found = _PROFILE_SELECTOR.match(expression)
    if found is None:
        shown = " ".join(expression.split())[:80]
        return (
            f"CEL selector {shown!r} is not the form "
            "device.attributes['gpu.nvidia.com'].profile == '<profile>'"
        )
    try:
        parsed = parse_profile(found.group(3))
    except InvalidSpec:
        return f"{found.group(3)!r} is not a MIG profile name"
    if parsed.ci_slices not in (None, parsed.gi_slices):
        return f"{found.group(3)} is a compute-instance profile; demand counts GPU instances"
    return str(parsed), count


@dataclass(slots=True)
class _Wanted:
    claim: object | None  # None: from a template, not generated yet
    spec: object
    who: str
    priority: int
    pool: str | None
    pending_pod: bool


def demand_from_claims(
    pods: Iterable[object], claims: Iterable[object], templates: Iterable[object] = ()
) -> ClaimDemand:
    """The MIG demand pods make through ResourceClaims (pure; see the module doc)."""
    by_key = {claim_key(c): c for c in claims if isinstance(c, dict)}
    template_of = {claim_key(t): t for t in templates if isinstance(t, dict)}
    wanted: dict[str, _Wanted] = {}
    missing: Counter[str] = Counter()
    for pod in pods:
        phase = dig(pod, "status", "phase")
        if phase not in ("Pending", "Running"):
            continue
        ns = str(dig(pod, "metadata", "namespace") or "")
        name = str(dig(pod, "metadata", "name") or "")
        pending_pod = phase == "Pending"
        priority = _priority(pod)
        pool = pool_of(dig(pod, "spec", "nodeSelector"))
        generated = _generated(pod)
        refs = dig(pod, "spec", "resourceClaims")
        for ref in refs[:MAX_REQUESTS] if isinstance(refs, list) else []:
            pod_claim = dig(ref, "name")
            direct = dig(ref, "resourceClaimName")
            template = dig(ref, "resourceClaimTemplateName")
            if isinstance(direct, str) and direct:
                claim_name = direct
            elif isinstance(template, str) and template:
                if pod_claim in generated:
                    claim_name = generated[pod_claim]
                    if not claim_name:
                        continue  # the status says no claim was needed
                else:
                    spec = dig(template_of.get((ns, template)), "spec", "spec")
                    who = f"{ns}/{name}/{pod_claim} (template {template}, not generated yet)"
                    if spec is None:
                        missing[f"template {ns}/{template}"] += 1
                    elif pending_pod:
                        wanted.setdefault(who, _Wanted(None, spec, who, priority, pool, True))
                    continue
            else:
                continue
            claim = by_key.get((ns, claim_name))
            if claim is None:
                missing[f"claim {ns}/{claim_name}"] += 1
                continue
            who = f"{ns}/{claim_name}"
            seen = wanted.get(who)
            if seen is None or (pending_pod and priority > seen.priority):
                spec = dig(claim, "spec")
                wanted[who] = _Wanted(claim, spec, who, priority, pool, pending_pod)
            elif pending_pod:
                seen.pending_pod = True
    return _count(wanted.values(), missing)


def _count(items: Iterable[_Wanted], missing: Counter[str]) -> ClaimDemand:
    totals: Counter[tuple[str, int, str | None]] = Counter()
    pending: list[PendingRequest] = []
    reasons: Counter[str] = Counter()
    whole = 0
    n_pending = n_allocated = 0
    for w in sorted(items, key=lambda w: w.who):
        allocated = w.claim is not None and dig(w.claim, "status", "allocation") is not None
        if not allocated and not w.pending_pod:
            continue  # unallocated but no pod waits on it: not demand now
        requests = dig(w.spec, "devices", "requests")
        if not isinstance(requests, list) or len(requests) > MAX_REQUESTS:
            reasons[f"{w.who}: spec.devices.requests is not a list of at most {MAX_REQUESTS}"] += 1
            continue
        mig: list[tuple[str, int]] = []
        for request in requests:
            found = request_profile(request)
            if isinstance(found, tuple):
                mig.append(found)
            elif found == "whole GPU":
                whole += 1
            elif found != "other class":
                reasons[f"{w.who} request {dig(request, 'name')!s:.63}: {found}"] += 1
        if not mig:
            continue
        if allocated:
            n_allocated += 1
        else:
            n_pending += 1
        pool = DRA_POOL if w.pool is None else f"{DRA_POOL},{w.pool}"
        for profile, n in mig:
            totals[(profile, w.priority, pool)] += n
            if not allocated:
                pending.append(PendingRequest(w.who, profile, n, w.priority, w.pool))
    notes = [f"left out: {r}" for r in sorted(reasons)]
    if whole:
        notes.append(f"{whole} claim request(s) ask for whole GPUs ({GPU_CLASS}): not MIG demand")
    notes += [f"{what} not found ({n} pod reference(s)): left out" for what, n in missing.items()]
    if len(notes) > 50:
        notes = [*notes[:50], f"... and {len(notes) - 50} more"]
    return ClaimDemand(dict(totals), tuple(pending), n_pending, n_allocated, tuple(notes))


def _generated(pod: object) -> dict[object, str]:
    """The pod's claim name -> its generated claim's name ("" when none was needed)."""
    out: dict[object, str] = {}
    statuses = dig(pod, "status", "resourceClaimStatuses")
    for entry in statuses[:MAX_REQUESTS] if isinstance(statuses, list) else []:
        name = dig(entry, "name")
        claim = dig(entry, "resourceClaimName")
        if isinstance(name, str):
            out[name] = claim if isinstance(claim, str) else ""
    return out


def _priority(pod: object) -> int:
    priority = dig(pod, "spec", "priority")
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


def pool_of(selector: object) -> str | None:
    """A pod's node selector as the pool its demand is planned in (None: any node)."""
    if not isinstance(selector, dict) or not selector:
        return None
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
