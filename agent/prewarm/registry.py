"""Read an image's manifest from its registry over the OCI distribution API.

Pure parts: `parse_reference` (an image reference → where its API lives), `parse_challenges`
(``WWW-Authenticate``), `parse_manifest` and `select_manifest` (an index → the node's platform).
`RegistryClient` does the HTTP: the manifest GET with the Accept types of OCI and Docker v2, the
Basic or Bearer token flow (``WWW-Authenticate: Bearer realm,service,scope``) with credentials
from the Docker config.json CRI pulls use, and the ``Authorization`` header later blob GETs send.

Every URL (registry, token realm, redirects) passes `UrlPolicy`, so host allow/deny lists and the
metadata-address guard apply; plain http only for a loopback registry or one the operator listed
as insecure. No credential or token appears in an error or a log line. Each request's lookup and
connection are held by the ``cancelled`` token of the item it serves, so the item's stop ends a
registry or token service that does not answer.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.client
import ipaddress
import json
import logging
import platform
import re
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

from agent.errors import FieldViolation, InvalidSpec, NotFound, PermissionDenied
from agent.prewarm.cancel import never
from agent.prewarm.docker_auth import DOCKER_HUB, Credentials, credentials_for, registry_host
from agent.prewarm.errors import Cancelled, FetchFailed, transport_error
from agent.prewarm.fetch_http import CancelledFn, direct_connection, request_target
from agent.prewarm.policy import UrlPolicy, redact_url

log = logging.getLogger(__name__)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)

# nydusd (through nydus-snapshotter) reaches Docker Hub at index.docker.io; blob URLs must be the
# ones it requests for Dragonfly task ids to match (prewarm.md §1.4).
DOCKER_HUB_API = "index.docker.io"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
_MAX_REDIRECTS = 5
_TOKEN_LEEWAY_S = 30.0
_DEFAULT_TOKEN_TTL_S = 60.0  # the distribution token spec's default expires_in
_MAX_TOKEN_TTL_S = 24 * 3600.0  # a token is asked again at least daily, whatever it says

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"\w[\w.-]{0,127}")
#: distribution/reference's NameTotalLengthMax, which containerd applies: the name as written,
#: registry included; a whole reference adds at most a tag of 128 and a sha512 digest.
_NAME_MAX = 255
_MAX_REFERENCE = _NAME_MAX + 1 + 128 + 1 + len("sha512:") + 128
# What of a registry's words an error may name: a short, well-formed media type (RFC 6838) or
# platform word; anything else is the registry's bytes, not echoed.
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}")
_PLATFORM_WORD = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
_MACHINE_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}


def node_arch() -> str:
    """This machine's architecture as OCI platforms name it (amd64, arm64, …)."""
    machine = platform.machine().lower()
    return _MACHINE_ARCH.get(machine, machine)


@dataclass(frozen=True, slots=True)
class ImageName:
    """Where an image reference's distribution API lives.

    ``registry`` is the host as the reference names it (``docker.io`` when it names none);
    ``api_host`` is the host[:port] requests go to.
    """

    ref: str
    registry: str
    api_host: str
    repository: str
    tag: str | None
    digest: str | None
    scheme: str = "https"

    @property
    def reference(self) -> str:
        """What the manifest URL ends with: the digest when the reference pins one."""
        return self.digest or self.tag or "latest"

    @property
    def normalized(self) -> str:
        """The fully qualified reference containerd's CRI records (docker.io/library/x:tag)."""
        tag = self.tag or (None if self.digest else "latest")
        tail = f":{tag}" if tag else ""
        tail += f"@{self.digest}" if self.digest else ""
        return f"{self.registry}/{self.repository}{tail}"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.api_host}/v2/{self.repository}"

    def manifest_url(self, reference: str | None = None) -> str:
        return f"{self.base_url}/manifests/{reference or self.reference}"

    def blob_url(self, digest: str) -> str:
        """``<scheme>://<host>/v2/<repo>/blobs/<digest>``: what nydusd's registry backend GETs."""
        return f"{self.base_url}/blobs/{digest}"


def parse_reference(ref: str, insecure: Sequence[str] = ()) -> ImageName:
    """Split an image reference; ``insecure`` are registries (host or host:port globs) on http."""
    bad = [FieldViolation("image", "e.g. registry.example.com/team/server:1.4 or …@sha256:<hex>")]
    if len(ref) > _MAX_REFERENCE:  # before any refusal repeats it
        raise InvalidSpec(_too_long(len(ref)), bad)
    rest, at, digest = ref.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise InvalidSpec(f"image reference {ref!r} has a malformed digest", bad)
    registry = registry_host(rest)
    path = rest[len(registry) + 1 :] if rest.startswith(f"{registry}/") else rest
    name, colon, tag = path.rpartition(":")
    if not colon or "/" in tag:
        name, tag = path, ""
    if colon and tag and not _TAG.fullmatch(tag):
        raise InvalidSpec(f"image reference {ref!r} has a malformed tag", bad)
    written = len(rest) - (len(tag) + 1 if tag else 0)  # the name as given, registry included
    if written > _NAME_MAX:
        raise InvalidSpec(_too_long(written), bad)
    if registry == DOCKER_HUB and "/" not in name:
        name = f"library/{name}"
    if not _REPOSITORY.fullmatch(name):
        raise InvalidSpec(f"image reference {ref!r} has a malformed repository name", bad)
    api_host = DOCKER_HUB_API if registry == DOCKER_HUB else registry
    scheme = "http" if is_insecure(api_host, insecure) else "https"
    return ImageName(ref, registry, api_host, name, tag or None, digest or None, scheme)


def _too_long(chars: int) -> str:
    return (
        f"image reference of {chars} characters: a name (registry and repository) takes at most "
        f"{_NAME_MAX}, a tag 128"
    )


def is_insecure(host_port: str, insecure: Sequence[str]) -> bool:
    """Loopback registries and the ones listed are reached over plain http (as containerd does
    with a hosts.toml ``server = "http://…"``)."""
    host = urlsplit(f"//{host_port}").hostname or ""
    if host == "localhost":
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    return any(fnmatchcase(host_port, p) or fnmatchcase(host, p) for p in insecure)


@dataclass(frozen=True, slots=True)
class Challenge:
    """One ``WWW-Authenticate`` challenge: scheme (lower case) and its parameters."""

    scheme: str
    params: Mapping[str, str] = field(default_factory=dict)


_TOKEN_CHARS = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_SCHEME = re.compile(rf"({_TOKEN_CHARS})(?:[ \t]+|$)")
_PARAM = re.compile(
    rf"[ \t]*({_TOKEN_CHARS})[ \t]*=[ \t]*(?:\"((?:[^\"\\]|\\.)*)\"|({_TOKEN_CHARS}))[ \t]*(?:,|$)"
)
_SEPARATORS = re.compile(r"[\s,]*")


def parse_challenges(header: str) -> list[Challenge]:
    """Parse ``WWW-Authenticate`` (RFC 7235): ``Bearer realm="…",service="…",scope="…"``.

    Several challenges may share one header; quoted values may hold commas and escapes.
    Anything unparsable ends the list (what was read so far is returned).
    """
    out: list[Challenge] = []
    pos = 0
    while True:
        separators = _SEPARATORS.match(header, pos)
        pos = separators.end() if separators else pos
        if pos >= len(header):
            return out
        scheme = _SCHEME.match(header, pos)
        if scheme is None:
            return out
        pos = scheme.end()
        params: dict[str, str] = {}
        while (param := _PARAM.match(header, pos)) is not None:
            quoted, bare = param[2], param[3]
            value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
            params[param[1].lower()] = value
            pos = param.end()
        out.append(Challenge(scheme[1].lower(), params))


@dataclass(frozen=True, slots=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    platform: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Manifest:
    """An image manifest (not an index): its digest, config and layers in order."""

    media_type: str
    digest: str
    config: Descriptor | None
    layers: tuple[Descriptor, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Index:
    media_type: str
    digest: str
    manifests: tuple[Descriptor, ...]


def _descriptor(data: Any, where: str) -> Descriptor:
    if not isinstance(data, dict):
        raise FetchFailed(f"{where}: a descriptor is not an object")
    digest, size = data.get("digest"), data.get("size")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise FetchFailed(f"{where}: a descriptor digest is not sha256/sha512 hex")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise FetchFailed(f"{where}: descriptor {digest} has no valid size")
    annotations = data.get("annotations") or {}
    plat = data.get("platform") or {}
    if not isinstance(annotations, dict) or not isinstance(plat, dict):
        raise FetchFailed(f"{where}: descriptor {digest} has malformed annotations or platform")
    return Descriptor(
        str(data.get("mediaType", "")),
        digest,
        size,
        {str(k): str(v) for k, v in annotations.items()},
        plat,
    )


def parse_manifest(body: bytes, content_type: str, digest: str) -> Manifest | Index:
    """An image manifest or an index from its JSON; the body's mediaType wins over the header."""
    where = f"manifest {digest}"
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise FetchFailed(f"{where} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FetchFailed(f"{where} is not a JSON object")
    media_type = str(data.get("mediaType") or content_type.split(";", 1)[0].strip())
    if media_type in INDEX_TYPES or (media_type not in MANIFEST_TYPES and "manifests" in data):
        entries = data.get("manifests")
        if not isinstance(entries, list):
            raise FetchFailed(f"{where}: an index without a manifests list")
        return Index(media_type, digest, tuple(_descriptor(m, where) for m in entries))
    if media_type not in (OCI_MANIFEST, DOCKER_MANIFEST) and "layers" not in data:
        shown = repr(media_type) if _MEDIA_TYPE.fullmatch(media_type) else "(not shown)"
        raise FetchFailed(
            f"{where}: unsupported media type {shown} (want one of {', '.join(MANIFEST_TYPES)})"
        )
    layers = data.get("layers")
    if not isinstance(layers, list):
        raise FetchFailed(f"{where}: no layers list")
    config = data.get("config")
    annotations = data.get("annotations") or {}
    return Manifest(
        media_type,
        digest,
        _descriptor(config, where) if config is not None else None,
        tuple(_descriptor(layer, where) for layer in layers),
        {str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {},
    )


def _word(value: Any) -> str:
    """A platform word of a registry's index as an error may name it ("?" when malformed)."""
    return value if isinstance(value, str) and _PLATFORM_WORD.fullmatch(value) else "?"


def select_manifest(
    index: Index, arch: str, os_name: str = "linux", prefer_features: Sequence[str] = ()
) -> Descriptor:
    """The index entry for ``os_name/arch``; among several, those whose ``platform.os.features``
    include any of ``prefer_features`` first, else those without them (index order otherwise)."""
    matching = [
        m
        for m in index.manifests
        if m.platform.get("os") == os_name and m.platform.get("architecture") == arch
    ]
    if not matching:
        have = sorted(
            {
                f"{_word(m.platform.get('os'))}/{_word(m.platform.get('architecture'))}"
                for m in index.manifests
            }
        )
        raise NotFound(
            f"index {index.digest} has no {os_name}/{arch} manifest (it has: {', '.join(have)})"
        )

    def featured(m: Descriptor) -> bool:
        features = m.platform.get("os.features") or ()
        return any(f in features for f in prefer_features)

    wanted = [m for m in matching if featured(m)]
    others = [m for m in matching if not featured(m)]
    return (wanted + others)[0] if prefer_features else (others + wanted)[0]


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    url: str


@dataclass
class _Token:
    header: str = field(repr=False)
    expires: float


class RegistryClient:
    """Manifests and blob-request credentials for images, per registry and repository."""

    def __init__(
        self,
        policy: UrlPolicy,
        docker_config: Path | None = None,
        insecure: Sequence[str] = (),
        arch: str | None = None,
        timeout_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._docker_config = docker_config
        self._insecure = tuple(insecure)
        self.arch = arch or node_arch()
        self._timeout = timeout_s
        self._ssl = ssl_context or ssl.create_default_context()
        self._clock = clock
        self._challenges: dict[str, Challenge] = {}
        self._tokens: dict[tuple[str, str], _Token] = {}

    def name(self, ref: str) -> ImageName:
        return parse_reference(ref, self._insecure)

    def policy_for(self, url: str) -> UrlPolicy:
        """The policy with plain http allowed for this URL's host when it is insecure."""
        host = urlsplit(url).hostname or ""
        netloc = urlsplit(url).netloc.rpartition("@")[2]
        if is_insecure(netloc, self._insecure):
            return dataclasses.replace(self._policy, http_hosts=(*self._policy.http_hosts, host))
        return self._policy

    # -- manifests ----------------------------------------------------------------------------

    def manifest(
        self,
        name: ImageName,
        prefer_features: Sequence[str] = (),
        *,
        cancelled: CancelledFn = never,
    ) -> tuple[Manifest, Index | None]:
        """The image manifest for this node's platform, and the index it was chosen from."""
        first = self._get_manifest(name, name.reference, cancelled)
        if isinstance(first, Manifest):
            return first, None
        chosen = select_manifest(first, self.arch, prefer_features=prefer_features)
        second = self._get_manifest(name, chosen.digest, cancelled)
        if not isinstance(second, Manifest):
            raise FetchFailed(f"index entry {chosen.digest} of {name.ref} is itself an index")
        return second, first

    def _get_manifest(
        self, name: ImageName, reference: str, cancelled: CancelledFn
    ) -> Manifest | Index:
        url = name.manifest_url(reference)
        accept = {"Accept": ", ".join(MANIFEST_TYPES)}
        resp = self._get(name, url, accept, MAX_MANIFEST_BYTES, cancelled)
        if resp.status == 404:
            raise NotFound(f"manifest {reference} of {name.repository} not found at {url}")
        if resp.status != 200:
            raise FetchFailed(f"registry answered HTTP {resp.status} for {redact_url(url)}")
        pinned = _DIGEST.fullmatch(reference) is not None
        algorithm = reference.split(":", 1)[0] if pinned else "sha256"
        digest = f"{algorithm}:{hashlib.new(algorithm, resp.body).hexdigest()}"
        if pinned and digest != reference:
            raise FetchFailed(f"manifest {reference} of {name.ref}: the bytes hash to {digest}")
        return parse_manifest(resp.body, resp.headers.get("content-type", ""), digest)

    # -- auth ---------------------------------------------------------------------------------

    def authorization(self, name: ImageName, *, cancelled: CancelledFn = never) -> dict[str, str]:
        """``Authorization`` for a request to this repository, from the last challenge seen
        there (a fresh token when the cached one is about to expire); {} when anonymous."""
        key = (name.api_host, name.repository)
        token = self._tokens.get(key)
        if token is not None and token.expires - _TOKEN_LEEWAY_S > self._clock():
            return {"Authorization": token.header}
        challenge = self._challenges.get(name.api_host)
        if challenge is None:
            return {}
        return {"Authorization": self._authorize(name, challenge, cancelled).header}

    def _get(
        self,
        name: ImageName,
        url: str,
        headers: Mapping[str, str],
        max_bytes: int,
        cancelled: CancelledFn,
    ) -> _Response:
        """GET with this repository's credentials; a 401 answers its challenge and retries once."""
        auth = self.authorization(name, cancelled=cancelled)
        resp = self._request("GET", url, {**headers, **auth}, None, max_bytes, cancelled)
        if resp.status != 401:
            return resp
        challenges = parse_challenges(resp.headers.get("www-authenticate", ""))
        usable = [c for c in challenges if c.scheme in ("bearer", "basic")]
        if not usable:
            raise PermissionDenied(
                f"registry {name.api_host} answered 401 without a Basic or Bearer challenge"
            )
        challenge = sorted(usable, key=lambda c: c.scheme != "bearer")[0]
        self._challenges[name.api_host] = challenge
        self._tokens.pop((name.api_host, name.repository), None)
        auth = {"Authorization": self._authorize(name, challenge, cancelled).header}
        resp = self._request("GET", url, {**headers, **auth}, None, max_bytes, cancelled)
        if resp.status == 401:
            raise PermissionDenied(
                f"registry {name.api_host} refused the credentials for {name.repository} "
                f"(prewarm.docker_config)"
            )
        return resp

    def _credentials(self, name: ImageName) -> Credentials | None:
        return credentials_for(name.ref, self._docker_config)

    def _authorize(self, name: ImageName, challenge: Challenge, cancelled: CancelledFn) -> _Token:
        creds = self._credentials(name)
        key = (name.api_host, name.repository)
        if challenge.scheme == "basic":
            if creds is None or not creds.username:
                raise PermissionDenied(
                    f"registry {name.api_host} asks for basic auth and prewarm.docker_config "
                    f"has no credentials for {name.registry}"
                )
            raw = f"{creds.username}:{creds.password}".encode()
            token = _Token(f"Basic {base64.b64encode(raw).decode()}", float("inf"))
        elif creds is not None and creds.registry_token:
            token = _Token(f"Bearer {creds.registry_token}", float("inf"))
        else:
            token = self._fetch_token(name, challenge, creds, cancelled)
        self._tokens[key] = token
        return token

    def _fetch_token(
        self,
        name: ImageName,
        challenge: Challenge,
        creds: Credentials | None,
        cancelled: CancelledFn,
    ) -> _Token:
        realm = challenge.params.get("realm")
        if not realm:
            raise PermissionDenied(f"registry {name.api_host}: Bearer challenge without a realm")
        query = {"scope": f"repository:{name.repository}:pull"}
        if challenge.params.get("service"):
            query["service"] = challenge.params["service"]
        started = self._clock()
        if creds is not None and creds.identity_token:
            # OAuth2 refresh-token grant, as docker does with an identity token.
            body = urlencode(
                {
                    **query,
                    "grant_type": "refresh_token",
                    "refresh_token": creds.identity_token,
                    "client_id": "gpu-agent",
                }
            ).encode()
            headers = {"Content-Type": "application/x-www-form-urlencoded"}
            resp = self._request("POST", realm, headers, body, 1024 * 1024, cancelled)
        else:
            headers = {}
            if creds is not None and creds.username:
                raw = f"{creds.username}:{creds.password}".encode()
                headers["Authorization"] = f"Basic {base64.b64encode(raw).decode()}"
            sep = "&" if urlsplit(realm).query else "?"
            url = f"{realm}{sep}{urlencode(query)}"
            resp = self._request("GET", url, headers, None, 1 << 20, cancelled)
        if resp.status in (401, 403):
            raise PermissionDenied(
                f"token service {redact_url(realm)} refused pull access to {name.repository} "
                f"({resp.status}; check prewarm.docker_config)"
            )
        if resp.status != 200:
            raise FetchFailed(f"token service {redact_url(realm)} answered HTTP {resp.status}")
        try:
            data = json.loads(resp.body)
            value = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError, TypeError):
            value, data = None, {}
        if not isinstance(value, str) or not value:
            raise FetchFailed(f"token service {redact_url(realm)} answered without a token")
        return _Token(f"Bearer {value}", started + _lifetime(data.get("expires_in")))

    # -- transport ----------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        max_bytes: int,
        cancelled: CancelledFn,
    ) -> _Response:
        """One request, following redirects (checked by the policy; headers kept only on the
        origin named first, and a body, the token POST's credentials, never sent elsewhere),
        reading at most ``max_bytes`` of the body."""
        origin, first = _origin(url), url
        current = dict(headers)
        for _ in range(_MAX_REDIRECTS + 1):
            target = self.policy_for(url).check(url, field="image", cancelled=cancelled)
            conn = direct_connection(target, self._timeout, self._ssl, cancelled)
            parts = urlsplit(url)
            path = request_target((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
            try:
                conn.request(
                    method, path, body=body, headers={"User-Agent": "gpu-agent-prewarm", **current}
                )
                resp = conn.getresponse()
                location = resp.getheader("Location")
                if resp.status in (301, 302, 303, 307, 308) and location:
                    resp.read(64 * 1024)
                    url = urljoin(url, location)
                    if resp.status == 303:
                        method, body = "GET", None
                    if _origin(url) != origin:
                        if body is not None:  # 301, 302, 307, 308 resend it: a refresh token
                            raise FetchFailed(
                                f"{redact_url(first)} redirected a request with credentials to "
                                f"another origin ({redact_url(url)}); not followed"
                            )
                        current = {k: v for k, v in current.items() if k.lower() != "authorization"}
                    continue
                data = resp.read(max_bytes + 1)
                if len(data) > max_bytes:
                    raise FetchFailed(f"{redact_url(url)} answered more than {max_bytes} bytes")
                return _Response(
                    resp.status,
                    resp.reason,
                    {k.lower(): v for k, v in resp.getheaders()},
                    data,
                    url,
                )
            except (OSError, http.client.HTTPException) as exc:
                if cancelled():  # the item's stop interrupted the wait
                    raise Cancelled("cancelled") from None
                raise FetchFailed(
                    f"registry request to {redact_url(url)} failed: {transport_error(exc)}"
                ) from None
            finally:
                conn.close()
        raise FetchFailed(f"more than {_MAX_REDIRECTS} redirects from {redact_url(url)}")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def _lifetime(expires_in: object) -> float:
    """A token's seconds: the spec's default where the answer has none or a nonsense one
    (negative, NaN), at most a day where it says more (an endless token is asked again)."""
    try:
        ttl = float(expires_in or _DEFAULT_TOKEN_TTL_S)  # type: ignore[arg-type]
    except (ValueError, TypeError, OverflowError):
        return _DEFAULT_TOKEN_TTL_S
    return min(ttl, _MAX_TOKEN_TTL_S) if ttl > 0 else _DEFAULT_TOKEN_TTL_S
