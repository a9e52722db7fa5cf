"""The DaemonSet runs the agent the way the agent's own config says it runs.

The agent reads its settings through `agent.config.load_config`; this test feeds it exactly what
the manifests give a pod (the ConfigMap's file at the mounted path, the container's env with
downward-API values filled in) and checks the result against the pod spec: ports and probes on
the configured listen addresses, a host mount at every configured host path, the TLS files in
the pod's own certificate (CSI driver), the coordinator's identity as the one admin.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from agent.config import CONFIG_ENV, AgentConfig, config_schema, load_config
from tests.deploy.conftest import Obj, agent_container, agent_daemonset, find, render

NODE = "gpu-node-7"
_CERT_MANAGER_KEYS = {"tls.crt", "tls.key", "ca.crt"}


def _pod_env(container: Obj) -> dict[str, str]:
    """The container's env as the agent process sees it."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            field = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == "spec.nodeName", f"{var['name']}: unexpected downward-API field"
            env[var["name"]] = NODE
    return env


def _mount_for(container: Obj, path: PurePosixPath) -> Obj | None:
    """The volumeMount whose directory holds ``path`` (the deepest one)."""
    best = None
    for mount in container.get("volumeMounts", []):
        root = PurePosixPath(mount["mountPath"])
        if (path == root or root in path.parents) and (
            best is None or len(root.parts) > len(PurePosixPath(best["mountPath"]).parts)
        ):
            best = mount
    return best


def _volume(objs: list[Obj], name: str) -> Obj:
    volumes = agent_daemonset(objs)["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == name]
    return volume


def _effective_config(objs: list[Obj], tmp_path: Path) -> AgentConfig:
    """load_config over the pod's env and the ConfigMap file the env points at."""
    container = agent_container(objs)
    env = _pod_env(container)
    config_path = PurePosixPath(env[CONFIG_ENV])
    mount = _mount_for(container, config_path)
    assert mount is not None, f"{CONFIG_ENV}={config_path} is on no volume"
    volume = _volume(objs, mount["name"])
    configmap = find(objs, "ConfigMap", volume["configMap"]["name"])
    key = str(config_path.relative_to(mount["mountPath"]))
    assert key in configmap["data"], f"ConfigMap has no key {key}"
    local = tmp_path / "config.yaml"
    local.write_text(configmap["data"][key])
    return load_config(None, {**env, CONFIG_ENV: str(local)}, {})


def _port(listen: str) -> int:
    return int(listen.rpartition(":")[2])


@pytest.fixture
def objs(kustomization: str) -> list[Obj]:
    return render(kustomization)


@pytest.fixture
def config(objs: list[Obj], tmp_path: Path) -> AgentConfig:
    return _effective_config(objs, tmp_path)


def test_every_agent_env_variable_is_a_setting(objs: list[Obj]) -> None:
    """A GPU_AGENT_* name the schema does not know would stop the agent at start."""
    known = {row["env"] for row in config_schema()} | {CONFIG_ENV}
    aliases = {a for row in config_schema() for a in row["env_aliases"]}  # type: ignore[union-attr]
    names = set(_pod_env(agent_container(objs)))
    unknown = {n for n in names if n.startswith("GPU_AGENT_")} - known
    assert not unknown, f"not in agent.config.config_schema(): {sorted(unknown)}"
    assert "NODE_NAME" in names and "NODE_NAME" in aliases


def test_config_loads_and_names_the_node(config: AgentConfig) -> None:
    """The agent starts with this config (load_config raises on any bad key or value) and
    takes the node name from the downward API."""
    assert config.node_name == NODE


def test_ports_are_the_configured_listen_addresses(objs: list[Obj], config: AgentConfig) -> None:
    container = agent_container(objs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": _port(config.metrics_listen), "grpc": _port(config.grpc_listen)}
    for service, port_name in (("gpu-agent", "metrics"), ("gpu-agent-grpc", "grpc")):
        (port,) = find(objs, "Service", service)["spec"]["ports"]
        assert port["targetPort"] in (port_name, ports[port_name])
        assert port["port"] == ports[port_name]


def test_probes_hit_the_agents_health_endpoints(objs: list[Obj], config: AgentConfig) -> None:
    """/healthz for liveness and startup, /readyz for readiness, on the metrics listener."""
    container = agent_container(objs)
    metrics = _port(config.metrics_listen)
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    expected = {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert named.get(get["port"], get["port"]) == metrics, probe


def test_host_paths_are_mounted_where_the_agent_looks(objs: list[Obj], config: AgentConfig) -> None:
    """Each host path the agent uses is on a hostPath volume at the configured path. Sockets
    come through their directory (the daemon recreates the socket file when it restarts)."""
    container = agent_container(objs)
    # setting -> (path in the container, must the host path equal it?)
    wanted: dict[str, tuple[PurePosixPath, bool]] = {
        "state_dir": (PurePosixPath(config.state_dir), True),
        "socket_path": (PurePosixPath(config.socket_path).parent, True),
        "telemetry.kubelet_socket": (PurePosixPath(config.telemetry.kubelet_socket).parent, True),
        "prewarm.containerd_socket": (PurePosixPath(config.prewarm.containerd_socket).parent, True),
        "sharing.config_path": (PurePosixPath(config.sharing.config_path).parent, True),
        # the cache may live on any disk of the host (local NVMe); the agent sees it here
        "prewarm.cache_dir": (PurePosixPath(config.prewarm.cache_dir), False),
    }
    for setting, (path, same_on_host) in wanted.items():
        mount = _mount_for(container, path)
        assert mount is not None and PurePosixPath(mount["mountPath"]) == path, (
            f"{setting}: nothing mounted at {path}"
        )
        volume = _volume(objs, mount["name"])
        assert "hostPath" in volume, f"{setting}: volume {volume['name']} is not a hostPath"
        if same_on_host:
            assert PurePosixPath(volume["hostPath"]["path"]) == path, setting
        writable = setting in {
            "state_dir",
            "socket_path",
            "sharing.config_path",
            "prewarm.cache_dir",
        }
        assert bool(mount.get("readOnly")) is not writable, (
            f"{setting}: readOnly should be {not writable}"
        )


def test_proc_root_is_the_hosts(objs: list[Obj], config: AgentConfig) -> None:
    """telemetry.proc_root /proc is the host's only with hostPID (which sighup needs too)."""
    spec = agent_daemonset(objs)["spec"]["template"]["spec"]
    if PurePosixPath(config.telemetry.proc_root) == PurePosixPath("/proc"):
        assert spec.get("hostPID") is True
    if config.sharing.reload == "sighup":
        assert spec.get("hostPID") is True


def test_tls_files_come_from_the_pods_own_certificate(objs: list[Obj], config: AgentConfig) -> None:
    """cert-manager's CSI driver writes this pod's key, certificate and CA (one key per agent)."""
    container = agent_container(objs)
    tls = config.tls
    files = [tls.cert_file, tls.key_file, tls.ca_file]
    assert all(files), "the gRPC TCP listener is off without cert, key and CA"
    for file in files:
        path = PurePosixPath(str(file))
        mount = _mount_for(container, path)
        assert mount is not None, f"{path} is on no volume"
        csi = _volume(objs, mount["name"]).get("csi", {})
        assert csi.get("driver") == "csi.cert-manager.io"
        written = {
            csi["volumeAttributes"].get(f"csi.cert-manager.io/{key}", default)
            for key, default in (
                ("certificate-file", "tls.crt"),
                ("privatekey-file", "tls.key"),
                ("ca-file", "ca.crt"),
            )
        }
        assert path.name in written
        assert path.name in _CERT_MANAGER_KEYS
    assert [PurePosixPath(str(f)).name for f in files] == ["tls.crt", "tls.key", "ca.crt"]


def test_only_the_coordinator_may_mutate(objs: list[Obj], config: AgentConfig) -> None:
    """The coordinator's URI is the one admin; no other role names anyone by default."""
    uris = find(objs, "Certificate", "gpu-agent-coordinator")["spec"]["uris"]
    assert list(config.roles.admin) == uris
    assert config.roles.prewarm == config.roles.sharing == config.roles.mig == ()
    assert config.tls.mutating_identities == ()


def test_restart_pod_reload_has_its_grant_and_no_other_reload_does(
    objs: list[Obj], config: AgentConfig
) -> None:
    """sharing.reload restart-pod deletes the plugin pod: a Role in the plugin's namespace,
    bound to the agent's account, must allow listing and deleting pods there. With any other
    reload the agent never deletes the plugin's pods, and no such Role grants it to."""
    verbs = _pod_restart_grant(objs, config.sharing.plugin_namespace, "gpu-agent-device-plugin-")
    if config.sharing.reload == "restart-pod":
        assert {"list", "delete"} <= verbs
    else:
        assert not verbs


def _pod_restart_grant(objs: list[Obj], namespace: str, prefix: str) -> set[str]:
    """The pod verbs a Role named ``prefix...`` in ``namespace`` bound to the agent grants."""
    account = agent_daemonset(objs)["spec"]["template"]["spec"]["serviceAccountName"]
    verbs: set[str] = set()
    for role in objs:
        meta = role["metadata"]
        if role["kind"] != "Role" or meta.get("namespace") != namespace:
            continue
        if not meta["name"].startswith(prefix):
            continue
        bound = any(
            o["kind"] == "RoleBinding"
            and o["roleRef"]["name"] == meta["name"]
            and {"kind": "ServiceAccount", "name": account, "namespace": "gpu-agent"}
            in o["subjects"]
            for o in objs
        )
        if bound:
            verbs |= {
                v for rule in role["rules"] if "pods" in rule["resources"] for v in rule["verbs"]
            }
    return verbs


def test_the_allocation_mode_can_watch_resourceslices(objs: list[Obj]) -> None:
    """The allocation mode (docs/dra.md) is a list+watch of the node's ResourceSlices."""
    role = find(objs, "ClusterRole", "gpu-agent")
    verbs = {
        v
        for rule in role["rules"]
        if "resourceslices" in rule["resources"] and "resource.k8s.io" in rule["apiGroups"]
        for v in rule["verbs"]
    }
    assert {"list", "watch"} <= verbs


def test_static_mig_under_dra_has_its_grant(
    kustomization: str, objs: list[Obj], config: AgentConfig
) -> None:
    """The dra-static-mig overlay lets the agent restart the DRA kubelet plugin pod in the
    driver's namespace (the republish after a MIG apply on a dra node); nothing else does."""
    verbs = _pod_restart_grant(objs, config.dra.plugin_namespace, "gpu-agent-dra-")
    if kustomization == "dra-static-mig":
        assert {"list", "delete"} <= verbs
    else:
        assert not verbs


def test_overlays_change_what_they_say(kustomization: str, config: AgentConfig) -> None:
    expected: dict[str, Any] = {"simulated": "dgx-h100"}
    assert config.simulate == expected.get(kustomization)
    assert config.sharing.reload == (
        "restart-pod" if kustomization == "sharing-restart-pod" else "sighup"
    )
