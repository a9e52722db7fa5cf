"""Least privilege, as the manifests grant it: each privilege the agent holds has a reason in
docs/install.md, the coordinator holds none, RBAC grants only what the components do, and the
network lets only the coordinator reach the agents' gRPC port."""

from __future__ import annotations

import math
from pathlib import PurePosixPath

from tests.deploy.conftest import REPO, Obj, agent_container, agent_daemonset, find, render

INSTALL_DOC = REPO / "docs" / "install.md"
READ = {"get", "list", "watch"}


def test_agent_keeps_only_sys_admin(kustomization: str) -> None:
    """Root for the root-owned devices and sockets, CAP_SYS_ADMIN for MIG and profiling, every
    other capability dropped, the runtime's default seccomp profile. Only the privileged overlay
    asks for more; the simulated one for less."""
    security = agent_container(render(kustomization))["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"]
    added = {"simulated": []}.get(kustomization, ["SYS_ADMIN"])
    assert security["capabilities"].get("add", []) == added
    assert security["privileged"] is (kustomization == "privileged")
    assert security["seccompProfile"]["type"] == "RuntimeDefault"
    assert security["runAsUser"] == 0


def test_agent_schedules_on_gpu_nodes_only() -> None:
    spec = agent_daemonset(render("default"))["spec"]
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork")
    # docs/operations.md, "Upgrading": 2% of the agents restart at a time, never two on one
    # node (two agents on one node would fight over MIG, the plugin config and the state dir)
    rolling = spec["updateStrategy"]["rollingUpdate"]
    assert (rolling["maxUnavailable"], rolling["maxSurge"]) == ("2%", 0)


def test_agent_tolerates_its_own_health_taint(kustomization: str) -> None:
    """The agent taints a node with failed GPUs gpu-agent.io/health=failed:NoSchedule
    (health.taint) and only the agent removes it: its pod must come back there after a rollout
    or a deletion, or the taint stays for good (docs/health.md)."""
    from agent.health.publish import TAINT_KEY

    pod = agent_daemonset(render(kustomization))["spec"]["template"]["spec"]
    tolerated = [t for t in pod["tolerations"] if t.get("key") == TAINT_KEY]
    assert tolerated == [{"key": TAINT_KEY, "operator": "Exists"}]


def test_an_upgrade_restarts_few_agents_at_a_time_each_ready_a_minute_never_two_on_one_node(
    kustomization: str,
) -> None:
    """docs/operations.md, "Upgrading": 2% of the agents (rounded up: 100 of 5,000, 1 of up to
    50) restart at a time, and each counts only after a minute ready, so a release that fails
    soon after its start stops in the first batch."""
    spec = agent_daemonset(render(kustomization))["spec"]
    strategy = spec["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": "2%"}
    assert spec["minReadySeconds"] == 60
    percent = int(strategy["rollingUpdate"]["maxUnavailable"].rstrip("%"))
    assert [math.ceil(nodes * percent / 100) for nodes in (20, 50, 5000)] == [1, 1, 100]


def test_every_container_has_requests_and_limits(kustomization: str) -> None:
    for obj in render(kustomization):
        if obj["kind"] in ("DaemonSet", "Deployment"):
            for c in obj["spec"]["template"]["spec"]["containers"]:
                resources = c["resources"]
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(resources[kind]), f"{c['name']} {kind}"


def test_coordinator_runs_unprivileged() -> None:
    deployment = find(render("default"), "Deployment", "gpu-agent-coordinator")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}


def _rules(objs: list[Obj], kind: str, name: str) -> list[Obj]:
    return list(find(objs, kind, name)["rules"])


def test_rbac_grants_no_wildcards_and_no_secrets(kustomization: str) -> None:
    for obj in render(kustomization):
        if obj["kind"] in ("Role", "ClusterRole"):
            for rule in obj["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule.get(field, []), f"{obj['metadata']['name']}: * {field}"
                assert "secrets" not in rule["resources"], obj["metadata"]["name"]


def test_agent_rbac_is_what_the_agent_does() -> None:
    """Read and label its Node, patch its Node's status (the GPUHealthy condition), create core
    Events (one POST each: agent/kube.py post_node_event), list and watch DRA ResourceSlices
    (to attribute GPUs pods got through DRA claims), create (and get and watch, for `share
    show`) the DeviceClasses of sharing on DRA nodes, never update or delete one (a class's
    name fixes its spec: docs/dra.md), write DeviceTaintRules for its failed GPUs; nothing
    else. No pods cluster-wide: its only pod access (list and delete of one plugin pod) is a
    Role in the plugin's namespace, in the overlays that need it (test_agent_contract.py)."""
    grants = {
        (tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"])
        for r in _rules(render("default"), "ClusterRole", "gpu-agent")
    }
    assert grants == {
        (("",), ("nodes",)): READ | {"patch"},
        (("",), ("nodes/status",)): {"patch"},
        (("",), ("events",)): {"create"},
        (("resource.k8s.io",), ("resourceslices",)): {"list", "watch"},
        (("resource.k8s.io",), ("deviceclasses",)): READ | {"create"},
        (("resource.k8s.io",), ("devicetaintrules",)): {"list", "create", "delete"},
    }


def test_coordinator_reads_and_writes_only_its_lease_status_and_events() -> None:
    """It reads nodes and pods; it writes its Lease and its status ConfigMap, by name (create
    cannot name one), and creates Events; nothing else (no node patch, no pod delete)."""
    objs = render("default")
    rules = _rules(objs, "ClusterRole", "gpu-agent-coordinator") + _rules(
        objs, "Role", "gpu-agent-coordinator"
    )
    owned = {"leases": "gpu-agent-coordinator", "configmaps": "gpu-agent-rollout-status"}
    reads = [r for r in rules if r["resources"][0] not in {*owned, "events"}]
    assert {v for r in reads for v in r["verbs"]} <= READ
    assert {res for r in reads for res in r["resources"]} == {"nodes", "pods"}
    for resource, name in owned.items():
        mine = [r for r in rules if r["resources"] == [resource]]
        assert [r["verbs"] for r in mine if not r.get("resourceNames")] == [["create"]]
        assert [
            (r["resourceNames"], sorted(r["verbs"])) for r in mine if r.get("resourceNames")
        ] == [([name], ["get", "update"])]
    assert [r["verbs"] for r in rules if r["resources"] == ["events"]] == [["create"]]
    role = find(objs, "Role", "gpu-agent-coordinator")
    assert role["metadata"]["namespace"] == "gpu-agent", "agent pods and the Lease: here only"


def test_coordinator_runs_two_replicas_with_progress_and_leader_probes() -> None:
    """Two replicas (leader election makes it safe); liveness on /healthz (progress) and
    readiness on /readyz (leading or a working standby); the pod name names the holder."""
    deployment = find(render("default"), "Deployment", "gpu-agent-coordinator")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name"


def test_node_patches_are_fenced_by_the_admission_policy() -> None:
    """RBAC lets the agent patch any Node; the ValidatingAdmissionPolicy (tested in
    test_node_policy.py) narrows it, and its binding denies rather than warns."""
    objs = render("default")
    policy = find(objs, "ValidatingAdmissionPolicy", "gpu-agent-own-node-labels")
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "gpu-agent-own-node-labels")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    account = find(objs, "ServiceAccount", "gpu-agent")["metadata"]
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    (condition,) = policy["spec"]["matchConditions"]
    assert f"'{user}'" in condition["expression"]


def test_only_the_coordinator_reaches_the_grpc_port() -> None:
    """The agents' NetworkPolicy admits gRPC from coordinator pods alone; the only rule open to
    everyone is the read-only metrics port."""
    objs = render("default")
    policy = find(objs, "NetworkPolicy", "gpu-agent")["spec"]
    agent_labels = agent_daemonset(objs)["spec"]["template"]["metadata"]["labels"]
    coordinator = find(objs, "Deployment", "gpu-agent-coordinator")
    coordinator_labels = coordinator["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= agent_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    grpc_rules = [r for r in policy["ingress"] if {"port": "grpc", "protocol": "TCP"} in r["ports"]]
    assert len(grpc_rules) == 1
    (source,) = grpc_rules[0]["from"]
    assert set(source) == {"podSelector"}, "same namespace only"
    assert source["podSelector"]["matchLabels"].items() <= coordinator_labels.items()
    assert not source["podSelector"]["matchLabels"].items() <= agent_labels.items()
    for rule in policy["ingress"]:
        if "from" not in rule:
            assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]


def test_a_drain_takes_at_most_one_coordinator_and_leaves_one_to_lead() -> None:
    """A PodDisruptionBudget over the coordinator pods: a voluntary eviction takes one of the
    two at a time, so one replica always keeps (or takes) the Lease; a pod that is not ready
    leads nothing and may always go."""
    objs = render("default")
    deployment = find(objs, "Deployment", "gpu-agent-coordinator")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    budget = find(objs, "PodDisruptionBudget", "gpu-agent-coordinator")["spec"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert not budget["selector"]["matchLabels"].items() <= (
        agent_daemonset(objs)["spec"]["template"]["metadata"]["labels"].items()
    )
    assert budget["maxUnavailable"] == 1 and "minAvailable" not in budget
    assert deployment["spec"]["replicas"] - budget["maxUnavailable"] >= 1
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_only_this_namespace_and_monitoring_reach_the_coordinator() -> None:
    """/fleet/status lists the whole fleet: the coordinator's NetworkPolicy admits its one
    port from pods of its own namespace and of the monitoring namespace(s) (a named knob),
    from nowhere else; egress stays open for the agents' gRPC and the API server."""
    objs = render("default")
    deployment = find(objs, "Deployment", "gpu-agent-coordinator")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    policy = find(objs, "NetworkPolicy", "gpu-agent-coordinator")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert [p["name"] for p in container["ports"]] == ["metrics"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    same_namespace, monitoring = rule["from"]
    assert same_namespace == {"podSelector": {}}
    assert set(monitoring) == {"namespaceSelector"}
    (expression,) = monitoring["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "In" and expression["values"] == ["monitoring"]


def test_a_node_without_containerd_still_starts_the_agent(kustomization: str) -> None:
    """/run/containerd is only for image prewarm: a node whose runtime is CRI-O (or k3s's
    containerd elsewhere) must not keep the whole agent from starting, so the hostPath may be
    missing (DirectoryOrCreate), and the agent only ever connects to it (read-only)."""
    objs = render(kustomization)
    pod = agent_daemonset(objs)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "containerd"]
    assert volume["hostPath"] == {"path": "/run/containerd", "type": "DirectoryOrCreate"}
    (mount,) = [m for m in agent_container(objs)["volumeMounts"] if m["name"] == "containerd"]
    assert mount["readOnly"] is True


def test_security_doc_says_the_containerd_socket_is_node_root() -> None:
    text = (REPO / "docs" / "security.md").read_text()
    section = text[text.index("## The node's root the agent pod holds") :]
    section = section[: section.index("\n## ")]
    assert "/run/containerd" in section and "image prewarm" in section
    assert "DirectoryOrCreate" in section


def test_an_operator_can_stop_the_agent_on_one_node(kustomization: str) -> None:
    """A driver upgrade must stop the agent on its node first (docs/operations.md): the label
    gpu-agent.io/deploy=false takes the node out of the DaemonSet (its controller deletes the
    pod), any other value or none keeps it in; the runbook says so step by step."""
    pod = agent_daemonset(render(kustomization))["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    assert term == {
        "matchExpressions": [
            {"key": "gpu-agent.io/deploy", "operator": "NotIn", "values": ["false"]}
        ]
    }
    text = (REPO / "docs" / "operations.md").read_text()
    runbook = text[text.index("### Upgrading the driver on a node") :]
    runbook = runbook[: runbook.index("\n### ")]
    steps = [
        "kubectl label node $NODE gpu-agent.io/deploy=false",
        "kubectl -n gpu-agent wait --for=delete",
        "kubectl label node $NODE gpu-agent.io/deploy-",
    ]
    assert all(step in runbook for step in steps)
    assert [runbook.index(step) for step in steps] == sorted(runbook.index(s) for s in steps)


def test_namespace_admits_the_agents_host_access() -> None:
    namespace = find(render("default"), "Namespace", "gpu-agent")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_install_doc_explains_every_privilege() -> None:
    """docs/install.md names each host path the agent mounts and each privilege it holds."""
    text = INSTALL_DOC.read_text()
    objs = render("default")
    pod = agent_daemonset(objs)["spec"]["template"]["spec"]
    needed = ["CAP_SYS_ADMIN", "hostPID", "system-node-critical", "NVIDIA_MIG_CONFIG_DEVICES"]
    needed += [str(PurePosixPath(v["hostPath"]["path"])) for v in pod["volumes"] if "hostPath" in v]
    missing = [n for n in needed if n not in text]
    assert not missing, f"docs/install.md does not explain: {missing}"
