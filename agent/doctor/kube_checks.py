"""The checks of the Kubernetes duty: the API server answers, the agent's service account may
do what the agent does (one SelfSubjectAccessReview per verb, the same verbs
deploy/kubernetes/base/agent-rbac.yaml grants: tests/unit/doctor/test_kube_checks.py keeps
them equal), and the API versions the agent uses are served. Outside a cluster each is ok,
saying so: nothing there needs the API."""

from __future__ import annotations

from typing import Any

from agent.doctor.facts import Facts, failed, ok
from agent.errors import AgentError, PermissionDenied
from agent.wire.doctor import Check

__all__ = [
    "AGENT_VERBS",
    "allowed",
    "fix_for",
    "kube_api_versions",
    "kube_rbac",
    "kube_reachable",
]

K = "kubernetes"
NOT_IN_CLUSTER = "not in a cluster (no service account, no KUBECONFIG): nothing needs the API"
#: (group, resource, verbs) the agent uses: deploy/kubernetes/base/agent-rbac.yaml's ClusterRole.
AGENT_VERBS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "nodes", ("get", "list", "watch", "patch")),
    ("", "nodes/status", ("patch",)),
    ("", "events", ("create",)),
    ("resource.k8s.io", "resourceslices", ("list", "watch")),
    ("resource.k8s.io", "deviceclasses", ("get", "list", "watch", "create")),
    ("resource.k8s.io", "devicetaintrules", ("list", "create", "delete")),
)
SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
RBAC_FIX = (
    "kubectl apply -k deploy/kubernetes (the gpu-agent ClusterRole and its binding to the "
    "gpu-agent service account), or add the verbs to the role bound to the agent"
)
#: The fix when the API server did not answer at all (down, timing out, 5xx): not RBAC.
UNANSWERED_FIX = "the API server does not answer: see kubernetes/reachable"


def fix_for(exc: AgentError) -> str:
    """The fix for a call the API refused: RBAC only when it said so (401/403); an outage, a
    timeout or a 5xx is no missing verb, and granting one would not help."""
    return RBAC_FIX if isinstance(exc, PermissionDenied) else UNANSWERED_FIX


def kube_reachable(facts: Facts) -> Check:
    kube = facts.kube
    if kube is None:
        return ok(K, "reachable", NOT_IN_CLUSTER)
    try:
        version = kube.get("/version")
    except AgentError as exc:
        return failed(
            K,
            "reachable",
            f"{kube.server} does not answer: {exc}",
            "check the node reaches the API server (NetworkPolicy, the kubernetes Service) and "
            "the service-account token is mounted",
        )
    said = version.get("gitVersion", "?") if isinstance(version, dict) else "?"
    return ok(K, "reachable", f"{kube.server} answers, version {said}")


def allowed(facts: Facts, group: str, resource: str, verb: str, namespace: str = "") -> bool:
    """Whether the agent's service account may ``verb`` ``resource`` (in ``namespace``, or
    cluster-wide): one SelfSubjectAccessReview; AgentError when the API refuses to answer."""
    assert facts.kube is not None
    name, _, sub = resource.partition("/")
    attributes: dict[str, Any] = {"group": group, "resource": name, "verb": verb}
    if sub:
        attributes["subresource"] = sub
    if namespace:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    answer = facts.kube.request("POST", SSAR, body=review)
    status = answer.get("status", {}) if isinstance(answer, dict) else {}
    return bool(status.get("allowed"))


def kube_rbac(facts: Facts) -> Check:
    if facts.kube is None:
        return ok(K, "rbac", NOT_IN_CLUSTER)
    denied = []
    asked = 0
    try:
        for group, resource, verbs in AGENT_VERBS:
            for verb in verbs:
                asked += 1
                if not allowed(facts, group, resource, verb):
                    denied.append(f"{verb} {resource}{'.' + group if group else ''}")
    except AgentError as exc:
        return failed(K, "rbac", f"SelfSubjectAccessReview refused: {exc}", fix_for(exc))
    if denied:
        return failed(K, "rbac", f"denied {len(denied)} of {asked}: {', '.join(denied)}", RBAC_FIX)
    return ok(K, "rbac", f"all {asked} verbs the agent uses are allowed")


def kube_api_versions(facts: Facts) -> Check:
    if facts.kube is None:
        return ok(K, "api-versions", NOT_IN_CLUSTER)
    try:
        listing = facts.kube.get("/apis")
    except AgentError as exc:
        return failed(K, "api-versions", f"discovery (/apis) failed: {exc}", fix_for(exc))
    served = {
        g.get("name"): [v.get("version") for v in g.get("versions", [])]
        for g in (listing.get("groups", []) if isinstance(listing, dict) else [])
    }
    dra = served.get("resource.k8s.io")
    said = f"resource.k8s.io {'/'.join(dra)}" if dra else "no resource.k8s.io (no DRA)"
    return ok(
        K, "api-versions", f"{said}; events.k8s.io {'/'.join(served.get('events.k8s.io', []))}"
    )
