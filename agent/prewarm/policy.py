"""Which origins prewarm may fetch from: scheme allowlist, host allow/deny lists, and every
resolved address checked against link-local and cloud-metadata ranges (denied by default).

Pure apart from the injectable resolver. Fetchers call `UrlPolicy.check` for the first URL and
for every redirect target, then connect to the addresses it returned, so a DNS answer that
changes between check and connect cannot reach a denied address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from agent.errors import FieldViolation, InvalidSpec, PermissionDenied
from agent.redact import redact_url as redact_url  # the one redaction; fetchers import it here

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[str]]

# Link-local covers 169.254.169.254 (AWS, GCP, Azure IMDS) and fe80::/10; the rest are metadata
# endpoints outside link-local, and addresses that mean "this host, any interface".
DEFAULT_DENIED_NETWORKS: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS IMDS over IPv6
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud metadata
    ipaddress.ip_network("168.63.129.16/32"),  # Azure WireServer
    ipaddress.ip_network("0.0.0.0/8"),
    ipaddress.ip_network("::/128"),
)
DEFAULT_DENIED_HOSTS = ("metadata.google.internal", "metadata", "instance-data")


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True, slots=True)
class Target:
    """A checked origin: connect to ``addresses`` (in order), send ``host`` as Host/SNI."""

    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]


def _as_network(pattern: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(pattern, strict=False)
    except ValueError:
        return None


def _unmapped(addr: IpAddress) -> IpAddress:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


@dataclass(frozen=True, slots=True)
class UrlPolicy:
    """Rules from PrewarmSettings; entries of the host lists are names, globs or CIDRs."""

    allow_http: bool = False
    allowed_hosts: tuple[str, ...] = ()
    denied_hosts: tuple[str, ...] = ()
    resolver: Resolver = system_resolver
    # Hosts (names or globs) reached over plain http even without allow_http: an insecure
    # registry the operator named, never a host a request chose.
    http_hosts: tuple[str, ...] = ()

    @property
    def schemes(self) -> tuple[str, ...]:
        return ("https", "http") if self.allow_http else ("https",)

    def check_static(self, url: str, field: str = "url") -> tuple[str, str, int]:
        """Scheme, host and port of ``url`` if its form and host name pass; no DNS lookup."""
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
        if self._name_denied(host):
            raise PermissionDenied(f"host {host} is denied for prewarm ({redact_url(url)})")
        by_address = any(_as_network(p) is not None for p in self.allowed_hosts)
        if self.allowed_hosts and not by_address and not self._name_allowed(host):
            raise PermissionDenied(f"host {host} is not in prewarm.allowed_hosts")
        return parts.scheme, host, port

    def check(self, url: str, field: str = "url") -> Target:
        """Check the URL and every address its host resolves to; return where to connect."""
        scheme, host, port = self.check_static(url, field)
        try:
            addresses = tuple(self.resolver(host, port))
        except OSError as exc:
            raise InvalidSpec(
                f"{field}: cannot resolve host {host}: {exc.strerror or exc}"
            ) from exc
        if not addresses:
            raise InvalidSpec(f"{field}: host {host} has no addresses")
        for text in addresses:
            addr = _unmapped(ipaddress.ip_address(text.split("%", 1)[0]))
            if self._address_denied(addr):
                raise PermissionDenied(
                    f"host {host} resolves to {addr}, a denied address (link-local, cloud "
                    "metadata or prewarm.denied_hosts)"
                )
            if self.allowed_hosts and not self._name_allowed(host) and not self._addr_allowed(addr):
                raise PermissionDenied(f"host {host} is not in prewarm.allowed_hosts")
        return Target(url, scheme, host, port, addresses)

    def _name_denied(self, host: str) -> bool:
        names = (*DEFAULT_DENIED_HOSTS, *self.denied_hosts)
        if any(_as_network(p) is None and fnmatchcase(host, p.lower()) for p in names):
            return True
        literal = _literal(host)
        return literal is not None and self._address_denied(literal)

    def _name_allowed(self, host: str) -> bool:
        if any(_as_network(p) is None and fnmatchcase(host, p.lower()) for p in self.allowed_hosts):
            return True
        literal = _literal(host)
        return literal is not None and self._addr_allowed(literal)

    def _address_denied(self, addr: IpAddress) -> bool:
        nets = [n for n in map(_as_network, self.denied_hosts) if n is not None]
        return any(addr in net for net in (*DEFAULT_DENIED_NETWORKS, *nets))

    def _addr_allowed(self, addr: IpAddress) -> bool:
        nets = [n for n in map(_as_network, self.allowed_hosts) if n is not None]
        return any(addr in net for net in nets)


def _literal(host: str) -> IpAddress | None:
    try:
        return _unmapped(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None
