"""Egress policy: non-public addresses are denied in every spelling until the operator opens them
(prewarm.egress_allow); pure rules, with a stub resolver instead of DNS."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agent.errors import PermissionDenied
from agent.prewarm.policy import UrlPolicy


def no_dns(host: str, port: int) -> Sequence[str]:
    raise AssertionError(f"an address literal was looked up in DNS: {host}")


def resolving_to(*addresses: str, **rules: tuple[str, ...]) -> UrlPolicy:
    return UrlPolicy(allow_http=True, resolver=lambda host, port: list(addresses), **rules)


# Every way the attack run reached a non-public address with the old defaults, and more.
SPELLINGS = [
    ("http://2130706433/", "loopback"),  # 127.0.0.1 as one decimal number
    ("http://0177.0.0.1/", "loopback"),  # octal
    ("http://0x7f.1/", "loopback"),  # hex, two parts
    ("http://127.0.0.1:10250/pods", "loopback"),  # the kubelet
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:169.254.169.254]/", "cloud metadata"),  # IPv4-mapped
    ("http://[64:ff9b::a9fe:a9fe]/", "cloud metadata"),  # NAT64
    ("http://[2002:a9fe:a9fe::]/", "cloud metadata"),  # 6to4
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://168.63.129.16/", "cloud metadata"),  # Azure WireServer, a public range
    ("http://100.64.0.1/", "CGNAT"),
    ("http://10.0.0.1/", "private"),
    ("http://172.16.0.1/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://[fd00::1]/", "unique-local"),
    ("http://[fe80::1]/", "link-local"),
    ("http://[fe80::1%25eth0]/", "link-local"),  # with a zone id
    ("http://0.0.0.0/", "this-host"),
    ("http://224.0.0.1/", "multicast"),
]


@pytest.mark.parametrize(("url", "kind"), SPELLINGS)
def test_non_public_addresses_are_denied_in_every_spelling(url: str, kind: str) -> None:
    policy = UrlPolicy(allow_http=True, resolver=no_dns)
    with pytest.raises(PermissionDenied, match=kind) as err:
        policy.check(url)
    assert "prewarm.egress_allow" in str(err.value)  # says how an operator would open it
    with pytest.raises(PermissionDenied):
        policy.check_static(url)  # refused before any lookup too


@pytest.mark.parametrize(
    "address",
    ["10.0.0.5", "127.0.0.1", "100.64.1.1", "fd00::1", "::ffff:10.0.0.1", "64:ff9b::7f00:1"],
)
def test_a_name_that_resolves_to_a_non_public_address_is_denied_without_showing_it(
    address: str,
) -> None:
    with pytest.raises(PermissionDenied, match="resolves to a") as err:
        resolving_to(address).check("https://models.example.com/m")
    assert address not in str(err.value)  # the node's DNS answers are not the caller's to map


def test_public_addresses_pass_in_any_spelling() -> None:
    for address in ("8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"):
        target = resolving_to(address).check("https://models.example.com/m")
        assert target.addresses == (address,)
    assert UrlPolicy(resolver=no_dns).check("https://134744072/").addresses == ("8.8.8.8",)


def test_egress_allow_opens_its_cidrs_and_names_and_nothing_else() -> None:
    loopback = resolving_to("127.0.0.1", egress_allow=("127.0.0.0/8",))
    assert loopback.check("http://127.0.0.1:8080/x").addresses == ("127.0.0.1",)
    assert loopback.check("http://2130706433/x").addresses == ("127.0.0.1",)
    assert loopback.check("http://[::ffff:127.0.0.1]/x").host == "::ffff:127.0.0.1"
    with pytest.raises(PermissionDenied):
        loopback.check("http://10.0.0.1/x")
    with pytest.raises(PermissionDenied):
        loopback.check("http://169.254.169.254/x")
    named = resolving_to("10.1.2.3", egress_allow=("*.corp.example",))
    assert named.check("https://minio.corp.example/b").addresses == ("10.1.2.3",)
    with pytest.raises(PermissionDenied):
        named.check("https://minio.elsewhere.example/b")


def test_denied_hosts_win_over_egress_allow() -> None:
    policy = resolving_to(
        "127.0.0.2", egress_allow=("127.0.0.0/8",), denied_hosts=("127.0.0.2/32",)
    )
    with pytest.raises(PermissionDenied, match="denied_hosts"):
        policy.check("http://origin.test/x")


def test_every_resolved_address_must_pass() -> None:
    with pytest.raises(PermissionDenied):
        resolving_to("8.8.8.8", "10.0.0.1").check("https://two.example.com/m")


@pytest.mark.parametrize(
    "registry", ["127.0.0.1:5000", "[::ffff:169.254.169.254]:5000", "2130706433", "10.0.0.9"]
)
def test_a_registry_on_a_non_public_address_is_denied(registry: str) -> None:
    with pytest.raises(PermissionDenied):
        UrlPolicy(resolver=no_dns).check_registry(registry)
    UrlPolicy(resolver=no_dns, egress_allow=("0.0.0.0/0", "::/0")).check_registry(registry)


def test_a_registry_name_is_checked_on_what_it_resolves_to() -> None:
    with pytest.raises(PermissionDenied, match="resolves to a private"):
        resolving_to("10.0.0.7").check_registry("registry.corp.example")
    resolving_to("8.8.8.8").check_registry("registry.example.com")

    def unresolvable(host: str, port: int) -> Sequence[str]:
        raise OSError("no such host")

    # Not resolvable here: left to containerd and its mirrors (the documented gap).
    UrlPolicy(resolver=unresolvable).check_registry("registry.example.com")
    with pytest.raises(PermissionDenied):
        UrlPolicy(resolver=unresolvable).check_registry("metadata.google.internal")
