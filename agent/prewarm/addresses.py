"""Which IP addresses are not the public internet, in every spelling a URL can give them.

Pure: no DNS, no sockets. `classify` names the kind of a non-public address (loopback, private,
link-local, CGNAT, unique-local, metadata, …) and looks through the IPv6 forms that carry an
IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``), so
``[::ffff:169.254.169.254]`` is the metadata address it reaches. `parse_host` reads a URL's host
as an address the way the C resolver does, so ``2130706433`` and ``0177.0.0.1`` are 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import re
import typing

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata and host-agent endpoints, named first so an error says what was reached. Most
# lie in a range below anyway; 168.63.129.16 (Azure WireServer) is a public address.
METADATA: frozenset[IpAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OCI, OpenStack IMDS
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.253",  # AWS VPC DNS
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure WireServer
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::253",  # AWS VPC DNS over IPv6
    )
)


def _kinds(*rows: tuple[str, str]) -> tuple[tuple[IpNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), kind) for net, kind in rows)


_V4 = _kinds(
    ("0.0.0.0/8", "this-host"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "special-purpose"),
    ("192.168.0.0/16", "private"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
)
_V6 = _kinds(
    ("::/128", "this-host"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/32", "Teredo tunnel"),
    ("fc00::/7", "unique-local (ULA)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def classify(addr: IpAddress) -> str | None:
    """What kind of non-public address ``addr`` is, or None for a public one."""
    if isinstance(addr, ipaddress.IPv6Address):
        addr = addr.__class__(addr.packed)  # drop a zone id (fe80::1%eth0): same address
        embedded, via = _embedded_v4(addr)
        if embedded is not None:
            kind = classify(embedded)
            return None if kind is None else f"{kind} ({via} {embedded})"
    if addr in METADATA:
        return "cloud metadata"
    table = _V4 if isinstance(addr, ipaddress.IPv4Address) else _V6
    return next((kind for net, kind in table if addr in net), None)


def _embedded_v4(addr: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address | None, str]:
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped, "IPv4-mapped"
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF), "NAT64"
    if addr.sixtofour is not None:
        return addr.sixtofour, "6to4"
    return None, ""


_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


def parse_host(host: str) -> IpAddress | None:
    """The address a URL host spells, or None for a name.

    IPv6 with or without brackets (and a zone id); IPv4 as ``inet_aton`` reads it: 1 to 4
    parts, each decimal, octal (leading 0) or hex (0x), the last filling the remaining bytes
    (``2130706433``, ``0177.0.0.1``, ``0x7f.1`` and ``127.1`` are all 127.0.0.1).
    """
    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if ":" in text:
        return None
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_PART.fullmatch(p) for p in parts):
        return None
    values = [_number(p) for p in parts]
    if None in values:
        return None
    *head, last = typing.cast(list[int], values)
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (5 - len(parts))):
        return None
    number = 0
    for v in head:
        number = number << 8 | v
    return ipaddress.IPv4Address(number << (8 * (4 - len(head))) | last)


def _number(part: str) -> int | None:
    if part[:2].lower() == "0x":
        return int(part[2:], 16) if len(part) > 2 else None
    return int(part, 8) if part.startswith("0") else int(part)
