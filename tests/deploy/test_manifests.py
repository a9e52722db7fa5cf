"""The Kubernetes manifests build with kustomize and every object is valid.

Built-in kinds are validated against the Kubernetes OpenAPI schemas shipped by the PyPI package
kubernetes-validate, in strict mode (unknown fields are errors), for the oldest Kubernetes the
install supports and the newest the package knows. Custom resources (cert-manager's Issuer and
Certificate, prometheus-operator's ServiceMonitor and PrometheusRule) have no schema there, so
their structure and their references to the other objects are checked here instead.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import KUSTOMIZATIONS, REPO, Obj, containers, find, render

try:
    from kubernetes_validate import utils as kubernetes_validate
except ImportError:  # pragma: no cover - the failure below says what to install
    kubernetes_validate = None

#: Kubernetes 1.30: ValidatingAdmissionPolicy v1 and node names in service-account tokens.
MIN_KUBERNETES = "1.30.0"
CUSTOM_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def _validator() -> Any:
    if kubernetes_validate is None:
        pytest.fail(
            "the PyPI package kubernetes-validate is missing: pip install kubernetes-validate",
            pytrace=False,
        )
    return kubernetes_validate


def _versions() -> list[str]:
    latest = kubernetes_validate.latest_version() if kubernetes_validate else "latest"
    return [MIN_KUBERNETES, latest]


def test_kustomization_builds_unique_named_objects(kustomization: str) -> None:
    """`kubectl kustomize` builds it; every object is named, namespaced where it must be, once."""
    objs = render(kustomization)
    assert objs
    seen = set()
    for obj in objs:
        meta = obj["metadata"]
        key = (obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        assert key not in seen, f"duplicate object {key}"
        seen.add(key)
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, f"{obj['kind']} {meta['name']} is cluster-scoped"
        else:
            assert meta.get("namespace"), f"{obj['kind']} {meta['name']} names no namespace"


@pytest.mark.parametrize("version", _versions())
def test_builtin_objects_match_the_kubernetes_schema(version: str) -> None:
    """Strict schema validation of every built-in object of every kustomization: no unknown
    field, no wrong type. Objects the overlays share are validated once."""
    validator = _validator()
    unique: dict[str, tuple[Obj, list[str]]] = {}
    for name in sorted(KUSTOMIZATIONS):
        for obj in render(name):
            if (obj["apiVersion"], obj["kind"]) not in CUSTOM_KINDS:
                key = json.dumps(obj, sort_keys=True)
                unique.setdefault(key, (obj, []))[1].append(name)
    problems = []
    for obj, users in unique.values():
        try:
            validator.validate(obj, version, strict=True)
        except validator.SchemaNotFoundError:
            problems.append(f"{obj['apiVersion']} {obj['kind']}: no schema in Kubernetes {version}")
        except validator.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            problems.append(
                f"{obj['kind']} {obj['metadata']['name']} ({', '.join(users)}): "
                f"{where}: {exc.message}"
            )
    assert not problems, "\n".join(problems)


def test_the_schema_check_has_teeth() -> None:
    """A misspelt field fails strict validation, so a pass above means something."""
    validator = _validator()
    objs = render("default")
    daemonset = dict(find(objs, "DaemonSet", "gpu-agent"))
    daemonset["spec"] = {**daemonset["spec"], "updateStrategyy": {}}
    with pytest.raises(validator.ValidationError):
        validator.validate(daemonset, MIN_KUBERNETES, strict=True)


def test_only_known_custom_resources(kustomization: str) -> None:
    """Every object is either a built-in kind (validated above) or a custom kind checked here."""
    for obj in render(kustomization):
        group = obj["apiVersion"].split("/")[0]
        if "." in group and not group.endswith(".k8s.io"):
            assert (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS, obj["kind"]


# --- cert-manager ---------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(\.\d+)?(h|m|s|ms))+")
_USAGES = {"digital signature", "key encipherment", "server auth", "client auth", "cert sign"}


def test_certificates_chain_to_the_installation_ca() -> None:
    """Issuer and Certificate fields as cert-manager v1 defines them, and the chain they form:
    a self-signed Issuer signs the CA, a CA Issuer on the CA's secret signs the coordinator's
    certificate and every agent pod's (through cert-manager's CSI driver)."""
    objs = render("default")
    issuers = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Issuer"}
    certs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Certificate"}
    for issuer in issuers.values():
        kinds = set(issuer["spec"]) & {"selfSigned", "ca", "acme", "vault", "venafi"}
        assert len(kinds) == 1, f"Issuer {issuer['metadata']['name']} needs exactly one type"
    for name, cert in certs.items():
        spec = cert["spec"]
        assert spec["secretName"], name
        ref = spec["issuerRef"]
        assert ref["kind"] == "Issuer" and ref["name"] in issuers, f"{name}: unknown issuer {ref}"
        assert spec.get("commonName") or spec.get("dnsNames") or spec.get("uris"), name
        assert set(spec.get("usages", [])) <= _USAGES, name
        assert spec["privateKey"]["algorithm"] in {"RSA", "ECDSA", "Ed25519"}, name
        for field in ("duration", "renewBefore"):
            assert _DURATION.fullmatch(spec[field]), f"{name}.{field}: {spec[field]}"
    ca = certs["gpu-agent-ca"]["spec"]
    assert ca["isCA"] and "selfSigned" in issuers[ca["issuerRef"]["name"]]["spec"]
    assert issuers["gpu-agent-ca"]["spec"]["ca"]["secretName"] == ca["secretName"]
    assert set(certs) == {"gpu-agent-ca", "gpu-agent-coordinator"}  # no shared serving cert
    coordinator = certs["gpu-agent-coordinator"]["spec"]
    assert coordinator["issuerRef"]["name"] == "gpu-agent-ca" and not coordinator.get("isCA")
    assert "client auth" in coordinator["usages"]
    attrs = _agent_csi_volume(objs)["volumeAttributes"]
    assert attrs["csi.cert-manager.io/issuer-name"] == "gpu-agent-ca"
    assert attrs["csi.cert-manager.io/issuer-kind"] == "Issuer"


def test_the_ca_keeps_its_key_when_cert_manager_renews_it() -> None:
    """rotationPolicy Never on the CA (cert-manager 1.18 changed the default to Always): the
    automatic renewal keeps the key, so leaves signed before and after verify under either CA
    certificate and nobody loses trust while the new ca.crt spreads; docs/security.md says how
    to change the key on purpose."""
    certs = {o["metadata"]["name"]: o for o in render("default") if o["kind"] == "Certificate"}
    assert certs["gpu-agent-ca"]["spec"]["privateKey"]["rotationPolicy"] == "Never"
    assert certs["gpu-agent-coordinator"]["spec"]["privateKey"]["rotationPolicy"] == "Always"
    text = (REPO / "docs" / "security.md").read_text()
    section = text[text.index("## The installation's CA") :]
    assert "rotationPolicy: Never" in section and "trust bundle" in section


#: What cert-manager's csi-driver substitutes (pkg/requestgen/generator.go, expand).
_CSI_VARIABLES = {"POD_NAME", "POD_NAMESPACE", "POD_UID", "SERVICE_ACCOUNT_NAME"}


def _agent_csi_volume(objs: list[Obj]) -> Obj:
    volumes = find(objs, "DaemonSet", "gpu-agent")["spec"]["template"]["spec"]["volumes"]
    (tls,) = [v for v in volumes if v["name"] == "tls"]
    csi: Obj = tls["csi"]
    assert csi["driver"] == "csi.cert-manager.io" and csi["readOnly"] is True
    return csi


def test_each_agent_gets_its_own_serving_key_naming_its_pod() -> None:
    """No wildcard, no name two agents share: the one DNS SAN is the pod's name under the gRPC
    Service, which the coordinator checks per pod ({pod}.gpu-agent-grpc.NAMESPACE.svc)."""
    objs = render("default")
    service = find(objs, "Service", "gpu-agent-grpc")
    attrs = _agent_csi_volume(objs)["volumeAttributes"]
    names = [n.strip() for n in attrs["csi.cert-manager.io/dns-names"].split(",")]
    assert names == [f"${{POD_NAME}}.{service['metadata']['name']}.${{POD_NAMESPACE}}.svc"]
    assert (
        "csi.cert-manager.io/uri-sans" not in attrs and "csi.cert-manager.io/ip-sans" not in attrs
    )
    used = set(re.findall(r"\$\{(\w+)\}", " ".join(attrs.values())))
    assert used <= _CSI_VARIABLES
    usages = {u.strip() for u in attrs["csi.cert-manager.io/key-usages"].split(",")}
    assert "server auth" in usages and "client auth" not in usages
    assert attrs["csi.cert-manager.io/key-algorithm"] in {"RSA", "ECDSA", "Ed25519"}
    for field in ("duration", "renew-before"):
        assert _DURATION.fullmatch(attrs[f"csi.cert-manager.io/{field}"]), field
    files = [attrs[f"csi.cert-manager.io/{k}"] for k in ("certificate-file", "privatekey-file")]
    assert [*files, attrs["csi.cert-manager.io/ca-file"]] == ["tls.crt", "tls.key", "ca.crt"]
    # The coordinator's default check names exactly this pattern.
    from agent.coordinator.control.connect import FleetOptions

    options = FleetOptions(
        agents=(),
        dns=None,
        kubernetes=True,
        namespace=service["metadata"]["namespace"],
        tls_dir=Path("/etc/gpu-agent/tls"),
        tls_cert=None,
        tls_key=None,
        tls_ca=None,
        server_name=None,
        insecure=False,
        timeout=1.0,
    )
    expected = names[0].replace("${POD_NAME}", "{pod}")
    assert options.default_server_name() == expected.replace(
        "${POD_NAMESPACE}", service["metadata"]["namespace"]
    )


def test_coordinator_identity_is_a_spiffe_uri_of_its_service_account() -> None:
    objs = render("default")
    (uri,) = find(objs, "Certificate", "gpu-agent-coordinator")["spec"]["uris"]
    deployment = find(objs, "Deployment", "gpu-agent-coordinator")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"]["namespace"]
    assert uri == f"spiffe://cluster.local/ns/{namespace}/sa/{account}"


def test_pods_mount_the_secrets_their_certificates_write() -> None:
    objs = render("default")
    secrets = {
        o["spec"]["secretName"]: o["metadata"]["name"] for o in objs if o["kind"] == "Certificate"
    }
    for kind, name, cert in (("Deployment", "gpu-agent-coordinator", "gpu-agent-coordinator"),):
        volumes = find(objs, kind, name)["spec"]["template"]["spec"]["volumes"]
        mounted = {v["secret"]["secretName"] for v in volumes if "secret" in v}
        assert {s for s in mounted if secrets.get(s) == cert}, f"{name} mounts no {cert} secret"


# --- prometheus-operator --------------------------------------------------------------------------

_RELABEL_ACTIONS = {"replace", "keep", "drop", "labeldrop", "labelkeep", "labelmap", "hashmod"}


def test_servicemonitor_scrapes_the_agents_metrics_port() -> None:
    """The ServiceMonitor selects the metrics Service (only it), on its port name, and its
    relabelings are valid prometheus-operator RelabelConfigs."""
    objs = render("default")
    monitor = find(objs, "ServiceMonitor", "gpu-agent")["spec"]
    selected = [
        s
        for s in objs
        if s["kind"] == "Service"
        and s["metadata"]["namespace"] in monitor["namespaceSelector"]["matchNames"]
        and monitor["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == ["gpu-agent"]
    ports = {p["name"] for p in selected[0]["spec"]["ports"]}
    for endpoint in monitor["endpoints"]:
        assert endpoint["port"] in ports
        assert endpoint["path"] == "/metrics"
        assert _DURATION.fullmatch(endpoint["interval"])
        for relabel in endpoint["relabelings"]:
            action = relabel.get("action", "replace")
            assert action in _RELABEL_ACTIONS, relabel
            if action == "replace":
                assert relabel["sourceLabels"] and relabel["targetLabel"], relabel
            if action == "labeldrop":
                re.compile(relabel["regex"])
                assert "sourceLabels" not in relabel
    targets = {r.get("targetLabel") for r in monitor["endpoints"][0]["relabelings"]}
    assert {"node", "pool"} <= targets, "alerts and dashboards group by node and pool"


def test_prometheusrule_groups_are_well_formed() -> None:
    rule = find(render("default"), "PrometheusRule", "gpu-agent")
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert ("alert" in r) != ("record" in r), r
            assert r["expr"]


def test_overlay_without_prometheus_operator_needs_no_monitoring_crds() -> None:
    kinds = {o["kind"] for o in render("without-prometheus-operator")}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert "DaemonSet" in kinds


# --- images -----------------------------------------------------------------------------------


def test_images_are_the_package_version(kustomization: str) -> None:
    """The manifests deploy the images of this source tree's version, built from docker/."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    objs = render(kustomization)
    images = {
        c["image"] for o in objs if o["kind"] in ("DaemonSet", "Deployment") for c in containers(o)
    }
    assert images == {f"gpu-node-agent:{version}", f"gpu-node-agent-coordinator:{version}"}


# --- runtime class ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kustomization", "runtime_class"),
    [
        ("default", "nvidia"),
        ("without-prometheus-operator", "nvidia"),
        ("nvidia-default-runtime", None),
        ("simulated", None),
    ],
)
def test_the_agent_runs_with_the_nvidia_runtime_class(
    kustomization: str, runtime_class: str | None
) -> None:
    """The GPU Operator's default (CDI on) leaves nvidia out of containerd's default runtime and
    runs its operands with runtimeClassName nvidia; so does the agent, unless an overlay says
    nvidia is the default runtime (or there is no GPU: simulated)."""
    pod = find(render(kustomization), "DaemonSet", "gpu-agent")["spec"]["template"]["spec"]
    assert pod.get("runtimeClassName") == runtime_class
