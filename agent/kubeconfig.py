"""A kubeconfig read into the settings ``agent.kube.InClusterKubeClient`` takes.

lightkube's kubeconfig model (docs/architecture.md, "The Kubernetes client": why lightkube)
selects the context and types its cluster and user; what its model drops is read from the
document itself: ``proxy-url``, ``tls-server-name`` and the exec plugin's ``interactiveMode``
and ``provideClusterInfo``. Exec plugins run in ``agent.kube_exec``. The file is read with the
project's bounded YAML loader, so a hostile kubeconfig is refused before lightkube sees it.
What kubectl refuses (client-go's ConfirmUsable and TLSConfigFor) is refused here too, naming
the field, rather than loaded and half used (`_refuse_what_kubectl_refuses`).
"""

from __future__ import annotations

import base64
import contextlib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import safeyaml
from agent.errors import FieldViolation, InvalidSpec, NotSupported
from agent.kube_exec import ExecPlugin
from agent.redact import redact_url

if TYPE_CHECKING:
    from lightkube.config.kubeconfig import KubeConfig

__all__ = ["KubeconfigSettings", "load", "refuse_server", "server_problem"]


#: a server URL's longest: its path is in every call and every error naming the server
MAX_SERVER_CHARS = 1024
SERVER_FIELD = "clusters[].cluster.server"


def server_problem(server: str) -> str | None:
    """Why no call could go to ``server`` as given (None: it can), said without echoing it.
    Its path prefixes every call's (a server behind a path), so one that is not printable
    ASCII fails every request, and a query or fragment would be dropped from each."""
    if not server:  # kubectl: "no server found for cluster"
        return "is missing or empty"
    if len(server) > MAX_SERVER_CHARS:
        return f"is {len(server)} characters, over {MAX_SERVER_CHARS}"
    try:
        path = urllib.parse.urlsplit(server).path
    except ValueError:
        return "is not a URL"
    if "?" in server or "#" in server:
        return "carries a query or fragment, which no call could send (the path prefixes each)"
    if not all("!" <= c <= "~" for c in path):
        return "has a path that is not printable ASCII without spaces (percent-encode it)"
    return None


def refuse_server(server: str, where: str = "") -> None:
    """InvalidSpec naming the kubeconfig field (and ``where``: the file) for `server_problem`."""
    if (problem := server_problem(server)) is not None:
        shown = safeyaml.capped(redact_url(server), 200) if server else ""
        raise InvalidSpec(
            f"{where}{SERVER_FIELD} {shown!r} {problem}",
            [
                FieldViolation(
                    SERVER_FIELD,
                    f"an http(s) URL of at most {MAX_SERVER_CHARS} "
                    "printable ASCII characters, with no query or fragment",
                )
            ],
        )


@dataclass(frozen=True)
class KubeconfigSettings:
    server: str
    # The credentials are kept out of the repr: the token, the client key, and the proxy's
    # password (http://USER:PASSWORD@HOST:PORT).
    token: str | None = field(default=None, repr=False)
    token_path: Path | None = None
    ca_data: bytes | None = None
    client_cert: tuple[bytes, bytes] | None = field(default=None, repr=False)
    insecure: bool = False
    proxy: str | None = field(default=None, repr=False)
    exec_plugin: ExecPlugin | None = None
    #: the name the server's certificate is checked against (and SNI), if not its host's
    tls_server_name: str | None = None


def _invalid(path: Path, message: str, field: str, want: str) -> InvalidSpec:
    return InvalidSpec(f"kubeconfig {path}: {message}", [FieldViolation(field, want)])


def load(
    path: Path, context: str | None = None, exec_timeout_s: float = 10.0
) -> KubeconfigSettings:
    """The settings the (current, or ``context``) context of the kubeconfig at ``path`` names."""
    import msgspec
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.core.exceptions import ConfigError

    doc = safeyaml.load(safeyaml.read_text(path, "kubeconfig"), "kubeconfig")
    if not isinstance(doc, dict):
        raise _invalid(path, "not a mapping", "kubeconfig", "a kubeconfig document")
    # a file without clusters or contexts lists is one whose context names none (field named)
    lists = {key: doc.get(key) or [] for key in ("clusters", "contexts")}
    try:
        config = KubeConfig.from_dict({**doc, **lists}, fname=path.absolute())
        _refuse_dangling(path, config, context)
        chosen = config.get(context)
    except ConfigError as exc:
        raise _invalid(path, str(exc), "current-context", "a context the file names") from exc
    except KeyError as exc:  # an entry of clusters, contexts or users without a key it needs
        missing = safeyaml.capped(str(exc.args[0]), 60)
        raise _invalid(
            path, f"malformed: an entry lacks {missing!r}", "kubeconfig", "named entries"
        ) from exc
    except (TypeError, AttributeError, msgspec.ValidationError) as exc:
        raise _invalid(path, f"malformed: {exc}", "kubeconfig", "kubeconfig's schema") from exc
    assert chosen is not None  # get() without a default raises instead
    cluster, user = chosen.cluster, chosen.user
    raw_cluster = _entry(doc, "clusters", chosen.context.cluster, "cluster")
    raw_user = _entry(doc, "users", chosen.context.user or "", "user")
    if user is not None and user.auth_provider:
        raise NotSupported(
            f"kubeconfig {path}: user auth-provider plugins (removed in kubectl 1.26) are not "
            "supported; use the provider's exec plugin (kubelogin, gke-gcloud-auth-plugin)"
        )
    _refuse_what_kubectl_refuses(path, raw_cluster, raw_user)
    base = path.absolute().parent
    cert = key = None
    if user is not None:
        cert = _pem(path, user.client_cert_data, user.client_cert, base, "client-certificate")
        key = _pem(path, user.client_key_data, user.client_key, base, "client-key")
    key = key if cert is not None else None  # a key alone is left unused, as client-go does
    ca = _pem(
        path, cluster.certificate_auth_data, cluster.certificate_auth, base, "certificate-authority"
    )
    token = (user.token or None) if user is not None else None
    token_file = user.token_file if user is not None else None
    # lightkube's model puts http://localhost:8080 where the server is missing; kubectl refuses
    refuse_server(cluster.server if "server" in raw_cluster else "", f"kubeconfig {path}: ")
    plugin = _exec(path, raw_user.get("exec"), raw_cluster, base, exec_timeout_s)
    return KubeconfigSettings(
        server=cluster.server,
        token=token,
        token_path=base / token_file if token_file else None,
        ca_data=ca,
        client_cert=(cert, key) if cert and key else None,
        insecure=cluster.insecure,
        proxy=_proxy(path, raw_cluster.get("proxy-url")),
        # client-go's rule: a token, token file or client certificate is sent and the exec
        # plugin never runs (exec.go, UpdateTransportConfig); the plugin is still checked
        exec_plugin=None if token or token_file or (cert and key) else plugin,
        tls_server_name=_tls_server_name(path, raw_cluster.get("tls-server-name")),
    )


def _refuse_dangling(path: Path, config: KubeConfig, context: str | None) -> None:
    """A context naming a cluster or user the file lacks, refused naming the context's field.
    kubectl refuses the first (no server to call) and would go on without credentials for the
    second; a typo, or a user kept in another KUBECONFIG file (only the first is read), is far
    likelier than a wish to call anonymously, so it is refused too (docs/coordinator.md)."""
    name = context if context is not None else config.current_context
    chosen = config.contexts.get(name) if name is not None else None
    if chosen is None:
        return  # lightkube's get() names the missing context
    for key, wanted, known in (
        ("cluster", chosen.cluster, config.clusters),
        ("user", chosen.user, config.users),
    ):
        if (wanted or key == "cluster") and wanted not in known:
            where = f"contexts[{safeyaml.capped(str(name), 60)}].context.{key}"
            shown = safeyaml.capped(str(wanted), 60)
            why = f"no {key} named {shown!r} in the file"
            raise _invalid(path, f"{where}: {why}", where, f"a name from the file's {key}s")


#: Fields kubectl refuses together: (section, one, other, why).
_EXCLUSIVE = (
    ("clusters[].cluster", "certificate-authority", "certificate-authority-data",
     "give the CA once, as a file or as data"),
    ("users[].user", "client-certificate", "client-certificate-data",
     "give the certificate once, as a file or as data"),
    ("users[].user", "client-key", "client-key-data", "give the key once, as a file or as data"),
    ("clusters[].cluster", "insecure-skip-tls-verify", "certificate-authority",
     "a CA with insecure-skip-tls-verify is not allowed: nothing would check the server with it"),
    ("clusters[].cluster", "insecure-skip-tls-verify", "certificate-authority-data",
     "a CA with insecure-skip-tls-verify is not allowed: nothing would check the server with it"),
)  # fmt: skip


def _refuse_what_kubectl_refuses(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> None:
    """InvalidSpec naming the field for what client-go refuses, in our words: two forms of
    one thing (which one would win is a guess), a certificate without its key, a token beside
    basic auth; and basic auth as the only credential (it is not taken). What client-go only
    leaves unused (a key without a certificate, basic auth beside a certificate or an exec
    plugin) is left unused here too."""

    def given(entry: dict[str, Any], key: str) -> bool:
        return entry.get(key) not in (None, "", False)

    for section, one, other, why in _EXCLUSIVE:
        entry = cluster if section.startswith("clusters") else user
        if given(entry, one) and given(entry, other):
            where = f"{section}.{one}"
            raise _invalid(path, f"{where} and {other} are both set: {why}", where, why)
    has_cert = given(user, "client-certificate") or given(user, "client-certificate-data")
    has_key = given(user, "client-key") or given(user, "client-key-data")
    if has_cert and not has_key:
        lacking = "users[].user.client-key"
        raise _invalid(
            path,
            f"a client certificate without its key: set {lacking} (or its -data)",
            lacking,
            "set",
        )
    basic = [name for name in ("username", "password") if given(user, name)]
    token = given(user, "token") or given(user, "tokenFile")
    if basic and (token or not (has_cert or given(user, "exec"))):
        where, want = f"users[].user.{basic[0]}", "a token, client certificate or exec plugin"
        why = (
            "a token and basic auth are two authentication methods: say one"
            if token
            else "basic auth is not taken (the API server removed it in 1.19)"
        )
        raise _invalid(path, f"{where}: {why}; use {want}", where, want)


def _tls_server_name(path: Path, name: object) -> str | None:
    if name is None or name == "":
        return None
    # 253: a DNS name's most (RFC 1035), and more than any IP address's text
    if isinstance(name, str) and len(name) <= 253 and name.isprintable() and " " not in name:
        with contextlib.suppress(UnicodeError):
            name.encode("idna")  # as the handshake encodes it, for SNI and the certificate check
            return name
    where, want = "clusters[].cluster.tls-server-name", "a DNS name or IP address (253 at most)"
    shown = safeyaml.capped(str(name), 200)
    raise _invalid(path, f"{where} {shown!r}: want {want}", where, want)


def _entry(doc: dict[str, Any], section: str, name: str, key: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(key)
            return body if isinstance(body, dict) else {}
    return {}


def _exec(
    path: Path, spec: object, cluster: dict[str, Any], base: Path, timeout_s: float
) -> ExecPlugin | None:
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise _invalid(path, "users[].user.exec is not a mapping", "exec", "a mapping")
    return ExecPlugin.from_spec(spec, cluster, base, timeout_s, str(path))


def _proxy(path: Path, url: object) -> str | None:
    if url is None or url == "":
        return None
    try:
        parts = urllib.parse.urlsplit(str(url))
        taken = parts.scheme == "http" and bool(parts.hostname)
        _ = parts.port  # ValueError when out of range or not a number
    except ValueError:  # unparsable, or a port that is none: refused here, not at every call
        taken = False
    if not taken:
        # a CONNECT tunnel to a plain-HTTP proxy; https:// and socks5:// proxies are not taken.
        # Shown without its user info: socks5://user:password@host is how a proxy is given one.
        shown = safeyaml.capped(redact_url(str(url)), 200)
        raise _invalid(
            path,
            f"proxy-url {shown!r} is not an http://HOST:PORT URL",
            "proxy-url",
            "http://HOST:PORT",
        )
    return str(url)


def _pem(path: Path, data: str | None, name: str | None, base: Path, field: str) -> bytes | None:
    """A PEM given inline (``FIELD-data``, base64) or as a file path (relative to the file)."""
    if data:
        try:
            return base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise _invalid(path, f"{field}-data is not base64", f"{field}-data", "base64") from exc
    if not name:
        return None
    # read no further than a PEM can be: refused naming the field and the file otherwise
    return safeyaml.read_bytes(
        base / name, field, safeyaml.MAX_PEM_BYTES, f"kubeconfig {path}: {field}"
    )
