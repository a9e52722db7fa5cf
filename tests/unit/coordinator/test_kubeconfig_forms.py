"""`gpu-agent fleet status --kubernetes` from a laptop takes the kubeconfig forms kubectl does:
exec credential plugins (EKS, GKE, AKS: fake plugins here, small Python scripts printing an
ExecCredential), tokens, token files, insecure-skip-tls-verify, the current context among
several, and a proxy-url; against the Kubernetes API stand-in (tests/kube/fake_api.py), which
answers 401 to any other bearer token. A plugin that is missing, fails, hangs or prints
something else is one line naming it."""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cli.fleet import fleet
from tests.integration.prewarm_fixtures.tinyproxy import tinyproxy
from tests.kube.fake_api import FakeKubeApi, Pod
from tests.kube.fixtures import make_tls_cert
from tests.unit.coordinator.agents import Outcome, invoke

SELECTOR = {"app.kubernetes.io/name": "gpu-agent", "app.kubernetes.io/component": "agent"}
V1 = "client.authentication.k8s.io/v1"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJtZSJ9.c2lnbmF0dXJl"
#: base64 of a PEM (never parsed: each form with it is refused before)
PEM = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()


def exec_env(*names: str) -> dict[str, Any]:
    env = [{"name": n, "value": "v"} for n in names]
    return {"exec": {"command": "x", "apiVersion": V1, "interactiveMode": "Never", "env": env}}


@pytest.fixture
def api(kube_api: tuple[FakeKubeApi, str], monkeypatch: pytest.MonkeyPatch) -> FakeKubeApi:
    """One node whose agent pod has no IP yet: status lists it, found through the API."""
    fake, _ = kube_api
    fake.nodes["gpu-a"] = {"pool": "train"}
    fake.pods.append(Pod("gpu-agent", "gpu-agent-a", "gpu-a", dict(SELECTOR)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return fake


def write_kubeconfig(
    path: Path, url: str, user: dict[str, Any], cluster: dict[str, Any] | None = None
) -> Path:
    """A kubeconfig whose current context ``laptop`` names ``user`` on the stand-in; a second
    context names a wrong token, so picking the current context matters."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "laptop",
        "contexts": [
            {"name": "other", "context": {"cluster": "c", "user": "wrong"}},
            {"name": "laptop", "context": {"cluster": "c", "user": "me"}},
        ],
        "clusters": [{"name": "c", "cluster": {"server": url, **(cluster or {})}}],
        "users": [{"name": "wrong", "user": {"token": "nope"}}, {"name": "me", "user": user}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def plugin(tmp_path: Path, body: str, name: str = "fake-eks-token") -> Path:
    """An executable Python script: ``body`` runs with ``runs`` (a file counting its runs)
    and ``info`` (KUBERNETES_EXEC_INFO, decoded) defined."""
    script = tmp_path / name
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        f"runs = {str(tmp_path / (name + '.runs'))!r}\n"
        "n = int(open(runs).read()) + 1 if os.path.exists(runs) else 1\n"
        "open(runs, 'w').write(str(n))\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        f"open(runs + '.info', 'w').write(json.dumps(info))\n{body}\n"
    )
    script.chmod(0o755)
    return script


def credential(token: str, version: str = V1, expires: str | None = None) -> str:
    status: dict[str, Any] = {"token": token}
    if expires:
        status["expirationTimestamp"] = expires
    cred = {"apiVersion": version, "kind": "ExecCredential", "status": status}
    return f"print({json.dumps(json.dumps(cred))})"


def status(config: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> Outcome:
    monkeypatch.setenv("KUBECONFIG", str(config))
    args = [
        "status",
        "--kubernetes",
        "--namespace",
        "gpu-agent",
        "--insecure",
        "--nodes",
        "-o",
        "json",
    ]
    return invoke(fleet, [*args, *extra])


def found_nodes(result: Outcome) -> set[str]:
    assert "error:" not in result.output, result.output
    return {n["name"] for n in json.loads(result.output)["nodes"]}


def bearer_tokens(api: FakeKubeApi) -> set[str]:
    return {r.headers.get("Authorization", "") for r in api.requests}


def test_an_exec_plugin_token_is_sent_and_cached(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As `aws eks get-token`: v1 with args, env and provideClusterInfo; the plugin gets its
    KUBERNETES_EXEC_INFO, runs once for the pod and node lists (its token is cached: no
    expirationTimestamp), and the API sees its token. 288 KiB of warnings on its stderr, more
    than a pipe holds, do not stall it."""
    _, url = kube_api
    exe = plugin(
        tmp_path,
        "assert sys.argv[1:] == ['eks', 'get-token', '--cluster-name', 'gpu'], sys.argv\n"
        "assert os.environ['AWS_PROFILE'] == 'ml'\n"
        "sys.stderr.write('warning: ' * 32768)\n" + credential("token-1"),
    )
    user = {
        "exec": {
            "apiVersion": V1,
            "command": str(exe),
            "args": ["eks", "get-token", "--cluster-name", "gpu"],
            "env": [{"name": "AWS_PROFILE", "value": "ml"}],
            "interactiveMode": "Never",
            "provideClusterInfo": True,
        }
    }
    # the certificate names 127.0.0.1: tls-server-name as the address, given to the plugin
    cluster = {"certificate-authority": str(tls_cert[0]), "tls-server-name": "127.0.0.1"}
    config = write_kubeconfig(tmp_path / "kc", url, user, cluster)
    assert found_nodes(status(config, monkeypatch)) == {"gpu-a"}
    assert bearer_tokens(api) == {"Bearer token-1"}
    assert (tmp_path / "fake-eks-token.runs").read_text() == "1"
    info = json.loads((tmp_path / "fake-eks-token.runs.info").read_text())
    assert info["apiVersion"] == V1 and info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == url
    assert info["spec"]["cluster"]["certificate-authority-data"]
    assert info["spec"]["cluster"]["tls-server-name"] == "127.0.0.1"


def test_a_relative_certificate_authority_reaches_the_plugin_from_any_directory(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``certificate-authority: ca.crt`` beside the kubeconfig, run from another directory: a
    kubeconfig's relative paths are the file's folder's (kubectl's rule), so the client checks
    the server against that CA and a provideClusterInfo plugin is given the same CA."""
    _, url = kube_api
    folder, elsewhere = tmp_path / "kube", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / "ca.crt").write_bytes(tls_cert[0].read_bytes())
    exe = plugin(tmp_path, credential("token-1"))
    user = {
        "exec": {
            "apiVersion": V1,
            "command": str(exe),
            "interactiveMode": "Never",
            "provideClusterInfo": True,
        }
    }
    config = write_kubeconfig(folder / "config", url, user, {"certificate-authority": "ca.crt"})
    monkeypatch.chdir(elsewhere)
    assert found_nodes(status(config, monkeypatch)) == {"gpu-a"}
    info = json.loads((tmp_path / "fake-eks-token.runs.info").read_text())
    sent = info["spec"]["cluster"].get("certificate-authority-data")
    assert sent and base64.b64decode(sent) == tls_cert[0].read_bytes()


def test_a_refused_or_expired_plugin_token_runs_the_plugin_again(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As gke-gcloud-auth-plugin (v1beta1): the first token is refused (401), so the plugin
    runs again at once; the second has expired by the next call (its expirationTimestamp), so
    it runs a third time."""
    _, url = kube_api
    body = (
        "token = 'revoked' if n == 1 else 'token-1'\n"
        "stamp = '2000-01-01T00:00:00Z' if n == 2 else '2999-01-01T00:00:00Z'\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', "
        "'kind': 'ExecCredential', 'status': {'token': token, 'expirationTimestamp': stamp}}))"
    )
    exe = plugin(tmp_path, body, "gke-gcloud-auth-plugin")
    user = {"exec": {"apiVersion": V1.replace("v1", "v1beta1"), "command": str(exe)}}
    config = write_kubeconfig(
        tmp_path / "kc", url, user, {"certificate-authority": str(tls_cert[0])}
    )
    assert found_nodes(status(config, monkeypatch)) == {"gpu-a"}
    assert (tmp_path / "gke-gcloud-auth-plugin.runs").read_text() == "3"
    assert "Bearer revoked" in bearer_tokens(api)


@pytest.mark.parametrize(
    ("body", "command", "expected"),
    [
        ("", "no-such-kubelogin", r"'no-such-kubelogin'.*cannot run .*No such file"),
        (
            f"sys.stderr.write('AADSTS700082: refresh token expired for {JWT}\\n'); sys.exit(3)",
            None,
            r"'kubelogin'.*exited 3: AADSTS700082: refresh token expired for <redacted>$",
        ),
        # the token straddles the 288th character, where the cut falls: hidden whole, then cut
        (f"sys.stderr.write('denied: ' + 'w ' * 131 + {JWT!r} + ' retry' * 40); sys.exit(3)",
         None, r"'kubelogin'.*exited 3: denied: w w .* w <redacted> retry r …\(cut\)$"),
        ("time.sleep(60)", None, r"'kubelogin'.*no answer within 1 s; killed"),
        ("print('Opening a browser to sign in...')", None, r"'kubelogin'.*no ExecCredential"),
        ("while True: sys.stdout.write('x' * 65536)", None,
         r"'kubelogin'.*printed more than 1048576 bytes on stdout; killed"),
        (credential("t", "client.authentication.k8s.io/v1alpha1"), None, r"answered 'client"),
        ("print(json.dumps({'kind': 'ExecCredential', 'apiVersion': "
         f"{V1!r}, 'status': {{}}}}))", None, r"'kubelogin'.*no status.token"),
        # no process can be started with it: a ValueError out of Popen, not an OSError
        ("", "kubelogin\0", r"'kubelogin\\x00'.*cannot run 'kubelogin\\x00': embedded null"),
    ],
    ids=["missing", "fails", "long-stderr", "hangs", "garbage", "floods", "wrong-version",
         "no-token", "nul-in-command"],
)  # fmt: skip
def test_a_broken_exec_plugin_is_one_line_naming_it(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    command: str | None,
    expected: str,
) -> None:
    """No token leaves (the API sees no request), and the line names the plugin, with its
    stderr shortened (a cut said so) and any credential in it hidden, before the cut; a hang
    ends at the exec timeout."""
    _, url = kube_api
    exe = plugin(tmp_path, body, "kubelogin")
    user = {"exec": {"apiVersion": V1, "command": command or str(exe), "interactiveMode": "Never"}}
    config = write_kubeconfig(tmp_path / "kc", url, user, {"insecure-skip-tls-verify": True})
    monkeypatch.setenv("KUBECONFIG_EXEC_TIMEOUT", "1")
    result = status(config, monkeypatch)
    assert result.exit_code != 0
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert "exec plugin" in line
    assert re.search(expected, line), line
    assert JWT not in result.output
    assert api.requests == []


@pytest.mark.parametrize(
    "static", [{"token": "token-1"}, {"tokenFile": "sa-token"}], ids=["token", "tokenFile"]
)
def test_a_token_beside_an_exec_plugin_is_sent_and_the_plugin_never_runs(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    static: dict[str, str],
) -> None:
    """A user with a token (or token file) and an exec plugin: client-go sends the token and
    never runs the plugin (exec_test.go TestAuthorizationHeaderPresentCancelsExecAction), so
    the same kubeconfig reaches the cluster as kubectl would, without the plugin's login."""
    _, url = kube_api
    (tmp_path / "sa-token").write_text("token-1\n")
    exe = plugin(tmp_path, credential("plugin-token"), "kubelogin")
    user = {**static, "exec": {"apiVersion": V1, "command": str(exe), "interactiveMode": "Never"}}
    config = write_kubeconfig(tmp_path / "kc", url, user, {"insecure-skip-tls-verify": True})
    assert found_nodes(status(config, monkeypatch)) == {"gpu-a"}
    assert bearer_tokens(api) == {"Bearer token-1"}
    assert not (tmp_path / "kubelogin.runs").exists()


@pytest.mark.parametrize("through_proxy", [False, True], ids=["direct", "proxy-url"])
def test_tls_server_name_is_the_name_the_server_certificate_is_checked_against(
    connect_proxy: tuple[str, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    through_proxy: bool,
) -> None:
    """An API server dialled at an address its certificate does not name (127.0.0.1; the
    certificate names only kubernetes.default.svc, as behind a tunnel or a load balancer):
    with tls-server-name the certificate is checked against that name, which SNI sends, and
    the call goes through, directly or through a proxy-url; without it the check fails and
    no request is sent."""
    cert, key = make_tls_cert(tmp_path, "DNS:kubernetes.default.svc")
    (tmp_path / "token").write_text("token-1\n")
    api = FakeKubeApi(token_path=tmp_path / "token")
    api.nodes["gpu-a"] = {}
    api.pods.append(Pod("gpu-agent", "gpu-agent-a", "gpu-a", dict(SELECTOR)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    server, url = api.serve(cert, key)
    cluster = {"certificate-authority": str(cert)}
    if through_proxy:
        cluster["proxy-url"] = connect_proxy[0]
    try:
        named = {**cluster, "tls-server-name": "kubernetes.default.svc"}
        config = write_kubeconfig(tmp_path / "kc", url, {"token": "token-1"}, named)
        assert found_nodes(status(config, monkeypatch)) == {"gpu-a"}
        assert set(api.server_names) == {"kubernetes.default.svc"}
        seen = len(api.requests)
        config = write_kubeconfig(tmp_path / "kc", url, {"token": "token-1"}, cluster)
        refused = status(config, monkeypatch)
        assert refused.exit_code != 0
        assert "CERTIFICATE_VERIFY_FAILED" in refused.output, refused.output
        assert len(api.requests) == seen
    finally:
        api.close()
        server.shutdown()
        server.server_close()


def test_a_server_behind_a_path_is_called_under_it_and_shown_without_user_info(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rancher hands out kubeconfigs whose server is https://rancher/k8s/clusters/<id>: every
    call went to the host's root (/api/v1/...), which the proxy answers 404, so the fleet was
    unreachable through it. Calls go under the server's path, as kubectl sends them; a user
    and password in the server URL are not shown in an error (nor sent)."""
    _, url = kube_api
    api.prefix = "/k8s/clusters/c-m-4x2"
    token = api.token_path.read_text().strip()
    insecure = {"insecure-skip-tls-verify": True}
    behind = url + api.prefix + "/"
    config = write_kubeconfig(tmp_path / "kubeconfig", behind, {"token": token}, insecure)
    assert found_nodes(status(config, monkeypatch)) == {"gpu-a"}
    assert {r.path.split("?")[0] for r in api.requests} >= {"/api/v1/nodes"}
    secret = url.replace("https://", "https://admin:hunter2@") + "/elsewhere"
    config = write_kubeconfig(tmp_path / "kubeconfig", secret, {"token": token}, insecure)
    result = status(config, monkeypatch)
    assert "hunter2" not in result.output and "admin" not in result.output, result.output
    assert "/elsewhere" in result.output, result.output


def test_a_token_file_with_insecure_skip_tls_verify(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tokenFile (relative to the kubeconfig) and a cluster with no CA but
    insecure-skip-tls-verify, as a kind or dev cluster's kubeconfig."""
    _, url = kube_api
    (tmp_path / "sa-token").write_text("token-1\n")
    config = write_kubeconfig(
        tmp_path / "kc", url, {"tokenFile": "sa-token"}, {"insecure-skip-tls-verify": True}
    )
    assert found_nodes(status(config, monkeypatch)) == {"gpu-a"}
    assert bearer_tokens(api) == {"Bearer token-1"}


@pytest.fixture
def connect_proxy() -> Iterator[tuple[str, list[str]]]:
    """A plain-HTTP CONNECT proxy on 127.0.0.1: (its URL, the targets it tunnelled to)."""
    server = socket.create_server(("127.0.0.1", 0))
    targets: list[str] = []

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    def serve() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                head += client.recv(4096)
            target = head.split()[1].decode()
            targets.append(target)
            host, port = target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", targets
    finally:
        server.close()


def test_a_proxy_url_is_tunnelled_through(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    connect_proxy: tuple[str, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cluster's proxy-url carries every API call (CONNECT), TLS still checked end to end
    against the cluster CA."""
    _, url = kube_api
    proxy, targets = connect_proxy
    cluster = {"certificate-authority": str(tls_cert[0]), "proxy-url": proxy}
    config = write_kubeconfig(tmp_path / "kc", url, {"token": "token-1"}, cluster)
    assert found_nodes(status(config, monkeypatch)) == {"gpu-a"}
    assert targets and set(targets) == {url.removeprefix("https://")}
    assert len(targets) == len(api.requests)


def test_a_proxy_url_s_user_and_password_log_in_to_the_proxy(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``proxy-url: http://USER:PASSWORD@HOST:PORT`` (percent-encoded, as in any URL) logs in to
    a proxy that wants one (tinyproxy with BasicAuth) as kubectl does: its CONNECT carries
    ``Proxy-Authorization: Basic``. Without them, or with a wrong password, the proxy refuses
    the tunnel (407; tinyproxy 1.11 answers 401 to a wrong password), the error names the
    proxy, and no call reaches the API server; the API server never sees the proxy's login;
    no message shows the password."""
    _, url = kube_api
    password = "s3cret.proxy-pass"

    def through(user_info: str) -> Outcome:
        proxy_url = proxy.replace("http://", f"http://{user_info}")
        cluster = {"certificate-authority": str(tls_cert[0]), "proxy-url": proxy_url}
        config = write_kubeconfig(tmp_path / "kc", url, {"token": "token-1"}, cluster)
        return status(config, monkeypatch)

    with tinyproxy(tmp_path, basic_auth=("alice", password)) as (proxy, _):
        for refused in (through(""), through("alice:wrong-pass@")):
            assert refused.exit_code != 0, refused.output
            assert f"through proxy {proxy} " in refused.output, refused.output
            assert re.search(r"Tunnel connection failed: 40[17] ", refused.output), refused.output
            assert api.requests == []
        encoded = password.replace(".", "%2E")  # an encoded character is sent decoded
        assert found_nodes(through(f"alice:{encoded}@")) == {"gpu-a"}
        refused_with_it = through(f"alice:{encoded}x@")
    assert api.requests and not any("Proxy-Authorization" in r.headers for r in api.requests)
    assert re.search(r"Tunnel connection failed: 40[17] ", refused_with_it.output)
    assert "alice" not in refused_with_it.output
    assert password not in refused_with_it.output and encoded not in refused_with_it.output


def _client_cert(directory: Path) -> tuple[Path, Path, Path]:
    """(CA, client certificate, client key), made with the openssl command."""
    ca, ca_key = directory / "client-ca.crt", directory / "client-ca.key"
    cert, key, csr = directory / "me.crt", directory / "me.key", directory / "me.csr"
    subj = ["-subj", "/CN=laptop-user/O=gpu-admins"]
    for args in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(ca_key),
         "-out", str(ca), "-subj", "/CN=client-ca"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), *subj],
        ["x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-days", "1", "-out", str(cert)],
    ):  # fmt: skip
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    return ca, cert, key


def test_a_client_certificate_inline_authenticates(
    tls_cert: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """client-certificate-data and client-key-data (base64, as kind and kubeadm write them),
    certificate-authority-data: the stand-in authenticates the certificate, no token sent."""
    ca, cert, key = _client_cert(tmp_path)
    (tmp_path / "token").write_text("unused-token\n")
    api = FakeKubeApi(token_path=tmp_path / "token", client_ca=ca)
    api.nodes["gpu-a"] = {}
    api.pods.append(Pod("gpu-agent", "gpu-agent-a", "gpu-a", dict(SELECTOR)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    server, url = api.serve(*tls_cert)
    try:
        user = {
            "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(key.read_bytes()).decode(),
        }
        cluster = {
            "certificate-authority-data": base64.b64encode(tls_cert[0].read_bytes()).decode()
        }
        config = write_kubeconfig(tmp_path / "kc", url, user, cluster)
        assert found_nodes(status(config, monkeypatch)) == {"gpu-a"}
        assert bearer_tokens(api) == {""}
    finally:
        api.close()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("user", "cluster", "expected"),
    [
        ({"auth-provider": {"name": "oidc"}}, {}, r"auth-provider plugins .* not supported"),
        ({"token": "t"}, {"proxy-url": "socks5://127.0.0.1:1080"}, r"proxy-url .* not an http://"),
        ({"exec": {"command": "x", "apiVersion": "client.authentication.k8s.io/v1alpha1"}}, {},
         r"exec apiVersion .*client.authentication.k8s.io/v1 or .*v1beta1"),
        ({"exec": {"command": "x", "apiVersion": V1}}, {}, r"exec interactiveMode None"),
        ({"token": "t"}, {"insecure-skip-tls-verify": "yes"}, r"malformed: Expected `bool`"),
        # Basic auth: client-go would send it, an API server since 1.19 never takes it.
        ({"username": "u", "password": "p"}, {},
         r"users\[\]\.user\.username: basic auth is not taken .*1\.19"),
        ({"password": "p"}, {}, r"users\[\]\.user\.password: basic auth"),
        ({"token": "t", "username": "u", "password": "p"}, {},
         r"user\.username: a token and basic auth are two authentication methods"),
        # What client-go's ConfirmUsable and TLSConfigFor refuse: two forms of one thing, a
        # certificate without its key, a CA that insecure-skip-tls-verify would not use.
        ({"client-certificate-data": PEM}, {},
         r"a client certificate without its key: set users\[\]\.user\.client-key "),
        ({"client-certificate-data": PEM, "client-certificate": "me.crt", "client-key-data": PEM},
         {}, r"users\[\]\.user\.client-certificate and client-certificate-data are both set"),
        ({"client-certificate-data": PEM, "client-key": "me.key", "client-key-data": PEM},
         {}, r"users\[\]\.user\.client-key and client-key-data are both set"),
        ({"token": "t"}, {"certificate-authority-data": PEM, "certificate-authority": "ca.crt"},
         r"clusters\[\]\.cluster\.certificate-authority and certificate-authority-data are "
         "both set"),
        ({"token": "t"}, {"insecure-skip-tls-verify": True, "certificate-authority-data": PEM},
         r"insecure-skip-tls-verify and certificate-authority-data are both set: a CA with "
         "insecure-skip-tls-verify is not allowed"),
        ({"token": "t"}, {"insecure-skip-tls-verify": True, "certificate-authority": "ca.crt"},
         r"insecure-skip-tls-verify and certificate-authority are both set"),
        ({"token": "t"}, {"server": ""}, r"clusters\[\]\.cluster\.server '' is missing or empty"),
        ({"token": "t"}, {"tls-server-name": "kubernetes..svc"},
         r"clusters\[\]\.cluster\.tls-server-name 'kubernetes..svc': want a DNS name"),
        ({"token": "t"}, {"tls-server-name": "a" * 60 + ("." + "b" * 60) * 200},
         r"clusters\[\]\.cluster\.tls-server-name 'a+\.b+.*: want a DNS name .*253 at most"),
        # An exec env name no process environment could hold.
        (exec_env("A", ""), {}, r"exec env\[1\]\.name '': want a variable name"),
        (exec_env("AWS=PROFILE"), {}, r"exec env\[0\]\.name 'AWS=PROFILE': want a variable"),
        (exec_env("AWS\0PROFILE"), {}, r"exec env\[0\]\.name 'AWS\\x00PROFILE': want"),
    ],
    ids=["auth-provider", "socks-proxy", "v1alpha1", "v1-without-mode", "wrong-type",
         "basic-auth", "password-only", "token-and-basic-auth", "cert-without-key",
         "cert-data-and-file", "key-data-and-file", "ca-data-and-file",
         "insecure-with-ca-data", "insecure-with-ca-file", "empty-server", "bad-tls-server-name",
         "12-kib-tls-server-name",
         "empty-env-name", "env-name-with-equals", "env-name-with-nul"],
)  # fmt: skip
def test_a_kubeconfig_it_cannot_take_is_refused_naming_the_field(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    user: dict[str, Any],
    cluster: dict[str, Any],
    expected: str,
) -> None:
    _, url = kube_api
    result = status(write_kubeconfig(tmp_path / "kc", url, user, cluster), monkeypatch)
    assert result.exit_code != 0
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert re.search(expected, line), line
    assert str(tmp_path / "kc") in line
    assert api.requests == []


def test_a_plugin_that_must_prompt_without_a_terminal_is_refused_before_it_runs(
    api: FakeKubeApi,
    kube_api: tuple[FakeKubeApi, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """interactiveMode: Always (a device-code login) with no terminal on stdin, as in CI or a
    coordinator: one line, and the plugin never runs (it would wait for input)."""
    _, url = kube_api
    exe = plugin(tmp_path, credential("token-1"), "kubelogin")
    user = {"exec": {"apiVersion": V1, "command": str(exe), "interactiveMode": "Always"}}
    result = status(write_kubeconfig(tmp_path / "kc", url, user), monkeypatch)
    assert "'kubelogin'" in result.output and "needs a terminal" in result.output
    assert not (tmp_path / "kubelogin.runs").exists()
    assert api.requests == []
