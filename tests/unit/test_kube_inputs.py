"""What a kubeconfig, and the files it or the pod names, may hold that the agent must refuse:
a proxy-url with a password (refused without showing it), a certificate, key or token file of
megabytes (refused unread, naming the file), a token no HTTP header can carry. Nothing here
reaches a server: each is refused before a request."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import kubeconfig
from agent.errors import AgentError, InvalidSpec, PermissionDenied
from agent.kube import InClusterKubeClient
from agent.kube_exec import _cluster_info

SERVER = "https://127.0.0.1:1"
V1 = "client.authentication.k8s.io/v1"
SECRET = "s3cret-pass"
#: A file far past any PEM or token, made sparse (no disk, no time).
HUGE = 64 << 20


def _config(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": SERVER, **cluster}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _sparse(path: Path, size: int = HUGE) -> Path:
    with path.open("wb") as f:
        os.truncate(f.fileno(), size)
    return path


@pytest.mark.parametrize(
    "proxy",
    [
        f"socks5://alice:{SECRET}@proxy.example:1080",
        f"https://alice:{SECRET}@proxy.example:3128",
        f"http://alice:{SECRET}@proxy.example:99999",  # no port: ValueError at the first call
        f"http://alice:{SECRET}@[proxy.example",  # not a URL: ValueError out of urlsplit
    ],
)
def test_a_proxy_url_refused_never_shows_its_password(tmp_path: Path, proxy: str) -> None:
    path = _config(tmp_path, {"token": "t"}, {"proxy-url": proxy})
    with pytest.raises(InvalidSpec) as caught:
        kubeconfig.load(path)
    said = str(caught.value) + repr(caught.value.violations)
    assert SECRET not in said and "alice" not in said, said
    assert [v.field for v in caught.value.violations] == ["proxy-url"]
    assert "proxy.example" in said or "<unparsable URL>" in said, said


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ("cluster", "certificate-authority"),
        ("user", "client-certificate"),
        ("user", "client-key"),
    ],
)
def test_a_certificate_or_key_file_of_megabytes_is_refused_unread(
    tmp_path: Path, where: str, field: str
) -> None:
    import lightkube.config.kubeconfig  # noqa: F401  # imported before memory is counted

    big = _sparse(tmp_path / "big.pem")
    (tmp_path / "small.pem").write_text("PEM")  # the pair's other half: a key needs its cert
    pair = {"client-certificate": "small.pem", "client-key": "small.pem"}
    entry = {field: str(big)}
    user, cluster = ({**pair, **entry}, {}) if where == "user" else ({"token": "t"}, entry)
    path = _config(tmp_path, user, cluster)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidSpec) as caught:
            kubeconfig.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(big) in str(caught.value) and "larger than" in str(caught.value)
    assert [v.field for v in caught.value.violations] == [field]
    assert peak < 8 << 20, peak  # read no further than the bound, not 64 MiB


def test_a_token_file_of_megabytes_is_refused_unread_naming_it(tmp_path: Path) -> None:
    big = _sparse(tmp_path / "token")
    client = InClusterKubeClient(SERVER, big)
    tracemalloc.start()
    try:
        with pytest.raises(PermissionDenied) as caught:
            client.request("GET", "/api/v1/nodes/n")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(big) in str(caught.value) and "larger than" in str(caught.value)
    assert peak < 8 << 20, peak


@pytest.mark.parametrize("token", ["tōken", "abc\r\nX-Injected: 1", "abc\x00def"])
def test_a_token_no_header_can_carry_is_refused_naming_its_file_not_its_text(
    tmp_path: Path, token: str
) -> None:
    """http.client raised UnicodeEncodeError or ValueError past every handler of AgentError."""
    path = tmp_path / "token"
    path.write_text(token + "\n")
    with pytest.raises(PermissionDenied) as caught:
        InClusterKubeClient(SERVER, path).request("GET", "/api/v1/nodes/n")
    assert str(path) in str(caught.value) and token.strip() not in str(caught.value)


def test_a_kubeconfig_token_file_of_megabytes_is_refused_too(tmp_path: Path) -> None:
    _sparse(tmp_path / "sa-token")
    path = _config(tmp_path, {"tokenFile": "sa-token"}, {"insecure-skip-tls-verify": True})
    client = InClusterKubeClient.from_kubeconfig(path)
    with pytest.raises(PermissionDenied, match=r"sa-token.*larger than"):
        client.request("GET", "/api/v1/nodes/n")


def test_an_exec_plugins_cluster_ca_of_megabytes_is_not_read_into_its_environment(
    tmp_path: Path,
) -> None:
    big = _sparse(tmp_path / "ca.pem", 8 << 20)
    info = _cluster_info({"server": SERVER, "certificate-authority": str(big)}, tmp_path)
    assert info == {"server": SERVER}


def test_no_repr_of_a_kubeconfig_s_settings_shows_a_credential(tmp_path: Path) -> None:
    """What a traceback or a debug line may print of a loaded kubeconfig (its settings, its
    exec plugin after it ran) holds no token, client key, proxy password, nor the plugin's
    secret args and env."""
    token = "p1ugin-token-" + "x" * 30
    script = tmp_path / "plugin"
    credential = {"apiVersion": V1, "kind": "ExecCredential", "status": {"token": token}}
    script.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    script.chmod(0o755)
    proxy = {"proxy-url": f"http://alice:{SECRET}@proxy.example:3128"}
    key = base64.b64encode(b"-----BEGIN PRIVATE KEY-----k3y-s3cret").decode()
    user = {"token": "b3arer-s3cret", "client-certificate-data": key, "client-key-data": key}
    with_token = kubeconfig.load(_config(tmp_path, user, proxy))
    exec_user = {
        "exec": {
            "apiVersion": V1,
            "command": str(script),
            "args": [f"--client-secret={SECRET}"],
            "env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": SECRET}],
            "interactiveMode": "Never",
            "provideClusterInfo": True,
        }
    }
    with_plugin = kubeconfig.load(_config(tmp_path, exec_user, proxy))
    assert with_plugin.exec_plugin is not None
    assert with_plugin.exec_plugin.token() == token
    shown = repr(with_token) + repr(with_plugin) + repr(with_plugin.exec_plugin)
    for secret in (SECRET, "b3arer-s3cret", "k3y-s3cret", key, token):
        assert secret not in shown, secret
    assert "proxy.example" not in shown and "plugin" in shown  # the plugin is still named


@pytest.mark.parametrize(
    ("server", "said"),
    [
        ("https://127.0.0.1:1/p\u00e9", "not printable ASCII"),  # raised UnicodeEncodeError
        ("https://127.0.0.1:1/k8s clusters", "not printable ASCII"),
        ("https://127.0.0.1:1/k8s?cluster=a", "query or fragment"),  # was dropped from calls
        ("https://127.0.0.1:1/k8s#a", "query or fragment"),
        ("https://127.0.0.1:1/" + "k" * 8000, "over 1024"),  # was echoed in every error
    ],
    ids=["non-ascii", "space", "query", "fragment", "8-kib"],
)
def test_a_server_no_call_could_go_to_is_refused_at_load_naming_the_field(
    tmp_path: Path, server: str, said: str
) -> None:
    path = _config(tmp_path, {"token": "t"}, {"server": server})
    for load in (kubeconfig.load, InClusterKubeClient.from_kubeconfig):
        with pytest.raises(InvalidSpec, match=said) as caught:
            load(path)
        assert [v.field for v in caught.value.violations] == ["clusters[].cluster.server"]
        assert str(path) in str(caught.value) and len(str(caught.value)) < 600
    with pytest.raises(InvalidSpec, match=said):
        InClusterKubeClient(server, None, token="t")
    # A server behind a path, percent-encoded, is taken.
    assert kubeconfig.load(_config(tmp_path, {"token": "t"}, {"server": SERVER + "/k%C3%A9"}))


def test_a_cluster_without_a_server_is_refused_not_sent_to_localhost(tmp_path: Path) -> None:
    """lightkube's model puts http://localhost:8080 where ``server`` is missing: calls went
    there. kubectl refuses such a cluster ("no server found for cluster"), and so does this."""
    path = _config(tmp_path, {"token": "t"}, {"insecure-skip-tls-verify": True})
    doc = yaml.safe_load(path.read_text())
    del doc["clusters"][0]["cluster"]["server"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InvalidSpec, match="server '' is missing or empty") as caught:
        kubeconfig.load(path)
    assert [v.field for v in caught.value.violations] == ["clusters[].cluster.server"]
    assert str(path) in str(caught.value)


def test_a_client_certificate_beside_an_exec_plugin_leaves_the_plugin_unrun(
    tmp_path: Path,
) -> None:
    """client-go sends a client certificate and never runs the exec plugin beside it (exec.go
    UpdateTransportConfig: HasCertAuth); the plugin's fields are still checked."""
    pem = base64.b64encode(b"PEM").decode()
    plugin = {"command": "kubelogin", "apiVersion": V1, "interactiveMode": "Never"}
    user = {"client-certificate-data": pem, "client-key-data": pem, "exec": plugin}
    settings = kubeconfig.load(_config(tmp_path, user, {}))
    assert settings.client_cert == (b"PEM", b"PEM") and settings.exec_plugin is None
    with pytest.raises(InvalidSpec, match="exec interactiveMode 'Sometimes'"):
        kubeconfig.load(
            _config(tmp_path, {**user, "exec": {**plugin, "interactiveMode": "Sometimes"}}, {})
        )


@pytest.mark.parametrize(
    ("user", "sent"),
    [
        ({"token": "t", "client-key-data": base64.b64encode(b"KEY").decode()}, "token"),
        ({"token": "t", "client-key": "me.key"}, "token"),
        (
            {
                "client-certificate-data": base64.b64encode(b"CERT").decode(),
                "client-key-data": base64.b64encode(b"KEY").decode(),
                "username": "u",
                "password": "p",
            },
            "certificate",
        ),
    ],
    ids=["token-and-lone-key-data", "token-and-lone-key-file", "certificate-and-basic-auth"],
)
def test_what_client_go_leaves_unused_loads_and_is_left_unused(
    tmp_path: Path, user: dict[str, object], sent: str
) -> None:
    """client-go refuses neither a key without its certificate (TLSConfigFor's HasCertAuth
    wants both, so it is unused) nor basic auth beside a client certificate (a certificate is
    no second authentication method): kubectl loads both files and sends the other
    credential. So does this; neither is half used."""
    (tmp_path / "me.key").write_bytes(b"KEY")  # read as client-go reads it, then unused
    settings = kubeconfig.load(_config(tmp_path, user, {}))
    if sent == "token":
        assert settings.token == "t" and settings.client_cert is None
    else:
        assert settings.client_cert == (b"CERT", b"KEY") and settings.token is None


def test_a_context_with_no_user_sends_no_credential(tmp_path: Path) -> None:
    """As kubectl: client-go's DirectClientConfig.ConfirmUsable does not check the context, so
    a context without ``user`` is an anonymous client, not a refusal."""
    path = _config(tmp_path, {"token": "t"}, {})
    doc = yaml.safe_load(path.read_text())
    del doc["contexts"][0]["context"]["user"]
    path.write_text(yaml.safe_dump(doc))
    settings = kubeconfig.load(path)
    assert settings.token is settings.token_path is settings.client_cert is None
    assert settings.exec_plugin is None and settings.server == SERVER


@pytest.mark.parametrize(
    ("key", "edit"),
    [
        ("user", lambda doc: doc["contexts"][0]["context"].update(user="nope")),
        ("cluster", lambda doc: doc["contexts"][0]["context"].update(cluster="nope")),
        ("cluster", lambda doc: doc.pop("clusters")),  # no clusters list at all
    ],
    ids=["user", "cluster", "no-clusters-list"],
)
def test_a_context_naming_what_the_file_lacks_is_refused_naming_the_contexts_field(
    tmp_path: Path, key: str, edit: Any
) -> None:
    """kubectl refuses a missing cluster (no server) and would call anonymously for a missing
    user; a typo or a user in another KUBECONFIG file (not read) is likelier: refused too."""
    path = _config(tmp_path, {"token": "t"}, {})
    doc = yaml.safe_load(path.read_text())
    edit(doc)
    path.write_text(yaml.safe_dump(doc))
    wanted = doc["contexts"][0]["context"][key]
    with pytest.raises(InvalidSpec) as info:
        kubeconfig.load(path)
    where = f"contexts[c].context.{key}"
    assert f"{where}: no {key} named {wanted!r} in the file" in str(info.value)
    assert [v.field for v in info.value.violations] == [where]


def test_an_entry_without_its_name_is_refused_as_malformed_saying_what_it_lacks(
    tmp_path: Path,
) -> None:
    path = _config(tmp_path, {"token": "t"}, {})
    doc = yaml.safe_load(path.read_text())
    del doc["users"][0]["name"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InvalidSpec, match="malformed: an entry lacks 'name'"):
        kubeconfig.load(path)


def test_a_contexts_namespace_is_not_read(tmp_path: Path) -> None:
    """The agents' namespace is --namespace (POD_NAMESPACE), never the context's: one no
    namespace could be named, which client-go's Validate refuses, changes nothing here."""
    path = _config(tmp_path, {"token": "t"}, {})
    doc = yaml.safe_load(path.read_text())
    doc["contexts"][0]["context"]["namespace"] = "Not_A_Label"
    path.write_text(yaml.safe_dump(doc))
    assert kubeconfig.load(path).server == SERVER


def test_a_request_that_cannot_be_encoded_is_an_error_naming_the_server() -> None:
    """A proxy's CONNECT to a server whose host is not ASCII raised UnicodeEncodeError, past
    every handler of AgentError (OSError, HTTPException)."""
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen(4)  # connected to (backlog), never answering: the client fails first
        port = proxy.getsockname()[1]
        server = "https://\u00e9xample.com:6443"
        client = InClusterKubeClient(
            server, None, token="t", timeout=2, proxy=f"http://127.0.0.1:{port}"
        )
        with pytest.raises(AgentError, match=re.escape(f"Kubernetes API {server} ")):
            client.request("GET", "/api/v1/nodes")
        with pytest.raises(AgentError, match=re.escape(f"Kubernetes API {server} ")):
            client.stream("/api/v1/nodes", {}, timeout=2)
