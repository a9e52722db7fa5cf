"""Image references, WWW-Authenticate challenges, and the registry auth flows against a real
HTTP server on a local socket (a registry that demands a Bearer token, or Basic auth)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from agent.errors import InvalidSpec, NotFound, PermissionDenied
from agent.prewarm.errors import FetchFailed
from agent.prewarm.fetch_http import HttpFetcher, no_progress
from agent.prewarm.image_warm import NydusWarmer
from agent.prewarm.nydus import BLOB_MEDIA_TYPE
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.registry import (
    OCI_INDEX,
    OCI_MANIFEST,
    Challenge,
    Descriptor,
    Index,
    Manifest,
    RegistryClient,
    parse_challenges,
    parse_manifest,
    parse_reference,
    select_manifest,
)
from tests.integration.prewarm_fixtures.agent import LOOPBACK

MANIFEST = json.dumps(
    {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "c", "digest": "sha256:" + "0" * 64, "size": 2},
        "layers": [{"mediaType": "l", "digest": "sha256:" + "1" * 64, "size": 3}],
    }
).encode()
MANIFEST_DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


def test_references_name_the_api_host_repository_and_reference() -> None:
    hub = parse_reference("nginx")
    assert (hub.registry, hub.api_host, hub.repository, hub.reference) == (
        "docker.io",
        "index.docker.io",  # the host nydusd's registry backend uses for Docker Hub
        "library/nginx",
        "latest",
    )
    assert hub.normalized == "docker.io/library/nginx:latest"  # as CRI records it
    assert hub.scheme == "https"
    local = parse_reference("localhost:5000/team/model:v1.2")
    assert (local.api_host, local.repository, local.tag, local.scheme) == (
        "localhost:5000",
        "team/model",
        "v1.2",
        "http",  # loopback registries are reached over http
    )
    assert local.blob_url("sha256:ab") == "http://localhost:5000/v2/team/model/blobs/sha256:ab"
    pinned = parse_reference(f"reg.io:443/x/y:1@{MANIFEST_DIGEST}")
    assert pinned.reference == MANIFEST_DIGEST and pinned.tag == "1"
    assert pinned.normalized == f"reg.io:443/x/y:1@{MANIFEST_DIGEST}"
    assert parse_reference("reg.io/x", insecure=["reg.io"]).scheme == "http"
    assert parse_reference("reg.io:5000/x", insecure=["*.internal"]).scheme == "https"
    for bad in ("reg.io/UPPER:1", "reg.io/x@sha256:short", "reg.io/x:bad tag", "reg.io/"):
        with pytest.raises(InvalidSpec):
            parse_reference(bad)


def test_challenges_parse_quoted_values_escapes_and_several_schemes() -> None:
    header = (
        'Bearer realm="https://auth.example.com/token",service="registry.example.com",'
        'scope="repository:team/a:pull,push", Basic realm="say \\"hi\\""'
    )
    assert parse_challenges(header) == [
        Challenge(
            "bearer",
            {
                "realm": "https://auth.example.com/token",
                "service": "registry.example.com",
                "scope": "repository:team/a:pull,push",
            },
        ),
        Challenge("basic", {"realm": 'say "hi"'}),
    ]
    assert parse_challenges("Basic realm=registry") == [Challenge("basic", {"realm": "registry"})]
    assert parse_challenges("") == []


@dataclass
class Seen:
    path: str
    authorization: str | None


@dataclass
class FakeRegistry:
    """A registry demanding a token from its own /token realm (or Basic auth) for pulls."""

    scheme: str = "bearer"
    users: dict[str, str] = field(default_factory=lambda: {"puller": "s3cret"})
    expires_in: int = 300
    #: where its challenge sends clients for a token ("": its own /token)
    realm: str = ""
    #: a token a token service at ``realm`` issues, accepted besides its own
    outside_token: str = ""
    seen: list[Seen] = field(default_factory=list)
    tokens_issued: int = 0

    def __post_init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_GET(self) -> None:
                fake._serve(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _basic_ok(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return self.users.get(user) == password

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
        h.send_response(status)
        for key, value in headers.items():
            h.send_header(key.replace("_", "-"), value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        auth = h.headers.get("Authorization")
        self.seen.append(Seen(url.path, auth))
        if url.path == "/token":
            query = parse_qs(url.query)
            if not self._basic_ok(auth) or query.get("scope") != ["repository:team/app:pull"]:
                self._send(h, 401, b"{}")
                return
            self.tokens_issued += 1
            token = f"tok-{self.tokens_issued}"
            body = json.dumps({"token": token, "expires_in": self.expires_in}).encode()
            self._send(h, 200, body, Content_Type="application/json")
            return
        if self.scheme == "bearer":
            ok = auth == f"Bearer tok-{self.tokens_issued}" and self.tokens_issued > 0
            ok = ok or (bool(self.outside_token) and auth == f"Bearer {self.outside_token}")
            challenge = (
                f'Bearer realm="{self.realm or f"http://{self.host}/token"}",service="fake",'
                'scope="repository:team/app:pull"'
            )
        else:
            ok = self._basic_ok(auth)
            challenge = 'Basic realm="fake"'
        if not ok:
            self._send(h, 401, b'{"errors":[]}', WWW_Authenticate=challenge)
            return
        self._send(h, 200, MANIFEST, Content_Type=OCI_MANIFEST)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    fake = FakeRegistry()
    yield fake
    fake.close()


def docker_config(tmp_path: Path, host: str, user: str, password: str) -> Path:
    path = tmp_path / "config.json"
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return path


def test_bearer_flow_gets_a_token_with_docker_config_credentials_and_reuses_it(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    now = [1000.0]
    client = RegistryClient(
        UrlPolicy(egress_allow=LOOPBACK),
        docker_config(tmp_path, registry.host, "puller", "s3cret"),
        clock=lambda: now[0],
    )
    name = client.name(f"{registry.host}/team/app:v1")
    manifest, index = client.manifest(name)
    assert isinstance(manifest, Manifest) and index is None
    assert manifest.digest == MANIFEST_DIGEST
    assert [s.path for s in registry.seen] == [
        "/v2/team/app/manifests/v1",  # anonymous: 401 + challenge
        "/token",  # Basic credentials from the docker config
        "/v2/team/app/manifests/v1",  # with the token
    ]
    assert registry.seen[-1].authorization == "Bearer tok-1"
    # Blob requests reuse it while it is valid, and get a fresh one before it expires.
    assert client.authorization(name) == {"Authorization": "Bearer tok-1"}
    now[0] += registry.expires_in - 10
    assert client.authorization(name) == {"Authorization": "Bearer tok-2"}


@pytest.mark.parametrize("expires_in", [float("inf"), float("nan"), 10**400, -5])
def test_a_token_lifetime_past_reason_is_held_within_a_day(
    tmp_path: Path, registry: FakeRegistry, expires_in: float
) -> None:
    """An endless, NaN, overflowing or negative ``expires_in`` neither keeps a token for ever
    nor fails the pull: the token is asked again within a day at the latest."""
    registry.expires_in = expires_in  # type: ignore[assignment]
    now = [1000.0]
    client = RegistryClient(
        UrlPolicy(egress_allow=LOOPBACK),
        docker_config(tmp_path, registry.host, "puller", "s3cret"),
        clock=lambda: now[0],
    )
    name = client.name(f"{registry.host}/team/app:v1")
    client.manifest(name)  # the challenge, then the token
    assert client.authorization(name) == {"Authorization": "Bearer tok-1"}
    now[0] += 24 * 3600
    assert client.authorization(name) == {"Authorization": "Bearer tok-2"}


def test_refused_credentials_are_a_permission_error_without_the_secret(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    client = RegistryClient(
        UrlPolicy(egress_allow=LOOPBACK),
        docker_config(tmp_path, registry.host, "puller", "wrong-pw"),
    )
    with pytest.raises(PermissionDenied) as err:
        client.manifest(client.name(f"{registry.host}/team/app:v1"))
    assert "refused pull access to team/app" in str(err.value)
    assert "wrong-pw" not in str(err.value)
    anonymous = RegistryClient(UrlPolicy(egress_allow=LOOPBACK))
    with pytest.raises(PermissionDenied):
        anonymous.manifest(anonymous.name(f"{registry.host}/team/app:v1"))


def test_basic_challenge_sends_basic_credentials(tmp_path: Path) -> None:
    fake = FakeRegistry(scheme="basic")
    try:
        client = RegistryClient(
            UrlPolicy(egress_allow=LOOPBACK), docker_config(tmp_path, fake.host, "puller", "s3cret")
        )
        name = client.name(f"{fake.host}/team/app:v1")
        assert client.manifest(name)[0].digest == MANIFEST_DIGEST
        expected = "Basic " + base64.b64encode(b"puller:s3cret").decode()
        assert fake.seen[-1].authorization == expected
        assert client.authorization(name) == {"Authorization": expected}
    finally:
        fake.close()


def test_a_pinned_digest_must_match_the_bytes(registry: FakeRegistry, tmp_path: Path) -> None:
    client = RegistryClient(
        UrlPolicy(egress_allow=LOOPBACK), docker_config(tmp_path, registry.host, "puller", "s3cret")
    )
    assert client.manifest(client.name(f"{registry.host}/team/app@{MANIFEST_DIGEST}"))
    other = "sha256:" + "f" * 64
    with pytest.raises(FetchFailed, match="the bytes hash to"):
        client.manifest(client.name(f"{registry.host}/team/app@{other}"))


def test_the_url_policy_still_applies_to_registries(registry: FakeRegistry) -> None:
    denied = RegistryClient(UrlPolicy(denied_hosts=("127.0.0.0/8",)))
    with pytest.raises(PermissionDenied, match="denied"):
        denied.manifest(denied.name(f"{registry.host}/team/app:v1"))
    assert registry.seen == []
    # Not loopback and not listed as insecure: https only, even with allow_http off or on.
    client = RegistryClient(UrlPolicy(egress_allow=LOOPBACK))
    assert client.name("registry.example.com/x:1").scheme == "https"


def test_a_registry_s_media_type_or_platform_words_are_echoed_only_when_well_formed() -> None:
    """A manifest of an unsupported media type failed as "unsupported media type '<the
    registry's mediaType string>'", and an index without the node's platform listed every
    entry's os/architecture as the registry wrote them: the registry's bytes, unbounded, went
    into the item's `warmth_error` (shown by `prewarm list -o json`) and the log. Only a short,
    well-formed media type or platform word is named now."""
    digest = "sha256:" + "0" * 64
    hostile = "application/x-" + "s3cr3t" * 2000 + "\x1b[31m"
    for media_type in (hostile, "text/plain\r\nX-Injected: 1"):
        body = json.dumps({"mediaType": media_type}).encode()
        with pytest.raises(FetchFailed) as err:
            parse_manifest(body, "", digest)
        assert "s3cr3t" not in str(err.value) and "Injected" not in str(err.value), err.value
        assert len(str(err.value)) < 400 and "unsupported media type" in str(err.value)
    old = "application/vnd.docker.distribution.manifest.v1+prettyjws"
    with pytest.raises(FetchFailed, match=re.escape(repr(old))):
        parse_manifest(json.dumps({"mediaType": old}).encode(), "", digest)
    entries = tuple(
        Descriptor(OCI_MANIFEST, digest, 1, {}, {"os": "linux", "architecture": arch})
        for arch in ("arm64", "s3cr3t" * 100, "x\x1b[2J")
    )
    with pytest.raises(NotFound) as err:
        select_manifest(Index(OCI_INDEX, digest, entries), "amd64")
    assert "linux/arm64" in str(err.value) and "s3cr3t" not in str(err.value), err.value
    assert "\x1b" not in str(err.value)


REFRESH = "refresh-s3cret-of-the-node"


@dataclass
class Heard:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Origin:
    """A local HTTP origin that keeps every request it hears and answers it with ``answer``."""

    def __init__(self, answer: Callable[[Heard], tuple[int, dict[str, str], bytes]]) -> None:
        self.heard: list[Heard] = []
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                heard = Heard(self.command, self.path, dict(self.headers), self.rfile.read(length))
                origin.heard.append(heard)
                status, headers, body = answer(heard)
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _issue(heard: Heard) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"access_token": "outside-tok", "expires_in": 300}).encode()
    return 200, {"Content-Type": "application/json"}, body


def identity_config(tmp_path: Path, host: str) -> Path:
    """A docker config whose entry for ``host`` is an OAuth2 refresh token (docker login to a
    registry with an identity provider), which the token flow POSTs in the form body."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"auths": {host: {"username": "<token>", "identitytoken": REFRESH}}})
    )
    return path


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_token_service_redirecting_the_refresh_token_post_elsewhere_never_hands_it_over(
    tmp_path: Path, status: int
) -> None:
    """The refresh-token POST followed a redirect with its body, so a token service (or
    whoever answers for its realm) could send the node's refresh token to any origin it
    named. A redirect that would carry the credential to another origin is refused now."""
    thief = Origin(_issue)
    realm = Origin(lambda heard: (status, {"Location": f"{thief.url}/token"}, b""))
    registry = FakeRegistry(realm=f"{realm.url}/token", outside_token="outside-tok")
    try:
        client = RegistryClient(
            UrlPolicy(egress_allow=LOOPBACK), identity_config(tmp_path, registry.host)
        )
        with pytest.raises(FetchFailed) as err:
            client.manifest(client.name(f"{registry.host}/team/app:v1"))
        assert thief.heard == []
        assert [h.method for h in realm.heard] == ["POST"]
        assert REFRESH.encode() in realm.heard[0].body  # what the realm was trusted with
        assert REFRESH not in str(err.value)
        assert "another origin" in str(err.value), err.value
    finally:
        for server in (thief, realm, registry):
            server.close()


def test_a_token_service_moving_its_endpoint_within_its_origin_still_issues_the_token(
    tmp_path: Path,
) -> None:
    """A token service may redirect to another path of its own origin: the POST is sent there
    with its body, and the pull goes on with the token it issues."""

    def answer(heard: Heard) -> tuple[int, dict[str, str], bytes]:
        if heard.path == "/token":
            return 307, {"Location": "/v2/token"}, b""
        return _issue(heard)

    realm = Origin(answer)
    registry = FakeRegistry(realm=f"{realm.url}/token", outside_token="outside-tok")
    try:
        client = RegistryClient(
            UrlPolicy(egress_allow=LOOPBACK), identity_config(tmp_path, registry.host)
        )
        manifest, _ = client.manifest(client.name(f"{registry.host}/team/app:v1"))
        assert manifest.digest == MANIFEST_DIGEST
        assert [(h.method, h.path) for h in realm.heard] == [
            ("POST", "/token"),
            ("POST", "/v2/token"),
        ]
        form = parse_qs(realm.heard[1].body.decode())
        assert form["refresh_token"] == [REFRESH] and form["grant_type"] == ["refresh_token"]
        assert registry.seen[-1].authorization == "Bearer outside-tok"
    finally:
        realm.close()
        registry.close()


def test_a_registry_redirecting_its_manifest_and_blob_gets_elsewhere_keeps_the_credentials_home(
    tmp_path: Path,
) -> None:
    """A registry that sends its manifest and blob GETs to a CDN (S3, a mirror) is asked with
    the node's credentials; the CDN, another origin, never sees them."""
    blob = b"nydus data blob"
    blob_digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    layer = {"mediaType": BLOB_MEDIA_TYPE, "digest": blob_digest, "size": len(blob)}
    manifest = json.dumps({**json.loads(MANIFEST), "layers": [layer]}).encode()
    cdn = Origin(
        lambda heard: (
            (200, {"Content-Type": OCI_MANIFEST}, manifest)
            if heard.path == "/manifest"
            else (200, {}, blob)
        )
    )

    def registry_answer(heard: Heard) -> tuple[int, dict[str, str], bytes]:
        if "Authorization" not in heard.headers:
            return 401, {"WWW-Authenticate": 'Basic realm="registry"'}, b""
        to = "/manifest" if "/manifests/" in heard.path else "/blob"
        return 307, {"Location": f"{cdn.url}{to}"}, b""

    registry = Origin(registry_answer)
    host = urlsplit(registry.url).netloc
    try:
        client = RegistryClient(
            UrlPolicy(egress_allow=LOOPBACK), docker_config(tmp_path, host, "puller", "s3cret")
        )
        fetcher = lambda policy: HttpFetcher(policy, backoff_s=0.01, timeout_s=10)  # noqa: E731
        warmed = NydusWarmer(client, fetcher).warm(
            f"{host}/team/app:v1", None, no_progress, lambda: False
        )
        assert warmed.warmth.blobs_warm == 1, warmed
        basic = "Basic " + base64.b64encode(b"puller:s3cret").decode()
        asked = [(h.path, h.headers.get("Authorization")) for h in registry.heard]
        assert ("/v2/team/app/manifests/v1", basic) in asked
        assert (f"/v2/team/app/blobs/{blob_digest}", basic) in asked
        assert [h.path for h in cdn.heard] == ["/manifest", "/blob"]
        for heard in cdn.heard:
            assert "authorization" not in {k.lower() for k in heard.headers}, heard
    finally:
        cdn.close()
        registry.close()
