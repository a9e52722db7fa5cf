"""Which origins prewarm may fetch from: scheme allowlist, host allow/deny lists, and every
address a host spells or resolves to checked against the non-public ranges (`addresses`):
loopback, private, CGNAT, link-local, unique-local, cloud metadata, in all their spellings, are
denied unless the operator's ``prewarm.egress_allow`` opens them.

Pure apart from the injectable resolver. Fetchers call `UrlPolicy.check` for the first URL and
for every redirect target, then connect to the addresses it returned, so a DNS answer that
changes between check and connect cannot reach a denied address. A resolver cannot be
interrupted, so it runs `abandonable`: a fetch stops waiting for it when its item stops, and
any caller after `RESOLVE_DEADLINE_S`, shorter than the agent's shutdown budget. Image
references handed to the CRI go through `UrlPolicy.check_registry` (the agent never sees
where containerd connects).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from agent.errors import FieldViolation, InvalidSpec, PermissionDenied
from agent.prewarm.addresses import IpAddress, IpNetwork, classify, parse_host
from agent.prewarm.cancel import abandonable, never
from agent.redact import redact_url as redact_url  # the one redaction; fetchers import it here

Resolver = Callable[[str, int], Sequence[str]]

#: How long a DNS answer is waited for: glibc's default (two tries of 5 s) plus a margin, and
#: well inside the agent's 20 s shutdown budget.
RESOLVE_DEADLINE_S = 12.0

# Names of metadata services that resolve to them inside the cloud's own DNS.
DEFAULT_DENIED_HOSTS = ("metadata.google.internal", "metadata", "instance-data")
_OPEN_SETTING = "prewarm.egress_allow"


_HOST_PATTERN = re.compile(r"[a-z0-9*?_-][a-z0-9*?._-]*")


#: The longest URL taken, a request's or a redirect's: an HTTP server's request-line limit
#: (nginx's and Apache's 8 KiB); a signed object-store URL is a few KiB. A longer one would be
#: stored, and echoed in every listing, error, event and log line of its item, to fail anyway.
MAX_URL_CHARS = 8192


def check_length(url: str, field: str = "url") -> None:
    """Refuse a URL longer than `MAX_URL_CHARS`, naming ``field`` and not echoing the URL."""
    if len(url) > MAX_URL_CHARS:
        raise InvalidSpec(
            f"{field}: a URL of {len(url)} characters; at most {MAX_URL_CHARS} are taken",
            [FieldViolation(field, f"a URL of at most {MAX_URL_CHARS} characters")],
        )


def is_host_pattern(text: str) -> bool:
    """A host list entry: a CIDR or address, or a host name or glob."""
    return _as_network(text) is not None or bool(_HOST_PATTERN.fullmatch(text.lower()))


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


_DEFAULT_PORTS = {"https": 443, "http": 80}


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``, lower case, the port always written: what header
    secrets are bound to, and what a redirect is compared with."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    try:
        port = parts.port
    except ValueError:
        port = None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or _DEFAULT_PORTS.get(scheme, 0)}"


@dataclass(frozen=True, slots=True)
class Target:
    """A checked origin: connect to ``addresses`` (in order), send ``host`` as Host/SNI."""

    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]


def _as_network(pattern: str) -> IpNetwork | None:
    try:
        return ipaddress.ip_network(pattern, strict=False)
    except ValueError:
        return None


def _unmapped(addr: IpAddress) -> IpAddress:
    if isinstance(addr, ipaddress.IPv6Address):
        addr = ipaddress.IPv6Address(addr.packed)  # without a zone id
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
    return addr


@dataclass(frozen=True, slots=True)
class UrlPolicy:
    """Rules from PrewarmSettings; entries of the host lists are names, globs or CIDRs.

    ``allowed_hosts`` (when not empty) and ``denied_hosts`` say which origins files come from;
    ``egress_allow`` opens non-public addresses (loopback, private, metadata …), which are
    denied whatever the other lists say until it names them.
    """

    allow_http: bool = False
    allowed_hosts: tuple[str, ...] = ()
    denied_hosts: tuple[str, ...] = ()
    egress_allow: tuple[str, ...] = ()
    resolver: Resolver = system_resolver
    # Hosts (names or globs) reached over plain http even without allow_http: an insecure
    # registry the operator named, never a host a request chose.
    http_hosts: tuple[str, ...] = ()

    @property
    def schemes(self) -> tuple[str, ...]:
        return ("https", "http") if self.allow_http else ("https",)

    def check_static(self, url: str, field: str = "url") -> tuple[str, str, int]:
        """Scheme, host and port of ``url`` if its form and host pass; no DNS lookup."""
        check_length(url, field)
        parts = urlsplit(url)
        http_host = (parts.hostname or "").lower().rstrip(".")
        if parts.scheme not in self.schemes and not (
            parts.scheme == "http" and any(fnmatchcase(http_host, p) for p in self.http_hosts)
        ):
            raise InvalidSpec(
                f"{field}: scheme {parts.scheme or '(none)'!r} is not allowed",
                [FieldViolation(field, f"allowed schemes: {', '.join(self.schemes)}")],
            )
        if parts.username is not None or parts.password is not None:
            raise InvalidSpec(
                f"{field}: credentials in the URL are not accepted",
                [FieldViolation(field, "pass them as a header read from a file instead")],
            )
        host = (parts.hostname or "").lower().rstrip(".")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise InvalidSpec(f"{field}: bad port", [FieldViolation(field, str(exc))]) from None
        if not host:
            raise InvalidSpec(f"{field}: no host", [FieldViolation(field, "an absolute URL")])
        self._check_name(host, url)
        by_address = any(_as_network(p) is not None for p in self.allowed_hosts)
        if self.allowed_hosts and not by_address and not self._name_allowed(host):
            raise PermissionDenied(f"host {host} is not in prewarm.allowed_hosts")
        literal = parse_host(host)
        if literal is not None:
            self._check_address(host, literal, restrict=True)
        return parts.scheme, host, port

    def check(self, url: str, field: str = "url", cancelled: Callable[[], bool] = never) -> Target:
        """Check the URL and every address its host spells or resolves to; return where to
        connect (those addresses, never a later DNS answer). ``cancelled``: the fetch's token,
        which ends the wait for a resolver that does not answer."""
        scheme, host, port = self.check_static(url, field)
        literal = parse_host(host)
        if literal is not None:
            addresses: tuple[str, ...] = (str(literal),)
        else:
            addresses = self._resolve(host, port, field, cancelled)
        for text in addresses:
            self._check_address(host, _address(text), restrict=True)
        return Target(url, scheme, host, port, addresses)

    def check_registry(self, host_port: str, field: str = "image") -> None:
        """Check an image registry before its reference goes to the CRI, which connects itself.

        The names and addresses rules of files hold (``allowed_hosts`` does not: it names file
        origins). The agent resolves the host as it would for a file; a host it cannot resolve
        is left to containerd, whose resolver and mirrors (hosts.toml) may differ: the agent
        cannot see the address containerd connects to.
        """
        parts = urlsplit(f"//{host_port}")
        host = (parts.hostname or "").lower().rstrip(".")
        if not host:
            raise InvalidSpec(f"{field}: no registry host", [FieldViolation(field, "a host")])
        self._check_name(host, host_port)
        literal = parse_host(host)
        if literal is not None:
            self._check_address(host, literal, restrict=False)
            return
        try:
            addresses = self.resolve(host, 443, never)
        except OSError:
            return
        for text in addresses:
            self._check_address(host, _address(text), restrict=False)

    def resolve(self, host: str, port: int, cancelled: Callable[[], bool]) -> tuple[str, ...]:
        """The resolver's answer; Cancelled when the item stops first, TimeoutError past
        RESOLVE_DEADLINE_S (the resolver's thread is left to end on its own)."""
        return abandonable(lambda: tuple(self.resolver(host, port)), cancelled, RESOLVE_DEADLINE_S)

    def _resolve(
        self, host: str, port: int, field: str, cancelled: Callable[[], bool]
    ) -> tuple[str, ...]:
        try:
            addresses = self.resolve(host, port, cancelled)
        except OSError as exc:
            raise InvalidSpec(
                f"{field}: cannot resolve host {host}: {exc.strerror or exc}"
            ) from exc
        if not addresses:
            raise InvalidSpec(f"{field}: host {host} has no addresses")
        return addresses

    def _check_name(self, host: str, url: str) -> None:
        names = [p for p in self.denied_hosts if _as_network(p) is None]
        if any(fnmatchcase(host, p.lower()) for p in names) or (
            host in DEFAULT_DENIED_HOSTS and not self._name_opened(host)
        ):
            raise PermissionDenied(f"host {host} is denied for prewarm ({redact_url(url)})")

    def _check_address(self, host: str, addr: IpAddress, *, restrict: bool) -> None:
        """``restrict``: ``allowed_hosts`` applies too (files and models, not CRI images)."""
        plain = _unmapped(addr)
        # A name's DNS answer is not shown: callers could map the node's internal names.
        where = (
            f"host {host} is {plain}, "
            if parse_host(host) is not None
            else f"host {host} resolves to "
        )
        denied = [n for n in map(_as_network, self.denied_hosts) if n is not None]
        if any(plain in net for net in denied):
            raise PermissionDenied(f"{where}an address prewarm.denied_hosts denies")
        kind = classify(addr)
        if kind is not None and not self._opened(host, plain):
            raise PermissionDenied(
                f"{where}a {kind} address, denied unless the operator lists it in {_OPEN_SETTING}"
            )
        if (
            restrict
            and self.allowed_hosts
            and not self._name_allowed(host)
            and not self._addr_allowed(plain)
        ):
            raise PermissionDenied(f"host {host} is not in prewarm.allowed_hosts")

    def _name_opened(self, host: str) -> bool:
        return any(
            _as_network(p) is None and fnmatchcase(host, p.lower()) for p in self.egress_allow
        )

    def _opened(self, host: str, addr: IpAddress) -> bool:
        nets = [n for n in map(_as_network, self.egress_allow) if n is not None]
        return self._name_opened(host) or any(addr in net for net in nets)

    def _name_allowed(self, host: str) -> bool:
        if any(_as_network(p) is None and fnmatchcase(host, p.lower()) for p in self.allowed_hosts):
            return True
        literal = parse_host(host)
        return literal is not None and self._addr_allowed(_unmapped(literal))

    def _addr_allowed(self, addr: IpAddress) -> bool:
        nets = [n for n in map(_as_network, self.allowed_hosts) if n is not None]
        return any(addr in net for net in nets)


def _address(text: str) -> IpAddress:
    return ipaddress.ip_address(text)
