"""Protection of /metrics, read from a Prometheus exporter-toolkit web config file.

The file format is exporter-toolkit's (``--web.config.file`` of node_exporter and friends), so
one file serves every exporter of a node. Supported::

    tls_server_config:
      cert_file: server.crt         # paths relative to this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
      client_ca_file: ca.crt
      min_version: TLS12            # TLS10 ... TLS13; default TLS12
      max_version: TLS13
    basic_auth_users:
      prometheus: $2b$12$...        # bcrypt hashes (htpasswd -nBC 12 "" | tr -d ':\\n')

Keys exporter-toolkit knows but the agent does not implement (inline ``cert``/``key``/
``client_ca``, cipher and curve lists, ``client_allowed_sans``, ``http_server_config``,
``rate_limit``) and the client auth types that accept unverified certificates
(``RequestClientCert``, ``RequireAnyClientCert``) are refused by name, never ignored. Unknown
keys are refused as exporter-toolkit's strict parsing refuses them.

The certificate files are re-read when they change (checked on each handshake), as
exporter-toolkit reads them per handshake. Health routes are never guarded: with
``RequireAndVerifyClientCert`` the handshake asks for a certificate but lets probes through,
and /metrics then refuses a client without one (403).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import re
import ssl
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent import safeyaml
from agent.errors import FieldViolation, InvalidSpec
from agent.filestamp import stamp_files
from agent.http import Handler, HttpServer, Request, Response

log = logging.getLogger(__name__)

__all__ = [
    "MetricsGuard",
    "ReloadingTls",
    "TlsServerConfig",
    "WebConfig",
    "load_web_config",
    "metrics_server",
]

_MAX_FILE_BYTES = 64 * 1024
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_VERIFYING = ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
_AUTH_TYPES = ("NoClientCert", *_VERIFYING)
_UNSUPPORTED_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file")
_TLS_VERSION_KEYS = ("min_version", "max_version")
_TLS_UNSUPPORTED = (
    "cert",
    "key",
    "client_ca",
    "cipher_suites",
    "curve_preferences",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
)
_TOP_UNSUPPORTED = ("http_server_config", "rate_limit")
#: the bytes of a password bcrypt reads; a longer one is refused (bcrypt 5 raises on it)
_BCRYPT_MAX = 72
_BCRYPT = re.compile(rb"\$2[aby]?\$\d{2}\$[./A-Za-z0-9]{53}")
_USER = re.compile(r"[^:\x00-\x1f\x7f]{1,256}")


@dataclass(frozen=True, slots=True)
class TlsServerConfig:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    @property
    def requires_client_cert(self) -> bool:
        return self.client_auth_type == "RequireAndVerifyClientCert"


@dataclass(frozen=True, slots=True)
class WebConfig:
    tls: TlsServerConfig | None = None
    #: user -> bcrypt hash
    users: Mapping[str, bytes] = field(default_factory=dict)


def _field(name: str) -> str:
    return f"metrics_web_config: {name}"


def _read(path: Path) -> Mapping[object, object]:
    problem = None
    try:
        with path.open("rb") as stream:
            raw = stream.read(_MAX_FILE_BYTES + 1)
        if len(raw) > _MAX_FILE_BYTES:
            problem = f"over {_MAX_FILE_BYTES} bytes"
        else:
            data = safeyaml.load(raw, "metrics_web_config", safeyaml.Limits(max_aliases=0))
    except (OSError, UnicodeDecodeError) as exc:
        problem = str(exc)[:500]
    except InvalidSpec as exc:
        problem = str(exc)[:500]
    if problem is not None:
        raise InvalidSpec(
            f"cannot read metrics web config {path}: {problem}",
            [FieldViolation("metrics_web_config", problem)],
        )
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InvalidSpec(
            f"metrics web config {path} is not a mapping",
            [FieldViolation("metrics_web_config", "a mapping of web config keys")],
        )
    return data


def _tls(raw: object, base: Path, violations: list[FieldViolation]) -> TlsServerConfig | None:
    if not isinstance(raw, Mapping):
        violations.append(FieldViolation(_field("tls_server_config"), "a mapping"))
        return None
    values: dict[str, object] = {}
    for key, value in raw.items():
        name = f"tls_server_config.{key}"
        if key in _TLS_UNSUPPORTED:
            violations.append(FieldViolation(_field(name), "not supported by gpu-agent"))
        elif key in _TLS_KEYS or key in _TLS_VERSION_KEYS:
            if not isinstance(value, str) or not value:
                violations.append(FieldViolation(_field(name), "a non-empty string"))
            else:
                values[str(key)] = value
        else:
            violations.append(FieldViolation(_field(name), "unknown key"))
    for key in ("cert_file", "key_file"):
        if key not in values:
            violations.append(FieldViolation(_field(f"tls_server_config.{key}"), "required"))
    auth = str(values.get("client_auth_type", "NoClientCert"))
    if auth in _UNSUPPORTED_AUTH:
        violations.append(
            FieldViolation(
                _field("tls_server_config.client_auth_type"),
                f"{auth} accepts unverified certificates, not supported; one of "
                + ", ".join(_AUTH_TYPES),
            )
        )
    elif auth not in _AUTH_TYPES:
        violations.append(
            FieldViolation(
                _field("tls_server_config.client_auth_type"), "one of " + ", ".join(_AUTH_TYPES)
            )
        )
    if auth in _VERIFYING and "client_ca_file" not in values:
        violations.append(
            FieldViolation(_field("tls_server_config.client_ca_file"), f"required with {auth}")
        )
    if "client_ca_file" in values and auth == "NoClientCert":
        violations.append(
            FieldViolation(
                _field("tls_server_config.client_auth_type"),
                "client_ca_file is set without a client auth type that verifies certificates",
            )
        )
    for key in _TLS_VERSION_KEYS:
        if key in values and values[key] not in _VERSIONS:
            violations.append(
                FieldViolation(_field(f"tls_server_config.{key}"), "one of " + ", ".join(_VERSIONS))
            )
    if violations or "cert_file" not in values or "key_file" not in values:
        return None

    def path(key: str) -> Path:
        return base / str(values[key])  # an absolute path stays as it is

    return TlsServerConfig(
        cert_file=path("cert_file"),
        key_file=path("key_file"),
        client_auth_type=auth,
        client_ca_file=path("client_ca_file") if "client_ca_file" in values else None,
        min_version=str(values.get("min_version", "TLS12")),
        max_version=str(values.get("max_version", "TLS13")),
    )


def _users(raw: object, violations: list[FieldViolation]) -> dict[str, bytes]:
    if not isinstance(raw, Mapping):
        violations.append(FieldViolation(_field("basic_auth_users"), "a mapping of user: hash"))
        return {}
    users = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not _USER.fullmatch(user):
            violations.append(
                FieldViolation(_field("basic_auth_users"), "user names: 1-256 characters, no ':'")
            )
            continue
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed.encode()):
            violations.append(
                FieldViolation(_field(f"basic_auth_users.{user}"), "a bcrypt hash ($2y$...)")
            )
            continue
        users[user] = hashed.encode()
    return users


def load_web_config(path: Path) -> WebConfig:
    """The parsed and checked file; InvalidSpec naming every bad key at once."""
    data = _read(path)
    violations: list[FieldViolation] = []
    tls = None
    users: dict[str, bytes] = {}
    for key, value in data.items():
        if key == "tls_server_config":
            tls = _tls(value, path.parent, violations)
        elif key == "basic_auth_users":
            users = _users(value, violations)
        elif key in _TOP_UNSUPPORTED:
            violations.append(FieldViolation(_field(str(key)), "not supported by gpu-agent"))
        else:
            violations.append(FieldViolation(_field(str(key)), "unknown key"))
    if violations:
        lines = "".join(f"\n  {v}" for v in violations)
        raise InvalidSpec(f"invalid metrics web config {path}:{lines}", violations)
    if tls is not None:
        ReloadingTls(tls)  # the files must load now: a start with a broken certificate fails
    return WebConfig(tls, users)


class ReloadingTls:
    """The server's SSL context, rebuilt when the certificate, key or client CA files change.

    Checked at each handshake (the SNI callback, which runs for every client hello); a set that
    does not load keeps the previous context, as the gRPC listener does.
    """

    def __init__(self, config: TlsServerConfig) -> None:
        self._config = config
        self._files = tuple(
            p for p in (config.cert_file, config.key_file, config.client_ca_file) if p is not None
        )
        self._stamp = stamp_files(self._files)
        self._current = self._build()
        self.context = self._build()  # the listener's; it hands each handshake _current
        self.context.sni_callback = self._pick

    def _build(self) -> ssl.SSLContext:
        c = self._config
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _VERSIONS[c.min_version]
        context.maximum_version = _VERSIONS[c.max_version]
        try:
            context.load_cert_chain(c.cert_file, c.key_file)
            if c.client_ca_file is not None:
                context.load_verify_locations(cafile=c.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidSpec(
                f"metrics TLS files do not load: {exc}",
                [FieldViolation(_field("tls_server_config"), f"cert, key or CA: {exc}")],
            ) from exc
        # Optional at the handshake even when required: probes of /healthz carry none, and
        # /metrics refuses a client without a verified certificate (MetricsGuard).
        context.verify_mode = (
            ssl.CERT_OPTIONAL if c.client_auth_type in _VERIFYING else ssl.CERT_NONE
        )
        return context

    def _pick(self, sock: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        try:
            stamp = stamp_files(self._files)
            if stamp != self._stamp:
                self._current = self._build()
                self._stamp = stamp
                log.info("metrics TLS files changed; new connections use them")
        except (OSError, InvalidSpec) as exc:
            log.warning("keeping the current metrics TLS certificate: %s", exc)
        sock.context = self._current


def _cost(hashed: bytes) -> int:
    """The work factor of a bcrypt hash (``$2y$12$...`` is 12); load_web_config checked the form."""
    return min(max(int(hashed.split(b"$")[2]), 4), 31)  # what gensalt accepts


class MetricsGuard:
    """Refuses /metrics without the credentials the web config asks for: a verified client
    certificate (RequireAndVerifyClientCert) and the basic auth password.

    bcrypt is slow on purpose (about 0.1 s at cost 10): checks run off the event loop, two at a
    time, and a successful check is remembered (a digest of user, password and hash, never the
    password) so a scrape every few seconds costs one bcrypt per credential, not one per scrape.
    """

    _REMEMBER = 64

    def __init__(self, config: WebConfig) -> None:
        self._users = dict(config.users)
        # An unknown user is checked against this, at the configured cost, so the answer takes
        # as long as a wrong password's and its speed does not tell which user names exist.
        self._stand_in = b""
        if self._users:  # bcrypt is loaded only where basic auth is configured
            import bcrypt

            cost = max(_cost(h) for h in self._users.values())
            self._stand_in = bcrypt.hashpw(b"", bcrypt.gensalt(cost))
        self._needs_cert = config.tls is not None and config.tls.requires_client_cert
        self._checks = asyncio.Semaphore(2)
        self._good: OrderedDict[bytes, None] = OrderedDict()

    async def refuse(self, request: Request) -> Response | None:
        if self._needs_cert and not request.peer_cert:
            return Response(403, b"a client certificate from the configured CA is required\n")
        if not self._users:
            return None
        if await self._authenticated(request.headers.get("authorization", "")):
            return None
        return Response(
            401,
            b"unauthorized\n",
            headers={"WWW-Authenticate": 'Basic realm="gpu-agent", charset="UTF-8"'},
        )

    async def _authenticated(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or len(encoded) > 4096:
            return False
        try:
            user, colon, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not colon or len(password.encode()) > _BCRYPT_MAX:
            return False
        known = self._users.get(user)
        hashed = self._stand_in if known is None else known
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed))).digest()
        if key in self._good:
            self._good.move_to_end(key)
            return True
        import bcrypt  # loaded by __init__ already: there are users

        async with self._checks:
            ok = await asyncio.to_thread(bcrypt.checkpw, password.encode(), hashed)
        if known is None:
            return False  # the stand-in's password is "", which must not let anyone in
        if ok:
            self._good[key] = None
            if len(self._good) > self._REMEMBER:
                self._good.popitem(last=False)
        return ok


def metrics_server(
    routes: Mapping[str, Handler], web: WebConfig | None, handshake_timeout_s: float
) -> HttpServer:
    """/metrics behind the web config's TLS, client certificates and basic auth, when set."""
    if web is None:
        return HttpServer(routes)
    tls = ReloadingTls(web.tls).context if web.tls is not None else None
    return HttpServer(
        routes,
        tls=tls,
        handshake_timeout_s=handshake_timeout_s,
        guard=MetricsGuard(web),
        protected={"/metrics"},
    )
